source scripts/gpu-quick-env.sh
cd /tmp
/tmp/vela synth --arch qwen2.5-0.5b --type q4_k_m -o /tmp/q05.gguf -t 8 >/dev/null 2>&1
/tmp/vela synth --arch smollm2-135m --type q4_1 -o /tmp/s2.gguf -t 8 >/dev/null 2>&1
/tmp/vela synth --arch gemma3-270m --type q4_k_m -o /tmp/g3.gguf -t 8 >/dev/null 2>&1
VELA_REQUIRE_GPU=1 timeout 100 /tmp/gpu-test --test-threads 1 attn:: 2>&1 | grep -E "test result|panicked"
B() { m=$1; tag=$2; d=$3; shift 3; echo "== $m $tag d$d $(env "$@" /tmp/vela bench -m /tmp/$m.gguf --device cuda -r 2 -p 0 -n 128 --depth $d 2>&1 | grep -oE 'tg128[^|]*\| [0-9.]+ ± [0-9.]+')"; }
for i in 1 2; do
  B g3 base 8192 X=1; B g3 d256off 8192 VELA_CUDA_FD_D256=0
  B s2 base 0 X=1; B s2 pf0 0 VELA_CUDA_L2PF=0; B s2 min256K 0 VELA_CUDA_L2PF_MIN=256; B s2 min512K 0 VELA_CUDA_L2PF_MIN=512; B s2 min1M 0 VELA_CUDA_L2PF_MIN=1024
  B q05 base 0 X=1; B q05 min256K 0 VELA_CUDA_L2PF_MIN=256; B q05 min512K 0 VELA_CUDA_L2PF_MIN=512
done
