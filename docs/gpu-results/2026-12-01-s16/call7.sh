# Session 16 call 7: split-K decode attention parts of 16 or 8 keys instead of 32
# (VELA_CUDA_DEFINES=SPLIT_CHUNK16|8 with VELA_CUDA_SPLIT_CHUNK=16|8): attention GPU tests, then
# tg128 A/B on g3, q05, s2, and g3 at 8K (its sliding layers take the split-K parts there).
R=$PWD
source scripts/gpu-quick-env.sh
cd /tmp
xz -dc $R/target/gpu-data/quick/s2vocab.gguf.xz > /tmp/s2vocab.gguf
xz -dc $R/target/gpu-data/quick/g3vocab.gguf.xz > /tmp/g3vocab.gguf
[ -f /tmp/q05.gguf ] || /tmp/vela synth --arch qwen2.5-0.5b --type q4_k_m -o /tmp/q05.gguf -t 8 >/dev/null 2>&1
[ -f /tmp/s2.gguf ] || /tmp/vela synth --arch smollm2-135m --type q4_1 --tokenizer /tmp/s2vocab.gguf -o /tmp/s2.gguf -t 8 >/dev/null 2>&1
[ -f /tmp/g3.gguf ] || /tmp/vela synth --arch gemma3-270m --type q4_k_m --tokenizer /tmp/g3vocab.gguf -o /tmp/g3.gguf -t 8 >/dev/null 2>&1
for c in 16 8; do
  VELA_CUDA_DEFINES=SPLIT_CHUNK$c VELA_CUDA_SPLIT_CHUNK=$c VELA_GPU_MODEL=/tmp/q05.gguf VELA_REQUIRE_GPU=1 timeout 150 /tmp/gpu-test --test-threads 1 attention_and_kv attn:: kernels2::split_attention > $OUT/t-chunk$c.txt 2>&1
  echo "chunk $c tests rc=$?"; grep -E "test result|panicked" $OUT/t-chunk$c.txt | head -3
done
B() { m=$1; tag=$2; d=$3; shift 3; echo "== $m $tag d$d $(env "$@" /tmp/vela bench -m /tmp/$m.gguf --device cuda -r 2 -p 0 -n 128 --depth $d 2>&1 | grep -oE 'tg128[^|]*\| [0-9.]+ ± [0-9.]+')"; }
for i in 1 2; do
  for m in g3 q05 s2; do
    B $m c32 0
    B $m c16 0 VELA_CUDA_DEFINES=SPLIT_CHUNK16 VELA_CUDA_SPLIT_CHUNK=16
    B $m c8 0 VELA_CUDA_DEFINES=SPLIT_CHUNK8 VELA_CUDA_SPLIT_CHUNK=8
  done
done
B g3 c32 8192
B g3 c16 8192 VELA_CUDA_DEFINES=SPLIT_CHUNK16 VELA_CUDA_SPLIT_CHUNK=16
B g3 c8 8192 VELA_CUDA_DEFINES=SPLIT_CHUNK8 VELA_CUDA_SPLIT_CHUNK=8
