# Session 18, call 4 (quick pack with the GPU test binary): persistent Q4_0 products
# (mv_q4_0s_x3p: Q/K/V and gate/up, VELA_CUDA_MV_PERSIST = blocks per SM). GPU test first (bit-equal
# to the two-row products without a K split), then Llama-3-8B Q4_0 tg128 interleaved, off vs 2 / 3
# / 4 blocks per SM, 2 rounds at depth 0, one at 8K; greedy md5.
R=$PWD
source scripts/gpu-quick-env.sh
VELA_REQUIRE_GPU=1 timeout 120 /tmp/gpu-test --test-threads 1 --nocapture persistent_q4_0 > $OUT/t-persist.txt 2>&1
echo "persist test rc=$?"; grep -E "test result|panicked|RESULT" $OUT/t-persist.txt | head -5
cd /tmp
/tmp/vela synth --arch llama3-8b --type q4_0 -o /tmp/l8.gguf -t 16 >/dev/null 2>&1
B() { m=$1; tag=$2; d=$3; shift 3; echo "== $m $tag d$d $(env "$@" /tmp/vela bench -m /tmp/$m.gguf --device cuda -r 2 -p 0 -n 128 --depth $d 2>&1 | grep -oE 'tg128[^|]*\| [0-9.]+ ± [0-9.]+')"; }
for i in 1 2; do
  B l8 p0 0; B l8 p2 0 VELA_CUDA_MV_PERSIST=2; B l8 p3 0 VELA_CUDA_MV_PERSIST=3; B l8 p4 0 VELA_CUDA_MV_PERSIST=4
done
B l8 p0 8192; B l8 p4 8192 VELA_CUDA_MV_PERSIST=4
# (With VELA_CUDA_MV_SPLIT=1 the usual x3 kernel sums as the persistent one: equal md5 expected.)
for p in 0 4; do echo "md5 l8 p$p split1 $(VELA_CUDA_MV_SPLIT=1 VELA_CUDA_MV_PERSIST=$p /tmp/vela run -m /tmp/l8.gguf --device cuda --prompt 'The capital of France is' --temperature 0 -n 64 2>/dev/null | md5sum)"; done
