# Session 16 call 5: what the Q8_0 LM head costs inside the decode (VELA_CUDA_SKIP of its kernel;
# results wrong, times real) on q05, s2 and g3, and its isolated time (VELA_CUDA_PROFILE=1).
R=$PWD
source scripts/gpu-quick-env.sh
cd /tmp
xz -dc $R/target/gpu-data/quick/s2vocab.gguf.xz > /tmp/s2vocab.gguf
xz -dc $R/target/gpu-data/quick/g3vocab.gguf.xz > /tmp/g3vocab.gguf
[ -f /tmp/q05.gguf ] || /tmp/vela synth --arch qwen2.5-0.5b --type q4_k_m -o /tmp/q05.gguf -t 8 >/dev/null 2>&1
[ -f /tmp/s2.gguf ] || /tmp/vela synth --arch smollm2-135m --type q4_1 --tokenizer /tmp/s2vocab.gguf -o /tmp/s2.gguf -t 8 >/dev/null 2>&1
/tmp/vela synth --arch gemma3-270m --type q4_k_m --tokenizer /tmp/g3vocab.gguf -o /tmp/g3.gguf -t 8 2>&1 | tail -1
/tmp/vela info -m /tmp/g3.gguf 2>&1 | grep -E "^\s+(f32|q[0-9])"
B() { m=$1; tag=$2; shift 2; echo "== $m $tag $(env "$@" /tmp/vela bench -m /tmp/$m.gguf --device cuda -r 2 -p 0 -n 128 2>&1 | grep -oE 'tg128[^|]*\| [0-9.]+ ± [0-9.]+')"; }
for m in q05 s2 g3; do
  B $m real
  B $m skip-head VELA_CUDA_SKIP=mv_q8_0_r2,mv_q8_0
  B $m skip-head-argmax VELA_CUDA_SKIP=mv_q8_0_r2,mv_q8_0,argmax
  VELA_CUDA_PROFILE=1 /tmp/vela bench -m /tmp/$m.gguf --device cuda -r 1 -p 0 -n 32 2>&1 | grep -E "mv_q8_0|argmax|kernel "
done
