# Session 16 call 9: the narrow-row GPU test (narrow now the default) and every mix test; then
# llama.cpp 0c1e570 CUDA built here (scripts/build-llama-cpp-cuda.sh, FA on) and brought back in
# parts; then vela vs llama-bench, interleaved, 3 rounds: pp512 + tg128 on the synth s2, g3, q05.
R=$PWD
source scripts/gpu-quick-env.sh
xz -dc $R/target/gpu-data/quick/s2vocab.gguf.xz > /tmp/s2vocab.gguf
xz -dc $R/target/gpu-data/quick/g3vocab.gguf.xz > /tmp/g3vocab.gguf
(cd /tmp
[ -f /tmp/q05.gguf ] || /tmp/vela synth --arch qwen2.5-0.5b --type q4_k_m -o /tmp/q05.gguf -t 8 >/dev/null 2>&1
[ -f /tmp/s2.gguf ] || /tmp/vela synth --arch smollm2-135m --type q4_1 --tokenizer /tmp/s2vocab.gguf -o /tmp/s2.gguf -t 8 >/dev/null 2>&1
[ -f /tmp/g3.gguf ] || /tmp/vela synth --arch gemma3-270m --type q4_k_m --tokenizer /tmp/g3vocab.gguf -o /tmp/g3.gguf -t 8 >/dev/null 2>&1)
VELA_REQUIRE_GPU=1 timeout 150 /tmp/gpu-test --test-threads 1 mix:: > $OUT/t-mix.txt 2>&1
echo "mix tests rc=$?"; grep -E "test result|panicked" $OUT/t-mix.txt | head -3
t0=$(date +%s)
bash scripts/build-llama-cpp-cuda.sh build /tmp/llama-cuda > /tmp/lbuild.log 2>&1; echo "llama build rc=$? in $(( $(date +%s) - t0 )) s"; tail -2 /tmp/lbuild.log
bash scripts/build-llama-cpp-cuda.sh bundle /tmp/lbout > /dev/null 2>&1 && split -b 15M -d /tmp/lbout/llama-bench-cuda.tar.xz $OUT/lb.part && ls -la $OUT/
LB=/tmp/llama-cuda/build/bin
for i in 1 2 3; do for m in s2 g3 q05; do
  echo "vela $m r$i $(/tmp/vela bench -m /tmp/$m.gguf --device cuda -r 1 -p 512 -n 128 2>&1 | grep -oE '(pp512|tg128)[^|]*\| [0-9.]+' | tr '\n' ' ')"
  echo "llama $m r$i $(LD_LIBRARY_PATH=$LB $LB/llama-bench -m /tmp/$m.gguf -ngl 99 -p 512 -n 128 -r 1 2>/dev/null | grep -oE '(pp512|tg128) *\| *[0-9.]+' | tr '\n' ' ')"
done; done
