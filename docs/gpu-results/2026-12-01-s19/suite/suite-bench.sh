# Session 19 suite, bench stage (same machine, right after suite-test.sh): vela vs llama.cpp CUDA,
# pp512 / tg128 / tg at 8K, the three real models and the synth 8B Q4_0 / Q4_K_M; plus the synth
# 8B Q4_0's tg128 without this session's default (the warp parts for head dim 128:
# VELA_CUDA_ATTN_WARP=2, session 18's head dim 64 only) at depths 0, 512 and 1280 (1,280-1,408
# keys: the warp parts now, the tensor-core decode before).
export VELA_CACHE_GPU=$HOME/.cache/vela
SUITE_SYNTH="llama3-8b:q4_0 llama3-8b:q4_k_m" \
SUITE_TG_AB="VELA_CUDA_ATTN_WARP=2" \
SUITE_TG_AB_MODELS="llama3-8b-q4_0" SUITE_TG_AB_DEPTHS="0 512 1280" bash scripts/gpu-suite.sh bench
