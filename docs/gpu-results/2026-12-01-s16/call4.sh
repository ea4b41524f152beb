# Session 16 call 4: where q05's and s2's decode chain goes, one kernel family skipped at a time
# (VELA_CUDA_SKIP; results wrong, times real), and the per-kernel GPU times (VELA_CUDA_PROFILE=1,
# graphs off).
R=$PWD
source scripts/gpu-quick-env.sh
cd /tmp
xz -dc $R/target/gpu-data/quick/s2vocab.gguf.xz > /tmp/s2vocab.gguf
/tmp/vela synth --arch qwen2.5-0.5b --type q4_k_m -o /tmp/q05.gguf -t 8 >/dev/null 2>&1
/tmp/vela synth --arch smollm2-135m --type q4_1 --tokenizer /tmp/s2vocab.gguf -o /tmp/s2.gguf -t 8 >/dev/null 2>&1
B() { m=$1; tag=$2; shift 2; echo "== $m $tag $(env "$@" /tmp/vela bench -m /tmp/$m.gguf --device cuda -r 2 -p 0 -n 128 2>&1 | grep -oE 'tg128[^|]*\| [0-9.]+ ± [0-9.]+')"; }
for m in q05 s2; do
  B $m real
  for s in norm_q8 rope_ attention_part attention_combine flash_decode act_q8 mv_ prefetch_l2 "norm_q8,rope_,attention_,flash_,act_q8" ; do B $m "skip:$s" VELA_CUDA_SKIP=$s; done
  B $m real
  VELA_CUDA_PROFILE=1 /tmp/vela bench -m /tmp/$m.gguf --device cuda -r 1 -p 0 -n 128 > $OUT/profile-$m.txt 2>&1
done
