source scripts/gpu-quick-env.sh
R=$PWD
/tmp/vela synth --arch qwen2.5-0.5b --type q4_k_m -o /tmp/q05.gguf -t 8 >/dev/null 2>&1
/tmp/vela synth --arch smollm2-135m --type q4_1 --tokenizer $R/target/gpu-data/quick/tok-s2.gguf -o /tmp/s2.gguf -t 8 >/dev/null 2>&1
B() { m=$1; tag=$2; d=$3; shift 3; echo "== $m $tag d$d $(env "$@" /tmp/vela bench -m /tmp/$m.gguf --device cuda -r 2 -p 0 -n 128 --depth $d 2>&1 | grep -oE 'tg128[^|]*\| [0-9.]+ ± [0-9.]+')"; }
cd /tmp; for i in 1 2; do
  B s2 base 0 X=1; B s2 stepmin0 0 VELA_CUDA_L2PF_STEP_MIN=0; B s2 pf0 0 VELA_CUDA_L2PF=0
  B q05 base 0 X=1; B q05 stepmin0 0 VELA_CUDA_L2PF_STEP_MIN=0; B q05 pf0 0 VELA_CUDA_L2PF=0
done
