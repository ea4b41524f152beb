source scripts/gpu-quick-env.sh
cd /tmp
( /tmp/vela synth --arch gemma4-12b --type q4_0 -o /tmp/g12.gguf -t 6 >/dev/null 2>&1 ) & p1=$!
( /tmp/vela synth --arch llama3-8b --type q4_0 -o /tmp/l8.gguf -t 6 >/dev/null 2>&1 ) & p2=$!
VELA_REQUIRE_GPU=1 timeout 200 /tmp/gpu-test --test-threads 1 --nocapture attn::fused_attention_matmul_equals_unfused matvec::staged_activations_equal_default >$OUT/tests.txt 2>&1; echo "tests rc=$?"; grep -E "test result|panicked|FAIL|ran|kernel" $OUT/tests.txt | head -30
wait $p1; wait $p2
B() { m=$1; tag=$2; d=$3; shift 3; echo "== $m $tag d$d $(env "$@" /tmp/vela bench -m /tmp/$m.gguf --device cuda -r 2 -p 0 -n 128 --depth $d 2>&1 | grep -oE 'tg128[^|]*\| [0-9.]+ ± [0-9.]+')"; }
for i in 1 2; do B g12 base 8192 X=1; B g12 d512 8192 VELA_CUDA_FD_D512=1; B g12 d256 8192 VELA_CUDA_FD_D256=1; B g12 both 8192 VELA_CUDA_FD_D512=1 VELA_CUDA_FD_D256=1; done
B g12 base 0 X=1; B g12 both 0 VELA_CUDA_FD_D512=1 VELA_CUDA_FD_D256=1; B g12 d256 0 VELA_CUDA_FD_D256=1
for i in 1 2; do B l8 base 0 X=1; B l8 xsmem 0 VELA_CUDA_MV_XSMEM=1; done
for v in 0 1; do echo "md5 g12 fd$v $(VELA_CUDA_FD_D512=$v VELA_CUDA_FD_D256=$v /tmp/vela run -m /tmp/g12.gguf --device cuda --prompt 'The capital of France is' --max-tokens 32 --temperature 0 2>/dev/null | md5sum)"; done
for v in 0 1; do echo "md5 l8 xs$v $(VELA_CUDA_MV_XSMEM=$v /tmp/vela run -m /tmp/l8.gguf --device cuda --prompt 'The capital of France is' --max-tokens 32 --temperature 0 2>/dev/null | md5sum)"; done
