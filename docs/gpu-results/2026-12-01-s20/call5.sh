# Session 20, call 5: does the data's entropy change the read bandwidth? bandwidth.cu now also
# reads (and copies) hashed data; chain_bw.cu with the regular pattern and with hashed data,
# twice each, interleaved. nvidia-smi samples SM/memory clocks and power meanwhile (read only).
nvcc=$(command -v nvcc || ls /usr/local/cuda*/bin/nvcc 2>/dev/null | head -1)
$nvcc -O3 -arch=sm_90 crates/vela-cuda/bench/bandwidth.cu -o /tmp/bw || exit 1
$nvcc -O3 -arch=sm_90 crates/vela-cuda/bench/chain_bw.cu -o /tmp/chain_bw || exit 1
nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.mem,power.draw,temperature.gpu,clocks_throttle_reasons.active --format=csv -lms 200 > $OUT/smi.csv 2>&1 &
SMI=$!
/tmp/bw | tee $OUT/bandwidth.txt
for r in 1 2; do for d in pattern random; do echo "== $d"; /tmp/chain_bw $d | grep -E "DATA|8b" | tee -a $OUT/chain.txt; done; done
kill $SMI
awk -F', ' 'NR>1 {print $2, $3, $4, $6}' $OUT/smi.csv | sort | uniq -c | sort -rn | head -20
