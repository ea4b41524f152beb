#!/bin/bash
# Session 10 call 2: repeat FD_SPLIT_COMBINE / MVS_DB; new MVS_DB3, MVKS_DB, FD_THREE_STAGES, FD waves.
Q=target/gpu-data/quick
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 )) s] $*"; }
export VELA_CACHE=/tmp/vela-cache; mkdir -p $VELA_CACHE/vocab
xz -dc $Q/vela.xz >/tmp/vela && xz -dc $Q/gpu-test.xz >/tmp/gpu-test && chmod +x /tmp/vela /tmp/gpu-test
for v in llama-bpe qwen2; do xz -dc $Q/vocab-$v.gguf.xz >$VELA_CACHE/vocab/ggml-vocab-$v.gguf; done
export VELA_NVRTC_LIB=$(ls /usr/local/cuda*/lib64/libnvrtc.so* 2>/dev/null | grep -v builtins | head -1)
( for m in l8:llama3-8b:q4_0 q05:qwen2.5-0.5b:q4_k_m k8:llama3-8b:q4_k_m; do IFS=: read -r n a t <<<"$m"
  timeout 90 /tmp/vela synth --arch $a --type $t -o /tmp/$n.gguf -t 8; done ) >$OUT/synth.log 2>&1 & spid=$!
VELA_CUDA_DEFINES=FD_SPLIT_COMBINE,FD_THREE_STAGES VELA_REQUIRE_GPU=1 timeout 120 /tmp/gpu-test --test-threads 1 --nocapture --exact \
  kernels2::split_attention_long_context_matches_cpu attn::fused_attention_matmul_equals_unfused >$OUT/t-fd.log 2>&1
el "FD tests rc=$?"; grep -E "RESULT|test result|panicked" $OUT/t-fd.log | tail -12
VELA_CUDA_DEFINES=MVS_DB,MVS_DB3,MVKS_DB VELA_REQUIRE_GPU=1 timeout 90 /tmp/gpu-test --test-threads 1 --nocapture --exact \
  kernels2::split_rows_equal_gguf_layout >$OUT/t-mv.log 2>&1
el "MV tests rc=$?"; grep -E "RESULT|test result|panicked" $OUT/t-mv.log | tail -8
wait $spid; el "synth done"; ls -la /tmp/*.gguf
ALL=FD_SPLIT_COMBINE,FD_THREE_STAGES,MVS_DB,MVS_DB3,MVKS_DB
for m in l8 k8 q05; do for d in "" $ALL; do
  echo "run $m [$d] $(VELA_CUDA_DEFINES=$d timeout 60 /tmp/vela run -m /tmp/$m.gguf --device cuda --prompt 'The capital of France is' --temperature 0 --max-tokens 64 2>/dev/null | md5sum)"
done; done
b() { local m=$1; shift; timeout 60 /tmp/vela bench -m /tmp/$m.gguf --device cuda -p 0 -n 128 -r 3 "$@" 2>&1 | grep -o 'tg128[^|]*| [0-9.]* ± [0-9.]*'; }
SC=FD_SPLIT_COMBINE
for r in 1 2 3; do
  for v in base MVS_DB MVS_DB,MVS_DB3; do echo "r$r l8 d0 $v $(VELA_CUDA_DEFINES=${v#base} b l8)"; done
  for v in base $SC $SC,MVS_DB $SC,MVS_DB,MVS_DB3 $SC,FD_THREE_STAGES W3 W4; do
    w=2; d=${v#base}; case $v in W3) w=3; d=$SC;; W4) w=4; d=$SC;; esac
    echo "r$r l8 d8192 $v $(VELA_CUDA_FD_WAVES=$w VELA_CUDA_DEFINES=$d b l8 --depth 8192)"; done
  for m in k8 q05; do for v in base MVKS_DB; do echo "r$r $m d0 $v $(VELA_CUDA_DEFINES=${v#base} b $m)"; done; done
  el "round $r"
done 2>&1 | tee $OUT/ab.txt
