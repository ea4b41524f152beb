#!/usr/bin/env bash
# Serving under load on the GPU (issue 37): `vela serve` vs llama-server (llama.cpp 0c1e570 built
# with CUDA), a synth Llama-3-8B Q4_0, 1/4/16/64 streaming clients (scripts/bench-serve.py).
#
#   here:   scripts/gpu-serve.sh pack    # -> target/gpu-data/serve/ (~13 MB, one carry): vela and
#                                        #    the GPU test binary (xz), the Llama 3 vocabulary for
#                                        #    `vela synth`, the trimmed llama.cpp source
#                                        #    (scripts/build-llama-cpp-cuda.sh pack)
#   there:  scripts/gpu-serve.sh build   # llama-bench + llama-server CUDA built from that source
#       (target/llama-cuda, kept while the machine stays warm) and bundled into $OUT in 15 MiB
#       parts (files come back at most 16 MiB each; cat them into
#       target/gpu-data/lb/llama-bench-cuda.tar.xz here and carry that folder with this one in
#       later calls: ~60 MB with the repository, of the 64 MiB a call takes);
#       meanwhile the GPU tests (SERVE_TESTS: test-name filters, default all) on the device
#   there:  scripts/gpu-serve.sh bench   # synth the 8B, then bench-serve.py --device cuda with
#       both engines (llama-server from the build above or a carried bundle; vela alone when
#       neither is there): SERVE_CLIENTS (default 1,4,16,64), SERVE_REPS (3): $OUT/serve.md
# Never touches GPU settings.
set -uo pipefail
stage=${1:?stage: pack|build|bench}
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
P=target/gpu-data/serve
OUT=${OUT:-/tmp/vela-gpu-serve}
LC=$root/target/llama-cuda
nvrtc() {
  export VELA_NVRTC_LIB=$(ls /usr/local/cuda*/lib64/libnvrtc.so* 2>/dev/null | grep -v builtins | head -1)
  export LD_LIBRARY_PATH=$(dirname "$VELA_NVRTC_LIB"):${LD_LIBRARY_PATH:-}
}
# llama-bench / llama-server from this machine's build or a carried bundle -> $LC/bin
llama_bin() {
  [ -x "$LC/build/bin/llama-server" ] && { echo "$LC/build/bin"; return; }
  local b=target/gpu-data/lb/llama-bench-cuda.tar.xz
  [ -f "$b" ] || return 1
  mkdir -p "$LC/bundle" && tar xJf "$b" -C "$LC/bundle" && echo "$LC/bundle/llama-bench-cuda"
}

case $stage in
pack)
  rm -rf $P && mkdir -p $P
  xz -T2 -6 -c target/release/vela >$P/vela.xz
  bin=$(ls -t target/release/deps/gpu-* | grep -v '\.d$' | head -1)
  xz -T2 -6 -c "$bin" >$P/gpu-test.xz
  xz -T2 -6 -c "${VELA_CACHE:-$HOME/.cache/vela}/llama-cpp-python/vendor/llama.cpp/models/ggml-vocab-llama-bpe.gguf" \
    >$P/vocab-llama-bpe.gguf.xz
  bash scripts/build-llama-cpp-cuda.sh pack >/dev/null
  cp target/gpu-data/llama-src.tar.gz $P/
  du -sh $P
  ;;
build)
  mkdir -p "$OUT" "$LC"
  t0=$(date +%s)
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  [ -d "$LC/llama.cpp" ] || tar xzf $P/llama-src.tar.gz -C "$LC"
  (bash scripts/build-llama-cpp-cuda.sh build "$LC" >"$OUT/llama-build.log" 2>&1; echo "build rc $?" >>"$OUT/llama-build.log") &
  bpid=$!
  nvrtc
  xz -dc $P/gpu-test.xz >/tmp/gt && chmod +x /tmp/gt
  # shellcheck disable=SC2086
  timeout 400 /tmp/gt ${SERVE_TESTS:-} --test-threads=1 >"$OUT/tests.log" 2>&1
  echo "tests rc $? ($(( $(date +%s) - t0 )) s)"
  grep -E "^test result|FAILED|panicked" "$OUT/tests.log" | head -20
  wait $bpid
  tail -3 "$OUT/llama-build.log"
  if [ -x "$LC/build/bin/llama-server" ]; then
    b=$OUT/llama-bench-cuda
    mkdir -p "$b"
    cp "$LC/build/bin/llama-bench" "$LC/build/bin/llama-server" "$b/"
    find "$LC/build" -name '*.so*' -exec cp -P {} "$b/" \;
    tar cJf - -C "$OUT" llama-bench-cuda | split -b 15M -d - "$OUT/lb.part"
    rm -rf "$b"
    ls -la "$OUT"/lb.part*
  fi
  echo "done ($(( $(date +%s) - t0 )) s)"
  ;;
bench)
  mkdir -p "$OUT"
  t0=$(date +%s)
  nvrtc
  export VELA_CACHE=/tmp/vela-cache
  mkdir -p $VELA_CACHE/vocab
  xz -dc $P/vela.xz >/tmp/vela && chmod +x /tmp/vela
  xz -dc $P/vocab-llama-bpe.gguf.xz >$VELA_CACHE/vocab/ggml-vocab-llama-bpe.gguf
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  [ -s /dev/shm/l8.gguf ] || /tmp/vela synth --arch llama3-8b --type q4_0 -o /dev/shm/l8.gguf -t 14 2>&1 | tail -1
  echo "synth ($(( $(date +%s) - t0 )) s)"
  engines=vela
  if lb=$(llama_bin); then
    engines=vela,llama
    export LD_LIBRARY_PATH=$lb:$LD_LIBRARY_PATH
  fi
  PYTHONUNBUFFERED=1 python3 scripts/bench-serve.py --vela /tmp/vela --llama-server "${lb:-none}/llama-server" \
    --model /dev/shm/l8.gguf --device cuda --engines $engines --threads 8 --endpoint completions --ignore-eos --timings \
    --clients ${SERVE_CLIENTS:-1,4,16,64} --reps ${SERVE_REPS:-3} --out $OUT/serve.md
  echo "done ($(( $(date +%s) - t0 )) s)"
  ;;
*) echo "unknown stage $stage" >&2; exit 1 ;;
esac
