#!/usr/bin/env bash
# Build the llama.cpp 0c1e570 oracle (vendored in the PyPI llama-cpp-python==0.3.36 sdist) for
# fixture generation and side-by-side benchmarks. Nothing of it is linked into vela.
#
#   scripts/build-llama-cpp.sh [avx2|avx512|server]      (default avx2)
#
# Output: $VELA_CACHE/llama.cpp-<flavor>/bin/{llama-tokenize,llama-bench,llama-quantize,llama-simple,libllama.so}
# plus $VELA_CACHE/llama-cpp-python/ (the sdist's ctypes bindings, used with LLAMA_CPP_LIB_PATH);
# `server`: $VELA_CACHE/llama-server/bin/llama-server (AVX2, static; scripts/bench-serve.py).
set -euo pipefail
FLAVOR=${1:-avx2}
CACHE=${VELA_CACHE:-$HOME/.cache/vela}
SRC=$CACHE/src/llama_cpp_python-0.3.36
OUTDIR=$CACHE/llama.cpp-$FLAVOR
mkdir -p "$CACHE/dl" "$CACHE/src"
SDIST=$CACHE/dl/llama_cpp_python-0.3.36.tar.gz
# The sdist straight from PyPI's simple index, checked against the index's sha256 (pip download
# prepares an sdist's metadata, which needs its build backend: without --no-build-isolation's
# packages installed that builds cmake from source first, many minutes on 2 cores); pip as the
# fallback.
fetch_sdist() {
  local link url sha
  link=$(curl -fsSL https://pypi.org/simple/llama-cpp-python/ |
    grep -o 'https://[^"]*/llama_cpp_python-0\.3\.36\.tar\.gz#sha256=[0-9a-f]*' | head -n1) || return 1
  [ -n "$link" ] || return 1
  url=${link%%#*}
  sha=${link##*sha256=}
  curl -fsSL -o "$SDIST.tmp" "$url" || return 1
  echo "$sha  $SDIST.tmp" | sha256sum -c --status || { echo "sha256 mismatch for $url" >&2; rm -f "$SDIST.tmp"; return 1; }
  mv "$SDIST.tmp" "$SDIST"
}
if [ ! -f "$SDIST" ]; then
  fetch_sdist ||
    pip download --no-deps --no-binary :all: --no-build-isolation -d "$CACHE/dl" llama-cpp-python==0.3.36 >&2 ||
    pip download --no-deps --no-binary :all: -d "$CACHE/dl" llama-cpp-python==0.3.36 >&2
fi
if [ ! -d "$SRC" ]; then
  tar -xzf "$SDIST" -C "$CACHE/src"
fi
ln -sfn "$SRC" "$CACHE/llama-cpp-python"
command -v cmake >/dev/null || { apt-get update -qq && apt-get install -y -qq cmake >&2; }
if [ "$FLAVOR" = server ]; then
  OUT=$CACHE/llama-server/bin
  if [ ! -x "$OUT/llama-server" ]; then
    B=$CACHE/build-llama-server
    cmake -S "$SRC/vendor/llama.cpp" -B "$B" -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=OFF \
      -DGGML_NATIVE=OFF -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DLLAMA_CURL=OFF \
      -DLLAMA_BUILD_SERVER=ON -DLLAMA_BUILD_TESTS=OFF >&2
    cmake --build "$B" -j"$(nproc)" --target llama-server >&2
    mkdir -p "$OUT"
    cp -a "$B/bin/llama-server" "$OUT/"
  fi
  echo "$OUT"
  exit 0
fi
case "$FLAVOR" in
  avx2) FLAGS="-DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON" ;;
  avx512) FLAGS="-DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON -DGGML_AVX512=ON -DGGML_AVX512_VNNI=ON -DGGML_AVX512_VBMI=ON -DGGML_AVX512_BF16=ON" ;;
  *) echo "unknown flavor $FLAVOR" >&2; exit 2 ;;
esac
if [ -x "$OUTDIR/bin/llama-bench" ] && [ -f "$OUTDIR/bin/libllama.so" ]; then
  echo "$OUTDIR/bin"; exit 0
fi
B=$CACHE/build-llama.cpp-$FLAVOR
# shellcheck disable=SC2086
cmake -S "$SRC/vendor/llama.cpp" -B "$B" -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=ON \
  -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_SERVER=OFF \
  -DGGML_NATIVE=OFF -DGGML_OPENMP=ON $FLAGS >&2
cmake --build "$B" -j"$(nproc)" --target llama-tokenize llama-bench llama-quantize llama-simple >&2
mkdir -p "$OUTDIR/bin"
cp -a "$B"/bin/llama-tokenize "$B"/bin/llama-bench "$B"/bin/llama-quantize "$B"/bin/llama-simple "$OUTDIR/bin/"
find "$B" -name '*.so*' -exec cp -a {} "$OUTDIR/bin/" \;
echo "$OUTDIR/bin"
