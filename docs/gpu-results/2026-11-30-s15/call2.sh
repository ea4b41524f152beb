source scripts/gpu-quick-env.sh
cd /tmp
/tmp/vela synth --arch llama3-8b --type q4_0 -o /tmp/l8.gguf -t 8 >/dev/null 2>&1
( /tmp/vela synth --arch gemma4-12b --type q4_0 -o /tmp/g12.gguf -t 4 >/dev/null 2>&1 ) & p1=$!
VELA_GPU_MODEL=/tmp/l8.gguf VELA_REQUIRE_GPU=1 timeout 150 /tmp/gpu-test --test-threads 1 stream 2>&1 | grep -E "RESULT|test result|panicked|FAIL" | tail -22
for v in 0 1 2 3; do echo "md5 l8 stream$v $(VELA_CUDA_MV_STREAM=$v /tmp/vela run -m /tmp/l8.gguf --device cuda --prompt 'The capital of France is' --max-tokens 48 --temperature 0 2>/dev/null | md5sum)"; done
B() { m=$1; tag=$2; d=$3; shift 3; echo "== $m $tag d$d $(env "$@" /tmp/vela bench -m /tmp/$m.gguf --device cuda -r 2 -p 0 -n 128 --depth $d 2>&1 | grep -oE 'tg128[^|]*\| [0-9.]+ ± [0-9.]+')"; }
for i in 1 2; do B l8 base 0 X=1; B l8 s1 0 VELA_CUDA_MV_STREAM=1; B l8 s2 0 VELA_CUDA_MV_STREAM=2; B l8 s3 0 VELA_CUDA_MV_STREAM=3; B l8 s3st3 0 VELA_CUDA_MV_STREAM=3 VELA_CUDA_MV_STREAM_STAGES=3; B l8 s3st6 0 VELA_CUDA_MV_STREAM=3 VELA_CUDA_MV_STREAM_STAGES=6; done
wait $p1
B g12 base 0 X=1; B g12 s3 0 VELA_CUDA_MV_STREAM=3; B g12 base 0 X=1; B g12 s3 0 VELA_CUDA_MV_STREAM=3
