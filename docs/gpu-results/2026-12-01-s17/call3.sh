# Session 17 call 3: the decode attention's older keys asked of L2 before the PDL wait (KV_PF in
# attention.cu / flash.cu; VELA_CUDA_DEFINES=NO_KV_PF off). attn:: GPU tests, then tg128 A/B
# interleaved, 2 rounds: q05 / s2 / g3 at depth 0 and 512 (attention_part2), q05 / l8 at 8192
# (flash_decode) and l8 at 0.
R=$PWD
source scripts/gpu-quick-env.sh
xz -dc $R/target/gpu-data/quick/s2vocab.gguf.xz > /tmp/s2vocab.gguf
xz -dc $R/target/gpu-data/quick/g3vocab.gguf.xz > /tmp/g3vocab.gguf
VELA_REQUIRE_GPU=1 timeout 200 /tmp/gpu-test --test-threads 1 attn:: > $OUT/t-attn.txt 2>&1
echo "attn tests rc=$?"; grep -E "test result|panicked" $OUT/t-attn.txt | head -4
cd /tmp
[ -f /tmp/q05.gguf ] || /tmp/vela synth --arch qwen2.5-0.5b --type q4_k_m -o /tmp/q05.gguf -t 8 >/dev/null 2>&1
[ -f /tmp/s2.gguf ] || /tmp/vela synth --arch smollm2-135m --type q4_1 --tokenizer /tmp/s2vocab.gguf -o /tmp/s2.gguf -t 8 >/dev/null 2>&1
[ -f /tmp/g3.gguf ] || /tmp/vela synth --arch gemma3-270m --type q4_k_m --tokenizer /tmp/g3vocab.gguf -o /tmp/g3.gguf -t 8 >/dev/null 2>&1
[ -f /tmp/l8.gguf ] || /tmp/vela synth --arch llama3-8b --type q4_0 -o /tmp/l8.gguf -t 16 >/dev/null 2>&1
B() { m=$1; tag=$2; d=$3; shift 3; echo "== $m $tag d$d $(env "$@" /tmp/vela bench -m /tmp/$m.gguf --device cuda -r 2 -p 0 -n 128 --depth $d 2>&1 | grep -oE 'tg128[^|]*\| [0-9.]+ ± [0-9.]+')"; }
for i in 1 2; do
  for d in 0 512; do for m in q05 s2 g3; do
    B $m pf $d
    B $m nopf $d VELA_CUDA_DEFINES=NO_KV_PF
  done; done
  for md in q05:8192 l8:8192 l8:0; do
    B ${md%%:*} pf ${md#*:}
    B ${md%%:*} nopf ${md#*:} VELA_CUDA_DEFINES=NO_KV_PF
  done
done
