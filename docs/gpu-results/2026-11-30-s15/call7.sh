source scripts/gpu-quick-env.sh
R=$PWD
/tmp/vela synth --arch smollm2-135m --type q4_1 --tokenizer $R/target/gpu-data/quick/tok-s2.gguf -o /tmp/s2.gguf -t 8 >/dev/null 2>&1
/tmp/vela synth --arch gemma3-270m --type q4_k_m --tokenizer $R/target/gpu-data/quick/tok-g3.gguf -o /tmp/g3.gguf -t 8 >/dev/null 2>&1
B() { m=$1; tag=$2; d=$3; shift 3; echo "== $m $tag d$d $(env "$@" /tmp/vela bench -m /tmp/$m.gguf --device cuda -r 2 -p 0 -n 128 --depth $d 2>&1 | grep -oE 'tg128[^|]*\| [0-9.]+ ± [0-9.]+')"; }
cd /tmp; for i in 1 2; do
  B g3 base 8192 X=1; B g3 d256off 8192 VELA_CUDA_FD_D256=0
  B s2 base 0 X=1; B s2 pf0 0 VELA_CUDA_L2PF=0; B s2 min256K 0 VELA_CUDA_L2PF_MIN=256; B s2 min512K 0 VELA_CUDA_L2PF_MIN=512; B s2 min1M 0 VELA_CUDA_L2PF_MIN=1024

done
