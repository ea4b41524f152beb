# Session 19, call 7: steps under 1 GiB of weights prefetch at most 2 MiB per product (the new
# default from call 6; VELA_CUDA_L2PF_SMALL=4: as before) on q05 and g3 (Gemma 3 270M geometry,
# about 246 MB per token, not in call 6), 3 rounds.
R=$PWD
source scripts/gpu-quick-env.sh
xz -dc $R/target/gpu-data/quick/g3vocab.gguf.xz > /tmp/g3vocab.gguf
cd /tmp
/tmp/vela synth --arch qwen2.5-0.5b --type q4_k_m -o /tmp/q05.gguf -t 8 >/dev/null 2>&1
/tmp/vela synth --arch gemma3-270m --type q4_k_m --tokenizer /tmp/g3vocab.gguf -o /tmp/g3.gguf -t 8 >/dev/null 2>&1
B() { m=$1; tag=$2; d=$3; shift 3; echo "== $m $tag d$d $(env "$@" /tmp/vela bench -m /tmp/$m.gguf --device cuda -r 2 -p 0 -n 128 --depth $d 2>&1 | grep -oE 'tg128[^|]*\| [0-9.]+ ± [0-9.]+')"; }
for i in 1 2 3; do
  for m in q05 g3; do B $m small2 0; B $m small4 0 VELA_CUDA_L2PF_SMALL=4; done
done
B q05 small2 512; B q05 small4 512 VELA_CUDA_L2PF_SMALL=4
