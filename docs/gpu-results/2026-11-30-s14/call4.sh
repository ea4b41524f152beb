source scripts/gpu-quick-env.sh
cd /tmp
( [ -s /tmp/q05.gguf ] || /tmp/vela synth --arch qwen2.5-0.5b --type q4_k_m -o /tmp/q05.gguf -t 4 >/dev/null 2>&1 ) & p1=$!
[ -s /tmp/l8.gguf ] || /tmp/vela synth --arch llama3-8b --type q4_0 -o /tmp/l8.gguf -t 12 >/dev/null 2>&1
wait $p1
B() { m=$1; tag=$2; shift 2; echo "== $m $tag $(env "$@" /tmp/vela bench -m /tmp/$m.gguf --device cuda -r 2 -p 0 -n 128 2>&1 | grep -oE 'tg128[^|]*\| [0-9.]+ ± [0-9.]+')"; }
for i in 1 2; do for v in 0 4 8 12 16; do B l8 pf$v VELA_CUDA_L2PF=$v; done; B l8 span8 VELA_CUDA_L2PF=8 VELA_CUDA_L2PF_SPAN=1; B l8 span16 VELA_CUDA_L2PF=16 VELA_CUDA_L2PF_SPAN=1; done
for i in 1 2; do for v in 0 2 4 8; do B q05 pf$v VELA_CUDA_L2PF=$v; done; B q05 span4 VELA_CUDA_L2PF=4 VELA_CUDA_L2PF_SPAN=1; done
