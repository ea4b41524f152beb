# Session 18, call 2 (quick pack of the warp-parts-by-default build): the warp-per-part attention
# on the 8B (head dim 128) at depths 0 and 512, off (VELA_CUDA_ATTN_WARP=0) vs the new default
# (unset = 2: head dims 64 / 128), 2 rounds interleaved; the small models default vs off once
# (Gemma 3's head dim 256 must equal off); greedy md5 off / default.
R=$PWD
source scripts/gpu-quick-env.sh
xz -dc $R/target/gpu-data/quick/s2vocab.gguf.xz > /tmp/s2vocab.gguf
xz -dc $R/target/gpu-data/quick/g3vocab.gguf.xz > /tmp/g3vocab.gguf
cd /tmp
/tmp/vela synth --arch llama3-8b --type q4_0 -o /tmp/l8.gguf -t 16 >/dev/null 2>&1
/tmp/vela synth --arch qwen2.5-0.5b --type q4_k_m -o /tmp/q05.gguf -t 8 >/dev/null 2>&1
/tmp/vela synth --arch smollm2-135m --type q4_1 --tokenizer /tmp/s2vocab.gguf -o /tmp/s2.gguf -t 8 >/dev/null 2>&1
/tmp/vela synth --arch gemma3-270m --type q4_k_m --tokenizer /tmp/g3vocab.gguf -o /tmp/g3.gguf -t 8 >/dev/null 2>&1
B() { m=$1; tag=$2; d=$3; shift 3; echo "== $m $tag d$d $(env "$@" /tmp/vela bench -m /tmp/$m.gguf --device cuda -r 2 -p 0 -n 128 --depth $d 2>&1 | grep -oE 'tg128[^|]*\| [0-9.]+ ± [0-9.]+')"; }
for i in 1 2; do for d in 0 512; do
  B l8 w0 $d VELA_CUDA_ATTN_WARP=0; B l8 auto $d
done; done
for m in q05 s2 g3; do B $m w0 0 VELA_CUDA_ATTN_WARP=0; B $m auto 0; done
for m in l8 q05 g3; do for w in 0 2; do echo "md5 $m w$w $(VELA_CUDA_ATTN_WARP=$w /tmp/vela run -m /tmp/$m.gguf --device cuda --prompt 'The capital of France is' --temperature 0 -n 64 2>/dev/null | md5sum)"; done; done
