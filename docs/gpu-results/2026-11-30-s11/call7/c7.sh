#!/bin/bash
# Session 11 call 7: post-norm sum in the kernel's own order (VELA_CUDA_DEFINES=POST_FAST_SUM) vs rms_norm's order (default) vs no fold.
source scripts/gpu-quick-env.sh
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 )) s] $*"; }
xz -dc target/gpu-data/quick/vocab-gemma3.gguf.xz >/tmp/vocab-gemma3.gguf
timeout 120 /tmp/vela synth --arch gemma3-270m --type q4_k_m --tokenizer /tmp/vocab-gemma3.gguf -o /tmp/g3.gguf -t 8 >$OUT/synth.log 2>&1 & p1=$!
VELA_CUDA_DEFINES=POST_FAST_SUM VELA_REQUIRE_GPU=1 timeout 120 /tmp/gpu-test --test-threads 1 --nocapture --exact mix::post_norm_matmul_equals_unfused >$OUT/t-fast.log 2>&1
el "fast-sum test rc=$?"; grep -E "RESULT" $OUT/t-fast.log | head -20
wait $p1; el "synth"
for v in "" POST_FAST_SUM; do echo "run g3 [$v] $(VELA_CUDA_DEFINES=$v timeout 60 /tmp/vela run -m /tmp/g3.gguf --device cuda --prompt 'Once upon a time' --temperature 0.8 --seed 7 --max-tokens 64 2>/dev/null | md5sum)"; done
b() { local m=$1; shift; timeout 60 /tmp/vela bench -m /tmp/$m.gguf --device cuda -p 0 -n 128 -r 3 "$@" 2>&1 | grep -o 'tg128[^|]*| [0-9.]* ± [0-9.]*'; }
for r in 1 2 3; do
  for d in 0 8192; do
    echo "r$r g3 d$d exact $(b g3 --depth $d)"
    echo "r$r g3 d$d fast $(VELA_CUDA_DEFINES=POST_FAST_SUM b g3 --depth $d)"
    echo "r$r g3 d$d nofold $(VELA_CUDA_NORM_FOLD=0 b g3 --depth $d)"
  done
  el "round $r"
done 2>&1 | tee $OUT/ab.txt
