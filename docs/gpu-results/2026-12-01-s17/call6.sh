# Session 17 call 6: fewer round trips after the wait in the split-K attention: attention_combine
# loads its first 8 values per thread together with the parts' (m, l) (COMBINE_PRE0 off), and
# attention_part2 loads the V rows of each thread's first 2 keys with q (PART_VPRE0 off); both
# bit-equal. Attention GPU tests, tg128 A/B interleaved (2 rounds), greedy md5.
R=$PWD
source scripts/gpu-quick-env.sh
xz -dc $R/target/gpu-data/quick/s2vocab.gguf.xz > /tmp/s2vocab.gguf
xz -dc $R/target/gpu-data/quick/g3vocab.gguf.xz > /tmp/g3vocab.gguf
VELA_REQUIRE_GPU=1 timeout 100 /tmp/gpu-test --test-threads 1 attn:: split_attention attention_and_kv fused_decode_ops > $OUT/t-attn.txt 2>&1
echo "attention tests rc=$?"; grep -E "test result|panicked" $OUT/t-attn.txt | head -4
cd /tmp
/tmp/vela synth --arch qwen2.5-0.5b --type q4_k_m -o /tmp/q05.gguf -t 8 >/dev/null 2>&1
/tmp/vela synth --arch smollm2-135m --type q4_1 --tokenizer /tmp/s2vocab.gguf -o /tmp/s2.gguf -t 8 >/dev/null 2>&1
/tmp/vela synth --arch gemma3-270m --type q4_k_m --tokenizer /tmp/g3vocab.gguf -o /tmp/g3.gguf -t 8 >/dev/null 2>&1
B() { m=$1; tag=$2; d=$3; shift 3; echo "== $m $tag d$d $(env "$@" /tmp/vela bench -m /tmp/$m.gguf --device cuda -r 2 -p 0 -n 128 --depth $d 2>&1 | grep -oE 'tg128[^|]*\| [0-9.]+ ± [0-9.]+')"; }
for i in 1 2; do for m in q05 s2 g3; do
  B $m def 0; B $m nocpre 0 VELA_CUDA_DEFINES=COMBINE_PRE0; B $m novpre 0 VELA_CUDA_DEFINES=PART_VPRE0
done; done
for m in q05 g3; do for f in "" "COMBINE_PRE0,PART_VPRE0"; do echo "md5 $m [$f] $(VELA_CUDA_DEFINES=$f /tmp/vela run -m /tmp/$m.gguf --device cuda --prompt 'The capital of France is' --temperature 0 -n 64 2>/dev/null | md5sum)"; done; done
