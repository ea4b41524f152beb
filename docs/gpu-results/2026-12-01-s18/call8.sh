# Session 18, call 8 (quick pack): with the warp parts (head dim 64), the split-K range past depth
# 512: more parts (one per 32 keys of capacity, up to 64: VELA_CUDA_SPLIT_KEYS=32
# VELA_CUDA_SPLIT_MAX_PARTS=64; the bench's capacity gives 18 / 29 parts from the grid term) at depth 1024, and the tensor-core decode from
# 4,096 keys instead of 1,536 (VELA_CUDA_FD_MIN_KEYS=4096) at depth 2048, on q05 / s2; tg128, 2
# rounds interleaved (no code change).
R=$PWD
source scripts/gpu-quick-env.sh
xz -dc $R/target/gpu-data/quick/s2vocab.gguf.xz > /tmp/s2vocab.gguf
cd /tmp
/tmp/vela synth --arch qwen2.5-0.5b --type q4_k_m -o /tmp/q05.gguf -t 8 >/dev/null 2>&1
/tmp/vela synth --arch smollm2-135m --type q4_1 --tokenizer /tmp/s2vocab.gguf -o /tmp/s2.gguf -t 8 >/dev/null 2>&1
B() { m=$1; tag=$2; d=$3; shift 3; echo "== $m $tag d$d $(env "$@" /tmp/vela bench -m /tmp/$m.gguf --device cuda -r 2 -p 0 -n 128 --depth $d 2>&1 | grep -oE 'tg128[^|]*\| [0-9.]+ ± [0-9.]+')"; }
for i in 1 2; do for m in q05 s2; do
  B $m def 1024; B $m p64 1024 VELA_CUDA_SPLIT_KEYS=32 VELA_CUDA_SPLIT_MAX_PARTS=64
  B $m def 2048; B $m fd4k 2048 VELA_CUDA_FD_MIN_KEYS=4096; B $m fd4kp64 2048 VELA_CUDA_FD_MIN_KEYS=4096 VELA_CUDA_SPLIT_KEYS=32 VELA_CUDA_SPLIT_MAX_PARTS=64
done; done
