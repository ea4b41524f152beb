# Session 21, call 2: mv_layout.cu variant 18 (the no-L1 split rows in round-major order: every
# warp's same round one contiguous region, as in a pure read) against the pure read (8) and
# today's no-L1 split rows (9). Only the down product (448 blocks per row) differs from 9.
nvcc=$(command -v nvcc || ls /usr/local/cuda*/bin/nvcc 2>/dev/null | head -1)
$nvcc -O3 -arch=sm_90 crates/vela-cuda/bench/mv_layout.cu -o /tmp/mv_layout || exit 1
timeout 250 /tmp/mv_layout arena 2 8,9,18 | tee $OUT/mv.txt | grep -E "FAIL|CHAIN|CHECK"
