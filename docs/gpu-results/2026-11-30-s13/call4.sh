# binary: e5e8817 + VELA_CUDA_MV_SPLIT=longS[:B] (split only rows of more than B blocks; removed after this call)
source scripts/gpu-quick-env.sh
cd /tmp
( /tmp/vela synth --arch gemma4-12b --type q4_0 -o /tmp/g12.gguf -t 8 >/dev/null 2>&1 ) & ps=$!
[ -f /tmp/l8.gguf ] || /tmp/vela synth --arch llama3-8b --type q4_0 -o /tmp/l8.gguf -t 8 >/dev/null 2>&1
VELA_REQUIRE_GPU=1 timeout 100 /tmp/gpu-test --test-threads 1 kernels2::matvec_x3_split_matches_single 2>&1 | grep -E "test result|panicked"
B() { m=$1; tag=$2; shift 2; echo "== $m $tag $(env "$@" /tmp/vela bench -m /tmp/$m.gguf --device cuda -r 2 -p 0 -n 128 2>&1 | grep -oE 'tg128[^|]*\| [0-9.]+ ± [0-9.]+')"; }
for i in 1 2; do B l8 base X=1; B l8 long2 VELA_CUDA_MV_SPLIT=long2; B l8 long4 VELA_CUDA_MV_SPLIT=long4; done
wait $ps
for i in 1 2; do B g12 base X=1; B g12 long2 VELA_CUDA_MV_SPLIT=long2; B g12 long4 VELA_CUDA_MV_SPLIT=long4; done
