# Session 20, call 8: variants of the split-row Q4_0 product (mv_layout.cu, waits behind a branch)
# against the pure read of the same bytes: weights not allocated in L1, 8 blocks per round
# without the second round, one row per warp, 8 or 2 warps per block, two rounds of half a row;
# then ncu (stall reasons, occupancy, throughput) on the down and gate/up launches of the pure read
# and vela's split-row port.
nvcc=$(command -v nvcc || ls /usr/local/cuda*/bin/nvcc 2>/dev/null | head -1)
ncu=$(command -v ncu || ls /usr/local/cuda*/bin/ncu 2>/dev/null | head -1)
$nvcc -O3 -arch=sm_90 -Xptxas -v crates/vela-cuda/bench/mv_layout.cu -o /tmp/mv_layout > $OUT/ptxas.txt 2>&1 || { cat $OUT/ptxas.txt; exit 1; }
grep -A1 "_Z3mvs" $OUT/ptxas.txt | grep -oE "_Z3mvs[A-Za-z0-9_]*|Used [0-9]+ registers" | paste - - 
timeout 250 /tmp/mv_layout arena 2 0,1,9,10,11,12,13,14 | tee $OUT/mv.txt | grep -E "FAIL|CHAIN"
timeout 200 $ncu --section SpeedOfLight --section WarpStateStats --section Occupancy --section MemoryWorkloadAnalysis -k regex:'mvs|rd2' /tmp/mv_layout arena 2 8,1 ncu > $OUT/ncu.txt 2>&1
grep -E "mvs|rd2|DRAM Throughput|Memory Throughput|Duration|Achieved Occupancy|Theoretical Occupancy|Registers|Stall|L1/TEX Hit|L2 Hit|Warp Cycles Per Issued|Mem Busy|Max Bandwidth" $OUT/ncu.txt | head -80
