# For session 20's first call (quick pack with the GPU test binary): the stream probe with the
# decomposition prepared after session 19's call 8 (not run on a GPU): up to 31 consumer warps,
# flag 4 (no per-phase input pass) and 5 (no edges, no input pass: the ring's stream and the dot
# products alone), next to the overlap probe with the same flag 5. Answers whether a ring-fed
# persistent layer streams the 8B's weights near the 4.47 TB/s read bandwidth.
R=$PWD
source scripts/gpu-quick-env.sh
VELA_REQUIRE_GPU=1 timeout 200 /tmp/gpu-test --test-threads 1 --nocapture probe:: > $OUT/t-probe.txt 2>&1
echo "probe tests rc=$?"; grep -E "RESULT|test result|panicked|FAILED|Error|error" $OUT/t-probe.txt | head -80
# Session 20 addition: the products' bandwidth in isolation (back-to-back launches of one shape).
VELA_REQUIRE_GPU=1 timeout 120 /tmp/gpu-test --test-threads 1 --nocapture kernels2::matvec_bandwidth > $OUT/t-mvbw.txt 2>&1
echo "mvbw rc=$?"; grep -E "RESULT|test result|panicked" $OUT/t-mvbw.txt | head -20
