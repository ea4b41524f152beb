source scripts/gpu-quick-env.sh
cd /tmp
( [ -s /tmp/q05.gguf ] || /tmp/vela synth --arch qwen2.5-0.5b --type q4_k_m -o /tmp/q05.gguf -t 4 >/dev/null 2>&1; [ -s /tmp/g12.gguf ] || /tmp/vela synth --arch gemma4-12b --type q4_0 -o /tmp/g12.gguf -t 8 >/dev/null 2>&1 ) & p1=$!
[ -s /tmp/l8.gguf ] || /tmp/vela synth --arch llama3-8b --type q4_0 -o /tmp/l8.gguf -t 8 >/dev/null 2>&1
B() { m=$1; tag=$2; shift 2; echo "== $m $tag $(env "$@" /tmp/vela bench -m /tmp/$m.gguf --device cuda -r 2 -p 0 -n 128 2>&1 | grep -oE 'tg128[^|]*\| [0-9.]+ ± [0-9.]+')"; }
for i in 1 2; do for v in 0 2 4 6; do B l8 pf$v VELA_CUDA_L2PF=$v; done; done
wait $p1
for i in 1 2; do for v in 0 1 2 3; do B q05 pf$v VELA_CUDA_L2PF=$v; done; done
for i in 1 2; do for v in 0 4; do B g12 pf$v VELA_CUDA_L2PF=$v; done; done
