#!/usr/bin/env bash
# CI-sized fuzz run (scripts/test.sh calls it): generate the seed corpora, build every target and
# run each for a fixed number of executions; a crash (or a failed build) fails the script.
#
#   VELA_FUZZ_RUNS=N      executions per target (default 20000; a quarter for the slow ones)
#   VELA_FUZZ_INSTALL=1   `cargo install cargo-fuzz` when it is missing (takes minutes)
#
# Without cargo-fuzz (and without VELA_FUZZ_INSTALL=1) the run is skipped with a note: it is not
# part of a plain Rust toolchain. See fuzz/README.md for the long runs.
set -euo pipefail
cd "$(dirname "$0")/.."
RUNS=${VELA_FUZZ_RUNS:-20000}

if ! cargo fuzz --version >/dev/null 2>&1; then
  if [ "${VELA_FUZZ_INSTALL:-0}" = 1 ]; then
    cargo install --locked cargo-fuzz
  else
    echo "fuzz: SKIPPED - cargo-fuzz is not installed (cargo install cargo-fuzz, or VELA_FUZZ_INSTALL=1)"
    exit 0
  fi
fi

# Seeds. gen-seeds.py needs gguf-py; without it gguf_parse starts from an empty corpus.
python3 fuzz/gen-text-seeds.py
python3 fuzz/gen-safetensors-seeds.py
python3 fuzz/gen-safetensors-index-seeds.py
python3 fuzz/gen-vocab-text-seeds.py
python3 fuzz/gen-state-seeds.py
if python3 -c 'import gguf' 2>/dev/null; then
  python3 fuzz/gen-seeds.py
else
  echo "fuzz: note - gguf-py missing, gguf_parse runs without seeds"
  mkdir -p fuzz/corpus/gguf_parse
fi

# Only a stable toolchain is expected: RUSTC_BOOTSTRAP lets it take cargo-fuzz's sanitizer flags.
export RUSTC_BOOTSTRAP=1
cargo fuzz build

# target:max_len:runs. tokenizer_json (a tokenizer built per input), chat_template (a render
# and a tokenization per input), template_source (a compile and a render per input) and
# gguf_vocab_text (several tokenizations per input, and the
# vocabularies loaded on first use) run a quarter of the executions: ~100-1000 per second.
SLOW=$((RUNS / 4))
for t in gguf_parse:16384:$RUNS safetensors_parse:16384:$RUNS safetensors_index:16384:$RUNS \
         request_bodies:16384:$RUNS output_parsers:4096:$RUNS config_json:16384:$RUNS \
         state_file:65536:$RUNS \
         tokenizer_json:65536:$SLOW chat_template:4096:$SLOW gguf_vocab_text:4096:$SLOW \
         template_source:4096:$SLOW; do
  IFS=: read -r name max_len runs <<<"$t"
  echo "fuzz: $name ($runs runs)"
  log=fuzz/artifacts/ci-$name.log
  mkdir -p fuzz/artifacts
  if ! cargo fuzz run "$name" -- -runs="$runs" -seed=1 -max_len="$max_len" -timeout=30 \
      -rss_limit_mb=4096 >"$log" 2>&1; then
    tail -n 40 "$log"
    echo "fuzz: $name FAILED (log $log, crash input under fuzz/artifacts/$name)"
    exit 1
  fi
  grep -E '^#[0-9]+[[:space:]]+DONE' "$log" | tail -n 1 || true
done
echo "fuzz: all targets passed"
