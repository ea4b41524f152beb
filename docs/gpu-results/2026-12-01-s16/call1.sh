# The first device call of session 16 (written at the end of session 15, not run): copy to
# target/gpu-data/quick/c1.sh after `scripts/gpu-suite.sh pack-quick` (lb.tar.xz removed) and run
# `bash target/gpu-data/quick/c1.sh` with carry ["target/gpu-data/quick"]. ~150 s with the start.
source scripts/gpu-quick-env.sh
cd /tmp
/tmp/vela synth --arch qwen2.5-0.5b --type q4_k_m -o /tmp/q05.gguf -t 8 >/dev/null 2>&1
# 1. The counter edge against a dependent launch and a grid barrier (sync_cost, prepared in
#    session 15): flag_chain_link checks that no link ran before its predecessor.
VELA_REQUIRE_GPU=1 timeout 120 /tmp/gpu-test --test-threads 1 --nocapture kernels2::grid_barrier_and_launch_cost 2>&1 | grep -E "RESULT|test result|panicked"
# 2. Every GPU test on q05 (session 15's binaries ran them in the suite; this re-checks the
#    head-dim-256 default and the prefetch step floor with the test binary of this commit).
VELA_GPU_MODEL=/tmp/q05.gguf VELA_REQUIRE_GPU=1 timeout 200 /tmp/gpu-test --test-threads 1 >$OUT/gpu-test-all.txt 2>&1
echo "gpu-test rc=$?"; grep -E "test result|panicked|FAIL" $OUT/gpu-test-all.txt | head
