source scripts/gpu-quick-env.sh
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader
cd /tmp
( /tmp/vela synth --arch gemma4-12b --type q4_0 -o /tmp/g12.gguf -t 8 >/tmp/synth-g12.log 2>&1 ) & ps=$!
VELA_REQUIRE_GPU=1 timeout 200 /tmp/gpu-test --test-threads 1 --nocapture gemm::prefill_attention_d512_gemm_matches_plain gemm::prefill_attention_kernels_match_cpu kernels2::split_rows_equal_gguf_layout gemm::prefill_attention_timing >$OUT/tests.txt 2>&1; echo "tests rc=$?"
grep -E "test result|FAILED|panicked|ok$" $OUT/tests.txt | head -20; grep -iE "ms|us|µs" $OUT/tests.txt | tail -15
wait $ps; tail -2 /tmp/synth-g12.log
B() { tag=$1; shift; echo "== $tag"; env "$@" /tmp/vela bench -m /tmp/g12.gguf --device cuda -r 2 $BA 2>&1 | grep -oE '(pp|tg)[0-9]+[^|]*\| [0-9.]+ ± [0-9.]+' ; }
BA="-p 8192 -n 0"; for i in 1 2; do B gemm1 VELA_CUDA_ATTN_GEMM=1; B gemm0 VELA_CUDA_ATTN_GEMM=0; done
BA="-p 0 -n 128"; for i in 1 2; do B pad1 VELA_CUDA_Q6K_PAD=1; B pad0 VELA_CUDA_Q6K_PAD=0; done
BA="-p 0 -n 128 --depth 8192"; B splitdefault X=1
/tmp/vela synth --arch qwen2.5-0.5b --type q4_k_m -o /tmp/q05.gguf -t 8 >/dev/null 2>&1
B2() { tag=$1; shift; echo "== $tag"; env "$@" /tmp/vela bench -m /tmp/q05.gguf --device cuda -r 3 -p 0 -n 128 2>&1 | grep -oE 'tg[0-9]+[^|]*\| [0-9.]+ ± [0-9.]+' ; }
for i in 1 2; do B2 q05pad1 VELA_CUDA_Q6K_PAD=1; B2 q05pad0 VELA_CUDA_Q6K_PAD=0; done
