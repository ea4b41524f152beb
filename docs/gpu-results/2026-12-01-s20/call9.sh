# Session 20, call 9: vela's decode matvecs with weight loads that do not allocate in L1 (ldw16 /
# ldw8 / ldw2 in kernels/matvec.cu, default) against plain loads (VELA_CUDA_DEFINES=MV_W_L1), both
# with the waits behind a branch (mv_guard). The matvec GPU tests first (bit-equality with the old
# kernels and the GGUF layout, CPU agreement), then tg128 on q05, s2, g3, l8 at depth 0 and l8 at
# 1024, 2 rounds interleaved.
R=$PWD
source scripts/gpu-quick-env.sh
VELA_REQUIRE_GPU=1 timeout 200 /tmp/gpu-test --test-threads 1 kernels2::matvec kernels2::split_rows kernels2::exact_matmul mix:: model::smollm2_gpu_matches_cpu model::graph_decode_matches_plain > $OUT/t-mv.txt 2>&1
echo "tests rc=$?"; grep -E "^test |test result|panicked" $OUT/t-mv.txt | head -30
xz -dc $R/target/gpu-data/quick/s2vocab.gguf.xz > /tmp/s2vocab.gguf
xz -dc $R/target/gpu-data/quick/g3vocab.gguf.xz > /tmp/g3vocab.gguf
cd /tmp
/tmp/vela synth --arch qwen2.5-0.5b --type q4_k_m -o /tmp/q05.gguf -t 8 >/dev/null 2>&1
/tmp/vela synth --arch smollm2-135m --type q4_1 --tokenizer /tmp/s2vocab.gguf -o /tmp/s2.gguf -t 8 >/dev/null 2>&1
/tmp/vela synth --arch gemma3-270m --type q4_k_m --tokenizer /tmp/g3vocab.gguf -o /tmp/g3.gguf -t 8 >/dev/null 2>&1
/tmp/vela synth --arch llama3-8b --type q4_0 -o /tmp/l8.gguf -t 16 >/dev/null 2>&1
B() { m=$1; tag=$2; d=$3; shift 3; echo "== $m $tag d$d $(env "$@" /tmp/vela bench -m /tmp/$m.gguf --device cuda -r 2 -p 0 -n 128 --depth $d 2>&1 | grep -oE 'tg128[^|]*\| [0-9.]+ ± [0-9.]+')"; }
for i in 1 2; do for m in q05 s2 g3 l8; do
  B $m noL1 0
  B $m L1 0 VELA_CUDA_DEFINES=MV_W_L1
done; B l8 noL1 1024; B l8 L1 1024 VELA_CUDA_DEFINES=MV_W_L1; done
for m in q05 l8; do echo "== md5 $m $(/tmp/vela run -m /tmp/$m.gguf --device cuda --prompt 'The capital of France is' --temperature 0 --max-tokens 32 2>/dev/null | md5sum) / L1 $(VELA_CUDA_DEFINES=MV_W_L1 /tmp/vela run -m /tmp/$m.gguf --device cuda --prompt 'The capital of France is' --temperature 0 --max-tokens 32 2>/dev/null | md5sum)"; done
