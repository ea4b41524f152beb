# Session 16 call 2: the norm prologue (`*_x3n`, VELA_CUDA_NORM_PRO=1): its GPU test, every GPU
# test with it on (q05), greedy output with it off / on, and tg128 A/B on q05 and s2.
R=$PWD
source scripts/gpu-quick-env.sh
cd /tmp
xz -dc $R/target/gpu-data/quick/s2vocab.gguf.xz > /tmp/s2vocab.gguf
/tmp/vela synth --arch qwen2.5-0.5b --type q4_k_m -o /tmp/q05.gguf -t 8 >/dev/null 2>&1
/tmp/vela synth --arch smollm2-135m --type q4_1 --tokenizer /tmp/s2vocab.gguf -o /tmp/s2.gguf -t 8 >/dev/null 2>&1
ls -la /tmp/*.gguf
VELA_REQUIRE_GPU=1 timeout 120 /tmp/gpu-test --test-threads 1 mix::norm_prologue > $OUT/t-npro.txt 2>&1
echo "npro test rc=$?"; grep -E "test result|panicked" $OUT/t-npro.txt | head -5; grep -c "RESULT.*| ok |" $OUT/t-npro.txt; grep -m3 FAIL $OUT/t-npro.txt
for p in 0 1; do for m in q05 s2; do
  VELA_CUDA_NORM_PRO=$p /tmp/vela run -m /tmp/$m.gguf --device cuda --prompt "The capital of France is" --temperature 0 --max-tokens 64 > /tmp/out-$m-$p.txt 2>/dev/null
  echo "greedy $m pro=$p $(md5sum < /tmp/out-$m-$p.txt)"; done; done
B() { m=$1; tag=$2; shift 2; echo "== $m $tag $(env "$@" /tmp/vela bench -m /tmp/$m.gguf --device cuda -r 2 -p 0 -n 128 2>&1 | grep -oE 'tg128[^|]*\| [0-9.]+ ± [0-9.]+')"; }
for i in 1 2; do
  B q05 off VELA_CUDA_NORM_PRO=0; B q05 pro VELA_CUDA_NORM_PRO=1
  B s2 off VELA_CUDA_NORM_PRO=0; B s2 pro VELA_CUDA_NORM_PRO=1
done
VELA_CUDA_NORM_PRO=1 VELA_GPU_MODEL=/tmp/q05.gguf VELA_REQUIRE_GPU=1 timeout 200 /tmp/gpu-test --test-threads 1 > $OUT/gpu-test-pro.txt 2>&1
echo "gpu-test (pro on) rc=$?"; grep -E "test result|panicked" $OUT/gpu-test-pro.txt | head
