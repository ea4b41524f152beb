source scripts/gpu-quick-env.sh
cd /tmp
/tmp/vela synth --arch qwen2.5-0.5b --type q4_k_m -o /tmp/q05.gguf -t 4 >/dev/null 2>&1
( /tmp/vela synth --arch gemma4-12b --type q4_0 -o /tmp/g12.gguf -t 6 >/dev/null 2>&1 ) & p1=$!
VELA_GPU_MODEL=/tmp/q05.gguf VELA_REQUIRE_GPU=1 timeout 140 /tmp/gpu-test --test-threads 1 >$OUT/gpu-test-all.txt 2>&1; echo "gpu-test rc=$?"; grep -E "test result|panicked|FAIL" $OUT/gpu-test-all.txt | head
wait $p1
B() { m=$1; tag=$2; d=$3; shift 3; echo "== $m $tag d$d $(env "$@" /tmp/vela bench -m /tmp/$m.gguf --device cuda -r 2 -p 0 -n 128 --depth $d 2>&1 | grep -oE 'tg128[^|]*\| [0-9.]+ ± [0-9.]+')"; }
B g12 base 8192 X=1; B g12 d256 8192 VELA_CUDA_FD_D256=1
