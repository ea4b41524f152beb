source scripts/gpu-quick-env.sh
cd /tmp
[ -f /tmp/l8.gguf ] || /tmp/vela synth --arch llama3-8b --type q4_0 -o /tmp/l8.gguf -t 16 >/dev/null 2>&1
[ -f /tmp/q05.gguf ] || /tmp/vela synth --arch qwen2.5-0.5b --type q4_k_m -o /tmp/q05.gguf -t 8 >/dev/null 2>&1
ls -la /tmp/*.gguf
M=gpu__time_duration.sum,dram__bytes_read.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed,l1tex__throughput.avg.pct_of_peak_sustained_active,sm__warps_active.avg.pct_of_peak_sustained_active,launch__registers_per_thread,launch__grid_size,launch__block_size,lts__t_bytes.sum
for m in l8 q05; do
  VELA_GPU_MODEL=/tmp/$m.gguf VELA_CUDA_GRAPH=0 timeout 240 ncu --clock-control none --metrics $M --csv --page raw --launch-skip 3000 --launch-count 700 /tmp/gpu-test --ignored --exact model::decode_profile_target >$OUT/ncu-$m.csv 2>$OUT/ncu-$m.err; echo "$m rc=$?"; wc -l $OUT/ncu-$m.csv; tail -3 $OUT/ncu-$m.err
done
