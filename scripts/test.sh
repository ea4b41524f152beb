#!/usr/bin/env bash
# The project's test command (README "Run the tests"; .ci/run calls exactly this).
#
#   scripts/test.sh            fetch/prepare test data, build, run all Rust tests, oracle parity,
#                              a short fuzz run of every fuzz target, server end-to-end tests
#   VELA_SKIP_PREPARE=1        use the data already in $VELA_CACHE
#
# Everything external (real models, llama.cpp oracle, golden files) lands in $VELA_CACHE
# (default ~/.cache/vela); nothing large is committed. Tests that need that data fail (not skip)
# here because VELA_REQUIRE_DATA=1.
set -euo pipefail
cd "$(dirname "$0")/.."
export VELA_CACHE=${VELA_CACHE:-$HOME/.cache/vela}
export VELA_REQUIRE_DATA=1
export CARGO_TERM_COLOR=never
step() { printf '\n=== %s (%s)\n' "$*" "$(date +%H:%M:%S)"; }

if [ "${VELA_SKIP_PREPARE:-0}" != 1 ]; then
  step "prepare test data"
  bash scripts/prepare-test-data.sh
fi

# NVRTC for the PTX compile test (installed by prepare-test-data.sh).
VELA_NVRTC_LIB=$(ls "$VELA_CACHE"/nvrtc-pip/nvidia/cuda_nvrtc/lib/libnvrtc.so* 2>/dev/null | head -n1 || true)
export VELA_NVRTC_LIB

step "cargo fmt --check"
cargo fmt --all -- --check

step "cargo build --release"
cargo build --release --workspace --all-targets

step "cargo test --release"
cargo test --release --workspace --no-fail-fast 2>&1 | tee "$VELA_CACHE/last-cargo-test.log"

step "SASS order of the CUDA decode matvecs (scripts/sass-check.sh: no activation load before a wait)"
bash scripts/sass-check.sh '^$'

step "parity against llama.cpp (fixtures from scripts/gen-parity-fixtures.py)"
python3 scripts/check-parity.py --vela target/release/vela

step "fuzz, CI-sized (fuzz/ci.sh: every target, fixed runs; skipped without cargo-fuzz)"
bash fuzz/ci.sh

if [ -f scripts/test-server.sh ]; then
  step "server end-to-end (official openai/anthropic clients)"
  bash scripts/test-server.sh
fi

step "done"
# The plain summary line CI reads: totals over every `cargo test` result line.
awk '/^test result:/ {p+=$4; f+=$6; i+=$8} END {printf "cargo: %d passed, %d failed, %d skipped\n", p, f, i}' \
  "$VELA_CACHE/last-cargo-test.log"
