#!/usr/bin/env bash
# vela vs llama.cpp on the CPU with a GGUF larger than the free RAM (issue 41; perf-log row
# "a GGUF larger than the RAM"): both read their weights from the mapped file (vela's
# `--experts auto` keeps routed experts in place, not repacked). Interleaved rounds, pp + tg.
#
#   scripts/bench-larger-than-ram.sh [ROUNDS]        (default 3)
#   env: MODEL (default: synthesized once, Gemma-4-26B-A4B Q8_0, 26.9 GB, to $OUT_DIR/big.gguf),
#        VELA (target/release/vela), LLAMA_BENCH ($VELA_CACHE/llama.cpp-avx2/bin/llama-bench),
#        P (32), N (16), THREADS (2), OUT_DIR (/tmp/vela-big)
# Prints one line per run ("vela|llama PP_TPS TG_TPS") and the medians.
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-3}
OUT_DIR=${OUT_DIR:-/tmp/vela-big}
VELA=${VELA:-target/release/vela}
LLAMA_BENCH=${LLAMA_BENCH:-${VELA_CACHE:-$HOME/.cache/vela}/llama.cpp-avx2/bin/llama-bench}
P=${P:-32} N=${N:-16} T=${THREADS:-2}
mkdir -p "$OUT_DIR"
M=${MODEL:-$OUT_DIR/big.gguf}
[ -s "$M" ] || "$VELA" synth --arch gemma4-26b-a4b --type q8_0 -o "$M"
echo "model $(du -h "$M" | cut -f1), $(free -g | awk '/Mem:/{print $7}') GiB available"
raw=$OUT_DIR/raw.txt; : >"$raw"
for r in $(seq 1 "$rounds"); do
  order="vela llama"; [ $((r % 2)) = 0 ] && order="llama vela"
  for e in $order; do
    if [ $e = vela ]; then
      "$VELA" bench -m "$M" --device cpu -t "$T" -p "$P" -n "$N" -r 1 --ctx 256 --json 2>/dev/null |
        python3 -c "import json,sys;d=json.load(sys.stdin);print('vela',d['pp']['tps_mean'],d['tg']['tps_mean'])"
    else
      "$LLAMA_BENCH" -m "$M" -p "$P" -n "$N" -r 1 -t "$T" -o json 2>/dev/null |
        python3 -c "import json,sys;d=json.load(sys.stdin);print('llama',*[x['avg_ts'] for x in d])"
    fi
  done | tee -a "$raw"
done
python3 - "$raw" <<'PY'
import statistics as st, sys
rows = {}
for line in open(sys.argv[1]):
    e, pp, tg = line.split()
    rows.setdefault(e, []).append((float(pp), float(tg)))
for e, v in rows.items():
    pp, tg = [x[0] for x in v], [x[1] for x in v]
    print(f"{e}: pp {st.median(pp):.2f} ({min(pp):.2f}-{max(pp):.2f}), tg {st.median(tg):.2f} ({min(tg):.2f}-{max(tg):.2f})")
PY
