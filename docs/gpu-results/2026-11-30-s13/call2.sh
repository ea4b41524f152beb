source scripts/gpu-quick-env.sh
cd /tmp; ls -la /tmp/*.gguf 2>&1 | head
[ -f /tmp/g12.gguf ] || /tmp/vela synth --arch gemma4-12b --type q4_0 -o /tmp/g12.gguf -t 16 >/dev/null 2>&1
[ -f /tmp/q05.gguf ] || /tmp/vela synth --arch qwen2.5-0.5b --type q4_k_m -o /tmp/q05.gguf -t 8 >/dev/null 2>&1
B() { m=$1; tag=$2; shift 2; echo "== $tag"; env "$@" /tmp/vela bench -m /tmp/$m.gguf --device cuda -r 2 $BA 2>&1 | grep -oE '(pp|tg)[0-9]+[^|]*\| [0-9.]+ ± [0-9.]+' ; }
BA="-p 2048 -n 0"; B g12 gemm0 VELA_CUDA_ATTN_GEMM=0; B g12 gemm1 VELA_CUDA_ATTN_GEMM=1
BA="-p 0 -n 128"; B g12 pad0 VELA_CUDA_Q6K_PAD=0; B g12 pad1 VELA_CUDA_Q6K_PAD=1; B q05 q05pad0 VELA_CUDA_Q6K_PAD=0; B q05 q05pad1 VELA_CUDA_Q6K_PAD=1
