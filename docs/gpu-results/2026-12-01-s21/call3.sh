# Session 21, call 3: the warp attention parts with every load of a piece in flight at once
# (attention_partw_pre, default for head dims 64 / 128) against attention_partw
# (VELA_CUDA_DEFINES=PARTW_SERIAL). The attention GPU tests first (warp parts against the CPU and
# the block parts, windows, long contexts, graph replay), greedy md5 (must equal call 1's: the
# arithmetic is unchanged), then tg128 A/B at depths 0 / 512 / 1024, q05 / s2 / l8, 2 rounds.
R=$PWD
source scripts/gpu-quick-env.sh
VELA_REQUIRE_GPU=1 timeout 200 /tmp/gpu-test --test-threads 1 attn:: attention split_attention model::graph_decode_matches_plain model::smollm2_gpu_matches_cpu > $OUT/t-attn.txt 2>&1
echo "tests rc=$?"; grep -E "^test |test result|panicked" $OUT/t-attn.txt | head -30
xz -dc $R/target/gpu-data/quick/s2vocab.gguf.xz > /tmp/s2vocab.gguf
xz -dc $R/target/gpu-data/quick/g3vocab.gguf.xz > /tmp/g3vocab.gguf
cd /tmp
/tmp/vela synth --arch qwen2.5-0.5b --type q4_k_m -o /tmp/q05.gguf -t 8 >/dev/null 2>&1
/tmp/vela synth --arch smollm2-135m --type q4_1 --tokenizer /tmp/s2vocab.gguf -o /tmp/s2.gguf -t 8 >/dev/null 2>&1
/tmp/vela synth --arch gemma3-270m --type q4_k_m --tokenizer /tmp/g3vocab.gguf -o /tmp/g3.gguf -t 8 >/dev/null 2>&1
/tmp/vela synth --arch llama3-8b --type q4_0 -o /tmp/l8.gguf -t 16 >/dev/null 2>&1
for m in q05 s2 g3 l8; do for v in pre serial; do
  if [ $v = serial ]; then export VELA_CUDA_DEFINES=PARTW_SERIAL; else unset VELA_CUDA_DEFINES; fi
  echo "md5 $m $v $(/tmp/vela run -m /tmp/$m.gguf --device cuda --prompt 'The capital of France is' --temperature 0 --max-tokens 64 2>/dev/null | md5sum | cut -c1-12)"
done; done | tee $OUT/md5.txt
unset VELA_CUDA_DEFINES
B() { m=$1; tag=$2; d=$3; shift 3; echo "== $m $tag d$d $(env "$@" /tmp/vela bench -m /tmp/$m.gguf --device cuda -r 2 -p 0 -n 128 --depth $d 2>&1 | grep -oE 'tg128[^|]*\| [0-9.]+ ± [0-9.]+')"; }
for i in 1 2; do for m in q05 s2 l8; do for d in 0 512 1024; do
  B $m pre $d
  B $m serial $d VELA_CUDA_DEFINES=PARTW_SERIAL
done; done; done | tee $OUT/ab.txt
