#!/bin/bash
# Session 11 call 5: QK norm folded into RoPE + store, post norms into the next pre-norm
# repeat with the exact post-norm sum (sum_sq_as_rms_norm): GPU tests, md5, A/B.
source scripts/gpu-quick-env.sh
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 )) s] $*"; }
xz -dc target/gpu-data/quick/vocab-gemma3.gguf.xz >/tmp/vocab-gemma3.gguf
timeout 120 /tmp/vela synth --arch gemma3-270m --type q4_k_m --tokenizer /tmp/vocab-gemma3.gguf -o /tmp/g3.gguf -t 8 >$OUT/synth.log 2>&1 & p1=$!
VELA_REQUIRE_GPU=1 timeout 120 /tmp/gpu-test --test-threads 1 --nocapture mix:: >$OUT/t-unit.log 2>&1
el "unit tests rc=$?"; grep -E "test result|panicked|FAIL" $OUT/t-unit.log | tail -6; grep -c "| ok |" $OUT/t-unit.log
wait $p1; el "synth rc=$?"; ls -la /tmp/g3.gguf
VELA_GPU_MODEL=/tmp/g3.gguf VELA_REQUIRE_GPU=1 timeout 120 /tmp/gpu-test --test-threads 1 --nocapture --exact model::pipelined_greedy_matches_plain model::prepared_steps_match_plain >$OUT/t-model.log 2>&1
el "model tests rc=$?"; grep -E "test result|panicked" $OUT/t-model.log | tail -3
for f in 1 0; do for pr in "The capital of France is" "def fibonacci(n):"; do
  echo "run g3 FOLD=$f [$pr] $(VELA_CUDA_NORM_FOLD=$f timeout 60 /tmp/vela run -m /tmp/g3.gguf --device cuda --prompt "$pr" --temperature 0 --max-tokens 64 2>/dev/null | md5sum)"
done; echo "run g3 FOLD=$f sampled $(VELA_CUDA_NORM_FOLD=$f timeout 60 /tmp/vela run -m /tmp/g3.gguf --device cuda --prompt 'Once upon a time' --temperature 0.8 --seed 7 --max-tokens 64 2>/dev/null | md5sum)"; done
b() { local m=$1; shift; timeout 60 /tmp/vela bench -m /tmp/$m.gguf --device cuda -p 0 -n 128 -r 3 "$@" 2>&1 | grep -o 'tg128[^|]*| [0-9.]* ± [0-9.]*'; }
for r in 1 2 3; do
  for d in 0 8192; do
    echo "r$r g3 d$d fold $(b g3 --depth $d)"
    echo "r$r g3 d$d nofold $(VELA_CUDA_NORM_FOLD=0 b g3 --depth $d)"
  done
  el "round $r"
done 2>&1 | tee $OUT/ab.txt
