#!/usr/bin/env bash
# llama.cpp (commit 0c1e570, the tree vendored in the llama-cpp-python==0.3.36 sdist) built with
# CUDA, as a speed ORACLE for the vela CUDA backend. Nothing of it is linked into vela.
#
#   scripts/build-llama-cpp-cuda.sh pack          # here (CPU machine, no CUDA needed)
#       -> target/gpu-data/llama-src.tar.gz: a trimmed source tree (~8 MB: ggml core + CPU + CUDA
#          backends, src/, include/, common/, vendor/ minus miniaudio's data, tools/llama-bench,
#          tools/server + its ui and mtmd dependencies, cmake/; no models/, docs/, tests/,
#          examples/, other GPU backends). tools/CMakeLists.txt is replaced by one that only adds
#          llama-bench and llama-server. target/ is ignored, so the tarball
#          travels to the GPU machine with the device tool's `carry: ["target/gpu-data"]`.
#   scripts/build-llama-cpp-cuda.sh build [dir]   # on the GPU machine (needs nvcc + cmake)
#       -> <dir>/build/bin/{llama-bench,llama-server} (dir defaults to /tmp/llama-cuda);
#          re-running reuses them.
#   scripts/build-llama-cpp-cuda.sh bundle <out>  # on the GPU machine: llama-bench, llama-server
#          and their shared libraries into <out>/llama-bench-cuda.tar.xz, so a later call can run
#          them unbuilt (`tar xJf ... && LD_LIBRARY_PATH=llama-bench-cuda llama-bench-cuda/llama-bench ...`).
#
# Build options: -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 (H100/H200), FlashAttention kernels
# ON (llama.cpp's fastest long-context decode; LLAMA_CUDA_FA=OFF skips them and saves compile
# time), no curl, tests, server, examples. VELA_CACHE defaults to /root/.cache/vela.
set -euo pipefail
mode=${1:?mode: pack|build|bundle}
root=$(cd "$(dirname "$0")/.." && pwd)
src=${VELA_CACHE:-/root/.cache/vela}/llama-cpp-python/vendor/llama.cpp
tarball=$root/target/gpu-data/llama-src.tar.gz

case $mode in
pack)
  [ -f "$src/CMakeLists.txt" ] || { echo "no llama.cpp source at $src" >&2; exit 1; }
  mkdir -p "$(dirname "$tarball")"
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' EXIT
  mkdir -p "$tmp/llama.cpp/tools"
  (cd "$src" && tar cf - CMakeLists.txt LICENSE cmake licenses include src common vendor \
      tools/llama-bench tools/server tools/mtmd scripts/ui-assets.cmake \
      tools/ui/CMakeLists.txt tools/ui/ui.cpp.in tools/ui/ui.h.in \
      ggml/CMakeLists.txt ggml/cmake ggml/include $(find ggml/src -maxdepth 1 -type f) \
      ggml/src/ggml-cpu ggml/src/ggml-cuda) |
    tar xf - -C "$tmp/llama.cpp"
  cat >"$tmp/llama.cpp/tools/CMakeLists.txt" <<'EOF'
# trimmed by vela's scripts/build-llama-cpp-cuda.sh: llama-bench and llama-server
find_package(Threads REQUIRED)
llama_add_compile_flags()
add_subdirectory(llama-bench)
add_subdirectory(ui)
add_subdirectory(mtmd)
add_subdirectory(server)
EOF
  tar czf "$tarball" -C "$tmp" llama.cpp
  ls -la "$tarball"
  ;;
build)
  dir=${2:-/tmp/llama-cuda}
  if [ -x "$dir/build/bin/llama-server" ]; then echo "reusing $dir/build/bin"; exit 0; fi
  mkdir -p "$dir"
  [ -d "$dir/llama.cpp" ] || tar xzf "$tarball" -C "$dir"
  export PATH=$PATH:$(ls -d /usr/local/cuda*/bin 2>/dev/null | head -1)
  command -v nvcc >/dev/null || { echo "nvcc not found" >&2; exit 1; }
  cmake -S "$dir/llama.cpp" -B "$dir/build" -DCMAKE_BUILD_TYPE=Release \
    -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 -DGGML_CUDA_FA=${LLAMA_CUDA_FA:-ON} -DGGML_CUDA_NCCL=OFF \
    -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_SERVER=ON \
    -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_APP=OFF -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF
  cmake --build "$dir/build" -j"$(nproc)" --target llama-bench llama-server
  ls -la "$dir/build/bin/llama-bench" "$dir/build/bin/llama-server"
  ;;
bundle)
  out=${2:?out dir}
  dir=/tmp/llama-cuda
  b=$out/llama-bench-cuda
  mkdir -p "$b"
  cp "$dir/build/bin/llama-bench" "$dir/build/bin/llama-server" "$b/"
  find "$dir/build" -name '*.so*' -exec cp -P {} "$b/" \;
  tar cJf "$out/llama-bench-cuda.tar.xz" -C "$out" llama-bench-cuda
  rm -rf "$b"
  ls -la "$out/llama-bench-cuda.tar.xz"
  ;;
*)
  echo "unknown mode $mode" >&2
  exit 1
  ;;
esac
