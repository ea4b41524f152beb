# Session 23, call 1 (carries only the trimmed llama.cpp source): llama.cpp 0c1e570 CUDA built on
# the GPU machine (the checkout is fresh again, target/gpu-data/lb was lost) and brought back in
# 15 MB parts for the suite's carry groups. Nothing else runs, so the build is not slowed.
t0=$(date +%s)
bash scripts/build-llama-cpp-cuda.sh build /tmp/llama-cuda > /tmp/lbuild.log 2>&1; echo "llama build rc=$? in $(( $(date +%s) - t0 )) s"
tail -2 /tmp/lbuild.log
bash scripts/build-llama-cpp-cuda.sh bundle /tmp/lbout > /dev/null 2>&1 && split -b 15M -d /tmp/lbout/llama-bench-cuda.tar.xz $OUT/lb.part && ls -la $OUT/ | grep lb.part
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv
