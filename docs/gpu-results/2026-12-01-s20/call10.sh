# Session 20, call 10: call 9's q05 greedy md5 differed between the no-L1 weight loads and
# MV_W_L1. Which builds agree? Greedy 32 tokens (md5 of the text), twice per configuration, for
# the session's starting binary (vela-old: d825c25's kernels), the new default, MV_W_L1,
# MV_W_L1 + MV_WAIT_UNGUARDED (= the old kernels' arithmetic and order), each also with PDL off
# (VELA_CUDA_PDL=0) and with graphs off; q05, s2, g3.
R=$PWD
source scripts/gpu-quick-env.sh
xz -dc target/gpu-data/quick/vela-old.xz > /tmp/vela-old && chmod +x /tmp/vela-old
xz -dc $R/target/gpu-data/quick/s2vocab.gguf.xz > /tmp/s2vocab.gguf
xz -dc $R/target/gpu-data/quick/g3vocab.gguf.xz > /tmp/g3vocab.gguf
cd /tmp
/tmp/vela synth --arch qwen2.5-0.5b --type q4_k_m -o /tmp/q05.gguf -t 8 >/dev/null 2>&1
/tmp/vela synth --arch smollm2-135m --type q4_1 --tokenizer /tmp/s2vocab.gguf -o /tmp/s2.gguf -t 8 >/dev/null 2>&1
/tmp/vela synth --arch gemma3-270m --type q4_k_m --tokenizer /tmp/g3vocab.gguf -o /tmp/g3.gguf -t 8 >/dev/null 2>&1
M() { m=$1; bin=$2; tag=$3; shift 3; echo "$m $tag $(env "$@" $bin run -m /tmp/$m.gguf --device cuda --prompt 'The capital of France is' --temperature 0 --max-tokens 32 2>/dev/null | md5sum | cut -c1-12)"; }
for m in q05 s2 g3; do
  for r in 1 2; do
    M $m /tmp/vela-old old
    M $m /tmp/vela new
    M $m /tmp/vela new-L1 VELA_CUDA_DEFINES=MV_W_L1
    M $m /tmp/vela new-L1-unguarded VELA_CUDA_DEFINES=MV_W_L1,MV_WAIT_UNGUARDED
  done
  M $m /tmp/vela-old old-pdl0 VELA_CUDA_PDL=0
  M $m /tmp/vela new-pdl0 VELA_CUDA_PDL=0
  M $m /tmp/vela-old old-graph0 VELA_CUDA_GRAPH=0
  M $m /tmp/vela new-graph0 VELA_CUDA_GRAPH=0
  M $m /tmp/vela new-L1-pdl0 VELA_CUDA_DEFINES=MV_W_L1 VELA_CUDA_PDL=0
  M $m /tmp/vela new-cpu-ref VELA_CUDA_PDL=0 VELA_CUDA_GRAPH=0
done 2>&1 | tee $OUT/md5.txt | sort | uniq -c
/tmp/vela run -m /tmp/q05.gguf --device cuda --prompt 'The capital of France is' --temperature 0 --max-tokens 32 2>/dev/null | head -c 300; echo
VELA_CUDA_DEFINES=MV_W_L1 /tmp/vela run -m /tmp/q05.gguf --device cuda --prompt 'The capital of France is' --temperature 0 --max-tokens 32 2>/dev/null | head -c 300; echo
