# Session 20, call 6: why does chain_bw.cu's read chain (call 5: ~4.1 TB/s) beat mv_layout.cu's
# pure-read chain of the same products (calls 3-4: 3.3 TB/s)? chain_bw with the layers only and
# with the gate/up products only; mv_layout with chain_bw's kernel as an extra variant.
nvcc=$(command -v nvcc || ls /usr/local/cuda*/bin/nvcc 2>/dev/null | head -1)
$nvcc -O3 -arch=sm_90 crates/vela-cuda/bench/mv_layout.cu -o /tmp/mv_layout || exit 1
$nvcc -O3 -arch=sm_90 crates/vela-cuda/bench/chain_bw.cu -o /tmp/chain_bw || exit 1
/tmp/chain_bw | grep -E "8b" | tee $OUT/chain.txt
timeout 200 /tmp/mv_layout arena 2 | tee $OUT/mv.txt | grep -v CHECK
/tmp/chain_bw | grep -E "8b" | tee -a $OUT/chain.txt
