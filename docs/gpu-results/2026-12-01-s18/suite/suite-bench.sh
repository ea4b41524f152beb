# Session 18 suite, bench stage (same machine, right after suite-test.sh): vela vs llama.cpp CUDA,
# pp512 / tg128 / tg at 8K, the three real models and the synth 8B Q4_0 / Q4_K_M; plus the real
# head-dim-64 models' tg128 without the warp parts (VELA_CUDA_ATTN_WARP=0) at depths 0 and 512.
export VELA_CACHE_GPU=$HOME/.cache/vela
SUITE_SYNTH="llama3-8b:q4_0 llama3-8b:q4_k_m" \
SUITE_TG_AB="VELA_CUDA_ATTN_WARP=0" \
SUITE_TG_AB_MODELS="SmolLM2|qwen" SUITE_TG_AB_DEPTHS="0 512" bash scripts/gpu-suite.sh bench
