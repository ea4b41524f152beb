# Session 18, call 7 (quick pack): with the warp parts by default for head dim 64, the part count:
# VELA_CUDA_SPLIT_MAX_PARTS=16 / 8 against the default (32 at the bench's capacity) on q05 / s2,
# tg128 at depths 0 and 512, 2 rounds interleaved (no code change).
R=$PWD
source scripts/gpu-quick-env.sh
xz -dc $R/target/gpu-data/quick/s2vocab.gguf.xz > /tmp/s2vocab.gguf
cd /tmp
/tmp/vela synth --arch qwen2.5-0.5b --type q4_k_m -o /tmp/q05.gguf -t 8 >/dev/null 2>&1
/tmp/vela synth --arch smollm2-135m --type q4_1 --tokenizer /tmp/s2vocab.gguf -o /tmp/s2.gguf -t 8 >/dev/null 2>&1
B() { m=$1; tag=$2; d=$3; shift 3; echo "== $m $tag d$d $(env "$@" /tmp/vela bench -m /tmp/$m.gguf --device cuda -r 2 -p 0 -n 128 --depth $d 2>&1 | grep -oE 'tg128[^|]*\| [0-9.]+ ± [0-9.]+')"; }
for i in 1 2; do for d in 0 512; do for m in q05 s2; do
  B $m def $d; B $m p16 $d VELA_CUDA_SPLIT_MAX_PARTS=16; B $m p8 $d VELA_CUDA_SPLIT_MAX_PARTS=8
done; done; done
