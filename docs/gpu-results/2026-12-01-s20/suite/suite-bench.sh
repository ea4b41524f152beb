# Session 20 suite, bench stage (same machine, right after suite-test.sh): vela vs llama.cpp CUDA,
# pp512 / tg128 / tg at 8K, the three real models and the synth 8B Q4_0 / Q4_K_M; plus vela's
# tg128 at depth 0 of the real Qwen2.5-Coder-0.5B and the synth 8B Q4_0 without this session's
# matvec change (VELA_CUDA_DEFINES=MV_W_L1,MV_WAIT_UNGUARDED: weight loads allocating in L1 and
# the unconditional wait, i.e. the session's starting kernels but for the coherent activation
# loads), 3 interleaved rounds.
export VELA_CACHE_GPU=$HOME/.cache/vela
SUITE_SYNTH="llama3-8b:q4_0 llama3-8b:q4_k_m" \
SUITE_TG_AB="VELA_CUDA_DEFINES=MV_W_L1,MV_WAIT_UNGUARDED" \
SUITE_TG_AB_MODELS="qwen|llama3-8b-q4_0" SUITE_TG_AB_DEPTHS="0" bash scripts/gpu-suite.sh bench
