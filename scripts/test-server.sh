#!/usr/bin/env bash
# End-to-end test of the HTTP server (crate vela-server): builds the `serve` example, then runs
# scripts/test-server.py against SmolLM2-135M (chat, stop, seeds, logprobs, /v1/messages, bad
# input, cancellation, load, prefix cache), Qwen2.5-Coder-0.5B (tool calls) and Gemma 3 270M
# (prefix cache beyond its 512-token sliding window), and a random-weight Gemma 4 with the real
# tokenizer/template plus its assistant (scripts/gen-gemma4-e2e.py: MTP speculative decoding in
# the server equals plain decoding; Gemma 4 tool rendering), and a tiny qwen4_exp trained to think and
# call a tool in Qwen3.5's XML with the real Qwen3.5 vocabulary/template (scripts/gen-qwen4exp-toolcall.py:
# reasoning_content, tool_calls, the answer from the tool result with turn 1 from the prefix cache),
# and structured output on Qwen2.5-Coder (scripts/test-structured.py --quick),
# and a tiny deepseek_v4 trained the same way in DSML with the real DeepSeek V3/V4 vocabulary and V4
# template (scripts/gen-deepseekv4-toolcall.py, an HF checkpoint directory; turns 2 and 3 reuse the
# earlier turns exactly), and a tiny glm5_next trained the same way in GLM's <arg_key>/<arg_value>
# format with a GLM-5-shaped vocabulary and the GLM-4.7-Flash template (scripts/gen-glm5-toolcall.py;
# turn 2 from the cache equals a fresh server's logprobs).
# Then the web chat UI in a real Chromium with Qwen2.5-Coder (scripts/test-ui.py; screenshots in
# $VELA_CACHE/ui-test/).
# Each run starts and stops its own servers.
# Models come from $VELA_CACHE/models (default ~/.cache/vela/models); missing ones are skipped.
# Usage: scripts/test-server.sh [smol|qwen|gemma|gemma4|qwen4exp|deepseekv4|glm5 ...]
set -euo pipefail
cd "$(dirname "$0")/.."
M="${VELA_CACHE:-$HOME/.cache/vela}/models"
python3 -m pip install -q openai anthropic httpx jsonschema playwright >/dev/null 2>&1 || echo "warning: pip install failed" >&2
cargo build --release -p vela-server --example serve
BIN=${CARGO_TARGET_DIR:-target}/release/examples/serve
kinds=("${@:-smol qwen gemma gemma4 qwen4exp deepseekv4 glm5}")
status=0
for k in ${kinds[*]}; do
  case $k in
    smol) f=$M/SmolLM2-135M-Instruct.Q4_1.gguf ;;
    qwen) f=$M/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf ;;
    gemma) f=$M/gemma-3-270m-q4_k_m.gguf ;;
    gemma4) f=${VELA_CACHE:-$HOME/.cache/vela}/golden/gemma4_e2e/model-f32.gguf ;;
    qwen4exp) f=${VELA_CACHE:-$HOME/.cache/vela}/golden/qwen4exp_toolcall/model-f32.gguf ;;
    deepseekv4) f=${VELA_CACHE:-$HOME/.cache/vela}/golden/deepseekv4_toolcall ;;
    glm5) f=${VELA_CACHE:-$HOME/.cache/vela}/golden/glm5_toolcall ;;
    *) echo "unknown kind $k" >&2; exit 2 ;;
  esac
  if [ ! -e "$f" ]; then echo "SKIP $k: $f missing"; continue; fi
  echo "######## $k ($f)"
  python3 scripts/test-server.py --bin "$BIN" --model "$f" --kind "$k" || status=1
  if [ "$k" = qwen ]; then
    # Structured output, CI-sized (the full 200-request check: scripts/test-structured.py).
    python3 scripts/test-structured.py --bin "$BIN" --model "$f" --quick || status=1
  fi
done
# The web chat UI at / (scripts/test-ui.py drives Debian's Chromium through Playwright).
ui_model=$M/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf
if [ -e "$ui_model" ]; then
  echo "######## web UI ($ui_model)"
  python3 scripts/test-ui.py --bin "$BIN" --model "$ui_model" || status=1
else
  echo "SKIP web UI: $ui_model missing"
fi
exit $status
