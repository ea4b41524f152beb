# Session 16 call 8: (1) the head-dim-256 chunk rule (now the default) against 32 for all,
# repeated; (2) the narrow-row Q8_0 head matvec (`mv_q8_0_r2n`, VELA_CUDA_MV_NARROW=1): greedy
# output equal, tg128 A/B on g3, q05, s2; GPU tests with both on.
R=$PWD
source scripts/gpu-quick-env.sh
cd /tmp
xz -dc $R/target/gpu-data/quick/s2vocab.gguf.xz > /tmp/s2vocab.gguf
xz -dc $R/target/gpu-data/quick/g3vocab.gguf.xz > /tmp/g3vocab.gguf
[ -f /tmp/q05.gguf ] || /tmp/vela synth --arch qwen2.5-0.5b --type q4_k_m -o /tmp/q05.gguf -t 8 >/dev/null 2>&1
[ -f /tmp/s2.gguf ] || /tmp/vela synth --arch smollm2-135m --type q4_1 --tokenizer /tmp/s2vocab.gguf -o /tmp/s2.gguf -t 8 >/dev/null 2>&1
[ -f /tmp/g3.gguf ] || /tmp/vela synth --arch gemma3-270m --type q4_k_m --tokenizer /tmp/g3vocab.gguf -o /tmp/g3.gguf -t 8 >/dev/null 2>&1
for m in q05 s2 g3; do for n in 0 1; do
  VELA_CUDA_MV_NARROW=$n /tmp/vela run -m /tmp/$m.gguf --device cuda --prompt "The capital of France is" --temperature 0 --max-tokens 64 > /tmp/out-$m-$n.txt 2>/dev/null
  echo "greedy $m narrow=$n $(md5sum < /tmp/out-$m-$n.txt)"; done; done
B() { m=$1; tag=$2; d=$3; shift 3; echo "== $m $tag d$d $(env "$@" /tmp/vela bench -m /tmp/$m.gguf --device cuda -r 2 -p 0 -n 128 --depth $d 2>&1 | grep -oE 'tg128[^|]*\| [0-9.]+ ± [0-9.]+')"; }
for i in 1 2; do
  B g3 chunk32 0 VELA_CUDA_DEFINES=SPLIT_CHUNK32 VELA_CUDA_SPLIT_CHUNK=32
  B g3 default 0
  B g3 narrow 0 VELA_CUDA_MV_NARROW=1
  B q05 default 0
  B q05 narrow 0 VELA_CUDA_MV_NARROW=1
  B s2 default 0
  B s2 narrow 0 VELA_CUDA_MV_NARROW=1
done
B g3 chunk32 8192 VELA_CUDA_DEFINES=SPLIT_CHUNK32 VELA_CUDA_SPLIT_CHUNK=32
B g3 default 8192
VELA_CUDA_MV_NARROW=1 VELA_GPU_MODEL=/tmp/q05.gguf VELA_REQUIRE_GPU=1 timeout 200 /tmp/gpu-test --test-threads 1 > $OUT/gpu-test-narrow.txt 2>&1
echo "gpu-test (narrow on) rc=$?"; grep -E "test result|panicked" $OUT/gpu-test-narrow.txt | head
