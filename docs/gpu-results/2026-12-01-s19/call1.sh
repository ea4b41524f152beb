# For session 19's first call (quick pack with the GPU test binary, plus s2vocab / g3vocab as in
# session 18): the defaults set after session 18's last call and never run as built (the warp
# parts' count following the keys, VELA_CUDA_WARP_MAX_PARTS=64, and the tensor-core decode from
# 4,096 keys for head dim 64), and the prepared VELA_CUDA_PARTS_FOLLOW=1 (the four-warp parts
# following the keys: l8, g3). Every op test first, then tg128 A/B interleaved, 2 rounds.
R=$PWD
source scripts/gpu-quick-env.sh
xz -dc $R/target/gpu-data/quick/s2vocab.gguf.xz > /tmp/s2vocab.gguf
xz -dc $R/target/gpu-data/quick/g3vocab.gguf.xz > /tmp/g3vocab.gguf
VELA_REQUIRE_GPU=1 timeout 240 /tmp/gpu-test --test-threads 1 --skip model:: > $OUT/t-ops.txt 2>&1
echo "op tests rc=$?"; grep -E "test result|panicked|FAILED" $OUT/t-ops.txt | head -8
cd /tmp
/tmp/vela synth --arch qwen2.5-0.5b --type q4_k_m -o /tmp/q05.gguf -t 8 >/dev/null 2>&1
/tmp/vela synth --arch smollm2-135m --type q4_1 --tokenizer /tmp/s2vocab.gguf -o /tmp/s2.gguf -t 8 >/dev/null 2>&1
/tmp/vela synth --arch gemma3-270m --type q4_k_m --tokenizer /tmp/g3vocab.gguf -o /tmp/g3.gguf -t 8 >/dev/null 2>&1
/tmp/vela synth --arch llama3-8b --type q4_0 -o /tmp/l8.gguf -t 16 >/dev/null 2>&1
B() { m=$1; tag=$2; d=$3; shift 3; echo "== $m $tag d$d $(env "$@" /tmp/vela bench -m /tmp/$m.gguf --device cuda -r 2 -p 0 -n 128 --depth $d 2>&1 | grep -oE 'tg128[^|]*\| [0-9.]+ ± [0-9.]+')"; }
for i in 1 2; do
  for m in q05 s2; do for d in 0 1024 2048; do B $m def $d; B $m wmp0 $d VELA_CUDA_WARP_MAX_PARTS=0; done; done
  for m in l8 g3; do for d in 512 1024; do B $m def $d; B $m follow $d VELA_CUDA_PARTS_FOLLOW=1; done; done
done
for m in q05 s2; do for w in 64 0; do echo "md5 $m wmp$w $(VELA_CUDA_WARP_MAX_PARTS=$w /tmp/vela run -m /tmp/$m.gguf --device cuda --prompt 'The capital of France is' --temperature 0 -n 64 2>/dev/null | md5sum)"; done; done
