# Session 17 call 4: constants before the PDL wait in the pre-norms (norm weights; NORM_ENTRY /
# NORM_RESUME, VELA_CUDA_DEFINES=NORM_WAIT_FIRST off) and in RoPE + store (position and first
# angle; ROPE_WAIT_FIRST off), with call 3's attention-part L2 prefetch on (NO_KV_PF off).
# GPU tests but the real-model ones, then tg128 A/B interleaved, 2 rounds.
R=$PWD
source scripts/gpu-quick-env.sh
xz -dc $R/target/gpu-data/quick/s2vocab.gguf.xz > /tmp/s2vocab.gguf
xz -dc $R/target/gpu-data/quick/g3vocab.gguf.xz > /tmp/g3vocab.gguf
VELA_REQUIRE_GPU=1 timeout 200 /tmp/gpu-test --test-threads 1 --skip model:: > $OUT/t-all.txt 2>&1
echo "gpu tests rc=$?"; grep -E "test result|panicked" $OUT/t-all.txt | head -4
cd /tmp
[ -f /tmp/q05.gguf ] || /tmp/vela synth --arch qwen2.5-0.5b --type q4_k_m -o /tmp/q05.gguf -t 8 >/dev/null 2>&1
[ -f /tmp/s2.gguf ] || /tmp/vela synth --arch smollm2-135m --type q4_1 --tokenizer /tmp/s2vocab.gguf -o /tmp/s2.gguf -t 8 >/dev/null 2>&1
[ -f /tmp/g3.gguf ] || /tmp/vela synth --arch gemma3-270m --type q4_k_m --tokenizer /tmp/g3vocab.gguf -o /tmp/g3.gguf -t 8 >/dev/null 2>&1
[ -f /tmp/l8.gguf ] || /tmp/vela synth --arch llama3-8b --type q4_0 -o /tmp/l8.gguf -t 16 >/dev/null 2>&1
B() { m=$1; tag=$2; d=$3; shift 3; echo "== $m $tag d$d $(env "$@" /tmp/vela bench -m /tmp/$m.gguf --device cuda -r 2 -p 0 -n 128 --depth $d 2>&1 | grep -oE 'tg128[^|]*\| [0-9.]+ ± [0-9.]+')"; }
for i in 1 2; do
  for m in q05 s2 g3; do
    B $m def 0
    B $m normwait 0 VELA_CUDA_DEFINES=NORM_WAIT_FIRST
    B $m ropewait 0 VELA_CUDA_DEFINES=ROPE_WAIT_FIRST
  done
  B l8 def 0
  B l8 none 0 VELA_CUDA_DEFINES=NORM_WAIT_FIRST,ROPE_WAIT_FIRST,NO_KV_PF
done
for m in q05 g3; do for f in "" "NORM_WAIT_FIRST,ROPE_WAIT_FIRST,NO_KV_PF"; do echo "md5 $m [$f] $(VELA_CUDA_DEFINES=$f /tmp/vela run -m /tmp/$m.gguf --device cuda --prompt 'The capital of France is' --temperature 0 -n 64 2>/dev/null | md5sum)"; done; done
