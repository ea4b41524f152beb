source scripts/gpu-quick-env.sh
cd /tmp
/tmp/vela synth --arch qwen2.5-0.5b --type q4_k_m -o /tmp/q05.gguf -t 4 >/dev/null 2>&1
/tmp/vela synth --arch llama3-8b --type q4_0 -o /tmp/l8.gguf -t 12 >/dev/null 2>&1
B() { m=$1; tag=$2; d=$3; shift 3; echo "== $m $tag d$d $(env "$@" /tmp/vela bench -m /tmp/$m.gguf --device cuda -r 2 -p 0 -n 128 --depth $d 2>&1 | grep -oE 'tg128[^|]*\| [0-9.]+ ± [0-9.]+')"; }
for i in 1 2; do
  B l8 base 0 X=1; B l8 lines32 0 VELA_CUDA_L2PF_LINES=32; B l8 lines2 0 VELA_CUDA_L2PF_LINES=2; B l8 min30M 0 VELA_CUDA_L2PF_MIN=30000; B l8 min30M-8M 0 VELA_CUDA_L2PF_MIN=30000 VELA_CUDA_L2PF=8; B l8 pf0 0 VELA_CUDA_L2PF=0
  B q05 base 0 X=1; B q05 lines32 0 VELA_CUDA_L2PF_LINES=32; B q05 lines2 0 VELA_CUDA_L2PF_LINES=2; B q05 pf2 0 VELA_CUDA_L2PF=2; B q05 pf0 0 VELA_CUDA_L2PF=0
done
