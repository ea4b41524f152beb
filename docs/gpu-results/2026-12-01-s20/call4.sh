# Session 20, call 4: does the weights' allocation change the products' stream? mv_layout.cu's pure
# read and split-row (vela mvs port) chains with each product in its own cudaMalloc (as call 3),
# carved from one contiguous cudaMalloc (as chain_bw.cu), or in its own cudaMallocAsync (vela's
# uploads through cudarc); chain_bw.cu again in the same call.
nvcc=$(command -v nvcc || ls /usr/local/cuda*/bin/nvcc 2>/dev/null | head -1)
$nvcc -O3 -arch=sm_90 crates/vela-cuda/bench/mv_layout.cu -o /tmp/mv_layout || exit 1
$nvcc -O3 -arch=sm_90 crates/vela-cuda/bench/chain_bw.cu -o /tmp/chain_bw || exit 1
for a in sep arena async arena sep async; do timeout 200 /tmp/mv_layout $a 2 | grep -E "ALLOC|all products|FAIL" | tee -a $OUT/alloc.txt; done
/tmp/chain_bw | tee $OUT/chain.txt
timeout 200 /tmp/mv_layout arena 2 | tee $OUT/arena-full.txt | grep -v CHECK
