# Session 21, call 4: two more load-order changes found in the SASS (same arithmetic):
#  - act_q8*/act_q8k* (the gated activation + quantization): all loads before the division's
#    slow-path branch (ACT_SERIAL: the old order, 8 / 2 dependent round trips);
#  - mvks (split-row k-quant matvec): a round's activation blocks loaded before its arithmetic
#    (MVKS_ASERIAL: the old order, one round trip per sub-block; the new code has 116-120
#    registers instead of 70 for one row per warp).
# GPU tests of the products and fused decode ops, greedy md5 (must equal call 1's), then tg128
# A/B at depth 0 on q05, g3, s2, l8 and l8k (synth Llama-3-8B Q4_K_M), 2 rounds.
R=$PWD
source scripts/gpu-quick-env.sh
VELA_REQUIRE_GPU=1 timeout 200 /tmp/gpu-test --test-threads 1 kernels2::matvec kernels2::split_rows kernels2::exact_matmul kernels2::fused_decode mix:: model::graph_decode_matches_plain > $OUT/t.txt 2>&1
echo "tests rc=$?"; grep -E "^test |test result|panicked" $OUT/t.txt | head -30
xz -dc $R/target/gpu-data/quick/s2vocab.gguf.xz > /tmp/s2vocab.gguf
xz -dc $R/target/gpu-data/quick/g3vocab.gguf.xz > /tmp/g3vocab.gguf
cd /tmp
/tmp/vela synth --arch qwen2.5-0.5b --type q4_k_m -o /tmp/q05.gguf -t 8 >/dev/null 2>&1
/tmp/vela synth --arch smollm2-135m --type q4_1 --tokenizer /tmp/s2vocab.gguf -o /tmp/s2.gguf -t 8 >/dev/null 2>&1
/tmp/vela synth --arch gemma3-270m --type q4_k_m --tokenizer /tmp/g3vocab.gguf -o /tmp/g3.gguf -t 8 >/dev/null 2>&1
/tmp/vela synth --arch llama3-8b --type q4_0 -o /tmp/l8.gguf -t 16 >/dev/null 2>&1
/tmp/vela synth --arch llama3-8b --type q4_k_m -o /tmp/l8k.gguf -t 16 >/dev/null 2>&1
for m in q05 s2 g3 l8 l8k; do
  echo "md5 $m $(/tmp/vela run -m /tmp/$m.gguf --device cuda --prompt 'The capital of France is' --temperature 0 --max-tokens 64 2>/dev/null | md5sum | cut -c1-12) serial $(VELA_CUDA_DEFINES=ACT_SERIAL,MVKS_ASERIAL /tmp/vela run -m /tmp/$m.gguf --device cuda --prompt 'The capital of France is' --temperature 0 --max-tokens 64 2>/dev/null | md5sum | cut -c1-12)"
done | tee $OUT/md5.txt
B() { m=$1; tag=$2; d=$3; shift 3; echo "== $m $tag d$d $(env "$@" /tmp/vela bench -m /tmp/$m.gguf --device cuda -r 2 -p 0 -n 128 --depth $d 2>&1 | grep -oE 'tg128[^|]*\| [0-9.]+ ± [0-9.]+')"; }
for i in 1 2; do for m in q05 g3 s2 l8 l8k; do
  B $m new 0
  B $m act_serial 0 VELA_CUDA_DEFINES=ACT_SERIAL
  case $m in q05|g3|l8k) B $m mvks_serial 0 VELA_CUDA_DEFINES=MVKS_ASERIAL;; esac
done; done | tee $OUT/ab.txt
