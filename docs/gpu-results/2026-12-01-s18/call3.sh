# Session 18, call 3 (quick pack with the GPU test binary): the warp parts merged in their block
# (attention_partm_*, VELA_CUDA_ATTN_MERGE=1, no attention_combine; head dim 64). Its GPU test
# first (bit-equal to warp parts + combine), then tg128 A/B interleaved on q05 / s2 at depths 0
# and 512, 2 rounds: default (warp parts + combine) / merged / merged with at most 16 parts;
# greedy md5.
R=$PWD
source scripts/gpu-quick-env.sh
xz -dc $R/target/gpu-data/quick/s2vocab.gguf.xz > /tmp/s2vocab.gguf
VELA_REQUIRE_GPU=1 timeout 120 /tmp/gpu-test --test-threads 1 --nocapture attn::warp_parts > $OUT/t-warp.txt 2>&1
echo "warp test rc=$?"; grep -E "test result|panicked|FAIL" $OUT/t-warp.txt | head -5; grep -c "RESULT.*merged.*ok" $OUT/t-warp.txt
cd /tmp
/tmp/vela synth --arch qwen2.5-0.5b --type q4_k_m -o /tmp/q05.gguf -t 8 >/dev/null 2>&1
/tmp/vela synth --arch smollm2-135m --type q4_1 --tokenizer /tmp/s2vocab.gguf -o /tmp/s2.gguf -t 8 >/dev/null 2>&1
B() { m=$1; tag=$2; d=$3; shift 3; echo "== $m $tag d$d $(env "$@" /tmp/vela bench -m /tmp/$m.gguf --device cuda -r 2 -p 0 -n 128 --depth $d 2>&1 | grep -oE 'tg128[^|]*\| [0-9.]+ ± [0-9.]+')"; }
for i in 1 2; do for d in 0 512; do for m in q05 s2; do
  B $m def $d; B $m m1 $d VELA_CUDA_ATTN_MERGE=1; B $m m1p16 $d VELA_CUDA_ATTN_MERGE=1 VELA_CUDA_SPLIT_MAX_PARTS=16
done; done; done
for m in q05 s2; do for w in 0 1; do echo "md5 $m m$w $(VELA_CUDA_ATTN_MERGE=$w /tmp/vela run -m /tmp/$m.gguf --device cuda --prompt 'The capital of France is' --temperature 0 -n 64 2>/dev/null | md5sum)"; done; done
