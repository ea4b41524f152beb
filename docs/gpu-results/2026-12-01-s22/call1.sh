# Session 22, call 1 (quick pack + s2vocab / g3vocab + the trimmed llama.cpp source): llama.cpp
# 0c1e570 CUDA built here (target/gpu-data/lb was lost with the old checkout) and brought back in
# parts for the suite; meanwhile 10 greedy runs of q05 / s2 / g3 / l8 / l8k with HEAD c87994a (the
# restricted forms of session 21's ACT_HOIST / MVKS_HOIST never ran on the GPU): every md5 of a
# model must be equal. Then per-kernel GPU times (VELA_CUDA_PROFILE=1, graphs off) of q05 and l8
# at depth 0 and l8 at 8K, for the profile the issue asks for.
R=$PWD
source scripts/gpu-quick-env.sh
xz -dc $R/target/gpu-data/quick/s2vocab.gguf.xz > /tmp/s2vocab.gguf
xz -dc $R/target/gpu-data/quick/g3vocab.gguf.xz > /tmp/g3vocab.gguf
t0=$(date +%s)
(bash scripts/build-llama-cpp-cuda.sh build /tmp/llama-cuda > /tmp/lbuild.log 2>&1; echo "llama build rc=$? in $(( $(date +%s) - t0 )) s" > /tmp/lbuild.rc) &
cd /tmp
/tmp/vela synth --arch qwen2.5-0.5b --type q4_k_m -o /tmp/q05.gguf -t 4 >/dev/null 2>&1
/tmp/vela synth --arch smollm2-135m --type q4_1 --tokenizer /tmp/s2vocab.gguf -o /tmp/s2.gguf -t 4 >/dev/null 2>&1
/tmp/vela synth --arch gemma3-270m --type q4_k_m --tokenizer /tmp/g3vocab.gguf -o /tmp/g3.gguf -t 4 >/dev/null 2>&1
/tmp/vela synth --arch llama3-8b --type q4_0 -o /tmp/l8.gguf -t 4 >/dev/null 2>&1
/tmp/vela synth --arch llama3-8b --type q4_k_m -o /tmp/l8k.gguf -t 4 >/dev/null 2>&1
for m in q05 s2 g3 l8 l8k; do for r in 1 2 3 4 5 6 7 8 9 10; do
  echo "$m $(/tmp/vela run -m /tmp/$m.gguf --device cuda --prompt 'The capital of France is' --temperature 0 --max-tokens 64 2>/dev/null | md5sum | cut -c1-12)"
done; done | sort | uniq -c | tee $OUT/md5.txt
wait; cat /tmp/lbuild.rc; tail -2 /tmp/lbuild.log
cd $R
bash scripts/build-llama-cpp-cuda.sh bundle /tmp/lbout > /dev/null 2>&1 && split -b 15M -d /tmp/lbout/llama-bench-cuda.tar.xz $OUT/lb.part && ls -la $OUT/ | grep lb.part
for x in q05:0 l8:0 l8:8192; do m=${x%:*}; d=${x#*:}
  VELA_CUDA_PROFILE=1 timeout 120 /tmp/vela bench -m /tmp/$m.gguf --device cuda -r 1 -p 0 -n 64 --depth $d > $OUT/prof-$m-d$d.txt 2>&1
  echo "== $m depth $d"; grep -A14 "vela-cuda profile" $OUT/prof-$m-d$d.txt
done
