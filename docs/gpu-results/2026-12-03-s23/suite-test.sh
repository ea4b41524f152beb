# Session 23: the suite, test stage (after the carries of target/gpu-data/suite's groups.txt, each
# `bash scripts/gpu-suite.sh recv`; this call carries the last group): every GPU test, gpu-vs-cpu
# on the three real models, the llama.cpp parity fixtures on the GPU, the synth 8B Q4_0 / Q4_K_M.
bash scripts/gpu-suite.sh recv
rm -f $HOME/.cache/vela/models/*.gguf
export VELA_CACHE_GPU=$HOME/.cache/vela
SUITE_SYNTH="llama3-8b:q4_0 llama3-8b:q4_k_m" bash scripts/gpu-suite.sh test
