source scripts/gpu-quick-env.sh
cd /tmp
[ -s /tmp/l8.gguf ] || /tmp/vela synth --arch llama3-8b --type q4_0 -o /tmp/l8.gguf -t 12 >/dev/null 2>&1
B() { m=$1; tag=$2; d=$3; shift 3; echo "== $m $tag d$d $(env "$@" /tmp/vela bench -m /tmp/$m.gguf --device cuda -r 2 -p 0 -n 128 --depth $d 2>&1 | grep -oE 'tg128[^|]*\| [0-9.]+ ± [0-9.]+')"; }
for i in 1 2 3; do B l8 base 0 X=1; B l8 max20M 0 VELA_CUDA_L2PF_MAX=20480; B l8 max12M 0 VELA_CUDA_L2PF_MAX=12288; done
