# Session 17 call 2: the fused split-K merge (attention_part2c_*: the last block per (head, token)
# merges the parts; VELA_CUDA_FUSED_COMBINE=0 off). Every GPU test, then tg128 A/B interleaved,
# 2 rounds: q05 / s2 / g3 at depth 0 and 512, the 8B Q4_0 (l8) at depth 0.
R=$PWD
source scripts/gpu-quick-env.sh
xz -dc $R/target/gpu-data/quick/s2vocab.gguf.xz > /tmp/s2vocab.gguf
xz -dc $R/target/gpu-data/quick/g3vocab.gguf.xz > /tmp/g3vocab.gguf
VELA_REQUIRE_GPU=1 timeout 200 /tmp/gpu-test --test-threads 1 > $OUT/t-all.txt 2>&1
echo "gpu tests rc=$?"; grep -E "test result|panicked|FAILED|failed" $OUT/t-all.txt | head -8
cd /tmp
[ -f /tmp/q05.gguf ] || /tmp/vela synth --arch qwen2.5-0.5b --type q4_k_m -o /tmp/q05.gguf -t 8 >/dev/null 2>&1
[ -f /tmp/s2.gguf ] || /tmp/vela synth --arch smollm2-135m --type q4_1 --tokenizer /tmp/s2vocab.gguf -o /tmp/s2.gguf -t 8 >/dev/null 2>&1
[ -f /tmp/g3.gguf ] || /tmp/vela synth --arch gemma3-270m --type q4_k_m --tokenizer /tmp/g3vocab.gguf -o /tmp/g3.gguf -t 8 >/dev/null 2>&1
[ -f /tmp/l8.gguf ] || /tmp/vela synth --arch llama3-8b --type q4_0 -o /tmp/l8.gguf -t 16 >/dev/null 2>&1
B() { m=$1; tag=$2; d=$3; shift 3; echo "== $m $tag d$d $(env "$@" /tmp/vela bench -m /tmp/$m.gguf --device cuda -r 2 -p 0 -n 128 --depth $d 2>&1 | grep -oE 'tg128[^|]*\| [0-9.]+ ± [0-9.]+')"; }
for i in 1 2; do
  for d in 0 512; do for m in q05 s2 g3; do
    B $m fc1 $d
    B $m fc0 $d VELA_CUDA_FUSED_COMBINE=0
  done; done
  B l8 fc1 0
  B l8 fc0 0 VELA_CUDA_FUSED_COMBINE=0
done
# greedy text equal with and without (md5 of 64 tokens)
for m in q05 g3; do for f in 1 0; do echo "md5 $m fc$f $(VELA_CUDA_FUSED_COMBINE=$f /tmp/vela run -m /tmp/$m.gguf --device cuda --prompt 'The capital of France is' --temperature 0 --max-tokens 64 2>/dev/null | md5sum)"; done; done
