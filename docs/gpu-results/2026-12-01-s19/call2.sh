# Session 19, call 2: the cluster-merged warp parts (attention_partc_*, VELA_CUDA_ATTN_CLUSTER,
# prepared this session): GPU tests (attn::), then tg128 A/B against the default (parts +
# attention_combine) on q05 / s2 at depth 0 and 1024, 2 rounds; l8: VELA_CUDA_PARTS_FOLLOW=1 at
# depths 0 / 256 / 512, and the warp parts with the cluster merge for head dim 128.
R=$PWD
source scripts/gpu-quick-env.sh
xz -dc $R/target/gpu-data/quick/s2vocab.gguf.xz > /tmp/s2vocab.gguf
VELA_REQUIRE_GPU=1 timeout 200 /tmp/gpu-test --test-threads 1 attn:: > $OUT/t-attn.txt 2>&1
echo "attn tests rc=$?"; grep -E "test result|panicked|FAILED" $OUT/t-attn.txt | head -8
grep -c "RESULT.*cluster.*ok" $OUT/t-attn.txt; grep "RESULT.*FAIL" $OUT/t-attn.txt | head -5
cd /tmp
/tmp/vela synth --arch qwen2.5-0.5b --type q4_k_m -o /tmp/q05.gguf -t 8 >/dev/null 2>&1
/tmp/vela synth --arch smollm2-135m --type q4_1 --tokenizer /tmp/s2vocab.gguf -o /tmp/s2.gguf -t 8 >/dev/null 2>&1
/tmp/vela synth --arch llama3-8b --type q4_0 -o /tmp/l8.gguf -t 16 >/dev/null 2>&1
B() { m=$1; tag=$2; d=$3; shift 3; echo "== $m $tag d$d $(env "$@" /tmp/vela bench -m /tmp/$m.gguf --device cuda -r 2 -p 0 -n 128 --depth $d 2>&1 | grep -oE 'tg128[^|]*\| [0-9.]+ ± [0-9.]+')"; }
for i in 1 2; do
  for m in q05 s2; do for d in 0 1024; do B $m def $d; B $m c16 $d VELA_CUDA_ATTN_CLUSTER=16; B $m c8 $d VELA_CUDA_ATTN_CLUSTER=8; done; done
done
for d in 0 256 512; do B l8 def $d; B l8 follow $d VELA_CUDA_PARTS_FOLLOW=1; done
for d in 0 512; do B l8 w1c16 $d VELA_CUDA_ATTN_WARP=1 VELA_CUDA_ATTN_CLUSTER=16; B l8 w1 $d VELA_CUDA_ATTN_WARP=1; done
for m in q05 s2; do for c in 0 16 8; do echo "md5 $m c$c $(VELA_CUDA_ATTN_CLUSTER=$c /tmp/vela run -m /tmp/$m.gguf --device cuda --prompt 'The capital of France is' --temperature 0 -n 64 2>/dev/null | md5sum)"; done; done
