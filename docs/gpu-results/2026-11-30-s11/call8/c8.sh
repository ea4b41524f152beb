#!/bin/bash
# Session 11 call 8: repeat of call 7's A/B (POST_FAST_SUM vs rms_norm's order), minimal.
source scripts/gpu-quick-env.sh
xz -dc target/gpu-data/quick/vocab-gemma3.gguf.xz >/tmp/vocab-gemma3.gguf
timeout 60 /tmp/vela synth --arch gemma3-270m --type q4_k_m --tokenizer /tmp/vocab-gemma3.gguf -o /tmp/g3.gguf -t 16 >$OUT/synth.log 2>&1
b() { local m=$1; shift; timeout 30 /tmp/vela bench -m /tmp/$m.gguf --device cuda -p 0 -n 128 -r 3 "$@" 2>&1 | grep -o 'tg128[^|]*| [0-9.]* ± [0-9.]*'; }
for r in 1 2 3; do for d in 0 8192; do
  echo "r$r g3 d$d exact $(b g3 --depth $d)"
  echo "r$r g3 d$d fast $(VELA_CUDA_DEFINES=POST_FAST_SUM b g3 --depth $d)"
done; done 2>&1 | tee $OUT/ab.txt
