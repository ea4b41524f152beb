#!/bin/bash
# Session 11 call 2: act epilogue (VELA_CUDA_ACT_EPILOGUE=1) tests + A/B; FD_MIN_BLOCKS=32 repeat.
source scripts/gpu-quick-env.sh
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 )) s] $*"; }
( for m in l8:llama3-8b:q4_0 q05:qwen2.5-0.5b:q4_k_m k8:llama3-8b:q4_k_m; do IFS=: read -r n a t <<<"$m"
  timeout 280 /tmp/vela synth --arch $a --type $t -o /tmp/$n.gguf -t 16; echo "$n rc=$? $(( $(date +%s) - t0 )) s"; done ) >$OUT/synth.log 2>&1 & spid=$!
VELA_REQUIRE_GPU=1 timeout 150 /tmp/gpu-test --test-threads 1 --nocapture --exact mix::ffn_act_epilogue_equals_unfused attn::fused_attention_matmul_equals_unfused kernels2::split_attention_long_context_matches_cpu >$OUT/t-unit.log 2>&1
el "unit tests rc=$?"; grep -E "test result|panicked|FAIL" $OUT/t-unit.log | tail -8; grep -c "| ok |" $OUT/t-unit.log
wait $spid; el "synth done"; grep rc= $OUT/synth.log
for m in q05 l8; do
  VELA_CUDA_ACT_EPILOGUE=1 VELA_GPU_MODEL=/tmp/$m.gguf VELA_REQUIRE_GPU=1 timeout 120 /tmp/gpu-test --test-threads 1 --nocapture --exact model::pipelined_greedy_matches_plain model::prepared_steps_match_plain >$OUT/t-model-$m.log 2>&1
  el "model tests $m rc=$?"; grep -E "test result|panicked" $OUT/t-model-$m.log | tail -3
done
for m in l8 q05 k8; do for v in 0 1; do
  echo "run $m AE=$v $(VELA_CUDA_ACT_EPILOGUE=$v timeout 60 /tmp/vela run -m /tmp/$m.gguf --device cuda --prompt 'The capital of France is' --temperature 0 --max-tokens 64 2>/dev/null | md5sum)"
done; done
b() { local m=$1; shift; timeout 60 /tmp/vela bench -m /tmp/$m.gguf --device cuda -p 0 -n 128 -r 3 "$@" 2>&1 | grep -o 'tg128[^|]*| [0-9.]* ± [0-9.]*'; }
for r in 1 2 3; do
  for m in q05 l8 k8; do
    echo "r$r $m d0 base $(b $m)"
    echo "r$r $m d0 AE $(VELA_CUDA_ACT_EPILOGUE=1 b $m)"
  done
  for d in 1024 1400; do
    echo "r$r l8 d$d base $(b l8 --depth $d)"
    echo "r$r l8 d$d MB32 $(VELA_CUDA_FD_MIN_BLOCKS=32 b l8 --depth $d)"
  done
  echo "r$r q05 d1400 base $(b q05 --depth 1400)"
  echo "r$r q05 d1400 MB32 $(VELA_CUDA_FD_MIN_BLOCKS=32 b q05 --depth 1400)"
  el "round $r"
done 2>&1 | tee $OUT/ab.txt
