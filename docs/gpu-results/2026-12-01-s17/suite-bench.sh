# Session 17 suite, bench stage (same machine, right after suite-test.sh): vela vs llama.cpp CUDA,
# pp512 / tg128 / tg at 8K, the three real models and the synth 8B Q4_0 / Q4_K_M; plus the real
# models' tg128 without this session's three pre-wait changes (VELA_CUDA_DEFINES=...) at depth 0.
export VELA_CACHE_GPU=$HOME/.cache/vela
SUITE_SYNTH="llama3-8b:q4_0 llama3-8b:q4_k_m" \
SUITE_TG_AB="VELA_CUDA_DEFINES=NORM_WAIT_FIRST,ROPE_WAIT_FIRST,NO_KV_PF" \
SUITE_TG_AB_MODELS="SmolLM2|gemma-3|qwen" SUITE_TG_AB_DEPTHS=0 bash scripts/gpu-suite.sh bench
