# Session 17 call 5 (after the suite): the attention parts' L2 prefetch one per 128-byte line
# (VELA_CUDA_DEFINES=KV_PF_LINE128) vs one per 32-byte sector (default), tg128 interleaved,
# 2 rounds; then q05's decode with one kernel family skipped at a time (VELA_CUDA_SKIP; results
# wrong, times real), as session 16's call 4, with this session's kernels.
R=$PWD
source scripts/gpu-quick-env.sh
xz -dc $R/target/gpu-data/quick/s2vocab.gguf.xz > /tmp/s2vocab.gguf
xz -dc $R/target/gpu-data/quick/g3vocab.gguf.xz > /tmp/g3vocab.gguf
cd /tmp
/tmp/vela synth --arch qwen2.5-0.5b --type q4_k_m -o /tmp/q05.gguf -t 8 >/dev/null 2>&1
/tmp/vela synth --arch smollm2-135m --type q4_1 --tokenizer /tmp/s2vocab.gguf -o /tmp/s2.gguf -t 8 >/dev/null 2>&1
/tmp/vela synth --arch gemma3-270m --type q4_k_m --tokenizer /tmp/g3vocab.gguf -o /tmp/g3.gguf -t 8 >/dev/null 2>&1
B() { m=$1; tag=$2; d=$3; shift 3; echo "== $m $tag d$d $(env "$@" /tmp/vela bench -m /tmp/$m.gguf --device cuda -r 2 -p 0 -n 128 --depth $d 2>&1 | grep -oE 'tg128[^|]*\| [0-9.]+ ± [0-9.]+')"; }
for i in 1 2; do
  for m in q05 s2 g3; do B $m pf32 0; B $m pf128 0 VELA_CUDA_DEFINES=KV_PF_LINE128; done
  B q05 pf32 512; B q05 pf128 512 VELA_CUDA_DEFINES=KV_PF_LINE128
done
B q05 real 0
for s in norm_q8 rope_ attention_part attention_combine act_q8 mv_ "norm_q8,rope_,attention_,flash_,act_q8"; do B q05 "skip:$s" 0 VELA_CUDA_SKIP=$s; done
B q05 real 0
