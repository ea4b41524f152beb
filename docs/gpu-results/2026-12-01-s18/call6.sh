# Session 18, call 6 (call 5 again after: the new key selected after its loads, no branch; every RoPE rotation through rope_rot, no FMA contraction, as the CPU rounds) (quick pack with the GPU test binary): RoPE + store folded into the warp
# parts (attention_partwr_*, rope_attention_matmul, VELA_CUDA_ROPE_ATTN=1; head dim 64, one
# token). Its GPU test (bit-equal to the unfused path, stored keys included), every op test but
# the real-model ones (rope_angle moved to common.cu; attention_impl changed), then tg128 A/B
# interleaved on q05 / s2 at depths 0 and 512, 2 rounds; greedy md5.
R=$PWD
source scripts/gpu-quick-env.sh
xz -dc $R/target/gpu-data/quick/s2vocab.gguf.xz > /tmp/s2vocab.gguf
VELA_REQUIRE_GPU=1 timeout 120 /tmp/gpu-test --test-threads 1 --nocapture rope_folded > $OUT/t-rope.txt 2>&1
echo "rope test rc=$?"; grep -E "test result|panicked" $OUT/t-rope.txt | head -3; grep -c "RESULT.*| ok |" $OUT/t-rope.txt; grep "FAIL" $OUT/t-rope.txt | head -3
VELA_REQUIRE_GPU=1 timeout 200 /tmp/gpu-test --test-threads 1 --skip model:: > $OUT/t-ops.txt 2>&1
echo "op tests rc=$?"; grep -E "test result|panicked|FAILED" $OUT/t-ops.txt | head -8
cd /tmp
/tmp/vela synth --arch qwen2.5-0.5b --type q4_k_m -o /tmp/q05.gguf -t 8 >/dev/null 2>&1
/tmp/vela synth --arch smollm2-135m --type q4_1 --tokenizer /tmp/s2vocab.gguf -o /tmp/s2.gguf -t 8 >/dev/null 2>&1
B() { m=$1; tag=$2; d=$3; shift 3; echo "== $m $tag d$d $(env "$@" /tmp/vela bench -m /tmp/$m.gguf --device cuda -r 2 -p 0 -n 128 --depth $d 2>&1 | grep -oE 'tg128[^|]*\| [0-9.]+ ± [0-9.]+')"; }
for i in 1 2; do for d in 0 512; do for m in q05 s2; do
  B $m r0 $d; B $m r1 $d VELA_CUDA_ROPE_ATTN=1
done; done; done
for m in q05 s2; do for r in 0 1; do echo "md5 $m r$r $(VELA_CUDA_ROPE_ATTN=$r /tmp/vela run -m /tmp/$m.gguf --device cuda --prompt 'The capital of France is' --temperature 0 -n 64 2>/dev/null | md5sum)"; done; done
