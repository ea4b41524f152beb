# Session 16 call 10: row groups per warp of the narrow Q8_0 head kernel (2 / 4 / 8) and 64-key
# split-K chunks for head dims other than 256, tg128 A/B interleaved (2 rounds).
R=$PWD
source scripts/gpu-quick-env.sh
xz -dc $R/target/gpu-data/quick/s2vocab.gguf.xz > /tmp/s2vocab.gguf
xz -dc $R/target/gpu-data/quick/g3vocab.gguf.xz > /tmp/g3vocab.gguf
cd /tmp
[ -f /tmp/q05.gguf ] || /tmp/vela synth --arch qwen2.5-0.5b --type q4_k_m -o /tmp/q05.gguf -t 8 >/dev/null 2>&1
[ -f /tmp/s2.gguf ] || /tmp/vela synth --arch smollm2-135m --type q4_1 --tokenizer /tmp/s2vocab.gguf -o /tmp/s2.gguf -t 8 >/dev/null 2>&1
[ -f /tmp/g3.gguf ] || /tmp/vela synth --arch gemma3-270m --type q4_k_m --tokenizer /tmp/g3vocab.gguf -o /tmp/g3.gguf -t 8 >/dev/null 2>&1
B() { m=$1; tag=$2; d=$3; shift 3; echo "== $m $tag d$d $(env "$@" /tmp/vela bench -m /tmp/$m.gguf --device cuda -r 2 -p 0 -n 128 --depth $d 2>&1 | grep -oE 'tg128[^|]*\| [0-9.]+ ± [0-9.]+')"; }
for i in 1 2; do
  B g3 G4 0
  B g3 G2 0 VELA_CUDA_DEFINES=NARROW_G2 VELA_CUDA_NARROW_G=2
  B g3 G8 0 VELA_CUDA_DEFINES=NARROW_G8 VELA_CUDA_NARROW_G=8
  B q05 G4 0
  B q05 G8 0 VELA_CUDA_DEFINES=NARROW_G8 VELA_CUDA_NARROW_G=8
  B q05 c64 0 VELA_CUDA_DEFINES=SPLIT_CHUNK64 VELA_CUDA_SPLIT_CHUNK=64
  B s2 c32 0
  B s2 c64 0 VELA_CUDA_DEFINES=SPLIT_CHUNK64 VELA_CUDA_SPLIT_CHUNK=64
done
B q05 c32 512
B q05 c64 512 VELA_CUDA_DEFINES=SPLIT_CHUNK64 VELA_CUDA_SPLIT_CHUNK=64
