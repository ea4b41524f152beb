# Session 20, call 3: Q4_0 decode products in vela's split-row layout (a port of mvs) against
# 32-row tiles (lane = row, warp-contiguous stream, broadcast activations), as the 8B step's chain
# of products in a graph with PDL, next to pure reads of the same bytes (crates/vela-cuda/bench/
# mv_layout.cu). Each variant is checked against a reference kernel.
nvcc=$(command -v nvcc || ls /usr/local/cuda*/bin/nvcc 2>/dev/null | head -1)
$nvcc -O3 -arch=sm_90 -Xptxas -v crates/vela-cuda/bench/mv_layout.cu -o /tmp/mv_layout > $OUT/ptxas.txt 2>&1 || { cat $OUT/ptxas.txt; exit 1; }
grep -E "registers|Compiling entry" $OUT/ptxas.txt | paste - - | sed 's/ptxas info    ://g' | cut -c1-220 | grep -E "mvs|mvt|rd" 
timeout 300 /tmp/mv_layout | tee $OUT/mv_layout.txt
