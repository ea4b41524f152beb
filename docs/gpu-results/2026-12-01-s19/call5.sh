# Session 19, call 5 (the final code, e99f175 = the suite's 60ae3c9 kernels and host): where the
# decode goes now, one kernel family skipped at a time (VELA_CUDA_SKIP; results wrong, times
# real) on q05 and l8 at depth 0, as session 17's call 5; then l8's warp parts capped at 32
# (VELA_CUDA_WARP_MAX_PARTS=32) at depths 1024 / 1280, 2 rounds (call 4: +1.5 % at 1280).
R=$PWD
source scripts/gpu-quick-env.sh
cd /tmp
/tmp/vela synth --arch qwen2.5-0.5b --type q4_k_m -o /tmp/q05.gguf -t 8 >/dev/null 2>&1
/tmp/vela synth --arch llama3-8b --type q4_0 -o /tmp/l8.gguf -t 16 >/dev/null 2>&1
B() { m=$1; tag=$2; d=$3; shift 3; echo "== $m $tag d$d $(env "$@" /tmp/vela bench -m /tmp/$m.gguf --device cuda -r 2 -p 0 -n 128 --depth $d 2>&1 | grep -oE 'tg128[^|]*\| [0-9.]+ ± [0-9.]+')"; }
for m in q05 l8; do
  B $m real 0
  for s in norm_q8 rope_ attention_part attention_combine act_q8 mv_ "norm_q8,rope_,attention_,flash_,act_q8"; do B $m "skip:$s" 0 VELA_CUDA_SKIP=$s; done
  B $m real 0
done
for i in 1 2; do for d in 1024 1280; do B l8 def $d; B l8 wmp32 $d VELA_CUDA_WARP_MAX_PARTS=32; done; done
