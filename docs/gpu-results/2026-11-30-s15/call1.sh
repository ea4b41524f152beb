# The first device call of session 15 (written at the end of session 14, not run): copy to
# target/gpu-data/quick/c1.sh after `scripts/gpu-suite.sh pack-quick` (lb.tar.xz removed) and run
# `bash target/gpu-data/quick/c1.sh` with carry ["target/gpu-data/quick"].
source scripts/gpu-quick-env.sh
cd /tmp
/tmp/vela synth --arch qwen2.5-0.5b --type q4_k_m -o /tmp/q05.gguf -t 4 >/dev/null 2>&1
( /tmp/vela synth --arch llama3-8b --type q4_0 -o /tmp/l8.gguf -t 6 >/dev/null 2>&1
  /tmp/vela synth --arch gemma4-12b --type q4_0 -o /tmp/g12.gguf -t 6 >/dev/null 2>&1 ) & p1=$!
# Every GPU test (the fixed bound of kernels2::split_attention_long_context_matches_cpu, the new
# attn::tail_combine_equals_separate and model::tail_fusions_match_plain included); the model
# tests on q05, then the two tail fusions' model test on l8.
VELA_GPU_MODEL=/tmp/q05.gguf VELA_REQUIRE_GPU=1 timeout 200 /tmp/gpu-test --test-threads 1 >$OUT/gpu-test-all.txt 2>&1
echo "gpu-test rc=$?"; grep -E "test result|panicked|FAIL" $OUT/gpu-test-all.txt | head
wait $p1
VELA_GPU_MODEL=/tmp/l8.gguf VELA_REQUIRE_GPU=1 timeout 120 /tmp/gpu-test --test-threads 1 model::tail_fusions_match_plain 2>&1 | grep -E "RESULT|test result"
for m in q05 l8; do for v in 0 1; do echo "md5 $m tail$v $(VELA_CUDA_TAIL_COMBINE=$v VELA_CUDA_TAIL_NORM=$v /tmp/vela run -m /tmp/$m.gguf --device cuda --prompt 'The capital of France is' --max-tokens 48 --temperature 0 2>/dev/null | md5sum)"; done; done
B() { m=$1; tag=$2; d=$3; shift 3; echo "== $m $tag d$d $(env "$@" /tmp/vela bench -m /tmp/$m.gguf --device cuda -r 2 -p 0 -n 128 --depth $d 2>&1 | grep -oE 'tg128[^|]*\| [0-9.]+ ± [0-9.]+')"; }
for i in 1 2; do B q05 base 0 X=1; B q05 tcomb 0 VELA_CUDA_TAIL_COMBINE=1; B q05 tnorm 0 VELA_CUDA_TAIL_NORM=1; B q05 both 0 VELA_CUDA_TAIL_COMBINE=1 VELA_CUDA_TAIL_NORM=1; B q05 pfmin1024 0 VELA_CUDA_L2PF_MIN=1024; done
for i in 1 2; do B l8 base 0 X=1; B l8 tcomb 0 VELA_CUDA_TAIL_COMBINE=1; B l8 tnorm 0 VELA_CUDA_TAIL_NORM=1; B l8 both 0 VELA_CUDA_TAIL_COMBINE=1 VELA_CUDA_TAIL_NORM=1; done
# The head-dim-256 key floor: g12 with FD_D256=1 should equal base now.
B g12 base 8192 X=1; B g12 d256 8192 VELA_CUDA_FD_D256=1
