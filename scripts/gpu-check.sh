#!/usr/bin/env bash
# GPU correctness + speed check of the CUDA backend (crates/vela-cuda), run ON the GPU machine.
#
#   scripts/gpu-check.sh <stage> <test-binary>
#     stage ops   : every op vs the CPU backend on random data (tests/gpu.rs, no model needed)
#     stage model : SmolLM2-135M Q4_1 GPU vs CPU logits + greedy 32 tokens (exact mode, then
#                   default mode), graph vs plain decode, then decode speed per configuration
#     stage all   : both
#     stage bench : decode speed 3x, device bandwidth (crates/vela-cuda/bench/bandwidth.cu, nvcc),
#                   and llama.cpp-CUDA's llama-bench on the same model when $LLAMA_BENCH (default
#                   /tmp/llama-cuda/build/bin/llama-bench, see scripts/build-llama-cpp-cuda.sh) exists
#
# Build the test binary on a CPU machine (no CUDA needed):
#   cargo test --release -p vela-cuda --no-run   # prints target/release/deps/gpu-<hash>
# The model for stage `model` is $VELA_GPU_MODEL, else target/gpu-data/part-* (the GGUF split
# with `split -b 40M`, so it can travel in pieces) concatenated and checked against its sha256.
# NVRTC is found via $VELA_NVRTC_LIB, else searched under /usr/local/cuda* and Python's
# site-packages (nvidia-cuda-nvrtc wheels). Writes $OUT/log and $OUT/results.md (OUT defaults
# to /tmp/vela-gpu-check). Re-runnable; never touches GPU settings.
set -uo pipefail
stage=${1:?stage: ops|model|all}
bin=${2:?test binary}
OUT=${OUT:-/tmp/vela-gpu-check}
mkdir -p "$OUT"
log="$OUT/log-$stage.txt"
: >"$log"

{
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm --format=csv 2>&1 || true
  if [ -z "${VELA_NVRTC_LIB:-}" ]; then
    cands=$( (ls /usr/local/cuda*/lib64/libnvrtc.so* /usr/local/cuda*/targets/*/lib/libnvrtc.so* 2>/dev/null;
              find / -xdev -path /proc -prune -o \( -name 'libnvrtc.so*' -path '*nvidia*' \) -print 2>/dev/null) |
             grep -v -e builtins -e '\.alt\.' | head -20)
    echo "nvrtc candidates:"; echo "$cands"
    export VELA_NVRTC_LIB=$(echo "$cands" | head -1)
  fi
  echo "VELA_NVRTC_LIB=$VELA_NVRTC_LIB"
  export LD_LIBRARY_PATH="$(dirname "$VELA_NVRTC_LIB"):${LD_LIBRARY_PATH:-}"
} 2>&1 | tee -a "$log"
if [ -z "${VELA_NVRTC_LIB:-}" ]; then
  export VELA_NVRTC_LIB=$(grep '^VELA_NVRTC_LIB=' "$log" | tail -1 | cut -d= -f2-)
  export LD_LIBRARY_PATH="$(dirname "$VELA_NVRTC_LIB"):${LD_LIBRARY_PATH:-}"
fi

export VELA_REQUIRE_GPU=1
export VELA_CACHE=${VELA_CACHE:-/tmp/vela-cache}
rc=0
run() {
  echo "== $*" | tee -a "$log"
  local t0=$(date +%s%N)
  "$bin" --test-threads=1 --nocapture "$@" 2>&1 | tee -a "$log"
  local r=${PIPESTATUS[0]}
  echo "== exit $r in $(( ($(date +%s%N) - t0) / 1000000 )) ms" | tee -a "$log"
  [ "$r" = 0 ] || rc=1
}

if [ "$stage" = ops ] || [ "$stage" = all ]; then
  rm -rf "$VELA_CACHE/cuda-kernels"
  run --exact elementwise_ops_match_cpu          # cold: compiles the kernels with NVRTC
  run --exact elementwise_ops_match_cpu          # warm: loads them from $VELA_CACHE/cuda-kernels
  run matmul_and_get_rows_match_cpu attention_and_kv_match_cpu
  # decode matvec vs CPU, exact mode vs CPU exact, device argmax, fused norm / RoPE / decode ops,
  # split-K decode attention at long contexts, x3 launches == single products, split rows
  run kernels2::matvec_matches_cpu kernels2::exact_matmul_matches_cpu_exact \
      kernels2::device_argmax_matches_cpu_sampler kernels2::fused_norm_matmul_and_rope_qk_match_cpu \
      kernels2::split_attention_long_context_matches_cpu kernels2::fused_decode_ops_match_cpu \
      kernels2::matvec_x3_matches_single kernels2::split_rows_match_cpu \
      kernels2::fused_rope_store_matches_cpu
  # cuBLAS prefill products, prefill attention (flash, 4/32-warp, head dim 512 through cuBLAS),
  # device top-k sampling
  run gemm::gemm_prefill_matches_cpu_exact gemm::prefill_attention_kernels_match_cpu \
      gemm::prefill_attention_d512_gemm_matches_cpu sample::device_top_k_matches_cpu
  # fused decode attention + product, split-K parts, mixed-type products with biases, narrow
  # Q8_0 rows, norms folded into RoPE + store and into the next pre-norm; Gemma 4 (synth
  # gemma4-tiny, needs ggml-vocab-gemma-4.gguf in $VELA_CACHE/vocab) exact vs CPU
  run attn::fused_attention_matmul_equals_unfused attn::split_parts_match_cpu \
      mix::mixed_x3_and_bias_equal_separate_products mix::narrow_q8_0_rows_match_cpu \
      mix::qk_norm_rope_store_equals_unfused mix::post_norm_matmul_equals_unfused \
      gemma4::gemma4_exact_gpu_matches_cpu
  run --exact gemm::prefill_attention_timing       # us per prefill attention layer (8B, Gemma 4 hd 512)
  run --exact gemm::gemm_speed                     # cuBLAS vs integer prefill products, crossover
  run --exact sample::device_top_k_timing          # us per top-k call vs reading the row back
  run --exact kernels2::matvec_bandwidth           # GB/s on 8B-sized matrices
  run --exact kernels2::attention_decode_timing    # us per decode attention call
fi
need_model() {
  if [ -z "${VELA_GPU_MODEL:-}" ]; then
    m=target/gpu-data/smollm2.gguf
    [ -s "$m" ] || cat target/gpu-data/part-* >"$m"
    sum=$(sha256sum "$m" | cut -d' ' -f1)
    echo "model sha256 $sum" | tee -a "$log"
    [ "$sum" = b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53 ] || { echo "BAD MODEL CHECKSUM" | tee -a "$log"; rc=1; }
    export VELA_GPU_MODEL=$PWD/$m
  fi
}
if [ "$stage" = model ] || [ "$stage" = all ]; then
  need_model
  run --exact model::smollm2_exact_gpu_matches_cpu   # VELA_MATMUL=f32 semantics: all criteria
  run --exact model::smollm2_gpu_matches_cpu         # default int8 activations: info + argmax
  run --exact model::graph_decode_matches_plain      # CUDA graph decode == plain, bit-exact
  run --exact model::pipelined_greedy_matches_plain   # chained greedy steps == plain steps
  run --exact model::prepared_steps_match_plain      # steps recorded ahead == recorded when run
  run --exact model::pipelining_guards               # chained/recorded-ahead steps refused where unsafe
  run --exact model::smollm2_decode_speed            # tok/s with and without graphs
fi
if [ "$stage" = bench ]; then
  need_model
  for _ in 1 2 3; do run --exact model::smollm2_decode_speed; done
  nvcc=$(command -v nvcc || ls /usr/local/cuda*/bin/nvcc 2>/dev/null | head -1)
  if [ -n "$nvcc" ]; then
    "$nvcc" -O3 -arch=sm_90 crates/vela-cuda/bench/bandwidth.cu -o /tmp/vela-bw && /tmp/vela-bw 2>&1 |
      sed 's/^BANDWIDTH/RESULT bandwidth/' | tee -a "$log"
  fi
  lb=${LLAMA_BENCH:-/tmp/llama-cuda/build/bin/llama-bench}
  if [ -x "$lb" ]; then
    echo "== llama-bench (llama.cpp CUDA)" | tee -a "$log"
    "$lb" -m "$VELA_GPU_MODEL" -p 512 -n 128 -r 3 -ngl 99 2>&1 | tee -a "$log"
    "$lb" -m "$VELA_GPU_MODEL" -p 0 -n 128 -d 512 -r 3 -ngl 99 2>&1 | tee -a "$log"
  else
    echo "no llama-bench at $lb: skipped the llama.cpp comparison" | tee -a "$log"
  fi
fi

{
  echo "| check | error / numbers | nmse | status |"
  echo "| --- | --- | --- | --- |"
  grep '^RESULT' "$log" | sed 's/^RESULT //'
} >"$OUT/results-$stage.md"
cat "$OUT/results-$stage.md"
exit $rc
