source scripts/gpu-quick-env.sh
cd /tmp
/tmp/vela synth --arch qwen2.5-0.5b --type q4_k_m -o /tmp/q05.gguf -t 4 >/dev/null 2>&1
( /tmp/vela synth --arch llama3-8b --type q4_0 -o /tmp/l8.gguf -t 8 >/dev/null 2>&1 ) & p1=$!
VELA_REQUIRE_GPU=1 timeout 150 /tmp/gpu-test --test-threads 1 attn:: > $OUT/gpu-test-attn.txt 2>&1; grep -E "test result|panicked|FAIL" $OUT/gpu-test-attn.txt | head; grep -c "RESULT.*cluster merge.*ok" $OUT/gpu-test-attn.txt
wait $p1
for m in q05 l8; do for v in 0 1; do echo "md5 $m cluster$v $(VELA_CUDA_ATTN_CLUSTER=$v /tmp/vela run -m /tmp/$m.gguf --device cuda --prompt 'The capital of France is' --max-tokens 48 --temperature 0 2>/tmp/err.txt | md5sum) $(grep -c 'capture failed' /tmp/err.txt)"; done; done
B() { m=$1; tag=$2; d=$3; shift 3; echo "== $m $tag d$d $(env "$@" /tmp/vela bench -m /tmp/$m.gguf --device cuda -r 2 -p 0 -n 128 --depth $d 2>&1 | grep -oE 'tg128[^|]*\| [0-9.]+ ± [0-9.]+')"; }
for i in 1 2; do B q05 base 0 X=1; B q05 cl 0 VELA_CUDA_ATTN_CLUSTER=1; B l8 base 0 X=1; B l8 cl 0 VELA_CUDA_ATTN_CLUSTER=1; done
B l8 base 1024 X=1; B l8 cl 1024 VELA_CUDA_ATTN_CLUSTER=1; B q05 base 1024 X=1; B q05 cl 1024 VELA_CUDA_ATTN_CLUSTER=1
