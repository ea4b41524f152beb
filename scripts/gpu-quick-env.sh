# Sourced ON the GPU machine from the repository root (`source scripts/gpu-quick-env.sh`) by the
# `quick` stage of scripts/gpu-suite.sh and by custom device calls that carry
# target/gpu-data/quick (made by `gpu-suite.sh pack-quick`): unpacks the vela and GPU test
# binaries to /tmp/vela and /tmp/gpu-test (the test binary only if it was packed) and the
# tokenizer sources `vela synth` needs into $VELA_CACHE/vocab, and exports VELA_CACHE (default
# /tmp/vela-cache) and VELA_NVRTC_LIB (the machine's libnvrtc).
Q=${QUICK_DIR:-target/gpu-data/quick}
export VELA_CACHE=${VELA_CACHE:-/tmp/vela-cache}
mkdir -p "$VELA_CACHE/vocab"
xz -dc $Q/vela.xz >/tmp/vela && chmod +x /tmp/vela
if [ -f $Q/gpu-test.xz ]; then xz -dc $Q/gpu-test.xz >/tmp/gpu-test && chmod +x /tmp/gpu-test; fi
for f in $Q/vocab-*.gguf.xz; do v=$(basename "$f" .gguf.xz); xz -dc "$f" >"$VELA_CACHE/vocab/ggml-${v}.gguf"; done
export VELA_NVRTC_LIB=$(ls /usr/local/cuda*/lib64/libnvrtc.so* 2>/dev/null | grep -v builtins | head -1)
