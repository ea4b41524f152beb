# Session 19, call 4 (after the suite): the device read bandwidth (the suite's log did not come
# back); the GPU attention tests with the one-warp attention (attention_warp1_*, prepared after
# the suite); tg128 A/B of VELA_CUDA_WARP_SINGLE_KEYS=64 / 128 (every key on one warp, no
# attention_combine, while the keys seen are at most that) on q05 / s2 / l8 at depth 0; the warp
# parts for head dim 256 too (VELA_CUDA_ATTN_WARP=1, g3 at depths 0 / 512 / 1024); the 8B's warp
# parts capped at 32 (VELA_CUDA_WARP_MAX_PARTS=32) at depth 1280. 2 rounds.
R=$PWD
source scripts/gpu-quick-env.sh
xz -dc $R/target/gpu-data/quick/g3vocab.gguf.xz > /tmp/g3vocab.gguf
xz -dc $R/target/gpu-data/quick/s2vocab.gguf.xz > /tmp/s2vocab.gguf
nvcc -O3 -arch=sm_90 crates/vela-cuda/bench/bandwidth.cu -o /tmp/vela-bw && /tmp/vela-bw 2>&1 | tee $OUT/bandwidth.txt
VELA_REQUIRE_GPU=1 timeout 200 /tmp/gpu-test --test-threads 1 attn:: > $OUT/t-attn.txt 2>&1
echo "attn tests rc=$?"; grep -E "test result|panicked|FAILED" $OUT/t-attn.txt | head -8
grep -c "RESULT.*one warp.*ok" $OUT/t-attn.txt; grep "RESULT.*FAIL" $OUT/t-attn.txt | head -5
cd /tmp
/tmp/vela synth --arch qwen2.5-0.5b --type q4_k_m -o /tmp/q05.gguf -t 8 >/dev/null 2>&1
/tmp/vela synth --arch smollm2-135m --type q4_1 --tokenizer /tmp/s2vocab.gguf -o /tmp/s2.gguf -t 8 >/dev/null 2>&1
/tmp/vela synth --arch gemma3-270m --type q4_k_m --tokenizer /tmp/g3vocab.gguf -o /tmp/g3.gguf -t 8 >/dev/null 2>&1
/tmp/vela synth --arch llama3-8b --type q4_0 -o /tmp/l8.gguf -t 16 >/dev/null 2>&1
B() { m=$1; tag=$2; d=$3; shift 3; echo "== $m $tag d$d $(env "$@" /tmp/vela bench -m /tmp/$m.gguf --device cuda -r 2 -p 0 -n 128 --depth $d 2>&1 | grep -oE 'tg128[^|]*\| [0-9.]+ ± [0-9.]+')"; }
for i in 1 2; do
  for m in q05 s2 l8; do B $m def 0; B $m sk64 0 VELA_CUDA_WARP_SINGLE_KEYS=64; B $m sk128 0 VELA_CUDA_WARP_SINGLE_KEYS=128; done
  for d in 0 512 1024; do B g3 def $d; B g3 w1 $d VELA_CUDA_ATTN_WARP=1; done
  B l8 def 1280; B l8 wmp32 1280 VELA_CUDA_WARP_MAX_PARTS=32
done
for m in q05 s2; do for k in 0 128; do echo "md5 $m sk$k $(VELA_CUDA_WARP_SINGLE_KEYS=$k /tmp/vela run -m /tmp/$m.gguf --device cuda --prompt 'The capital of France is' --temperature 0 -n 64 2>/dev/null | md5sum)"; done; done
for w in 3 1; do echo "md5 g3 w$w $(VELA_CUDA_ATTN_WARP=$w /tmp/vela run -m /tmp/g3.gguf --device cuda --prompt 'The capital of France is' --temperature 0 -n 64 2>/dev/null | md5sum)"; done
