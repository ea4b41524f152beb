#!/bin/bash
# Session 10 call 4: flash-decode thresholds/parts with the separate combine (env switches only).
Q=target/gpu-data/quick
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 )) s] $*"; }
export VELA_CACHE=/tmp/vela-cache; mkdir -p $VELA_CACHE/vocab
xz -dc $Q/vela.xz >/tmp/vela && chmod +x /tmp/vela
for v in llama-bpe qwen2; do xz -dc $Q/vocab-$v.gguf.xz >$VELA_CACHE/vocab/ggml-vocab-$v.gguf; done
export VELA_NVRTC_LIB=$(ls /usr/local/cuda*/lib64/libnvrtc.so* 2>/dev/null | grep -v builtins | head -1)
for m in l8:llama3-8b:q4_0 q05:qwen2.5-0.5b:q4_k_m; do IFS=: read -r n a t <<<"$m"
  [ -s /tmp/$n.gguf ] || timeout 90 /tmp/vela synth --arch $a --type $t -o /tmp/$n.gguf -t 16; done >$OUT/synth.log 2>&1
el "synth done"; cat $OUT/synth.log
b() { local m=$1; shift; timeout 60 /tmp/vela bench -m /tmp/$m.gguf --device cuda -p 0 -n 128 -r 3 "$@" 2>&1 | grep -o 'tg128[^|]*| [0-9.]* ± [0-9.]*'; }
for r in 1 2 3; do
  for v in base VELA_CUDA_FD_MIN_KEYS=1024 VELA_CUDA_FD_MIN_KEYS=768; do echo "r$r l8 d1024 $v $( [ $v = base ] || export $v; b l8 --depth 1024)"; done
  for v in base VELA_CUDA_FD_WAVES=1 VELA_CUDA_FD_MIN_TILES=2 VELA_CUDA_FD_MIN_TILES=8; do echo "r$r l8 d8192 $v $( [ $v = base ] || export $v; b l8 --depth 8192)"; done
  for v in base VELA_CUDA_FD_WAVES=1 VELA_CUDA_FD_MIN_TILES=8; do echo "r$r q05 d8192 $v $( [ $v = base ] || export $v; b q05 --depth 8192)"; done
  el "round $r"
done 2>&1 | tee $OUT/ab.txt
