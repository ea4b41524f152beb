source scripts/gpu-quick-env.sh
cd /tmp
( [ -s /tmp/g12.gguf ] || /tmp/vela synth --arch gemma4-12b --type q4_0 -o /tmp/g12.gguf -t 6 >/dev/null 2>&1 ) & p1=$!
( [ -s /tmp/l8.gguf ] || /tmp/vela synth --arch llama3-8b --type q4_0 -o /tmp/l8.gguf -t 4 >/dev/null 2>&1; /tmp/vela synth --arch gemma4-31b --type q4_0 -o /tmp/g31.gguf -t 8 >/dev/null 2>&1 ) & p2=$!
wait $p1
B() { m=$1; tag=$2; d=$3; shift 3; echo "== $m $tag d$d $(env "$@" /tmp/vela bench -m /tmp/$m.gguf --device cuda -r 2 -p 0 -n 128 --depth $d 2>&1 | grep -oE 'tg128[^|]*\| [0-9.]+ ± [0-9.]+')"; }
for i in 1 2; do B g12 d512 8192 VELA_CUDA_FD_D512=1; B g12 base 8192 X=1; done
B g12 d512 2048 VELA_CUDA_FD_D512=1; B g12 base 2048 X=1
wait $p2
for i in 1 2; do B g31 base 8192 X=1; B g31 d512 8192 VELA_CUDA_FD_D512=1; done
VELA_GPU_MODEL=/tmp/l8.gguf VELA_CUDA_GRAPH=0 timeout 200 ncu --clock-control none --kernel-name mv_q4_0s_r2 --launch-skip 40 --launch-count 4 --section WarpStateStats --section MemoryWorkloadAnalysis --section Occupancy --section SpeedOfLight /tmp/gpu-test --ignored --exact model::decode_profile_target >$OUT/ncu-down.txt 2>&1; echo "ncu rc=$?"
