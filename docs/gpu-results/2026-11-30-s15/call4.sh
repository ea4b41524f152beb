source scripts/gpu-quick-env.sh
cd /tmp
/tmp/vela synth --arch qwen2.5-0.5b --type q4_k_m -o /tmp/q05.gguf -t 4 >/dev/null 2>&1
/tmp/vela synth --arch llama3-8b --type q4_0 -o /tmp/l8.gguf -t 12 >/dev/null 2>&1
B() { m=$1; tag=$2; d=$3; shift 3; echo "== $m $tag d$d $(env "$@" /tmp/vela bench -m /tmp/$m.gguf --device cuda -r 2 -p 0 -n 128 --depth $d 2>&1 | grep -oE 'tg128[^|]*\| [0-9.]+ ± [0-9.]+')"; }
# Where the decode goes: products only (every other kernel skipped), everything but the products.
for i in 1 2; do for m in l8 q05; do B $m base 0 X=1; B $m products-only 0 VELA_CUDA_SKIP=norm_,rope,attention_,act_; B $m no-products 0 VELA_CUDA_SKIP=mv_; B $m no-l2pf-products-only 0 VELA_CUDA_L2PF=0 VELA_CUDA_SKIP=norm_,rope,attention_,act_; done; done
VELA_GPU_MODEL=/tmp/l8.gguf VELA_CUDA_GRAPH=0 timeout 150 ncu --clock-control none --kernel-name mv_q4_0s_x3_r2 --launch-skip 40 --launch-count 4 --section LaunchStats --section Occupancy --section SpeedOfLight --section WarpStateStats /tmp/gpu-test --ignored --exact model::decode_profile_target >$OUT/ncu-x3.txt 2>&1; echo "ncu rc=$?"
grep -E "Duration|DRAM Throughput|Registers Per|Achieved Occupancy|Theoretical Occupancy|Waves Per SM|Grid Size|Memory Throughput" $OUT/ncu-x3.txt | head -48
