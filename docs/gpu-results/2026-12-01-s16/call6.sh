# Session 16 call 6: the argmax's cost inside the decode (call 5: skipping it gained 21-72 us per
# token): the argmax alone skipped, pipelining off, PDL off.
R=$PWD
source scripts/gpu-quick-env.sh
cd /tmp
xz -dc $R/target/gpu-data/quick/s2vocab.gguf.xz > /tmp/s2vocab.gguf
xz -dc $R/target/gpu-data/quick/g3vocab.gguf.xz > /tmp/g3vocab.gguf
[ -f /tmp/q05.gguf ] || /tmp/vela synth --arch qwen2.5-0.5b --type q4_k_m -o /tmp/q05.gguf -t 8 >/dev/null 2>&1
[ -f /tmp/g3.gguf ] || /tmp/vela synth --arch gemma3-270m --type q4_k_m --tokenizer /tmp/g3vocab.gguf -o /tmp/g3.gguf -t 8 >/dev/null 2>&1
B() { m=$1; tag=$2; shift 2; echo "== $m $tag $(env "$@" /tmp/vela bench -m /tmp/$m.gguf --device cuda -r 2 -p 0 -n 128 2>&1 | grep -oE 'tg128[^|]*\| [0-9.]+ ± [0-9.]+')"; }
for m in g3 q05; do
  B $m real
  B $m skip-argmax VELA_CUDA_SKIP=argmax
  B $m skip-argmax_part VELA_CUDA_SKIP=argmax_part
  B $m skip-head VELA_CUDA_SKIP=mv_q8_0_r2
  B $m skip-both VELA_CUDA_SKIP=mv_q8_0_r2,argmax
  B $m pipeline0 VELA_CUDA_PIPELINE=0
  B $m pipeline0-skip-argmax VELA_CUDA_PIPELINE=0 VELA_CUDA_SKIP=argmax
  B $m pdl0 VELA_CUDA_PDL=0
  B $m pdl0-skip-argmax VELA_CUDA_PDL=0 VELA_CUDA_SKIP=argmax
done
