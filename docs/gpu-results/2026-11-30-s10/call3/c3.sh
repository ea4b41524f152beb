#!/bin/bash
# Session 10 call 3: one normalizing attention part per head at short contexts (VELA_CUDA_SHORT_KEYS).
Q=target/gpu-data/quick
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 )) s] $*"; }
export VELA_CACHE=/tmp/vela-cache; mkdir -p $VELA_CACHE/vocab
xz -dc $Q/vela.xz >/tmp/vela && xz -dc $Q/gpu-test.xz >/tmp/gpu-test && chmod +x /tmp/vela /tmp/gpu-test
for v in llama-bpe qwen2; do xz -dc $Q/vocab-$v.gguf.xz >$VELA_CACHE/vocab/ggml-vocab-$v.gguf; done
export VELA_NVRTC_LIB=$(ls /usr/local/cuda*/lib64/libnvrtc.so* 2>/dev/null | grep -v builtins | head -1)
( for m in l8:llama3-8b:q4_0 q05:qwen2.5-0.5b:q4_k_m; do IFS=: read -r n a t <<<"$m"
  timeout 90 /tmp/vela synth --arch $a --type $t -o /tmp/$n.gguf -t 8; done ) >$OUT/synth.log 2>&1 & spid=$!
VELA_REQUIRE_GPU=1 timeout 150 /tmp/gpu-test --test-threads 1 --nocapture --exact \
  kernels2::split_attention_long_context_matches_cpu attn::fused_attention_matmul_equals_unfused kernels2::fused_decode_ops_match_cpu >$OUT/t-attn.log 2>&1
el "tests rc=$?"; grep -E "test result|panicked" $OUT/t-attn.log; grep -c "| ok |" $OUT/t-attn.log; grep -E "FAIL" $OUT/t-attn.log | head; grep "one normalizing part" $OUT/t-attn.log | head -4
wait $spid; el "synth done"; cat $OUT/synth.log
for m in l8 q05; do for k in 256 0; do
  echo "run $m SHORT_KEYS=$k $(VELA_CUDA_SHORT_KEYS=$k timeout 60 /tmp/vela run -m /tmp/$m.gguf --device cuda --prompt 'The capital of France is' --temperature 0 --max-tokens 64 2>/dev/null | md5sum)"
done; done
b() { local m=$1; shift; timeout 60 /tmp/vela bench -m /tmp/$m.gguf --device cuda -p 0 -n 128 -r 3 "$@" 2>&1 | grep -o 'tg128[^|]*| [0-9.]* ± [0-9.]*'; }
for r in 1 2 3; do
  for m in l8 q05; do
    for k in 256 0; do echo "r$r $m d0 SHORT_KEYS=$k $(VELA_CUDA_SHORT_KEYS=$k b $m)"; done
    for k in 1024 0; do echo "r$r $m d512 SHORT_KEYS=$k $(VELA_CUDA_SHORT_KEYS=$k b $m --depth 512)"; done
  done
  el "round $r"
done 2>&1 | tee $OUT/ab.txt
