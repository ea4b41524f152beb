source scripts/gpu-quick-env.sh
xz -dc target/gpu-data/quick/vela-old.xz >/tmp/vela-old && chmod +x /tmp/vela-old
cd /tmp
( /tmp/vela synth --arch qwen2.5-0.5b --type q4_k_m -o /tmp/q05.gguf -t 4 >/dev/null 2>&1 ) & ps=$!
/tmp/vela synth --arch llama3-8b --type q4_0 -o /tmp/l8.gguf -t 12 >/dev/null 2>&1
wait $ps
VELA_REQUIRE_GPU=1 timeout 150 /tmp/gpu-test --test-threads 1 mix:: >$OUT/mix.txt 2>&1; echo "mix rc=$?"; grep -E "test result|panicked|FAIL" $OUT/mix.txt | head
VELA_GPU_MODEL=/tmp/q05.gguf VELA_CUDA_NORM_FUSE=4096 VELA_REQUIRE_GPU=1 timeout 150 /tmp/gpu-test --test-threads 1 model::graph_decode_matches_plain model::pipelined_greedy_matches_plain model::prepared_steps_match_plain >$OUT/model.txt 2>&1; echo "model rc=$?"; grep -E "test result|panicked|FAIL" $OUT/model.txt | head
for m in q05 l8; do for v in old 0 4096; do b=/tmp/vela; [ $v = old ] && b=/tmp/vela-old; echo "md5 $m $v $(VELA_CUDA_NORM_FUSE=$v $b run -m /tmp/$m.gguf --device cuda --prompt 'The capital of France is' --max-tokens 48 --temperature 0 2>/dev/null | md5sum)"; done; done
B() { m=$1; tag=$2; b=$3; shift 3; echo "== $m $tag $(env "$@" $b bench -m /tmp/$m.gguf --device cuda -r 2 -p 0 -n 128 2>&1 | grep -oE 'tg128[^|]*\| [0-9.]+ ± [0-9.]+')"; }
for i in 1 2; do B q05 old /tmp/vela-old X=1; B q05 new0 /tmp/vela VELA_CUDA_NORM_FUSE=0; B q05 fuse /tmp/vela VELA_CUDA_NORM_FUSE=4096; done
for i in 1 2; do B l8 old /tmp/vela-old X=1; B l8 new0 /tmp/vela VELA_CUDA_NORM_FUSE=0; B l8 fuse /tmp/vela VELA_CUDA_NORM_FUSE=4096; done
