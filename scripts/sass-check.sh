#!/usr/bin/env bash
# Developer check of the machine code (no GPU needed): compiles every CUDA kernel group to PTX with
# NVRTC (the `ptx` test's dump), assembles it for sm_90 with ptxas and disassembles it with
# nvdisasm (both from PyPI, fetched once into $VELA_CACHE/sass-tools), then lists, for every
# kernel that waits on the previous kernel (griddepcontrol.wait = ACQBULK), the global loads and
# prefetches it issues before the wait. The decode matvecs issue their first weight loads before
# the wait (MV_ENTRY / MV_RESUME in kernels/matvec.cu), and their weight loads do not allocate in
# L1 (LDG.E.NA); ptxas treats read-only (.nc) loads as invariant and may move them across the
# wait, so the script fails if a decode matvec issues any other load (an activation load, a race
# with the kernel that writes it) before its wait. A matvec with no load before the wait (ptxas
# scheduled the wait first) is only reported.
#   scripts/sass-check.sh [REGEX]    # REGEX filters the kernels listed (default: all)
set -euo pipefail
cd "$(dirname "$0")/.."
cache=${VELA_CACHE:-$HOME/.cache/vela}
tools=$cache/sass-tools
nvrtc=${VELA_NVRTC_LIB:-$(ls "$cache"/nvrtc-pip/nvidia/cuda_nvrtc/lib/libnvrtc.so.12 2>/dev/null || true)}
if [ -z "$nvrtc" ]; then
  pip install -q --target "$cache/nvrtc-pip" nvidia-cuda-nvrtc-cu12
  nvrtc=$cache/nvrtc-pip/nvidia/cuda_nvrtc/lib/libnvrtc.so.12
fi
ptxas=$tools/nvcc/nvidia/cuda_nvcc/bin/ptxas
[ -x "$ptxas" ] || pip install -q --target "$tools/nvcc" nvidia-cuda-nvcc-cu12==12.9.86
nvdisasm=$(ls "$tools"/nvdisasm/nvidia/*/bin/nvdisasm 2>/dev/null | head -1 || true)
if [ -z "$nvdisasm" ]; then
  pip install -q --target "$tools/nvdisasm" nvidia-cuda-nvdisasm==13.5.37
  nvdisasm=$(ls "$tools"/nvdisasm/nvidia/*/bin/nvdisasm | head -1)
fi
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
VELA_PTX_ARCHS=90 VELA_PTX_DUMP=$out VELA_NVRTC_LIB=$nvrtc \
  cargo test -q --release -p vela-cuda --test ptx >/dev/null
for f in "$out"/*.ptx; do
  "$ptxas" -arch=sm_90 "$f" -o "${f%.ptx}.cubin"
  "$nvdisasm" -c "${f%.ptx}.cubin" 2>/dev/null >"${f%.ptx}.sass"
done
python3 - "$out" "${1:-.}" <<'PY'
import glob, re, sys
out, pat = sys.argv[1], sys.argv[2]
bad, first = [], []
for path in sorted(glob.glob(f"{out}/*.sass")):
    parts = re.split(r"\n\s*\.text\.(\S+):", open(path).read())
    for i in range(1, len(parts), 2):
        name, lines = parts[i], parts[i + 1].split("\n")
        acq = [j for j, l in enumerate(lines) if "ACQBULK" in l]
        if not acq:
            continue
        pre = [l for l in lines[: acq[0]] if re.search(r"\bLDG|CCTL|UBLKPF", l)]
        # The decode matvecs (one-token `mv_*`, several-token `mmq_*`) except the k-quant kernels
        # of GGUF's layout (mvk, Q5_K: weights and activations loaded in the same round, after
        # the wait by design).
        matvec = re.match(r"mv_|mmq_", name) and not re.match(r"mv_q5_k(_|$)", name)
        other = [l for l in pre if ".NA" not in l] if matvec else []
        note = ""
        if other:
            bad.append(name)
            note = f"  <- {len(other)} load(s) not of weights before the wait"
        elif matvec and not pre:
            first.append(name)
            note = "  (the wait comes first)"
        if re.search(pat, name):
            print(f"{name:32s} loads before the wait: {len(pre)}{note}")
if first:
    print(f"note: ptxas put the wait before every load in {', '.join(first)}")
if bad:
    sys.exit(f"FAIL: loads other than weights before the wait in {', '.join(bad)}")
print("ok: no decode matvec loads anything but weights before its wait")
PY
