#!/bin/bash
# Session 11 call 1: COMBINE_Q8K test + A/Bs (k8: Q8K, MVKS_DB, FD_FUSED_COMBINE; l8/q05: FD_MIN_BLOCKS=32).
source scripts/gpu-quick-env.sh
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 )) s] $*"; }
( for m in l8:llama3-8b:q4_0 q05:qwen2.5-0.5b:q4_k_m k8:llama3-8b:q4_k_m; do IFS=: read -r n a t <<<"$m"
  timeout 280 /tmp/vela synth --arch $a --type $t -o /tmp/$n.gguf -t 16; echo "$n rc=$? $(( $(date +%s) - t0 )) s"; done ) >$OUT/synth.log 2>&1 & spid=$!
VELA_REQUIRE_GPU=1 timeout 120 /tmp/gpu-test --test-threads 1 --nocapture --exact attn::fused_attention_matmul_equals_unfused >$OUT/t-attn.log 2>&1
el "attn test rc=$?"; grep -E "RESULT|test result|panicked" $OUT/t-attn.log | tail -12
VELA_CUDA_DEFINES=MVKS_DB VELA_REQUIRE_GPU=1 timeout 90 /tmp/gpu-test --test-threads 1 --nocapture --exact kernels2::split_rows_equal_gguf_layout >$OUT/t-mv.log 2>&1
el "mvks_db test rc=$?"; grep -E "test result|panicked" $OUT/t-mv.log | tail -3
wait $spid; el "synth done"; cat $OUT/synth.log | grep rc=; ls -la /tmp/*.gguf
for v in base Q8K MVKS_DB; do
  echo "run k8 [$v] $(case $v in Q8K) export VELA_CUDA_COMBINE_Q8K=1;; MVKS_DB) export VELA_CUDA_DEFINES=MVKS_DB;; esac; timeout 60 /tmp/vela run -m /tmp/k8.gguf --device cuda --prompt 'The capital of France is' --temperature 0 --max-tokens 64 2>/dev/null | md5sum)"
done
b() { local m=$1; shift; timeout 60 /tmp/vela bench -m /tmp/$m.gguf --device cuda -p 0 -n 128 -r 3 "$@" 2>&1 | grep -o 'tg128[^|]*| [0-9.]* ± [0-9.]*'; }
for r in 1 2 3; do
  echo "r$r k8 d0 base $(b k8)"
  echo "r$r k8 d0 Q8K $(VELA_CUDA_COMBINE_Q8K=1 b k8)"
  echo "r$r k8 d0 MVKS_DB $(VELA_CUDA_DEFINES=MVKS_DB b k8)"
  echo "r$r k8 d8192 base $(b k8 --depth 8192)"
  echo "r$r k8 d8192 Q8K $(VELA_CUDA_COMBINE_Q8K=1 b k8 --depth 8192)"
  echo "r$r k8 d8192 FUSED $(VELA_CUDA_DEFINES=FD_FUSED_COMBINE b k8 --depth 8192)"
  for m in l8 q05; do for d in 1024 1400; do
    echo "r$r $m d$d base $(b $m --depth $d)"
    echo "r$r $m d$d MB32 $(VELA_CUDA_FD_MIN_BLOCKS=32 b $m --depth $d)"
  done; done
  el "round $r"
done 2>&1 | tee $OUT/ab.txt
