#!/usr/bin/env bash
# The whole GPU check of issue 6 in one place, run ON the GPU machine (no Rust toolchain, no
# network there) from the repository root, with what this machine built carried in
# target/gpu-data/ (the device tool's `carry`; files placed there stay between back-to-back calls
# while the machine is warm).
#
#   here:   scripts/gpu-suite.sh pack      # vela binary, gpu test binary, llama.cpp source, parity
#                                          # fixtures and the three real models split into <=60 MB
#                                          # parts under target/gpu-data/ (prints what to carry)
#   there:  scripts/gpu-suite.sh prep      # first call: starts the llama.cpp CUDA build (setsid,
#                                          # keeps running between calls) and `vela synth` of the
#                                          # 8B models in the background
#   there:  scripts/gpu-suite.sh run       # last call: assemble + sha256-check the models, then
#       1. device bandwidth (crates/vela-cuda/bench/bandwidth.cu, nvcc) — the roofline's denominator
#       2. GPU op/model tests (scripts/gpu-check.sh ops + model with the carried test binary)
#       3. GPU vs CPU logits + greedy (scripts/gpu-vs-cpu.py; exact mode gated, default reported)
#       4. llama.cpp parity fixtures with vela on the GPU (scripts/check-parity.py)
#       5. vela vs llama.cpp CUDA, interleaved, 3 reps (scripts/bench-vs-llama.py): pp512 + tg128
#          and tg128 at 8K depth, for the three real models and synth Llama-3-8B Q4_0 / Q4_K_M
#   Results: $OUT/suite.md (+ logs). Never touches GPU settings.
set -uo pipefail
stage=${1:?stage: pack|prep|run}
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
data=target/gpu-data
OUT=${OUT:-/tmp/vela-gpu-suite}
export VELA_CACHE=${VELA_CACHE_GPU:-/tmp/vela-cache}
SYNTH="llama3-8b:q4_0 llama3-8b:q4_k_m"

case $stage in
pack)
  src=${VELA_CACHE_HERE:-$HOME/.cache/vela}
  mkdir -p $data
  cp target/release/vela $data/vela
  bin=$(ls -t target/release/deps/gpu-* 2>/dev/null | grep -v '\.d$' | head -1)
  [ -n "$bin" ] && cp "$bin" $data/gpu-test
  [ -f $data/llama-src.tar.gz ] || scripts/build-llama-cpp-cuda.sh pack
  tar czf $data/parity.tar.gz -C "$src/golden" parity
  for m in SmolLM2-135M-Instruct.Q4_1 gemma-3-270m-q4_k_m qwen2.5-coder-0.5b-instruct-q4_k_m; do
    [ -f "$data/m-$m.sha256" ] && continue
    (cd "$src/models" && sha256sum $m.gguf) >"$data/m-$m.sha256"
    split -b 60M -d "$src/models/$m.gguf" "$data/m-$m.part"
  done
  ls -la $data
  ;;
prep)
  mkdir -p "$VELA_CACHE/models" /tmp/synth
  tar xzf $data/parity.tar.gz -C "$VELA_CACHE" 2>/dev/null; mkdir -p "$VELA_CACHE/golden"
  [ -d "$VELA_CACHE/parity" ] && rm -rf "$VELA_CACHE/golden/parity" && mv "$VELA_CACHE/parity" "$VELA_CACHE/golden/"
  setsid nohup scripts/build-llama-cpp-cuda.sh build /tmp/llama-cuda >/tmp/llama-build.log 2>&1 < /dev/null &
  chmod +x $data/vela $data/gpu-test 2>/dev/null
  if $data/vela synth --help >/dev/null 2>&1; then
    (for s in $SYNTH; do
       a=${s%%:*}; t=${s##*:}
       $data/vela synth --arch "$a" --type "$t" --seed 1 -o /tmp/synth/$a-$t.gguf
     done) >/tmp/synth.log 2>&1 < /dev/null &
    disown
  fi
  sleep 2; echo "prep started"; nproc; nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv
  ;;
run)
  mkdir -p "$OUT"
  log=$OUT/suite-log.txt
  : >"$log"
  say() { echo "$*" | tee -a "$log"; }
  for f in $data/m-*.sha256; do
    m=$(basename "$f" .sha256); m=${m#m-}
    if [ ! -s "$VELA_CACHE/models/$m.gguf" ] && ls $data/m-$m.part* >/dev/null 2>&1; then
      cat $data/m-$m.part* >"$VELA_CACHE/models/$m.gguf"
    fi
    (cd "$VELA_CACHE/models" && sha256sum -c "$root/$f") 2>&1 | tee -a "$log"
  done
  export PATH=$PATH:$(ls -d /usr/local/cuda*/bin 2>/dev/null | head -1)
  say "== 1. bandwidth"
  nvcc -O3 -arch=sm_90 crates/vela-cuda/bench/bandwidth.cu -o /tmp/vela-bw 2>>"$log" && /tmp/vela-bw 2>&1 | tee -a "$log"
  say "== 2. GPU tests"
  if [ -x $data/gpu-test ]; then
    VELA_GPU_MODEL=$VELA_CACHE/models/SmolLM2-135M-Instruct.Q4_1.gguf OUT=$OUT \
      timeout 240 scripts/gpu-check.sh all $data/gpu-test >/dev/null 2>&1
    say "gpu-check exit $?"
  fi
  say "== 3. GPU vs CPU"
  timeout 300 python3 scripts/gpu-vs-cpu.py --vela $data/vela --out $OUT/gpu-vs-cpu.md 2>&1 | tail -60 >>"$log"
  say "gpu-vs-cpu exit ${PIPESTATUS[0]}"
  say "== 4. parity fixtures on the GPU"
  timeout 300 python3 scripts/check-parity.py --vela $data/vela 2>&1 | tail -40 >$OUT/parity-gpu.txt
  say "check-parity exit ${PIPESTATUS[0]}"
  say "== 5. benchmarks"
  for i in $(seq 60); do [ -x /tmp/llama-cuda/build/bin/llama-bench ] && break; sleep 5; done
  mkdir -p "$VELA_CACHE/llama.cpp-cuda"
  ln -sfn /tmp/llama-cuda/build/bin "$VELA_CACHE/llama.cpp-cuda/bin"
  tail -3 /tmp/llama-build.log >>"$log"
  wait_synth() { for i in $(seq 60); do grep -q "synth done" /tmp/synth.log 2>/dev/null && break; [ -s "$1" ] && ! pgrep -f "vela synth" >/dev/null && break; sleep 5; done; }
  models=smollm2,gemma3,qwen25
  for s in $SYNTH; do f=/tmp/synth/${s%%:*}-${s##*:}.gguf; wait_synth "$f"; [ -s "$f" ] && models="$models,$f"; done
  cat /tmp/synth.log >>"$log" 2>/dev/null
  B=(python3 scripts/bench-vs-llama.py --vela $data/vela --flavors cuda --threads 16 --reps 3
     "--llama-args=-ngl 99" "--vela-args=--device cuda")
  timeout 420 "${B[@]}" --models "$models" --out $OUT/bench.md --json-out $OUT/bench.json 2>>"$log"
  timeout 300 "${B[@]}" --models "$models" -p 0 -n 128 --depth 8192 --out $OUT/bench-8k.md 2>>"$log"
  { echo "# GPU suite"; nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv
    echo; grep -E "RESULT|GB/s|OK|FAILED|exit" "$log"; echo; cat $OUT/gpu-vs-cpu.md $OUT/parity-gpu.txt \
    $OUT/bench.md $OUT/bench-8k.md 2>/dev/null; } >$OUT/suite.md
  cat $OUT/suite.md
  ;;
*) echo "unknown stage $stage" >&2; exit 1 ;;
esac
