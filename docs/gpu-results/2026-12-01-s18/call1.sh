# Session 18, call 1 (written in session 17 as next-call1.sh; op tests added) (quick pack with the GPU test binary, plus s2vocab / g3vocab as in
# call 6): the prepared warp-per-part attention (attention_partw_*, VELA_CUDA_ATTN_WARP=1), its GPU
# test first, then tg128 A/B interleaved, 2 rounds, depths 0 and 512, and greedy md5 (the warp
# parts sum in another order, so the md5 may differ; the test's bound is what decides).
R=$PWD
source scripts/gpu-quick-env.sh
xz -dc $R/target/gpu-data/quick/s2vocab.gguf.xz > /tmp/s2vocab.gguf
xz -dc $R/target/gpu-data/quick/g3vocab.gguf.xz > /tmp/g3vocab.gguf
VELA_REQUIRE_GPU=1 timeout 120 /tmp/gpu-test --test-threads 1 --nocapture attn::warp_parts > $OUT/t-warp.txt 2>&1
echo "warp test rc=$?"; grep -E "test result|panicked|FAIL|max|err" $OUT/t-warp.txt | head -8
# every op test but the real-model ones (bdbb52d's rope_row refactor has not run on a GPU)
VELA_REQUIRE_GPU=1 timeout 200 /tmp/gpu-test --test-threads 1 --skip model:: > $OUT/t-ops.txt 2>&1
echo "op tests rc=$?"; grep -E "test result|panicked|FAILED" $OUT/t-ops.txt | head -8
cd /tmp
/tmp/vela synth --arch qwen2.5-0.5b --type q4_k_m -o /tmp/q05.gguf -t 8 >/dev/null 2>&1
/tmp/vela synth --arch smollm2-135m --type q4_1 --tokenizer /tmp/s2vocab.gguf -o /tmp/s2.gguf -t 8 >/dev/null 2>&1
/tmp/vela synth --arch gemma3-270m --type q4_k_m --tokenizer /tmp/g3vocab.gguf -o /tmp/g3.gguf -t 8 >/dev/null 2>&1
B() { m=$1; tag=$2; d=$3; shift 3; echo "== $m $tag d$d $(env "$@" /tmp/vela bench -m /tmp/$m.gguf --device cuda -r 2 -p 0 -n 128 --depth $d 2>&1 | grep -oE 'tg128[^|]*\| [0-9.]+ ± [0-9.]+')"; }
for i in 1 2; do for d in 0 512; do for m in q05 s2 g3; do
  B $m w0 $d; B $m w1 $d VELA_CUDA_ATTN_WARP=1
done; done; done
for m in q05 g3; do for w in 0 1; do echo "md5 $m w$w $(VELA_CUDA_ATTN_WARP=$w /tmp/vela run -m /tmp/$m.gguf --device cuda --prompt 'The capital of France is' --temperature 0 -n 64 2>/dev/null | md5sum)"; done; done
