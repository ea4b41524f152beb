#!/usr/bin/env bash
# Prepare ALL external test data; the single entry point CI runs before `cargo test`.
#
#   scripts/prepare-test-data.sh            (env: VELA_CACHE, default ~/.cache/vela)
#
# Steps (each is idempotent and skips work whose outputs exist and whose inputs did not change, so
# a fully cached run takes seconds):
#   1. pip-install the Python deps of the generators (gguf==0.19.0 numpy jinja2 tokenizers), quietly,
#      only if an import fails;
#   2. scripts/fetch-models.sh              -> $VELA_CACHE/models/*.gguf (sha256-verified)
#   3. scripts/build-llama-cpp.sh avx2      -> $VELA_CACHE/llama.cpp-avx2/bin (oracle tools, libllama.so)
#   4. every scripts/gen-*.py / scripts/gen-*.sh except gen-parity-fixtures.py, in name order
#      (tokenizer, template, quant goldens, ...); any failure aborts;
#   5. scripts/gen-parity-fixtures.py       -> $VELA_CACHE/golden/parity (see docs/testing.md).
#
# Step-4 generators are skipped when their stamp ($VELA_CACHE/golden/.stamps/<script>.sha256)
# matches the hash of: the script, the other scripts/*.py it names, llama_oracle.py, the model/llama.cpp inputs (names, sizes,
# mtimes) and the listing (paths + sizes) of $VELA_CACHE/golden at the end of the last run; so an
# edited script, a changed input or a deleted golden file reruns them. VELA_FORCE_GEN=1 runs all.
# CPU use is polite (nice -n 10).
set -euo pipefail
cd "$(dirname "$0")/.."
export VELA_CACHE=${VELA_CACHE:-$HOME/.cache/vela}
STAMPS=$VELA_CACHE/golden/.stamps
mkdir -p "$STAMPS"
log() { printf '[prepare-test-data] %s\n' "$*" >&2; }

# 1. Python deps
if ! python3 -c 'import gguf, numpy, jinja2, tokenizers; assert gguf.__version__ == "0.19.0"' 2>/dev/null; then
  log "installing Python deps"
  python3 -m pip install -q --disable-pip-version-check "gguf==0.19.0" numpy jinja2 tokenizers >&2 ||
    python3 -m pip install -q --disable-pip-version-check --break-system-packages "gguf==0.19.0" numpy jinja2 tokenizers >&2
fi

# 2-3. models and the llama.cpp oracle
log "models: $(scripts/fetch-models.sh)"
log "llama.cpp: $(nice -n 10 scripts/build-llama-cpp.sh avx2)"

# NVRTC (no GPU needed) so the CUDA kernels are compiled to PTX in the tests (crates/vela-cuda/tests/ptx.rs).
NVRTC_DIR=$VELA_CACHE/nvrtc-pip
if ! ls "$NVRTC_DIR"/nvidia/cuda_nvrtc/lib/libnvrtc.so* >/dev/null 2>&1; then
  log "installing NVRTC from PyPI (nvidia-cuda-nvrtc-cu12) into $NVRTC_DIR"
  pip install -q --target "$NVRTC_DIR" nvidia-cuda-nvrtc-cu12 >&2
fi
log "nvrtc: $(ls "$NVRTC_DIR"/nvidia/cuda_nvrtc/lib/libnvrtc.so* | head -n1)"

# Inputs every generator may depend on (cheap identity: names, sizes, mtimes).
inputs_id() {
  {
    ls -l --time-style=+%s "$VELA_CACHE"/models/*.gguf 2>/dev/null | grep -v '\.f32\.gguf' | awk '{print $5, $6, $7}'
    ls -l --time-style=+%s "$VELA_CACHE"/llama.cpp-avx2/bin/libllama.so* 2>/dev/null | awk '{print $5, $6, $7}'
    readlink -f "$VELA_CACHE/llama-cpp-python" || true
  } | sha256sum | cut -d' ' -f1
}
INPUTS=$(inputs_id)

# What the other generators produced (paths + sizes, parity and stamps excluded): a deleted or
# truncated golden file changes this and makes every generator run again.
goldens_id() {
  (cd "$VELA_CACHE/golden" && find . -path ./parity -prune -o -path ./.stamps -prune -o -type f -printf '%p %s\n' |
    LC_ALL=C sort) | sha256sum | cut -d' ' -f1
}
# A generator's identity: its text, the other scripts it names (the modules and generators it
# loads, e.g. deepseekv4_ref.py), llama_oracle.py, the inputs and the goldens listing.
gen_id() {
  local deps=() f
  for f in scripts/*.py; do
    [ "$f" != "$1" ] && grep -qF "$(basename "$f" .py)" "$1" && deps+=("$f")
  done
  (sha256sum "$1" scripts/llama_oracle.py "${deps[@]}" 2>/dev/null; echo "$INPUTS $2") | sha256sum | cut -d' ' -f1
}

# 4. other generators
shopt -s nullglob
GENS=()
for g in scripts/gen-*.py scripts/gen-*.sh; do
  [ "$(basename "$g")" = gen-parity-fixtures.py ] && continue
  # The 31B-geometry Gemma 4 check is opt-in (11 min, 18 GB disk, 9 GB RAM): VELA_REALSHAPE=1.
  [ "$(basename "$g")" = gen-gemma4-realshape.py ] && [ "${VELA_REALSHAPE:-0}" != 1 ] && continue
  GENS+=("$g")
done
# Generators whose header says `# vela-venv: torch` need PyTorch + transformers 5.23 (the HF
# reference implementations); they run in $VELA_CACHE/venv-torch, created from PyPI on first use.
python_for() {
  if grep -q '^# vela-venv: torch' "$1"; then
    local v=$VELA_CACHE/venv-torch
    if ! "$v/bin/python" -c 'import torch, transformers, safetensors, numpy; assert transformers.__version__ == "5.23.0"' 2>/dev/null; then
      log "creating $v (torch, transformers==5.23.0) for $(basename "$1")"
      python3 -m venv "$v" >&2
      "$v/bin/pip" install -q torch "transformers==5.23.0" safetensors numpy sentencepiece protobuf >&2
    fi
    echo "$v/bin/python"
  else
    echo python3
  fi
}

BEFORE=$(goldens_id)
for g in "${GENS[@]}"; do
  name=$(basename "$g")
  stamp=$STAMPS/$name.sha256
  if [ "${VELA_FORCE_GEN:-0}" != 1 ] && [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$(gen_id "$g" "$BEFORE")" ]; then
    log "$name: up to date"
    continue
  fi
  log "running $name"
  case "$g" in
    *.py) nice -n 10 "$(python_for "$g")" "$g" ;;
    *.sh) nice -n 10 bash "$g" ;;
  esac
  touch "$STAMPS/$name.ran"
done
AFTER=$(goldens_id)
for g in "${GENS[@]}"; do
  name=$(basename "$g")
  # stamp generators that ran now, or were already up to date (their stamp matched BEFORE)
  if [ -f "$STAMPS/$name.ran" ] || { [ -f "$STAMPS/$name.sha256" ] && [ "$(cat "$STAMPS/$name.sha256")" = "$(gen_id "$g" "$BEFORE")" ]; }; then
    gen_id "$g" "$AFTER" > "$STAMPS/$name.sha256"
  fi
  rm -f "$STAMPS/$name.ran"
done

# 5. parity fixtures (has its own fingerprint-based up-to-date check)
log "running gen-parity-fixtures.py"
force=()
[ "${VELA_FORCE_GEN:-0}" = 1 ] && force=(--force)
nice -n 10 python3 scripts/gen-parity-fixtures.py "${force[@]}"
log "done: goldens in $VELA_CACHE/golden"
