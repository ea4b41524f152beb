# For session 22: the suite, bench stage (same machine, right after suite-test.sh): vela vs llama.cpp CUDA,
# pp512 / tg128 / tg at 8K, the three real models and the synth 8B Q4_0 / Q4_K_M; plus vela's
# tg128 at depth 0 of the real models and the synth 8B Q4_K_M without this session's three load-order changes
# (VELA_CUDA_DEFINES=PARTW_SERIAL,ACT_SERIAL,MVKS_ASERIAL: the session's starting kernels),
# 3 interleaved rounds.
export VELA_CACHE_GPU=$HOME/.cache/vela
SUITE_SYNTH="llama3-8b:q4_0 llama3-8b:q4_k_m" \
SUITE_TG_AB="VELA_CUDA_DEFINES=PARTW_SERIAL,ACT_SERIAL,MVKS_ASERIAL" \
SUITE_TG_AB_MODELS="qwen|gemma|SmolLM|llama3-8b-q4_k_m" SUITE_TG_AB_DEPTHS="0" bash scripts/gpu-suite.sh bench
