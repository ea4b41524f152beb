#!/usr/bin/env bash
# Batched decoding on the GPU, two vela builds side by side (issue 37): `vela bench --parallel` of
# a reference build (old) and this tree's build (new) on a synth Llama-3-8B Q4_0, interleaved.
#
#   here:   scripts/gpu-parallel-ab.sh pack OLD_VELA   # -> target/gpu-data/par (~20 MB, one carry):
#                                        #    OLD_VELA and target/release/vela (xz), this tree's GPU
#                                        #    test binary, the Llama 3 and Gemma 4 vocabularies for
#                                        #    `vela synth`
#   there:  scripts/gpu-parallel-ab.sh run
#       1. GPU tests without a model (PAR_TESTS0, default the K/V paging and attention tests),
#       2. synth the 8B into /dev/shm, GPU tests on it (PAR_TESTS1: batched and graph decoding),
#       3. PAR_ROUNDS rounds (default 3) of `vela bench --device cuda --parallel PAR_SEQS -n 32
#          -r 1` (PAR_SEQS default 1,16,64) for each of PAR_VARIANTS (default "old new"; an entry
#          `new:VAR=VALUE` runs a binary with one environment variable set), in that order each
#          round; medians and min-max per variant: $OUT/parallel.md,
#       4. scripts/kv-by-use.py of both builds (bytes per cached conversation; PAR_KV=0 skips it).
#   there:  scripts/gpu-parallel-ab.sh moe    # the expert products, same pack:
#       1. GPU tests MOE_TESTS (default the expert products') while `vela synth` writes the
#          Gemma-4-26B-A4B Q4_0 GGUF into /dev/shm,
#       2. MOE_ROUNDS rounds (default 3) of pp512 (`-r 2`) and batched decode (`--parallel
#          MOE_SEQS`, default 1,16) of old and new, interleaved: $OUT/moe.md.
# Never touches GPU settings.
set -uo pipefail
stage=${1:?stage: pack|run|moe}
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
P=target/gpu-data/par
OUT=${OUT:-/tmp/vela-gpu-par}

# The device side of both stages: NVRTC, the builds and test binary in /tmp, the vocabularies.
setup() {
  mkdir -p "$OUT"
  t0=$(date +%s)
  export VELA_NVRTC_LIB=$(ls /usr/local/cuda*/lib64/libnvrtc.so* 2>/dev/null | grep -v builtins | head -1)
  export LD_LIBRARY_PATH=$(dirname "$VELA_NVRTC_LIB"):${LD_LIBRARY_PATH:-}
  export VELA_CACHE=/tmp/vela-cache
  mkdir -p $VELA_CACHE/vocab
  nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  for f in vela-old vela-new gt; do xz -dc $P/$f.xz >/tmp/$f && chmod +x /tmp/$f; done
  for f in $P/vocab-*.gguf.xz; do xz -dc "$f" >"$VELA_CACHE/vocab/ggml-$(basename "$f" .gguf.xz).gguf"; done
}

case $stage in
pack)
  old=${2:?pack OLD_VELA}
  rm -rf $P && mkdir -p $P
  xz -T2 -6 -c "$old" >$P/vela-old.xz
  xz -T2 -6 -c target/release/vela >$P/vela-new.xz
  bin=$(ls -t target/release/deps/gpu-* | grep -v '\.d$' | head -1)
  xz -T2 -6 -c "$bin" >$P/gt.xz
  for v in llama-bpe gemma-4; do
    xz -T2 -6 -c "${VELA_CACHE:-$HOME/.cache/vela}/llama-cpp-python/vendor/llama.cpp/models/ggml-vocab-$v.gguf" \
      >$P/vocab-$v.gguf.xz
  done
  du -sh $P
  ;;
run)
  setup
  # shellcheck disable=SC2086
  timeout 120 /tmp/gt ${PAR_TESTS0:-kv_cache_is_held_by_use attention_and_kv} --test-threads=1 --nocapture \
    >"$OUT/tests0.log" 2>&1
  echo "tests without a model: rc $? ($(( $(date +%s) - t0 )) s)"
  grep -E "FAIL|panicked|^test |test result|bytes" "$OUT/tests0.log" | head -20
  [ -s /dev/shm/l8.gguf ] || /tmp/vela-new synth --arch llama3-8b --type q4_0 -o /dev/shm/l8.gguf -t 14 2>&1 | tail -1
  # shellcheck disable=SC2086
  VELA_GPU_MODEL=/dev/shm/l8.gguf timeout 150 /tmp/gt ${PAR_TESTS1:-batched_decode graph_decode} \
    --test-threads=1 --nocapture >"$OUT/tests1.log" 2>&1
  echo "tests on the 8B: rc $? ($(( $(date +%s) - t0 )) s)"
  grep -E "FAIL|panicked|^test |test result|replayed" "$OUT/tests1.log" | head -20
  : >"$OUT/runs.txt"
  for r in $(seq "${PAR_ROUNDS:-3}"); do
    for v in ${PAR_VARIANTS:-old new}; do
      b=${v%%:*}; e=${v#*:}; [ "$e" = "$v" ] && e=
      # One "| l8 ... | seqs | t/s ± sd |" row per sequence count.
      env $e timeout 120 /tmp/vela-$b bench -m /dev/shm/l8.gguf --device cuda --parallel "${PAR_SEQS:-1,16,64}" \
        -n 32 -r 1 2>&1 | grep -E "^\| l8" | awk -F'|' -v v="$v" '{gsub(/ /,"",$5); split($6,t," "); print v, $5, t[1]}' |
        tee -a "$OUT/runs.txt"
    done
  done
  python3 - "$OUT/runs.txt" <<'PYEOF' | tee "$OUT/parallel.md"
import statistics as st, sys
rows = {}
for line in open(sys.argv[1]):
    v, n, tps = line.split()
    rows.setdefault(int(n), {}).setdefault(v, []).append(float(tps))
vs = list(dict.fromkeys(v for d in rows.values() for v in d))
print("| sequences | " + " | ".join(f"{v} t/s median (min-max)" for v in vs) + " |")
print("|---:|" + "---:|" * len(vs))
for n, d in sorted(rows.items()):
    cells = [f"{st.median(d[v]):.1f} ({min(d[v]):.1f}-{max(d[v]):.1f})" if v in d else "-" for v in vs]
    print(f"| {n} | " + " | ".join(cells) + " |")
PYEOF
  [ "${PAR_KV:-1}" = 1 ] && timeout 150 python3 scripts/kv-by-use.py --vela /tmp/vela-old --vela /tmp/vela-new --model /dev/shm/l8.gguf \
    --device cuda --ctx 8192 --n 20 2>&1 | tail -4
  echo "done ($(( $(date +%s) - t0 )) s)"
  ;;
moe)
  setup
  [ -s /dev/shm/g26.gguf ] || (/tmp/vela-new synth --arch gemma4-26b-a4b --type q4_0 -o /dev/shm/g26.gguf -t 12 \
    >"$OUT/moe-synth.log" 2>&1) &
  # shellcheck disable=SC2086
  VELA_REQUIRE_GPU=1 timeout 150 /tmp/gt ${MOE_TESTS:-matmul_experts} --test-threads=1 --nocapture >"$OUT/moe-tests.log" 2>&1
  echo "GPU tests: rc $? ($(( $(date +%s) - t0 )) s)"
  grep -E "FAIL|panicked|^test |test result|tensor-core" "$OUT/moe-tests.log" | head -30
  wait
  echo "synth: $(tail -1 "$OUT/moe-synth.log" 2>/dev/null) ($(( $(date +%s) - t0 )) s)"
  for r in $(seq "${MOE_ROUNDS:-3}"); do
    for b in old new; do
      echo "$b pp512 round $r: $(timeout 60 /tmp/vela-$b bench -m /dev/shm/g26.gguf --device cuda -p 512 -n 0 -r 2 2>/dev/null |
        grep -E '^\| g' | awk -F'|' '{print $5}')" | tee -a "$OUT/moe.md"
      timeout 90 /tmp/vela-$b bench -m /dev/shm/g26.gguf --device cuda --parallel "${MOE_SEQS:-1,16}" -n 32 -r 1 2>&1 |
        grep -E "^\| g" | sed "s/^/$b round $r: /" | tee -a "$OUT/moe.md"
    done
  done
  echo "done ($(( $(date +%s) - t0 )) s)"
  ;;
*) echo "unknown stage $stage" >&2; exit 1 ;;
esac
