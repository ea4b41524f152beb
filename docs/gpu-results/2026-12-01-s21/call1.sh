# For session 21's first call (quick pack, plus s2vocab / g3vocab): is the default decode
# deterministic? Session 20's guard on the matvecs' wait first let ptxas hoist activation loads
# above it (a race, calls 9-10); the fix (coherent activation loads, checked in the SASS by
# scripts/sass-check.sh) ran in the suite but not through repeated runs. 10 greedy runs each of
# q05, s2, g3 (synth) and l8; every md5 of a model must be equal.
R=$PWD
source scripts/gpu-quick-env.sh
xz -dc $R/target/gpu-data/quick/s2vocab.gguf.xz > /tmp/s2vocab.gguf
xz -dc $R/target/gpu-data/quick/g3vocab.gguf.xz > /tmp/g3vocab.gguf
cd /tmp
/tmp/vela synth --arch qwen2.5-0.5b --type q4_k_m -o /tmp/q05.gguf -t 8 >/dev/null 2>&1
/tmp/vela synth --arch smollm2-135m --type q4_1 --tokenizer /tmp/s2vocab.gguf -o /tmp/s2.gguf -t 8 >/dev/null 2>&1
/tmp/vela synth --arch gemma3-270m --type q4_k_m --tokenizer /tmp/g3vocab.gguf -o /tmp/g3.gguf -t 8 >/dev/null 2>&1
/tmp/vela synth --arch llama3-8b --type q4_0 -o /tmp/l8.gguf -t 16 >/dev/null 2>&1
for m in q05 s2 g3 l8; do for r in 1 2 3 4 5 6 7 8 9 10; do
  echo "$m $(/tmp/vela run -m /tmp/$m.gguf --device cuda --prompt 'The capital of France is' --temperature 0 --max-tokens 64 2>/dev/null | md5sum | cut -c1-12)"
done; done | sort | uniq -c | tee $OUT/md5.txt
# Then the prepared split-row variants (mv_layout.cu 15-17, not yet run; ptxas 12.9: 4 rows per
# warp 140 registers, the caps of 5 / 6 blocks per SM 96 / 80 registers with 50 / 184 bytes of
# spills in the double-buffered single products) against the pure read (0, 8) and the no-L1 split
# rows (9, today's vela), 2 rounds.
cd $R
nvcc=$(command -v nvcc || ls /usr/local/cuda*/bin/nvcc 2>/dev/null | head -1)
$nvcc -O3 -arch=sm_90 crates/vela-cuda/bench/mv_layout.cu -o /tmp/mv_layout && timeout 200 /tmp/mv_layout arena 2 8,9,15,16,17 | tee $OUT/mv.txt | grep -E "FAIL|CHAIN"
