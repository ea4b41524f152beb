# Session 19, call 8 (last of the session's device time): the stream probe (stream_probe in
# elementwise.cu, written this session): session 17's overlap-probe layers with the weights
# streamed through a shared-memory ring by a producer warp (cp.async.bulk + mbarriers) that runs
# ahead of the edges; next to the overlap probe in the same run. RESULT lines with --nocapture.
R=$PWD
source scripts/gpu-quick-env.sh
VELA_REQUIRE_GPU=1 timeout 150 /tmp/gpu-test --test-threads 1 --nocapture probe:: > $OUT/t-probe.txt 2>&1
echo "probe tests rc=$?"; grep -E "RESULT|test result|panicked|FAILED|Error|error" $OUT/t-probe.txt | head -60
