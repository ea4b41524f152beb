#!/usr/bin/env bash
# Batched decoding on the GPU, two vela builds side by side (issue 37): `vela bench --parallel` of
# a reference build (old) and this tree's build (new) on a synth Llama-3-8B Q4_0, interleaved.
#
#   here:   scripts/gpu-parallel-ab.sh pack OLD_VELA   # -> target/gpu-data/par (~17 MB, one carry):
#                                        #    OLD_VELA and target/release/vela (xz), this tree's GPU
#                                        #    test binary, the Llama 3 vocabulary for `vela synth`
#   there:  scripts/gpu-parallel-ab.sh run
#       1. GPU tests without a model (PAR_TESTS0, default the K/V paging and attention tests),
#       2. synth the 8B into /dev/shm, GPU tests on it (PAR_TESTS1: batched and graph decoding),
#       3. PAR_ROUNDS rounds (default 3) of `vela bench --device cuda --parallel PAR_SEQS -n 32
#          -r 1` (PAR_SEQS default 1,16,64) for each of PAR_VARIANTS (default "old new"; an entry
#          `new:VAR=VALUE` runs a binary with one environment variable set), in that order each
#          round; medians and min-max per variant: $OUT/parallel.md,
#       4. scripts/kv-by-use.py of both builds (bytes per cached conversation; PAR_KV=0 skips it).
# Never touches GPU settings.
set -uo pipefail
stage=${1:?stage: pack|run}
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
P=target/gpu-data/par
OUT=${OUT:-/tmp/vela-gpu-par}

case $stage in
pack)
  old=${2:?pack OLD_VELA}
  rm -rf $P && mkdir -p $P
  xz -T2 -6 -c "$old" >$P/vela-old.xz
  xz -T2 -6 -c target/release/vela >$P/vela-new.xz
  bin=$(ls -t target/release/deps/gpu-* | grep -v '\.d$' | head -1)
  xz -T2 -6 -c "$bin" >$P/gt.xz
  xz -T2 -6 -c "${VELA_CACHE:-$HOME/.cache/vela}/llama-cpp-python/vendor/llama.cpp/models/ggml-vocab-llama-bpe.gguf" \
    >$P/vocab-llama-bpe.gguf.xz
  du -sh $P
  ;;
run)
  mkdir -p "$OUT"
  t0=$(date +%s)
  export VELA_NVRTC_LIB=$(ls /usr/local/cuda*/lib64/libnvrtc.so* 2>/dev/null | grep -v builtins | head -1)
  export LD_LIBRARY_PATH=$(dirname "$VELA_NVRTC_LIB"):${LD_LIBRARY_PATH:-}
  export VELA_CACHE=/tmp/vela-cache
  mkdir -p $VELA_CACHE/vocab
  nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  for f in vela-old vela-new gt; do xz -dc $P/$f.xz >/tmp/$f && chmod +x /tmp/$f; done
  xz -dc $P/vocab-llama-bpe.gguf.xz >$VELA_CACHE/vocab/ggml-vocab-llama-bpe.gguf
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
*) echo "unknown stage $stage" >&2; exit 1 ;;
esac
