source scripts/gpu-quick-env.sh
cd /tmp
( [ -s /tmp/q05.gguf ] || /tmp/vela synth --arch qwen2.5-0.5b --type q4_k_m -o /tmp/q05.gguf -t 4 >/dev/null 2>&1 ) & p1=$!
[ -s /tmp/l8.gguf ] || /tmp/vela synth --arch llama3-8b --type q4_0 -o /tmp/l8.gguf -t 12 >/dev/null 2>&1
wait $p1
VELA_GPU_MODEL=/tmp/q05.gguf VELA_CUDA_L2PF=16 VELA_REQUIRE_GPU=1 timeout 150 /tmp/gpu-test --test-threads 1 model::graph_decode_matches_plain model::pipelined_greedy_matches_plain model::prepared_steps_match_plain >$OUT/model-q05.txt 2>&1; echo "model q05 rc=$?"; grep -E "test result|panicked|FAIL" $OUT/model-q05.txt | head -5
for m in q05 l8; do for v in 0 16; do echo "md5 $m pf$v $(VELA_CUDA_L2PF=$v /tmp/vela run -m /tmp/$m.gguf --device cuda --prompt 'The capital of France is' --max-tokens 48 --temperature 0 2>/dev/null | md5sum)"; done; done
B() { m=$1; tag=$2; shift 2; echo "== $m $tag $(env "$@" /tmp/vela bench -m /tmp/$m.gguf --device cuda -r 2 -p 0 -n 128 2>&1 | grep -oE 'tg128[^|]*\| [0-9.]+ ± [0-9.]+')"; }
for i in 1 2; do for v in 0 4 8 16 32; do B l8 pf$v VELA_CUDA_L2PF=$v; done; B l8 pf16b2 VELA_CUDA_L2PF=16 VELA_CUDA_L2PF_BLOCKS=2; B l8 pf16b32 VELA_CUDA_L2PF=16 VELA_CUDA_L2PF_BLOCKS=32; done
for i in 1 2; do for v in 0 2 4 8 16; do B q05 pf$v VELA_CUDA_L2PF=$v; done; done
