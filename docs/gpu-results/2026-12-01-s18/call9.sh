# Session 18, call 9 (quick pack with the GPU test binary): the warp parts' count following the
# keys seen (VELA_CUDA_WARP_MAX_PARTS=64: one part per 32-key chunk past the shape's count, steps
# of 16), its GPU test (the warp test with a mode more), then tg128 on q05 / s2 at depths 512 to
# 8192, default vs wp64 (and the tensor-core decode moved: FD_MIN_KEYS 4096 at 2048, 16384 at 4096
# and 8192), one round.
R=$PWD
source scripts/gpu-quick-env.sh
xz -dc $R/target/gpu-data/quick/s2vocab.gguf.xz > /tmp/s2vocab.gguf
VELA_REQUIRE_GPU=1 timeout 120 /tmp/gpu-test --test-threads 1 --nocapture attn::warp_parts > $OUT/t-warp.txt 2>&1
echo "warp test rc=$?"; grep -E "test result|panicked" $OUT/t-warp.txt | head -3; grep -c "up to 64, vs CPU.*| ok |" $OUT/t-warp.txt; grep "FAIL" $OUT/t-warp.txt | head -3
cd /tmp
/tmp/vela synth --arch qwen2.5-0.5b --type q4_k_m -o /tmp/q05.gguf -t 8 >/dev/null 2>&1
/tmp/vela synth --arch smollm2-135m --type q4_1 --tokenizer /tmp/s2vocab.gguf -o /tmp/s2.gguf -t 8 >/dev/null 2>&1
B() { m=$1; tag=$2; d=$3; shift 3; echo "== $m $tag d$d $(env "$@" /tmp/vela bench -m /tmp/$m.gguf --device cuda -r 2 -p 0 -n 128 --depth $d 2>&1 | grep -oE 'tg128[^|]*\| [0-9.]+ ± [0-9.]+')"; }
for m in q05 s2; do
  B $m def 512; B $m wp64 512 VELA_CUDA_WARP_MAX_PARTS=64
  B $m def 1024; B $m wp64 1024 VELA_CUDA_WARP_MAX_PARTS=64
  B $m def 2048; B $m wp64fd4k 2048 VELA_CUDA_WARP_MAX_PARTS=64 VELA_CUDA_FD_MIN_KEYS=4096
  B $m def 4096; B $m wp64fd16k 4096 VELA_CUDA_WARP_MAX_PARTS=64 VELA_CUDA_FD_MIN_KEYS=16384
  B $m def 8192; B $m wp64fd16k 8192 VELA_CUDA_WARP_MAX_PARTS=64 VELA_CUDA_FD_MIN_KEYS=16384
done
