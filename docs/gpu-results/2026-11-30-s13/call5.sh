# binary: e5e8817 + VELA_CUDA_MV_R2_MIN (two rows per warp only for launches of >= that many weight elements; removed after this call)
source scripts/gpu-quick-env.sh
cd /tmp
( [ -f /tmp/q05.gguf ] || /tmp/vela synth --arch qwen2.5-0.5b --type q4_k_m -o /tmp/q05.gguf -t 4 >/dev/null 2>&1 ) & ps=$!
[ -f /tmp/l8.gguf ] || /tmp/vela synth --arch llama3-8b --type q4_0 -o /tmp/l8.gguf -t 12 >/dev/null 2>&1
wait $ps
B() { m=$1; tag=$2; shift 2; echo "== $m $tag $(env "$@" /tmp/vela bench -m /tmp/$m.gguf --device cuda -r 2 -p 0 -n 128 2>&1 | grep -oE 'tg128[^|]*\| [0-9.]+ ± [0-9.]+')"; }
for i in 1 2; do for v in 0 20000000 30000000 100000000; do B l8 r2min=$v VELA_CUDA_MV_R2_MIN=$v; done; done
for i in 1 2; do for v in 0 20000000; do B q05 r2min=$v VELA_CUDA_MV_R2_MIN=$v; done; done
