#!/usr/bin/env python3
"""Compare the CUDA kernels of two revisions without a GPU: compile every kernel group of
`crates/vela-cuda/kernels/` at REV_A and REV_B (a git revision, or `.` for the working tree) to
PTX for compute_90 with NVRTC (the same groups and prelude as `src/kernels.rs`), then classify
each kernel entry:

  same          identical up to a consistent renaming of virtual registers
  same-ops      the same multiset of instructions (registers and labels renamed), in another order
  DIFFERS       anything else (other instructions, other parameters)
  new / gone    only in one revision

For checking that a refactor of the kernels leaves the code the GPU runs unchanged. NVRTC is
found like the PTX test finds it: $VELA_NVRTC_LIB, else $VELA_CACHE/nvrtc-pip (installed by
scripts/prepare-test-data.sh). Usage: scripts/ptx-compare.py REV_A [REV_B=.]
"""
import ctypes, difflib, glob, os, re, subprocess, sys
from collections import Counter

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
KDIR = "crates/vela-cuda/kernels"
# Group -> files, as GROUPS in crates/vela-cuda/src/kernels.rs.
GROUPS = {"quant": ["quant.cu", "matvec.cu", "experts.cu"], "elementwise": ["elementwise.cu"],
          "attention": ["attention.cu", "flash.cu"], "sample": ["sample.cu"], "kit": ["kit.cu"]}
REG = re.compile(r"%(?:rd|rs|fd|hh|r|f|p|h|b)\d+")
LABEL = re.compile(r"\$L__BB\d+_\d+")


def nvrtc():
    cands = [os.environ.get("VELA_NVRTC_LIB", "")]
    cache = os.environ.get("VELA_CACHE", os.path.expanduser("~/.cache/vela"))
    cands += sorted(glob.glob(os.path.join(cache, "nvrtc-pip/nvidia/cuda_nvrtc/lib/libnvrtc.so*")))
    for c in cands:
        if c and os.path.exists(c):
            return ctypes.CDLL(c)
    sys.exit("NVRTC not found: set VELA_NVRTC_LIB or run scripts/prepare-test-data.sh")


def read(rev, name):
    if rev == ".":
        return open(os.path.join(ROOT, KDIR, name)).read()
    r = subprocess.run(["git", "-C", ROOT, "show", f"{rev}:{KDIR}/{name}"], capture_output=True, text=True)
    return r.stdout if r.returncode == 0 else ""


def kernels(lib, rev):
    out = {}
    for g, files in GROUPS.items():
        src = read(rev, "common.cu") + "\n" + "".join(read(rev, f) for f in files)
        prog = ctypes.c_void_p()
        assert lib.nvrtcCreateProgram(ctypes.byref(prog), src.encode(), f"{g}.cu".encode(), 0, None, None) == 0
        opts = [b"--gpu-architecture=compute_90", b"--std=c++17", b"-default-device"]
        if lib.nvrtcCompileProgram(prog, len(opts), (ctypes.c_char_p * len(opts))(*opts)) != 0:
            n = ctypes.c_size_t(); lib.nvrtcGetProgramLogSize(prog, ctypes.byref(n))
            log = ctypes.create_string_buffer(n.value); lib.nvrtcGetProgramLog(prog, log)
            sys.exit(f"{rev}: group {g} does not compile:\n{log.value.decode()[:2000]}")
        n = ctypes.c_size_t(); lib.nvrtcGetPTXSize(prog, ctypes.byref(n))
        buf = ctypes.create_string_buffer(n.value); lib.nvrtcGetPTX(prog, buf)
        text = buf.value.decode()
        # An entry runs from `.visible .entry NAME(` to the next `.globl` or module-level item.
        for m in re.finditer(r"\.visible \.entry (\w+)\((.*?)\n\}\n", text, re.S):
            body = [l.strip() for l in m.group(0).splitlines() if l.strip() and not l.strip().startswith("//")]
            # Function-scoped shared variables carry their function's mangled name, and local
            # (stack) depots the function's index in the module (which a kernel added before
            # it shifts).
            body = [re.sub(r"_ZZ\w+?E\d+(\w+)", r"SHARED_\1", l) for l in body]
            body = [re.sub(r"__local_depot\d+", "__local_depot", l) for l in body]
            # Branch labels carry the function's index too ($L__BB<function>_<block>).
            out[f"{g}/{m.group(1)}"] = [re.sub(r"\$L__BB\d+_(\d+)", r"$L__BB_\1", l) for l in body]
    return out


def same_up_to_renaming(a, b):
    if len(a) != len(b):
        return False
    m, inv = {}, {}
    for x, y in zip(a, b):
        if REG.sub("%", x) != REG.sub("%", y):
            return False
        for ra, rb in zip(REG.findall(x), REG.findall(y)):
            if m.setdefault(ra, rb) != rb or inv.setdefault(rb, ra) != ra:
                return False
    return True


def ops(lines):
    # Register counts and shared-variable declarations (which ptxas may place inside or outside
    # the entry) are not instructions.
    return Counter(LABEL.sub("L", REG.sub("%", l)) for l in lines
                   if not l.startswith((".reg", ".shared")))


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    ra, rb = sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else "."
    lib = nvrtc()
    a, b = kernels(lib, ra), kernels(lib, rb)
    counts = Counter()
    for k in sorted(set(a) | set(b)):
        if k not in b:
            verdict = "gone"
        elif k not in a:
            verdict = "new"
        elif same_up_to_renaming(a[k], b[k]):
            verdict = "same"
        elif ops(a[k]) == ops(b[k]):
            verdict = "same-ops"
        else:
            verdict = "DIFFERS"
            d = ops(b[k]); d.subtract(ops(a[k]))
            extra = [f"{'+' if v > 0 else ''}{v} {op.split()[0]}" for op, v in d.items() if v]
            verdict += "  (" + ", ".join(sorted(extra)[:8]) + ")"
        counts[verdict.split()[0]] += 1
        if not verdict.startswith("same"):
            print(f"{k:40} {verdict}")
        elif verdict == "same-ops":
            print(f"{k:40} same-ops")
    print("summary:", ", ".join(f"{v} {k}" for k, v in sorted(counts.items())))


if __name__ == "__main__":
    main()
