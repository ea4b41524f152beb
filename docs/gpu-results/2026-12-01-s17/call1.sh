# Session 17 call 1: the overlap probe (prepared in session 16, first run), then the zero-code
# attention A/Bs on q05 / s2 at depth 0 and 512: the tensor-core decode attention at every length
# (VELA_CUDA_FD_MIN_KEYS=0) and one block per KV head (VELA_CUDA_ATTN_PART=3), interleaved, 2 rounds.
R=$PWD
source scripts/gpu-quick-env.sh
xz -dc $R/target/gpu-data/quick/s2vocab.gguf.xz > /tmp/s2vocab.gguf
VELA_REQUIRE_GPU=1 timeout 120 /tmp/gpu-test --test-threads 1 --nocapture probe:: > $OUT/t-probe.txt 2>&1
echo "probe rc=$?"; grep -E "RESULT|test result|panicked" $OUT/t-probe.txt
cd /tmp
[ -f /tmp/q05.gguf ] || /tmp/vela synth --arch qwen2.5-0.5b --type q4_k_m -o /tmp/q05.gguf -t 8 >/dev/null 2>&1
[ -f /tmp/s2.gguf ] || /tmp/vela synth --arch smollm2-135m --type q4_1 --tokenizer /tmp/s2vocab.gguf -o /tmp/s2.gguf -t 8 >/dev/null 2>&1
B() { m=$1; tag=$2; d=$3; shift 3; echo "== $m $tag d$d $(env "$@" /tmp/vela bench -m /tmp/$m.gguf --device cuda -r 2 -p 0 -n 128 --depth $d 2>&1 | grep -oE 'tg128[^|]*\| [0-9.]+ ± [0-9.]+')"; }
for i in 1 2; do for d in 0 512; do for m in q05 s2; do
  B $m def $d
  B $m fd0 $d VELA_CUDA_FD_MIN_KEYS=0
  B $m part3 $d VELA_CUDA_ATTN_PART=3
done; done; done
