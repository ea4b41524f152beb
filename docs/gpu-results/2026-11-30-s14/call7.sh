source scripts/gpu-quick-env.sh
mkdir -p $VELA_CACHE/llama.cpp-cuda; tar xJf target/gpu-data/quick/lb.tar.xz -C /tmp && ln -sfn /tmp/llama-bench-cuda "$VELA_CACHE/llama.cpp-cuda/bin"
( [ -s /tmp/q05.gguf ] || /tmp/vela synth --arch qwen2.5-0.5b --type q4_k_m -o /tmp/q05.gguf -t 4 >/dev/null 2>&1 ) & p1=$!
[ -s /tmp/l8.gguf ] || /tmp/vela synth --arch llama3-8b --type q4_0 -o /tmp/l8.gguf -t 12 >/dev/null 2>&1
wait $p1
BL=(python3 scripts/bench-vs-llama.py --vela /tmp/vela --flavors cuda --threads 16 --reps 3 "--llama-args=-ngl 99" "--vela-args=--device cuda")
for m in l8 q05; do timeout 150 "${BL[@]}" --models /tmp/$m.gguf --out $OUT/vs-llama-$m.md 2>&1 | grep -E "\| $m \||ratio" | head -4; done
B() { m=$1; tag=$2; shift 2; echo "== $m $tag $(env "$@" /tmp/vela bench -m /tmp/$m.gguf --device cuda -r 2 -p 0 -n 128 2>&1 | grep -oE 'tg128[^|]*\| [0-9.]+ ± [0-9.]+')"; }
for i in 1 2; do B l8 pf4 X=1; B l8 gap4 VELA_CUDA_L2PF_GAP=1; B l8 pf0 VELA_CUDA_L2PF=0; done
for i in 1 2; do B q05 pf4 X=1; B q05 gap4 VELA_CUDA_L2PF_GAP=1; B q05 gap2 VELA_CUDA_L2PF_GAP=1 VELA_CUDA_L2PF=2; B q05 pf0 VELA_CUDA_L2PF=0; done
