# Session 19, call 6 (same binaries as call 5): the L2 prefetch budget per product
# (VELA_CUDA_L2PF MiB, default 4, tuned in session 14 before the chain got shorter) on l8 at
# depths 0 / 512 and q05 at depth 0, 2 rounds.
R=$PWD
source scripts/gpu-quick-env.sh
cd /tmp
/tmp/vela synth --arch qwen2.5-0.5b --type q4_k_m -o /tmp/q05.gguf -t 8 >/dev/null 2>&1
/tmp/vela synth --arch llama3-8b --type q4_0 -o /tmp/l8.gguf -t 16 >/dev/null 2>&1
B() { m=$1; tag=$2; d=$3; shift 3; echo "== $m $tag d$d $(env "$@" /tmp/vela bench -m /tmp/$m.gguf --device cuda -r 2 -p 0 -n 128 --depth $d 2>&1 | grep -oE 'tg128[^|]*\| [0-9.]+ ± [0-9.]+')"; }
for i in 1 2; do
  for p in 4 0 2 8; do B l8 pf$p 0 VELA_CUDA_L2PF=$p; done
  for p in 4 8; do B l8 pf$p 512 VELA_CUDA_L2PF=$p; done
  for p in 4 2 8; do B q05 pf$p 0 VELA_CUDA_L2PF=$p; done
done
