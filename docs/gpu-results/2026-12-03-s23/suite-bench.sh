# Session 23: the suite, bench stage (same machine, right after suite-test.sh): vela vs llama.cpp
# CUDA, pp512 / tg128 / tg at 8K, the three real models and the synth 8B Q4_0 / Q4_K_M; then
# vela's tg128 at depth 0 of the Qwen 0.5B and the synth 8B Q4_K_M without session 21's three
# load-order changes (VELA_CUDA_DEFINES=PARTW_SERIAL,ACT_SERIAL,MVKS_ASERIAL, session 21's
# starting kernels; measured there only on the synth models), 3 interleaved rounds.
export VELA_CACHE_GPU=$HOME/.cache/vela
SUITE_SYNTH="llama3-8b:q4_0 llama3-8b:q4_k_m" \
SUITE_TG_AB="VELA_CUDA_DEFINES=PARTW_SERIAL,ACT_SERIAL,MVKS_ASERIAL" \
SUITE_TG_AB_MODELS="qwen|llama3-8b-q4_k_m" SUITE_TG_AB_DEPTHS="0" bash scripts/gpu-suite.sh bench
