# Session 20, call 2: the read ceiling of a kernel-per-product decode step (crates/vela-cuda/bench/
# chain_bw.cu: pure-read kernels with the products' byte counts, in a captured graph, with and
# without PDL), next to the plain read bandwidth (bandwidth.cu); then the per-kernel GPU times of
# the real decode (VELA_CUDA_PROFILE=1, graphs off) on q05 and l8 at depth 0.
R=$PWD
source scripts/gpu-quick-env.sh
nvcc=$(command -v nvcc || ls /usr/local/cuda*/bin/nvcc 2>/dev/null | head -1)
$nvcc -O3 -arch=sm_90 crates/vela-cuda/bench/bandwidth.cu -o /tmp/bw && /tmp/bw | tee $OUT/bandwidth.txt
$nvcc -O3 -arch=sm_90 crates/vela-cuda/bench/chain_bw.cu -o /tmp/chain_bw && /tmp/chain_bw | tee $OUT/chain.txt
cd /tmp
/tmp/vela synth --arch qwen2.5-0.5b --type q4_k_m -o /tmp/q05.gguf -t 8 >/dev/null 2>&1
/tmp/vela synth --arch llama3-8b --type q4_0 -o /tmp/l8.gguf -t 16 >/dev/null 2>&1
for m in q05 l8; do
  VELA_CUDA_PROFILE=1 /tmp/vela bench -m /tmp/$m.gguf --device cuda -r 1 -p 0 -n 64 --depth 0 > $OUT/prof-$m.txt 2>&1
  echo "== $m"; grep -A40 "vela-cuda profile" $OUT/prof-$m.txt | head -40
done
$nvcc -O3 -arch=sm_90 crates/vela-cuda/bench/chain_bw.cu -o /tmp/chain_bw && /tmp/chain_bw | tee $OUT/chain2.txt
