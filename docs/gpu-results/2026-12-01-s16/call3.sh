# Session 16 call 3: why the norm prologue is slower (call 2): without the fence, without the
# counter (x not written: wrong output, time only), and the norms skipped (the bound).
R=$PWD
source scripts/gpu-quick-env.sh
cd /tmp
ls /tmp/q05.gguf /tmp/s2.gguf || /tmp/vela synth --arch qwen2.5-0.5b --type q4_k_m -o /tmp/q05.gguf -t 8 >/dev/null 2>&1
B() { m=$1; tag=$2; shift 2; echo "== $m $tag $(env "$@" /tmp/vela bench -m /tmp/$m.gguf --device cuda -r 2 -p 0 -n 128 2>&1 | grep -oE 'tg128[^|]*\| [0-9.]+ ± [0-9.]+')"; }
for i in 1 2; do
  B q05 off VELA_CUDA_NORM_PRO=0
  B q05 pro VELA_CUDA_NORM_PRO=1
  B q05 pro-nofence VELA_CUDA_NORM_PRO=1 VELA_CUDA_DEFINES=NPRO_NOFENCE
  B q05 pro-nocnt VELA_CUDA_NORM_PRO=1 VELA_CUDA_DEFINES=NPRO_NOCNT
  B q05 off-skipnorm VELA_CUDA_NORM_PRO=0 VELA_CUDA_SKIP=norm_q8
done
