#!/bin/bash
# Session 11 call 3: rows per warp of the 8B's down product (VELA_CUDA_MV_WIDE_ROWS=1|4) and the K split switch.
source scripts/gpu-quick-env.sh
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 )) s] $*"; }
timeout 100 /tmp/vela synth --arch llama3-8b --type q4_0 -o /tmp/l8.gguf -t 8 >$OUT/synth.log 2>&1 & p1=$!
timeout 100 /tmp/vela synth --arch qwen2.5-0.5b --type q4_k_m -o /tmp/q05.gguf -t 8 >>$OUT/synth.log 2>&1 & p2=$!
VELA_CUDA_MV_WIDE_ROWS=1 VELA_REQUIRE_GPU=1 timeout 60 /tmp/gpu-test --test-threads 1 --exact kernels2::split_rows_equal_gguf_layout >$OUT/t-r1.log 2>&1; el "r1 test rc=$?"
VELA_CUDA_MV_WIDE_ROWS=4 VELA_REQUIRE_GPU=1 timeout 60 /tmp/gpu-test --test-threads 1 --exact kernels2::split_rows_equal_gguf_layout >$OUT/t-r4.log 2>&1; el "r4 test rc=$?"
wait $p1; wait $p2; el "synth"; ls -la /tmp/*.gguf
for v in 2 1 4; do echo "run l8 WIDE=$v $(VELA_CUDA_MV_WIDE_ROWS=$v timeout 60 /tmp/vela run -m /tmp/l8.gguf --device cuda --prompt 'The capital of France is' --temperature 0 --max-tokens 64 2>/dev/null | md5sum)"; done
b() { local m=$1; shift; timeout 60 /tmp/vela bench -m /tmp/$m.gguf --device cuda -p 0 -n 128 -r 3 "$@" 2>&1 | grep -o 'tg128[^|]*| [0-9.]* ± [0-9.]*'; }
for r in 1 2 3; do
  echo "r$r l8 base $(b l8)"
  echo "r$r l8 WIDE1 $(VELA_CUDA_MV_WIDE_ROWS=1 b l8)"
  echo "r$r l8 WIDE4 $(VELA_CUDA_MV_WIDE_ROWS=4 b l8)"
  echo "r$r l8 SPLIT2 $(VELA_CUDA_MV_SPLIT=2 b l8)"
  echo "r$r l8 SPLITauto $(VELA_CUDA_MV_SPLIT=auto b l8)"
  echo "r$r q05 base $(b q05)"
  echo "r$r q05 SPLIT2 $(VELA_CUDA_MV_SPLIT=2 b q05)"
  el "round $r"
done 2>&1 | tee $OUT/ab.txt
