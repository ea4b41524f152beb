#!/bin/bash
# Session 10 call 1: guards tests, MVS_DB bit-equality, A/B FD_SPLIT_COMBINE / MVS_DB on l8.
Q=target/gpu-data/quick
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 )) s] $*"; }
export VELA_CACHE=/tmp/vela-cache; mkdir -p $VELA_CACHE/vocab
xz -dc $Q/vela.xz >/tmp/vela && xz -dc $Q/gpu-test.xz >/tmp/gpu-test && chmod +x /tmp/vela /tmp/gpu-test
for v in llama-bpe qwen2; do xz -dc $Q/vocab-$v.gguf.xz >$VELA_CACHE/vocab/ggml-vocab-$v.gguf; done
export VELA_NVRTC_LIB=$(ls /usr/local/cuda*/lib64/libnvrtc.so* 2>/dev/null | grep -v builtins | head -1)
el "unpacked, nvrtc=$VELA_NVRTC_LIB"
timeout 60 /tmp/vela synth --arch llama3-8b --type q4_0 -o /tmp/l8.gguf -t 12 >$OUT/synth.log 2>&1
el "synth rc=$? $(ls -la /tmp/l8.gguf)"
VELA_GPU_MODEL=/tmp/l8.gguf VELA_REQUIRE_GPU=1 timeout 150 /tmp/gpu-test --test-threads 1 --nocapture --exact \
  model::pipelining_guards model::prepared_steps_match_plain model::pipelined_greedy_matches_plain >$OUT/t-guards.log 2>&1
el "guards tests rc=$?"; grep -E "RESULT|test result|panicked" $OUT/t-guards.log
VELA_CUDA_DEFINES=MVS_DB VELA_REQUIRE_GPU=1 timeout 90 /tmp/gpu-test --test-threads 1 --nocapture --exact \
  kernels2::split_rows_equal_gguf_layout >$OUT/t-mvsdb.log 2>&1
el "MVS_DB split-row test rc=$?"; grep -E "RESULT|test result|panicked" $OUT/t-mvsdb.log | tail -8
b() { timeout 60 /tmp/vela bench -m /tmp/l8.gguf --device cuda -p 0 -n 128 -r 3 "$@" 2>&1 | grep -o 'tg128[^|]*| [0-9.]* ± [0-9.]*'; }
for r in 1 2 3; do
  for v in base FD_SPLIT_COMBINE MVS_DB; do
    d=$([ $v = base ] || echo $v)
    [ $v = FD_SPLIT_COMBINE ] || echo "r$r $v d0 $(VELA_CUDA_DEFINES=$d b)"
    echo "r$r $v d8192 $(VELA_CUDA_DEFINES=$d b --depth 8192)"
  done
  echo "r$r base T0.8 $(b --temperature 0.8)"
  el "round $r"
done 2>&1 | tee $OUT/ab.txt
