#!/usr/bin/env bash
# The whole GPU check of issue 6, run ON the GPU machine (no Rust toolchain, no network there)
# from the repository root, with what this machine built and fetched carried over by the device
# tool in pieces of at most 64 MiB per call (the machine stays warm between back-to-back calls).
#
#   here:   scripts/gpu-suite.sh pack     # -> target/gpu-data/suite/: the vela binary, the GPU
#                                         #    test binary, the three real models in 48 MiB parts,
#                                         #    the CPU side of gpu-vs-cpu.py (cpuref.tar),
#                                         #    the parity fixtures, tokenizer sources for
#                                         #    `vela synth`, llama.cpp CUDA (a llama-bench bundle
#                                         #    built there once by scripts/build-llama-cpp-cuda.sh
#                                         #    and brought back, target/gpu-data/lb/lb.partNN);
#                                         #    prints the carry groups (each <= 64 MiB)
#   here:   scripts/gpu-suite.sh regroup  # after a rebuild: fresh binaries into the pack, new groups
#   here:   scripts/gpu-suite.sh pack-small  # after regroup: a 4-call pack with SmolLM2 only
#   there:  scripts/gpu-suite.sh recv     # once per carry group: files -> /tmp/stash
#   there:  scripts/gpu-suite.sh test     # assemble + sha256-check the models, then
#       1. device bandwidth (crates/vela-cuda/bench/bandwidth.cu, nvcc) — the roofline's denominator
#       2. GPU op/model tests (scripts/gpu-check.sh all with the carried test binary)
#       3. GPU vs CPU logits + greedy (scripts/gpu-vs-cpu.py; exact mode gated, default reported)
#       4. llama.cpp parity fixtures with vela on the GPU (scripts/check-parity.py)
#       and `vela synth` of Llama-3-8B Q4_0 / Q4_K_M in the background
#   there:  scripts/gpu-suite.sh bench    # vela vs llama.cpp CUDA, interleaved, 3 reps
#       (scripts/bench-vs-llama.py): pp512 + tg128, and tg128 at 8K depth, for the three real
#       models and the two synth 8B models; weight bytes per token for the roofline
#   here:   scripts/gpu-suite.sh pack-quick  # one ~50 MB carry (target/gpu-data/quick) for
#   there:  scripts/gpu-suite.sh quick       # one call: every GPU op test (QUICK_TESTS filters),
#       then per model of QUICK_MODELS ("name:geometry:type ...", synthesized there) a pp512 +
#       tg128 run vs llama.cpp and tg128 A/B runs for QUICK_AB ("name:SWITCH=value ...", several
#       variables of one run joined by '/': "q05:A=1/B=1";
#       "name:+SWITCH=value": pp512 too), the 8B at 8K depth (QUICK_8K=0 skips; QUICK_8K_AB
#       switches; QUICK_DEPTHS="1024 8192" other depths; QUICK_CTX="8192 8192:SWITCH=value" the 8B's
#       tg128 with that context size, as a server allocates it), with QUICK_PROF8K=1 per-kernel GPU times of the 8B decode at 8K and 0 depth,
#       and with QUICK_NCU=1 an ncu profile of the 8B decode kernels. Example: QUICK_AB="l8:VELA_CUDA_GRAPH=0" bash ... quick
#   there:  scripts/gpu-suite.sh q4x         # from the same carry: Qwen3.8 Flash Next at real size
#       generated in memory (qwen4_exp GPU tests, pp/tg at 0 and 8K, MTP cost model): $OUT/q4x-*
#   there:  scripts/gpu-suite.sh d4x         # from the same carry: DeepSeek V4 Flash's first 12
#       layers generated in memory (pp512 + tg128, tg128 at the depths of D4X_DEPTHS, default 8192,
#       the memory plan; D4X_PROFILE=DEPTH: per-kernel GPU times of the decode at depth 0 and at
#       DEPTH): $OUT/d4x-*
#   there:  scripts/gpu-suite.sh tests       # from the carry of pack-ab: this tree's whole GPU test
#       binary (the model tests on a synth Qwen2.5-0.5B-geometry model, the HF fixtures the pack
#       carries): $OUT/tests.log
#   there:  scripts/gpu-suite.sh d4x-ab      # the same carry: DeepSeek V4's attention and op GPU
#       tests (new binary), then tg128 of the 12-layer geometry at depth 0 and at each depth of
#       D4X_DEPTHS (default 8192), the reference and this build alternating (D4X_ROUNDS rounds,
#       default 2, of `-r 2`): $OUT/d4x-ab.md
#   there:  scripts/gpu-suite.sh d4s         # from the same carry: DeepSeek V4's GPU tests and DSpark
#       speculation on the 12-layer geometry (verification cost, forced acceptance): $OUT/d4s-*
#   there:  scripts/gpu-suite.sh q4x-llama   # from the carry of pack-ab + the llama.cpp source (or its
#       bundle in target/gpu-data/lb): Qwen3.8 Flash Next (reduced depth, one GGUF) vs llama.cpp CUDA
#   there:  scripts/gpu-suite.sh q4x-fast    # the same carry: the qwen4_exp / sparse / recurrent
#       GPU tests first, then q4x-llama with tg128 at 8K depth and without the MTP numbers
#   here:   scripts/gpu-suite.sh pack-ab OLD_VELA OLD_GPU_TEST  # one carry (target/gpu-data/ab):
#                                         #    a reference build's binaries next to this tree's
#   there:  scripts/gpu-suite.sh ab          # one call, no llama.cpp needed: both GPU test
#       binaries (on a synth Qwen2.5-0.5B-geometry model), then pp512 + tg128 of both vela binaries
#       on the synth models of AB_MODELS ("name:geometry:type ...", default Llama-3-8B Q4_0,
#       Qwen2.5-0.5B Q4_K_M, Gemma-4-31B Q4_0, Gemma-4-26B-A4B Q4_0 (MoE)), AB_REPS rounds (default 3) alternating which binary
#       runs first (AB_TESTS=0 skips the tests); $OUT/ab.md: medians, min-max and new/old. For refactors that must not change
#       speed or results. Then the new binary's batched decoding (`vela bench --parallel`,
#       AB_PARALLEL sequence counts) on the first model: $OUT/parallel.md; then the `vela eval`
#       workloads of AB_EVAL (default long-32k) on it with the stall probe: $OUT/eval-NAME/.
#   here:   scripts/gpu-suite.sh pack-place  # one carry (target/gpu-data/place, ~55 MB): this
#                                         #    tree's vela and GPU test binaries, the Gemma 4 and
#                                         #    DeepSeek vocabularies, the llama.cpp CUDA bundle
#   there:  scripts/gpu-suite.sh place-tests # the placement GPU tests and DeepSeek V4's op tests
#   there:  scripts/gpu-suite.sh place       # experts in host memory (issue 41): a synth Gemma-4-26B-A4B Q4_0 GGUF side by side with llama.cpp, all on the GPU and
#       with every routed expert on the CPU (vela --experts cpu --expert-cache 0, llama-bench
#       -ncmoe 99), 3 interleaved rounds each; vela's traffic per token without and with a GPU
#       cache of hot experts (PLACE_CACHE GiB): $OUT/place-*.md
#   there:  scripts/gpu-suite.sh place-ab    # the same carry + a reference vela in
#       target/gpu-data/place-old/vela-old.xz: expert-product GPU tests, pp512 old vs new (all on
#       the GPU, experts streamed), tg256 per device cache size (one short call)
#   there:  scripts/gpu-suite.sh place-d4    # the same carry: DeepSeek V4 Flash at full size (43
#       layers, PLACE_TYPE default q4_0), more than the GPU holds, generated in memory and placed
#       by --experts auto (PLACE_EXPERTS): the plan, pp512 + tg128 with host traffic and the
#       device cache's hit rate; PLACE_DEPTHS="0 8192 ...": then the 12-layer geometry's tg64 at
#       those depths (PLACE_FULL=0: only those): $OUT/place-d4*.md
#   here:   scripts/gpu-suite.sh pack-g5x    # one carry (target/gpu-data/g5x): this tree's vela
#                                         #    and GPU test binaries, the GLM stand-in vocabulary
#                                         #    (ggml-vocab-qwen35), the glm5 `mtp` fixture
#   there:  scripts/gpu-suite.sh g5x         # GLM 5.3 Flash (issue 35), from that carry plus
#       target/gpu-data/llama-src.tar.gz (or the lb bundle): llama.cpp CUDA builds in the
#       background while the GPU tests run (glm5, recurrent, sparse, host experts, MTP), then
#       `vela synth --arch glm5-flash-12l` (G5X_TYPE default q4_0) writes one GGUF that vela
#       benchmarks alone (pp512 + tg128, MTP verify cost K = 0..7, forced 50/70/90 %
#       acceptance) and llama.cpp loads once (a smoke run): $OUT/g5x-*
#   there:  scripts/gpu-suite.sh g5x-llama   # the next call on the same machine: that GGUF side
#       by side with llama.cpp CUDA (bench-vs-llama.py, G5X_REPS rounds, default 3): pp512 +
#       tg128, then tg128 at each depth of G5X_DEPTHS (default "8192 65536"): $OUT/g5x-vs-llama*.md
#   there:  scripts/gpu-suite.sh g5x-ab      # one call from the carry of pack-g5x plus
#       target/gpu-data/g5x-vela-old.xz (a reference build's vela): the GPU tests of the
#       sparse, mHC, indexer and GLM kernels while the GGUF is written (to /dev/shm), then
#       tg128 at depth 8192 and pp512 + tg128 at depth 0, new and old alternating
#       (G5X_ROUNDS, default 1, of `-r 3` runs), then the new build's per-kernel GPU times
#       of the decode at depth 0 (G5X_PROFILE=1): $OUT/g5x-ab*
#   here:   scripts/gpu-suite.sh pack-pc     # one small carry (target/gpu-data/pc): vela, the
#                                         #    Llama 3 tokenizer source
#   there:  scripts/gpu-suite.sh pc          # --cache-dir on the GPU: a synth Llama-3-8B Q4_0,
#       a PC_TOKENS-token turn loaded after a restart vs evaluated again (bench-cache-dir.py)
#   A smaller suite: SUITE_MODELS / SUITE_KEYS / SUITE_SYNTH (see below), the same for every stage;
#   SUITE_AB8K="SWITCH=value ..." reruns the synth models' 8K-depth decode per switch (bench stage),
#   SUITE_AB0 their tg128 at depth 0; SUITE_SAMPLED="SWITCH=value ..." vela's sampled tg128 (T=0.8)
#   per switch; SUITE_TG_AB="SWITCH=value ..." vela alone, greedy tg128 at depths 0 and 8192
#   (SUITE_TG_AB_DEPTHS) of the models matching SUITE_TG_AB_MODELS (default: the synth ones)
#   without and with each switch, interleaved. A SWITCH is any environment variable of the run
#   (VELA_CUDA_GRAPH=0, VELA_MATMUL=f32, ...); the CUDA backend's own variables are listed in
#   crates/vela-cuda/src/tuning.rs.
#   SUITE_DIR: the pack's directory (default target/gpu-data/suite; target/gpu-data/suite-s for
#   the pack of `pack-small`), set for every stage there.
#   Results: $OUT/*.md (+ logs). Never touches GPU settings.
set -uo pipefail
stage=${1:?stage: pack|regroup|pack-small|recv|test|bench|pack-quick|quick|pack-ab|ab|q4x|q4x-llama|q4x-fast|d4x|d4x-ab|d4s|tests|pack-place|place|place-d4|place-tests|place-ab|pack-g5x|g5x|g5x-llama|g5x-ab|pack-pc|pc}
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
S=${SUITE_DIR:-target/gpu-data/suite}
stash=/tmp/stash
OUT=${OUT:-/tmp/vela-gpu-suite}
export VELA_CACHE=${VELA_CACHE_GPU:-/tmp/vela-cache}
# SUITE_MODELS (files) / SUITE_KEYS (their fixture keys) / SUITE_SYNTH select a smaller suite when
# device time is short (each 61 MiB carry is one call).
MODELS=${SUITE_MODELS:-SmolLM2-135M-Instruct.Q4_1 gemma-3-270m-q4_k_m qwen2.5-coder-0.5b-instruct-q4_k_m}
KEYS=${SUITE_KEYS:-smollm2,gemma3,qwen25}
SYNTH=${SUITE_SYNTH:-llama3-8b:q4_0 llama3-8b:q4_k_m}

# llama.cpp CUDA for a stage, in the background (sets $bpid; `wait $bpid` before use): the bundle
# target/gpu-data/lb/llama-bench-cuda.tar.xz when carried, else a build from
# target/gpu-data/llama-src.tar.gz (`scripts/build-llama-cpp-cuda.sh pack`), bundled into $OUT so
# a later machine can take it back unbuilt. Either way /tmp/llama-bench-cuda, linked as
# $VELA_CACHE/llama.cpp-cuda/bin.
llama_cuda_bg() {
  mkdir -p "$VELA_CACHE/llama.cpp-cuda"
  if [ -x /tmp/llama-bench-cuda/llama-bench ]; then
    echo "build exit 0 (ready)" >/tmp/llama-build.log &
  elif [ -s target/gpu-data/lb/llama-bench-cuda.tar.xz ]; then
    (tar xJf target/gpu-data/lb/llama-bench-cuda.tar.xz -C /tmp && echo "build exit 0 (bundle)" >/tmp/llama-build.log) &
  else
    (nice -n 19 bash scripts/build-llama-cpp-cuda.sh build >/tmp/llama-build.log 2>&1; echo "build exit $?" >>/tmp/llama-build.log
     grep -q "build exit 0" /tmp/llama-build.log && XZ_OPT=-T8 bash scripts/build-llama-cpp-cuda.sh bundle $OUT >>/tmp/llama-build.log 2>&1
     tar xJf $OUT/llama-bench-cuda.tar.xz -C /tmp) &
  fi
  bpid=$!
  ln -sfn /tmp/llama-bench-cuda "$VELA_CACHE/llama.cpp-cuda/bin"
}

# Carry groups of the files of $S (each call's carry, largest first): scripts/carry_groups.py.
groups() {
  python3 scripts/carry_groups.py "$S"
}

# vela's tg128 of one model ("SWITCH=value" or base; more switches joined by '/'), the rest of
# the arguments passed to `vela bench`: prints "tg128 ... | mean ± std".
vela_tg() {
  local sw=$1 m=$2; shift 2
  env $([ "$sw" = base ] || echo ${sw//\// }) timeout 60 /tmp/vela bench --model "$m" --device cuda \
    -p 0 -n 128 -r 3 "$@" 2>/dev/null | grep -o 'tg128[^|]*| [0-9.]* ± [0-9.]*'
}

case $stage in
pack)
  src=${VELA_CACHE_HERE:-$HOME/.cache/vela}
  rm -rf $S && mkdir -p $S
  cp target/release/vela $S/vela
  bin=$(ls -t target/release/deps/gpu-* 2>/dev/null | grep -v '\.d$' | head -1)
  cp "$bin" $S/gpu-test
  tar czf $S/parity.tar.gz -C "$src/golden" parity
  # Tokenizer sources of `vela synth` (llama3-8b, qwen2.5, and the GPU tests' gemma4-tiny).
  for v in llama-bpe qwen2 gemma-4; do cp "$src/llama-cpp-python/vendor/llama.cpp/models/ggml-vocab-$v.gguf" $S/; done
  cp target/gpu-data/lb/lb.part* $S/ 2>/dev/null || echo "no llama-bench bundle in target/gpu-data/lb"
  # The CPU side of scripts/gpu-vs-cpu.py, computed here (14 min on 2 cores, 30 MB) so the GPU
  # machine only runs the GPU side (VELA_SUITE_CPUREF=0 skips it; the test stage then runs both).
  if [ "${VELA_SUITE_CPUREF:-1}" = 1 ]; then
    VELA_CACHE=$src python3 scripts/gpu-vs-cpu.py --vela target/release/vela --models $KEYS --modes exact,default,mixed \
      --cpu-ref-out $S/cpuref >/dev/null && tar cf $S/cpuref.tar -C $S cpuref && rm -rf $S/cpuref
  fi
  for m in $MODELS; do
    (cd "$src/models" && sha256sum $m.gguf) >"$S/m-$m.sha256"
    split -b 48M -d "$src/models/$m.gguf" "$S/m-$m.part"
  done
  groups
  ;;
pack-small)
  # A smaller pack (4 carry calls instead of 17) from the full one after `regroup`: the binaries,
  # parity fixtures, CPU references, tokenizer sources, llama.cpp bundle and only the models of
  # SMALL_MODELS (default SmolLM2) -> target/gpu-data/suite-s. There, every stage with
  # SUITE_DIR=target/gpu-data/suite-s, SUITE_MODELS / SUITE_KEYS set to the same models, and
  # SUITE_SYNTH adding "qwen2.5-0.5b:q4_k_m" for the 0.5B geometry.
  small=${SMALL_MODELS:-SmolLM2-135M-Instruct.Q4_1}
  D=target/gpu-data/suite-s
  rm -rf $D && mkdir -p $D
  for f in vela gpu-test parity.tar.gz cpuref.tar ggml-vocab-llama-bpe.gguf ggml-vocab-qwen2.gguf ggml-vocab-gemma-4.gguf; do
    cp target/gpu-data/suite/$f $D/
  done
  cp target/gpu-data/suite/lb.part* $D/
  for m in $small; do cp target/gpu-data/suite/m-$m.* $D/; done
  S=$D groups
  ;;
regroup)
  # After a rebuild: the fresh vela and GPU test binaries (and any tokenizer source the pack
  # lacks) into an existing pack, new carry groups.
  cp target/release/vela $S/vela
  for v in llama-bpe qwen2 gemma-4; do
    [ -f $S/ggml-vocab-$v.gguf ] || cp "${VELA_CACHE_HERE:-$HOME/.cache/vela}/llama-cpp-python/vendor/llama.cpp/models/ggml-vocab-$v.gguf" $S/
  done
  bin=$(ls -t target/release/deps/gpu-* 2>/dev/null | grep -v '\.d$' | head -1)
  cp "$bin" $S/gpu-test
  groups
  ;;
recv)
  mkdir -p $stash
  for f in $S/*; do [ -f "$f" ] && cp -f "$f" $stash/; done
  echo "stash: $(ls $stash | wc -l) files, $(du -sh $stash | cut -f1)"
  ;;
test)
  # Every carried file present with its packed size (a failed or skipped carry call would
  # otherwise cost a whole test run): stop before anything runs.
  if [ -f $stash/manifest.txt ]; then
    bad=$(while read -r size f; do
      [ "$(stat -c %s "$stash/$f" 2>/dev/null)" = "$size" ] || echo "$f"; done <$stash/manifest.txt)
    if [ -n "$bad" ]; then echo "stash incomplete (missing or wrong size): $bad" >&2; exit 2; fi
  else
    echo "no manifest.txt in $stash (carry every group of groups.txt first)" >&2; exit 2
  fi
  mkdir -p "$OUT" "$VELA_CACHE/models" "$VELA_CACHE/golden" "$VELA_CACHE/vocab" /tmp/synth
  log=$OUT/suite-test-log.txt
  : >"$log"
  say() { echo "$*" | tee -a "$log"; }
  t0=$(date +%s)
  cp $stash/vela $stash/gpu-test /tmp/ && chmod +x /tmp/vela /tmp/gpu-test
  cp $stash/ggml-vocab-*.gguf "$VELA_CACHE/vocab/"
  (for s in $SYNTH; do
     a=${s%%:*}; t=${s##*:}
     /tmp/vela synth --arch "$a" --type "$t" --seed 1 -t 6 -o /tmp/synth/$a-$t.gguf
   done; echo "synth done") >/tmp/synth.log 2>&1 </dev/null &
  # (A model assembled earlier is reused only if its checksum still matches: a run with a
  # partial stash may have left a truncated one.)
  for m in $MODELS; do
    (cd "$VELA_CACHE/models" && sha256sum --status -c $stash/m-$m.sha256 2>/dev/null) ||
      cat $stash/m-$m.part* >"$VELA_CACHE/models/$m.gguf"
    (cd "$VELA_CACHE/models" && sha256sum -c $stash/m-$m.sha256) 2>&1 | tee -a "$log"
  done
  rm -rf "$VELA_CACHE/golden/parity" && tar xzf $stash/parity.tar.gz -C "$VELA_CACHE/golden"
  mkdir -p "$VELA_CACHE/llama.cpp-cuda" && cat $stash/lb.part* | tar xJf - -C /tmp &&
    rm -rf "$VELA_CACHE/llama.cpp-cuda/bin" && ln -s /tmp/llama-bench-cuda "$VELA_CACHE/llama.cpp-cuda/bin"
  export PATH=$PATH:$(ls -d /usr/local/cuda*/bin 2>/dev/null | head -1)
  say "== 1. bandwidth"
  nvcc -O3 -arch=sm_90 crates/vela-cuda/bench/bandwidth.cu -o /tmp/vela-bw 2>>"$log" && /tmp/vela-bw 2>&1 | tee -a "$log"
  # The three correctness stages run concurrently (16 cores; the timings they print are info).
  say "== 2-4. GPU tests, GPU vs CPU, parity on the GPU, concurrently ($(( $(date +%s) - t0 )) s)"
  (VELA_GPU_MODEL=$VELA_CACHE/models/SmolLM2-135M-Instruct.Q4_1.gguf OUT=$OUT \
    timeout 240 scripts/gpu-check.sh all /tmp/gpu-test >/dev/null 2>&1; echo "gpu-check exit $?" >$OUT/rc-check.txt) &
  ref=(); modes=exact,default
  if [ -f $stash/cpuref.tar ]; then
    tar xf $stash/cpuref.tar -C /tmp && ref=(--cpu-ref /tmp/cpuref) && modes=exact,default,mixed
  fi
  (timeout 240 python3 scripts/gpu-vs-cpu.py --vela /tmp/vela --models $KEYS --modes $modes "${ref[@]}" \
     --out $OUT/gpu-vs-cpu.md >$OUT/gpu-vs-cpu-log.txt 2>&1;
    echo "gpu-vs-cpu exit $?" >$OUT/rc-gvc.txt) &
  (timeout 240 python3 scripts/check-parity.py --vela /tmp/vela --models $KEYS >$OUT/parity-gpu.txt 2>&1;
    echo "check-parity exit $?" >$OUT/rc-parity.txt) &
  wait
  cat $OUT/rc-*.txt | tee -a "$log"
  grep -E "FAIL|panicked" $OUT/log-all.txt | head -20 | tee -a "$log"
  tail -25 $OUT/gpu-vs-cpu-log.txt | tee -a "$log"
  tail -8 $OUT/parity-gpu.txt | tee -a "$log"
  say "== done ($(( $(date +%s) - t0 )) s); synth: $(tail -1 /tmp/synth.log)"
  ;;
bench)
  mkdir -p "$OUT"
  log=$OUT/suite-bench-log.txt
  : >"$log"
  t0=$(date +%s)
  for i in $(seq 60); do grep -q "synth done" /tmp/synth.log && break; sleep 2; done
  cat /tmp/synth.log >>"$log"
  models=$KEYS
  for s in $SYNTH; do f=/tmp/synth/${s%%:*}-${s##*:}.gguf; [ -s "$f" ] && models="$models,$f"; done
  B=(python3 scripts/bench-vs-llama.py --vela /tmp/vela --flavors cuda --threads 16 --reps 3
     "--llama-args=-ngl 99" "--vela-args=--device cuda")
  timeout 190 "${B[@]}" --models "$models" --out $OUT/bench.md --json-out $OUT/bench.json 2>>"$log"
  echo "pp/tg done $(( $(date +%s) - t0 )) s" >>"$log"
  timeout 170 "${B[@]}" --models "$models" -p 0 -n 128 --depth 8192 --out $OUT/bench-8k.md 2>>"$log"
  echo "8k done $(( $(date +%s) - t0 )) s" >>"$log"
  # SUITE_AB8K="SWITCH=value ...": the 8K-depth decode of the synth models again per switch.
  synths=$(echo "$models" | tr ',' '\n' | grep '^/tmp/synth' | paste -sd, -)
  for sw in ${SUITE_AB8K:-}; do
    [ -n "$synths" ] && env ${sw//\// } timeout 120 "${B[@]}" --models "$synths" -p 0 -n 128 --depth 8192 \
      --out $OUT/bench-8k-$(echo $sw | tr '=,/' '___').md 2>>"$log" | grep "tg128" | sed "s|^|$sw |"
  done
  # SUITE_AB0="SWITCH=value ...": the tg128 (depth 0) of the synth models again per switch.
  for sw in ${SUITE_AB0:-}; do
    [ -n "$synths" ] && env ${sw//\// } timeout 120 "${B[@]}" --models "$synths" -p 0 -n 128 \
      --out $OUT/bench-tg-$(echo $sw | tr '=,/' '___').md 2>>"$log" | grep "tg128" | sed "s|^|$sw |"
  done
  # SUITE_TG_AB="SWITCH=value ...": vela alone, greedy tg128 at depths SUITE_TG_AB_DEPTHS
  # (default "0 8192") without and with each switch, 3 interleaved rounds of 3 reps each, of the
  # models whose paths match SUITE_TG_AB_MODELS (default "synth": the synth models; e.g.
  # "qwen|gemma" for real ones).
  if [ -n "${SUITE_TG_AB:-}" ]; then
    for r in 1 2 3; do
      for m in $( (ls $VELA_CACHE/models/*.gguf; echo ${synths//,/ } | tr ' ' '\n') | grep -E "${SUITE_TG_AB_MODELS:-synth}"); do
        for d in ${SUITE_TG_AB_DEPTHS:-0 8192}; do
          for sw in base $SUITE_TG_AB; do
            echo "| $r | $(basename "$m" .gguf) | $d | $sw | $(vela_tg $sw "$m" --depth $d) |"
          done
        done
      done
    done | tee $OUT/bench-tg-ab.md
  fi
  # SUITE_SAMPLED="SWITCH=value ...": vela's sampled decode (tg128 at temperature 0.8 with the
  # default sampler; llama-bench has no sampling) of every real model and the synth 8B Q4_0,
  # without and with each switch, 3 interleaved rounds of 3 reps each.
  if [ -n "${SUITE_SAMPLED:-}" ]; then
    for r in 1 2 3; do
      for m in $VELA_CACHE/models/*.gguf /tmp/synth/llama3-8b-q4_0.gguf; do
        for sw in base $SUITE_SAMPLED; do
          echo "| $r | $(basename "$m" .gguf) | $sw | $(vela_tg $sw "$m" --temperature 0.8) |"
        done
      done
    done | tee $OUT/bench-sampled.md
  fi
  # Weight bytes read per decoded token (the roofline's numerator without the KV cache).
  for m in $VELA_CACHE/models/*.gguf /tmp/synth/*.gguf; do
    /tmp/vela bench --model "$m" --device cuda -p 0 -n 4 -r 1 --json 2>/dev/null |
      python3 -c "import json,sys; j=json.load(sys.stdin); print(j['model'], j['weight_bytes_per_token'])"
  done >$OUT/weight-bytes.txt
  cat $OUT/bench.md $OUT/bench-8k.md $OUT/weight-bytes.txt
  ;;
pack-quick)
  # One carry (~50 MB): xz-compressed binaries, the llama.cpp bundle, the 8B tokenizer source.
  Q=target/gpu-data/quick
  rm -rf $Q && mkdir -p $Q
  xz -T2 -6 -c target/release/vela >$Q/vela.xz
  bin=$(ls -t target/release/deps/gpu-* 2>/dev/null | grep -v '\.d$' | head -1)
  xz -T2 -6 -c "$bin" >$Q/gpu-test.xz
  for v in llama-bpe qwen2 gemma-4; do
    xz -T2 -6 -c "${VELA_CACHE_HERE:-$HOME/.cache/vela}/llama-cpp-python/vendor/llama.cpp/models/ggml-vocab-$v.gguf" >$Q/vocab-$v.gguf.xz
  done
  cat target/gpu-data/lb/lb.part* >$Q/lb.tar.xz
  du -sh $Q
  ;;
quick)
  # One call (~5 min with the machine's start): every GPU op test, then
  # Llama-3-8B Q4_0 and the Qwen2.5-0.5B geometry (Q4_K_M) vela vs llama.cpp CUDA with each A/B
  # switch in QUICK_AB (3 interleaved reps each), and the 8B at 8K depth.
  Q=target/gpu-data/quick
  mkdir -p "$OUT" "$VELA_CACHE/vocab" "$VELA_CACHE/llama.cpp-cuda"
  t0=$(date +%s)
  QUICK_DIR=$Q source scripts/gpu-quick-env.sh
  tar xJf $Q/lb.tar.xz -C /tmp && ln -sfn /tmp/llama-bench-cuda "$VELA_CACHE/llama.cpp-cuda/bin"
  # QUICK_MODELS: name:geometry:type, synthesized here (8B: ~20 s each).
  models=${QUICK_MODELS:-l8:llama3-8b:q4_0 q05:qwen2.5-0.5b:q4_k_m}
  ( for m in $models; do IFS=: read -r n a t <<<"$m"
      [ -s /tmp/$n.gguf ] || /tmp/vela synth --arch $a --type $t -o /tmp/$n.gguf -t 12; done ) >/tmp/synth.log 2>&1 &
  VELA_REQUIRE_GPU=1 timeout 240 /tmp/gpu-test --test-threads 1 --nocapture ${QUICK_TESTS:-} >$OUT/quick-tests.log 2>&1
  echo "tests exit $? ($(( $(date +%s) - t0 )) s)"; grep -E "test result|panicked|FAIL" $OUT/quick-tests.log | head
  wait
  B=(python3 scripts/bench-vs-llama.py --vela /tmp/vela --flavors cuda --threads 16 --reps 3
     "--llama-args=-ngl 99" "--vela-args=--device cuda")
  # QUICK_AB: "model:SWITCH=value ..." decode-only A/B runs (tg128) after each model's base run
  # ("model:+SWITCH=value": pp512 and tg128).
  for m in $(for x in $models; do echo ${x%%:*}; done); do
    for sw in base $(for x in ${QUICK_AB:-}; do [ "${x%%:*}" = $m ] && echo ${x#*:}; done); do
      if [ $sw = base ]; then extra=(); elif [ "${sw:0:1}" = + ]; then sw=${sw:1}; extra=(); else extra=(-p 0 -n 128); fi
      env $([ $sw = base ] || echo ${sw//\// }) timeout 90 "${B[@]}" "${extra[@]}" --models /tmp/$m.gguf \
        --out $OUT/quick-$m-$(echo $sw | tr '=,/' '___').md 2>/dev/null | grep "| $m |" | sed "s|^|$sw |"
    done
  done
  # QUICK_CTX="8192 ...": the 8B's tg128 again with vela's context at that size (a server's
  # default is the model's, capped at 8192; the bench sizes it to the run, like llama-bench).
  # ("8192:SWITCH=value": with that switch.)
  for cs in ${QUICK_CTX:-}; do
    c=${cs%%:*}; sw=$([ "$c" = "$cs" ] || echo ${cs#*:})
    env ${sw//\// } timeout 90 python3 scripts/bench-vs-llama.py --vela /tmp/vela --flavors cuda --threads 16 --reps 3 \
      "--llama-args=-ngl 99" "--vela-args=--device cuda --ctx $c" -p 0 -n 128 --models /tmp/l8.gguf \
      --out $OUT/quick-l8-ctx$(echo $cs | tr '=,:/' '____').md 2>/dev/null | grep "| l8 |" | sed "s|^|ctx=$cs |"
  done
  # Graph statistics and the host time per replayed step (VELA_CUDA_DEBUG) of each model.
  for m in $(for x in $models; do echo ${x%%:*}; done); do
    VELA_CUDA_DEBUG=1 /tmp/vela bench -m /tmp/$m.gguf --device cuda -p 0 -n 128 2>&1 | grep -i "graph\|capture" |
      head -3 | sed "s|^|$m |"
  done
  if [ "${QUICK_8K:-1}" = 1 ]; then
    # QUICK_DEPTHS: the depths of this stage (default 8192; files quick-8k-* for 8192, else
    # quick-d<depth>-*).
    for dep in ${QUICK_DEPTHS:-8192}; do
      tag=$([ $dep = 8192 ] && echo 8k || echo d$dep)
      for sw in base ${QUICK_8K_AB:-}; do
        env $([ $sw = base ] || echo ${sw//\// }) timeout 90 "${B[@]}" --models /tmp/l8.gguf -p 0 -n 128 --depth $dep \
          --out $OUT/quick-$tag-$(echo $sw | tr '=,/' '___').md 2>/dev/null | grep "| l8 |" | sed "s|^|$sw |"
      done
    done
  fi
  if [ "${QUICK_PROF8K:-0}" = 1 ]; then
    # Per-kernel GPU time (VELA_CUDA_PROFILE=1, graphs off) of the 8B at 8K depth and at 0.
    for dep in 8192 0; do
      VELA_CUDA_PROFILE=1 timeout 120 /tmp/vela bench -m /tmp/l8.gguf --device cuda -p 0 -n 64 --depth $dep \
        >$OUT/prof-l8-d$dep.txt 2>&1; echo "profile depth $dep exit $?"
    done
  fi
  if [ "${QUICK_NCU:-0}" = 1 ]; then
    # Hardware counters of the decode kernels (graphs off so each launch is a kernel of its own).
    VELA_CUDA_GRAPH=0 timeout 150 ncu --clock-control none -k "regex:^(mv_|norm_q8|rope_store|attention_|act_q8)" \
      --launch-skip 300 --launch-count 24 --section SpeedOfLight --section Occupancy --section LaunchStats \
      --section WarpStateStats --section MemoryWorkloadAnalysis /tmp/vela bench -m /tmp/l8.gguf --device cuda -p 0 -n 4 \
      >$OUT/ncu.txt 2>&1; echo "ncu exit $?"
  fi
  # One archive of every result (the device tool brings back a limited number of files).
  (cd $OUT && tar czf /tmp/quick-results.tgz . && find . -type f ! -name quick-tests.log -delete && mv /tmp/quick-results.tgz .)
  echo "quick done ($(( $(date +%s) - t0 )) s)"
  ;;
pack-ab)
  # Reference binaries (e.g. built from an earlier commit) and this tree's, xz-compressed.
  A=target/gpu-data/ab
  rm -rf $A && mkdir -p $A
  xz -T2 -6 -c "${2:?old vela binary}" >$A/vela-old.xz
  xz -T2 -6 -c "${3:?old GPU test binary}" >$A/gpu-test-old.xz
  xz -T2 -6 -c target/release/vela >$A/vela-new.xz
  bin=$(ls -t target/release/deps/gpu-* | grep -v '\.d$' | head -1)
  xz -T2 -6 -c "$bin" >$A/gpu-test-new.xz
  for v in llama-bpe qwen2 qwen35 gemma-4 deepseek-llm; do
    xz -T2 -6 -c "${VELA_CACHE_HERE:-$HOME/.cache/vela}/llama-cpp-python/vendor/llama.cpp/models/ggml-vocab-$v.gguf" >$A/vocab-$v.gguf.xz
  done
  # The fixtures the GPU model tests compare against: carry NAME SET/FIXTURE FILE... copies the
  # files of $VELA_CACHE/golden/SET/FIXTURE (when it exists) to $A/NAME.
  carry() {
    local name=$1 src=${VELA_CACHE_HERE:-$HOME/.cache/vela}/golden/$2
    shift 2
    [ -d "$src" ] || return 0
    mkdir -p $A/$name
    for f in "$@"; do cp "$src/$f" $A/$name/; done
  }
  hf="config.json model.safetensors prompts.json tokenizer.json tokenizer_config.json"
  # scripts/gen-qwen4exp-fixtures.py, gen-qwen4exp-mtp.py, gen-deepseekv4-fixtures.py, gen-deepseekv4-mtp.py,
  # gen-deepseekv4-with-dspark.py
  carry q4 qwen4exp/gdn_qsa $hf logits_long.f32 generation_config.json
  carry q4m qwen4exp/mtp $hf mtp_rows_long.f32 generation_config.json
  carry d4 deepseekv4/flash_mini $hf logits_long.f32
  carry d4m deepseekv4/mtp $hf mtp_rows_long.f32
  carry d4s deepseekv4/dspark $hf dspark.json dspark_logits.f32
  du -sh $A
  ;;
ab)
  A=target/gpu-data/ab
  mkdir -p "$OUT" "$VELA_CACHE/vocab"
  for b in old new; do
    xz -dc $A/vela-$b.xz >/tmp/vela-$b && xz -dc $A/gpu-test-$b.xz >/tmp/gpu-test-$b && chmod +x /tmp/vela-$b /tmp/gpu-test-$b
  done
  for f in $A/vocab-*.gguf.xz; do v=$(basename "$f" .gguf.xz); xz -dc "$f" >"$VELA_CACHE/vocab/ggml-$v.gguf"; done
  if [ -d $A/q4 ]; then
    mkdir -p "$VELA_CACHE/golden/qwen4exp/gdn_qsa" && cp $A/q4/* "$VELA_CACHE/golden/qwen4exp/gdn_qsa/"
  fi
  if [ -d $A/q4m ]; then
    mkdir -p "$VELA_CACHE/golden/qwen4exp/mtp" && cp $A/q4m/* "$VELA_CACHE/golden/qwen4exp/mtp/"
  fi
  export VELA_NVRTC_LIB=$(ls /usr/local/cuda*/lib64/libnvrtc.so* 2>/dev/null | grep -v builtins | head -1)
  nvidia-smi --query-gpu=name,driver_version,clocks.sm --format=csv,noheader
  models=${AB_MODELS:-l8:llama3-8b:q4_0 q05:qwen2.5-0.5b:q4_k_m g31:gemma4-31b:q4_0 g26:gemma4-26b-a4b:q4_0}
  # The models first (the GPU tests run on the Qwen2.5-0.5B geometry: SmolLM2's synth needs the
  # real model's tokenizer, which does not travel).
  for m in q05:qwen2.5-0.5b:q4_k_m $models; do IFS=: read -r n a t <<<"$m"
    [ -s /tmp/$n.gguf ] || /tmp/vela-new synth --arch $a --type $t -o /tmp/$n.gguf -t 8 >>/tmp/synth.log 2>&1
  done
  for b in $([ "${AB_TESTS:-1}" = 1 ] && echo old new); do
    VELA_REQUIRE_GPU=1 VELA_GPU_MODEL=/tmp/q05.gguf timeout 300 /tmp/gpu-test-$b --test-threads 1 >$OUT/tests-$b.log 2>&1
    echo "gpu tests $b: exit $? $(grep -E '^test result' $OUT/tests-$b.log)"
    grep -E '^test .* (FAILED|ignored)' $OUT/tests-$b.log | head -20
  done
  : >$OUT/ab-raw.txt
  for r in $(seq 1 ${AB_REPS:-3}); do
    order="old new"; [ $((r % 2)) = 0 ] && order="new old"
    for m in $models; do n=${m%%:*}
      for b in $order; do
        /tmp/vela-$b bench -m /tmp/$n.gguf --device cuda -p 512 -n 128 -r 1 --json 2>/dev/null |
          python3 -c "import json,sys;d=json.load(sys.stdin);print('$n $b',d['pp']['tps_mean'],d['tg']['tps_mean'])" >>$OUT/ab-raw.txt
      done
    done
  done
  python3 - $OUT/ab-raw.txt >$OUT/ab.md <<'PYEOF'
import statistics as st, sys
rows = {}
for line in open(sys.argv[1]):
    n, b, pp, tg = line.split()
    rows.setdefault(n, {}).setdefault(b, []).append((float(pp), float(tg)))
print("| model | test | old median (min-max) | new median (min-max) | new/old |")
print("|---|---|---|---|---:|")
for n, d in rows.items():
    for i, t in enumerate(("pp512", "tg128")):
        o = [x[i] for x in d.get("old", [])]; w = [x[i] for x in d.get("new", [])]
        if o and w:
            f = lambda v: f"{st.median(v):.1f} ({min(v):.1f}-{max(v):.1f})"
            print(f"| {n} | {t} | {f(o)} | {f(w)} | {st.median(w) / st.median(o):.3f} |")
PYEOF
  cat $OUT/ab.md
  # Batched decoding (Session::eval_batch) of the new binary: aggregate tg rate with AB_PARALLEL
  # sequences (default 1,4,16,64) on the first model of AB_MODELS.
  n=${models%%:*}
  /tmp/vela-new bench -m /tmp/$n.gguf --device cuda -n 32 -r 3 --parallel ${AB_PARALLEL:-1,4,16,64} |
    tee $OUT/parallel.md
  # `vela eval` workloads (AB_EVAL, default long-32k; "none" skips) with the stall probe on the
  # same model: $OUT/eval-NAME/ (report.md, summary.json, events.jsonl, SVGs).
  for w in ${AB_EVAL:-long-32k}; do
    [ "$w" = none ] && continue
    timeout 300 /tmp/vela-new eval run $w -m /tmp/$n.gguf --device cuda -o $OUT/eval-$w 2>$OUT/eval-$w.log |
      grep -vE '^\| [0-9]+ \| ext-[2-7] '
    echo "eval $w: exit ${PIPESTATUS[0]}"
  done
  ;;
q4x)
  # Qwen3.8 Flash Next at real size (issue 33), from the pack of `pack-ab` (its new binary): the
  # weights generated in memory (`--model synth:GEOMETRY:TYPE`, no file; Q4X_GEOMETRY default
  # qwen3.8-flash-next, Q4X_TYPE q4_0). First the qwen4_exp GPU tests (gdn_qsa and MTP fixtures),
  # then pp512 + tg128, the verification cost of K + 1 tokens (K = 0..7) and greedy speculation
  # with the MTP head forced to 50/70/90 % acceptance, pp8192 + tg128 at depth 8192:
  # $OUT/q4x-*.md, GPU memory sampled every 0.5 s into $OUT/q4x-mem.csv.
  A=target/gpu-data/ab
  mkdir -p "$OUT" "$VELA_CACHE/vocab"
  xz -dc $A/vela-new.xz >/tmp/vela-new && xz -dc $A/gpu-test-new.xz >/tmp/gpu-test-new && chmod +x /tmp/vela-new /tmp/gpu-test-new
  for f in $A/vocab-*.gguf.xz; do v=$(basename "$f" .gguf.xz); xz -dc "$f" >"$VELA_CACHE/vocab/ggml-$v.gguf"; done
  for d in q4:gdn_qsa q4m:mtp; do
    [ -d $A/${d%%:*} ] && mkdir -p "$VELA_CACHE/golden/qwen4exp/${d#*:}" && cp $A/${d%%:*}/* "$VELA_CACHE/golden/qwen4exp/${d#*:}/"
  done
  export VELA_NVRTC_LIB=$(ls /usr/local/cuda*/lib64/libnvrtc.so* 2>/dev/null | grep -v builtins | head -1)
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  VELA_REQUIRE_GPU=1 timeout 120 /tmp/gpu-test-new --test-threads 1 qwen4exp recurrent >$OUT/q4x-tests.log 2>&1
  echo "qwen4_exp GPU tests: exit $? $(grep -E '^test result' $OUT/q4x-tests.log)"
  grep -E '^test .* FAILED|RESULT|panicked' $OUT/q4x-tests.log | head -20
  m=synth:${Q4X_GEOMETRY:-qwen3.8-flash-next}:${Q4X_TYPE:-q4_0}
  nvidia-smi --query-gpu=timestamp,memory.used --format=csv,noheader -lms 500 >$OUT/q4x-mem.csv &
  smi=$!
  # The reduced depth first (a quarter of the size: fails fast), then the full geometry; 8K
  # last (the GPU indexer's selection is O(blocks²) per query, the slowest part).
  [ "${Q4X_GEOMETRY:-}" = qwen3.8-flash-next-12l ] ||
    /tmp/vela-new bench -m synth:qwen3.8-flash-next-12l:${Q4X_TYPE:-q4_0} --device cuda -p 512 -n 128 -r 2 2>&1 |
    tee $OUT/q4x-bench-12l.md
  /tmp/vela-new bench -m $m --device cuda -p 512 -n 128 -r 3 2>&1 | tee $OUT/q4x-bench.md
  /tmp/vela-new bench -m $m --device cuda --spec-cost -d 512 -r 3 --draft-max 7 \
    --spec-accept 0.5,0.7,0.9 -n 128 2>&1 | tee $OUT/q4x-spec.md
  /tmp/vela-new bench -m $m --device cuda -p 8192 -n 128 -d 8192 -r 2 2>&1 | tee $OUT/q4x-bench8k.md
  kill $smi
  echo "peak GPU memory: $(sort -t, -k2 -n $OUT/q4x-mem.csv | tail -1)"
  ;;
d4x)
  # DeepSeek V4 Flash at real size (issue 34), from the pack of `pack-ab` (its new binary and
  # ggml-vocab-deepseek-llm): the weights generated in memory (`--model
  # synth:GEOMETRY:TYPE`, no file; D4X_GEOMETRY default deepseek-v4-flash-12l, ~45 GB at Q4_0:
  # the full 43 layers are ~160 GB at Q4_0, more than one card; D4X_TYPE q4_0). pp512 + tg128,
  # then tg128 at depth 8192: $OUT/d4x-*.md, GPU memory sampled every 0.5 s into
  # $OUT/d4x-mem.csv.
  A=target/gpu-data/ab
  mkdir -p "$OUT" "$VELA_CACHE/vocab"
  xz -dc $A/vela-new.xz >/tmp/vela-new && chmod +x /tmp/vela-new
  for f in $A/vocab-*.gguf.xz; do v=$(basename "$f" .gguf.xz); xz -dc "$f" >"$VELA_CACHE/vocab/ggml-$v.gguf"; done
  export VELA_NVRTC_LIB=$(ls /usr/local/cuda*/lib64/libnvrtc.so* 2>/dev/null | grep -v builtins | head -1)
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  /tmp/vela-new info -m synth:deepseek-v4-flash | tee $OUT/d4x-plan.md
  m=synth:${D4X_GEOMETRY:-deepseek-v4-flash-12l}:${D4X_TYPE:-q4_0}
  nvidia-smi --query-gpu=timestamp,memory.used --format=csv,noheader -lms 500 >$OUT/d4x-mem.csv &
  smi=$!
  /tmp/vela-new bench -m $m --device cuda -p 512 -n 128 -r 3 2>&1 | tee $OUT/d4x-bench.md
  for dep in ${D4X_DEPTHS:-8192}; do
    timeout 400 /tmp/vela-new bench -m $m --device cuda -p 0 -n 128 -d $dep -r 2 2>&1 | tee $OUT/d4x-bench-d$dep.md
  done
  kill $smi
  if [ -n "${D4X_PROFILE:-}" ]; then
    for dep in 0 $D4X_PROFILE; do
      VELA_CUDA_PROFILE=1 timeout 200 /tmp/vela-new bench -m $m --device cuda -p 0 -n 32 -d $dep \
        >$OUT/d4x-prof-d$dep.txt 2>&1; echo "profile depth $dep exit $?"
    done
  fi
  echo "peak GPU memory: $(sort -t, -k2 -n $OUT/d4x-mem.csv | tail -1)"
  ;;
d4x-ab)
  A=target/gpu-data/ab
  mkdir -p "$OUT" "$VELA_CACHE/vocab" "$VELA_CACHE/golden/deepseekv4/flash_mini"
  for b in vela-old vela-new gpu-test-new; do xz -dc $A/$b.xz >/tmp/$b && chmod +x /tmp/$b; done
  for f in $A/vocab-*.gguf.xz; do v=$(basename "$f" .gguf.xz); xz -dc "$f" >"$VELA_CACHE/vocab/ggml-$v.gguf"; done
  [ -d $A/d4 ] && cp $A/d4/* "$VELA_CACHE/golden/deepseekv4/flash_mini/"
  export VELA_NVRTC_LIB=$(ls /usr/local/cuda*/lib64/libnvrtc.so* 2>/dev/null | grep -v builtins | head -1)
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  VELA_REQUIRE_GPU=1 timeout 240 /tmp/gpu-test-new --test-threads 1 --nocapture dsv4 attention_sink deepseekv4 \
    >$OUT/d4x-tests.log 2>&1
  echo "gpu tests: exit $? $(grep -E '^test result' $OUT/d4x-tests.log)"
  grep -E '^test .* FAILED|panicked|RESULT \| attention_sink' $OUT/d4x-tests.log | head -20
  m=synth:deepseek-v4-flash-12l:${D4X_TYPE:-q4_0}
  { echo "| round | depth | build | tg128 t/s |"; echo "|---|---|---|---|"; } >$OUT/d4x-ab.md
  for r in $(seq ${D4X_ROUNDS:-2}); do
    for dep in 0 ${D4X_DEPTHS:-8192}; do
      order="vela-old vela-new"; [ $((r % 2)) = 0 ] && order="vela-new vela-old"
      for b in $order; do
        t=$(timeout 300 /tmp/$b bench -m $m --device cuda -p 0 -n 128 -d $dep -r 2 2>/dev/null |
            grep -o 'tg128[^|]*| [0-9.]* ± [0-9.]*' | grep -o '[0-9.]* ± [0-9.]*$')
        echo "| $r | $dep | $b | $t |" | tee -a $OUT/d4x-ab.md
      done
    done
  done
  ;;
tests)
  A=target/gpu-data/ab
  mkdir -p "$OUT" "$VELA_CACHE/vocab"
  xz -dc $A/vela-new.xz >/tmp/vela-new && xz -dc $A/gpu-test-new.xz >/tmp/gpu-test-new && chmod +x /tmp/vela-new /tmp/gpu-test-new
  for f in $A/vocab-*.gguf.xz; do v=$(basename "$f" .gguf.xz); xz -dc "$f" >"$VELA_CACHE/vocab/ggml-$v.gguf"; done
  for d in q4:qwen4exp/gdn_qsa q4m:qwen4exp/mtp d4:deepseekv4/flash_mini d4m:deepseekv4/mtp d4s:deepseekv4/dspark; do
    [ -d $A/${d%%:*} ] && mkdir -p "$VELA_CACHE/golden/${d#*:}" && cp $A/${d%%:*}/* "$VELA_CACHE/golden/${d#*:}/"
  done
  export VELA_NVRTC_LIB=$(ls /usr/local/cuda*/lib64/libnvrtc.so* 2>/dev/null | grep -v builtins | head -1)
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  [ -s /tmp/q05.gguf ] || /tmp/vela-new synth --arch qwen2.5-0.5b --type q4_k_m -o /tmp/q05.gguf -t 8 >/tmp/synth.log 2>&1
  VELA_REQUIRE_GPU=1 VELA_GPU_MODEL=/tmp/q05.gguf timeout ${TESTS_S:-300} /tmp/gpu-test-new --test-threads 1 \
    >$OUT/tests.log 2>&1
  echo "gpu tests: exit $? $(grep -E '^test result' $OUT/tests.log)"
  grep -E '^test .* (FAILED|ignored)|panicked' $OUT/tests.log | head -20
  ;;
pack-place)
  P=target/gpu-data/place
  rm -rf $P && mkdir -p $P
  xz -T2 -6 -c target/release/vela >$P/vela-new.xz
  bin=$(ls -t target/release/deps/gpu-* | grep -v '\.d$' | head -1)
  xz -T2 -6 -c "$bin" >$P/gpu-test-new.xz
  for v in gemma-4 deepseek-llm; do
    xz -T2 -6 -c "${VELA_CACHE_HERE:-$HOME/.cache/vela}/llama-cpp-python/vendor/llama.cpp/models/ggml-vocab-$v.gguf" >$P/vocab-$v.gguf.xz
  done
  # llama.cpp: its bundle once a machine built it (the stages look in target/gpu-data/lb), else
  # the source, built there by the first place stage.
  [ -s target/gpu-data/lb/llama-bench-cuda.tar.xz ] || ls -la target/gpu-data/llama-src.tar.gz
  du -sh $P
  ;;
place|place-d4|place-tests)
  P=target/gpu-data/place
  mkdir -p "$OUT" "$VELA_CACHE/vocab"
  t0=$(date +%s)
  # The GPU test binary only travels for place-tests (a carry is at most 64 MiB).
  xz -dc $P/vela-new.xz >/tmp/vela-new && chmod +x /tmp/vela-new
  [ -f $P/gpu-test-new.xz ] && xz -dc $P/gpu-test-new.xz >/tmp/gpu-test-new && chmod +x /tmp/gpu-test-new
  for f in $P/vocab-*.gguf.xz; do v=$(basename "$f" .gguf.xz); xz -dc "$f" >"$VELA_CACHE/vocab/ggml-$v.gguf"; done
  export VELA_NVRTC_LIB=$(ls /usr/local/cuda*/lib64/libnvrtc.so* 2>/dev/null | grep -v builtins | head -1)
  nvidia-smi --query-gpu=name,driver_version,memory.total,memory.used --format=csv,noheader
  free -g | head -2; nproc
  if [ $stage = place-d4 ] && [ "${PLACE_FULL:-1}" = 0 ]; then
    :
  elif [ $stage = place-d4 ]; then
    m=synth:deepseek-v4-flash:${PLACE_TYPE:-q4_0}
    /tmp/vela-new plan -m $m --device cuda --experts ${PLACE_EXPERTS:-auto} | tee $OUT/place-d4-plan.md
    nvidia-smi --query-gpu=timestamp,memory.used --format=csv,noheader -lms 1000 >$OUT/place-d4-mem.csv &
    smi=$!
    timeout ${PLACE_D4_S:-520} /tmp/vela-new bench -m $m --device cuda --experts ${PLACE_EXPERTS:-auto} \
      -p 512 -n 128 -r ${PLACE_REPS:-2} 2>&1 | tee $OUT/place-d4.md
    echo "exit $? ($(( $(date +%s) - t0 )) s)"
    kill $smi
    echo "peak GPU memory: $(sort -t, -k2 -n $OUT/place-d4-mem.csv | tail -1)"
  fi
  if [ $stage = place-d4 ]; then
    # PLACE_DEPTHS="0 8192 65536": the 12-layer geometry all on the GPU, tg64 at those depths
    # (the sparse attention's cost with the context).
    for dep in ${PLACE_DEPTHS:-}; do
      timeout 300 /tmp/vela-new bench -m synth:deepseek-v4-flash-12l:${PLACE_TYPE:-q4_0} --device cuda \
        -p 0 -n 64 -d $dep -r 1 2>&1 | grep -E "^\||synthesized" | tee -a $OUT/place-d4-depths.md
    done
    exit 0
  fi
  if [ $stage = place-tests ]; then
    # llama.cpp (for `place`) builds meanwhile when no bundle travelled; the stage waits for it
    # (PLACE_LLAMA=0: not).
    if [ "${PLACE_LLAMA:-1}" = 1 ]; then llama_cuda_bg; fi
    # And `place`'s GGUF after the tests (PLACE_SYNTH=0: not).
    [ "${PLACE_SYNTH:-1}" = 1 ] && [ ! -f /tmp/g26.done ] && (sleep 100
      /tmp/vela-new synth --arch gemma4-26b-a4b --type q4_0 -o /tmp/g26.gguf -t 8 >$OUT/place-synth.log 2>&1 && touch /tmp/g26.done) &
    VELA_REQUIRE_GPU=1 timeout 150 /tmp/gpu-test-new --test-threads 1 host_experts dsv4_ops gated_delta_rule >$OUT/place-tests.log 2>&1
    echo "placement GPU tests: exit $? $(grep -E '^test result' $OUT/place-tests.log) ($(( $(date +%s) - t0 )) s)"
    grep -E "^RESULT|panicked|FAILED" $OUT/place-tests.log
    wait
    tail -3 /tmp/llama-build.log; echo "llama.cpp ready, g26 $(ls /tmp/g26.done 2>&1) ($(( $(date +%s) - t0 )) s)"
    exit 0
  fi
  llama_cuda_bg
  [ -f /tmp/g26.done ] || { /tmp/vela-new synth --arch gemma4-26b-a4b --type q4_0 -o /tmp/g26.gguf -t 16 >$OUT/place-synth.log 2>&1 &&
    touch /tmp/g26.done; }
  echo "synth exit $? ($(( $(date +%s) - t0 )) s) $(ls -la /tmp/g26.gguf)"
  wait $bpid
  tail -2 /tmp/llama-build.log
  /tmp/vela-new plan -m /tmp/g26.gguf --device cuda --experts cpu | tee $OUT/place-g26-plan.md
  B=(python3 scripts/bench-vs-llama.py --vela /tmp/vela-new --flavors cuda --threads $(nproc) --reps ${PLACE_REPS:-3}
     --models /tmp/g26.gguf)
  timeout 200 "${B[@]}" "--llama-args=-ngl 99" "--vela-args=--device cuda --experts gpu" \
    --out $OUT/place-g26-gpu.md 2>$OUT/place-g26.log
  echo "all on the GPU done ($(( $(date +%s) - t0 )) s)"
  timeout 300 "${B[@]}" "--llama-args=-ngl 99 -ncmoe 99" "--vela-args=--device cuda --experts cpu --expert-cache 0" \
    --out $OUT/place-g26-cpu.md 2>>$OUT/place-g26.log
  echo "experts on the CPU done ($(( $(date +%s) - t0 )) s)"
  # Flyweight (PyPI flyweight-llm, the wheels of target/gpu-data/fw when carried) on the same
  # GGUF: every expert on the GPU, then routed experts on the CPU (PLACE_FW=0: not).
  if [ "${PLACE_FW:-1}" = 1 ] && ls target/gpu-data/fw/flyweight_llm-*.whl >/dev/null 2>&1; then
    python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site target/gpu-data/fw/*.whl 2>&1 | tail -2
    FW=(python3 scripts/bench-flyweight.py /tmp/g26.gguf -p 512 -n 128 --reps 3 --threads $(nproc)
        --flyweight "env PYTHONPATH=/tmp/site CUDA_PATH=$(ls -d /usr/local/cuda* | head -1) python3")
    timeout 200 "${FW[@]}" "--fw-args=--backend cuda --expert-mode auto -ngl all --hybrid-prefill split" \
      --out $OUT/place-g26-fw-gpu.md >$OUT/place-fw.log 2>&1
    timeout 200 "${FW[@]}" "--fw-args=--backend cuda --expert-mode cpu" --out $OUT/place-g26-fw-cpu.md >>$OUT/place-fw.log 2>&1
    cat $OUT/place-g26-fw-*.md 2>/dev/null; tail -3 $OUT/place-fw.log
    echo "flyweight done ($(( $(date +%s) - t0 )) s)"
  fi
  # vela alone: the traffic per token, then with a GPU cache of PLACE_CACHE GiB (default 4) of
  # the hot experts.
  for c in 0 ${PLACE_CACHE:-4}; do
    /tmp/vela-new bench -m /tmp/g26.gguf --device cuda --experts cpu --expert-cache $c -p 512 -n 128 -r 2 2>&1 |
      grep -E "^\||experts" | tee -a $OUT/place-g26-traffic.md
  done
  # Prefill of host layers at PLACE_PP prompt lengths (default 512 2048): how many batches the
  # measured choice streamed.
  for pp in ${PLACE_PP:-512 2048}; do
    timeout 120 /tmp/vela-new bench -m /tmp/g26.gguf --device cuda --experts cpu \
      --expert-cache 0 -p $pp -n 0 -r 3 2>&1 | grep -E "^\| g|experts" | tee -a $OUT/place-g26-prefill.md
  done
  ;;
place-ab)
  # One short call for a change to the expert products or the device cache, from the carry of
  # pack-place plus target/gpu-data/place-old/vela-old.xz (the reference build's vela): the
  # GPU tests of the expert products, the weight row writes and host experts, meanwhile the
  # synth Gemma-4-26B-A4B Q4_0 GGUF; then pp512 all on the GPU and with the CPU's experts
  # streamed, old and new interleaved (PLACE_REPS rounds, default 3); then the new build's
  # tg256 with device caches of PLACE_CACHES GiB (default "0 1 4"): $OUT/place-ab*.md.
  P=target/gpu-data/place
  mkdir -p "$OUT" "$VELA_CACHE/vocab"
  t0=$(date +%s)
  xz -dc $P/vela-new.xz >/tmp/vela-new && xz -dc $P/gpu-test-new.xz >/tmp/gpu-test-new &&
    xz -dc target/gpu-data/place-old/vela-old.xz >/tmp/vela-old && chmod +x /tmp/vela-new /tmp/vela-old /tmp/gpu-test-new
  for f in $P/vocab-*.gguf.xz; do v=$(basename "$f" .gguf.xz); xz -dc "$f" >"$VELA_CACHE/vocab/ggml-$v.gguf"; done
  export VELA_NVRTC_LIB=$(ls /usr/local/cuda*/lib64/libnvrtc.so* 2>/dev/null | grep -v builtins | head -1)
  nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
  [ -f /tmp/g26.done ] || (/tmp/vela-new synth --arch gemma4-26b-a4b --type q4_0 -o /tmp/g26.gguf -t 12 >$OUT/place-synth.log 2>&1 &&
    touch /tmp/g26.done) &
  VELA_REQUIRE_GPU=1 timeout 120 /tmp/gpu-test-new --test-threads 1 matmul_experts write_weight_rows host_experts >$OUT/place-ab-tests.log 2>&1
  echo "GPU tests: exit $? $(grep -E '^test result' $OUT/place-ab-tests.log) ($(( $(date +%s) - t0 )) s)"
  grep -E "^test .*FAILED|panicked" $OUT/place-ab-tests.log | head
  wait
  echo "synth $(ls /tmp/g26.done 2>&1) ($(( $(date +%s) - t0 )) s)"
  for r in $(seq ${PLACE_REPS:-3}); do
    for b in old new; do
      for e in gpu cpu; do
        echo "$b experts $e round $r: $(timeout 60 /tmp/vela-$b bench -m /tmp/g26.gguf --device cuda --experts $e --expert-cache 0 \
          -p 512 -n 0 -r 2 2>/dev/null | grep -E '^\| g' | awk -F'|' '{print $5}')" | tee -a $OUT/place-ab.md
      done
    done
  done
  echo "pp done ($(( $(date +%s) - t0 )) s)"
  for c in ${PLACE_CACHES:-0 1 4}; do
    timeout 60 /tmp/vela-new bench -m /tmp/g26.gguf --device cuda --experts cpu --expert-cache $c -p 0 -n 256 -r 2 2>&1 |
      grep -E "^\| g|experts in" | sed "s/^/cache $c GiB: /" | tee -a $OUT/place-ab-cache.md
  done
  echo "done ($(( $(date +%s) - t0 )) s)"
  ;;
d4s)
  # DeepSeek V4's GPU tests (ops, the model vs HF, DSpark vs its reference; from the pack of
  # `pack-ab`), then DSpark speculation on the 12-layer geometry with its three stages
  # (`synth:deepseek-v4-flash-12l-dspark`, D4X_TYPE default q4_0): the verification cost of
  # K + 1 tokens (K = 0..5) and greedy generation with the drafter's proposals forced to
  # 50/70/90 % acceptance, every K and the depth model: $OUT/d4s-*.
  A=target/gpu-data/ab
  mkdir -p "$OUT" "$VELA_CACHE/vocab"
  xz -dc $A/vela-new.xz >/tmp/vela-new && xz -dc $A/gpu-test-new.xz >/tmp/gpu-test-new && chmod +x /tmp/vela-new /tmp/gpu-test-new
  for f in $A/vocab-*.gguf.xz; do v=$(basename "$f" .gguf.xz); xz -dc "$f" >"$VELA_CACHE/vocab/ggml-$v.gguf"; done
  for d in d4:flash_mini d4m:mtp d4s:dspark; do
    [ -d $A/${d%%:*} ] && mkdir -p "$VELA_CACHE/golden/deepseekv4/${d#*:}" && cp $A/${d%%:*}/* "$VELA_CACHE/golden/deepseekv4/${d#*:}/"
  done
  export VELA_NVRTC_LIB=$(ls /usr/local/cuda*/lib64/libnvrtc.so* 2>/dev/null | grep -v builtins | head -1)
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  VELA_REQUIRE_GPU=1 timeout 200 /tmp/gpu-test-new --test-threads 1 dsv4 deepseekv4 dspark >$OUT/d4s-tests.log 2>&1
  echo "deepseek_v4 GPU tests: exit $? $(grep -E '^test result' $OUT/d4s-tests.log)"
  grep -E '^test .* FAILED|RESULT|panicked' $OUT/d4s-tests.log | head -20
  m=synth:deepseek-v4-flash-12l-dspark:${D4X_TYPE:-q4_0}
  /tmp/vela-new bench -m $m --device cuda --spec-cost -d 512 -r 3 --draft-max 5 2>&1 | tee $OUT/d4s-cost.md
  timeout 300 /tmp/vela-new bench -m $m --device cuda --spec-accept 0.5,0.7,0.9 -d 512 -n 128 -r 2 \
    --draft-max 5 2>&1 | tee $OUT/d4s-spec.md
  ;;
q4x-fast)
  # The qwen4_exp GPU work in one call, from the carry of q4x-llama: first the GPU tests of the
  # sparse kernels, the recurrent ops and the model (graph decode = plain decode; the HF fixture
  # ones when pack-ab carried them, DeepSeek V4's ops and model; Q4X_TESTS filters, default
  # "qwen4exp recurrent sparse dsv4 deepseekv4"),
  # then the q4x-llama stage without the MTP numbers (Q4X_SPEC=0) and with tg128 at depth
  # Q4X_DEPTH (default 8192): $OUT/q4x-tests.log, $OUT/q4x-vs-llama*.md.
  A=target/gpu-data/ab
  mkdir -p "$OUT" "$VELA_CACHE/golden/qwen4exp"
  xz -dc $A/gpu-test-new.xz >/tmp/gpu-test-new && chmod +x /tmp/gpu-test-new
  [ -d $A/q4 ] && mkdir -p "$VELA_CACHE/golden/qwen4exp/gdn_qsa" && cp $A/q4/* "$VELA_CACHE/golden/qwen4exp/gdn_qsa/"
  [ -d $A/q4m ] && mkdir -p "$VELA_CACHE/golden/qwen4exp/mtp" && cp $A/q4m/* "$VELA_CACHE/golden/qwen4exp/mtp/"
  [ -d $A/d4 ] && mkdir -p "$VELA_CACHE/golden/deepseekv4/flash_mini" && cp $A/d4/* "$VELA_CACHE/golden/deepseekv4/flash_mini/"
  [ -d $A/d4m ] && mkdir -p "$VELA_CACHE/golden/deepseekv4/mtp" && cp $A/d4m/* "$VELA_CACHE/golden/deepseekv4/mtp/"
  export VELA_NVRTC_LIB=$(ls /usr/local/cuda*/lib64/libnvrtc.so* 2>/dev/null | grep -v builtins | head -1)
  t0=$(date +%s)
  # The GGUF of q4x-llama generated meanwhile (the tests are GPU-bound).
  xz -dc $A/vela-new.xz >/tmp/vela-new && chmod +x /tmp/vela-new
  for f in $A/vocab-*.gguf.xz; do v=$(basename "$f" .gguf.xz); mkdir -p "$VELA_CACHE/vocab"; xz -dc "$f" >"$VELA_CACHE/vocab/ggml-$v.gguf"; done
  (/tmp/vela-new synth --arch qwen3.8-flash-next-12l-smallple --type ${Q4X_TYPE:-q4_0} -o /tmp/q12.gguf -t 16 \
     >$OUT/q4x-synth.log 2>&1 && touch /tmp/q12.done) &
  spid=$!
  VELA_REQUIRE_GPU=1 timeout ${Q4X_TESTS_S:-180} /tmp/gpu-test-new --test-threads 1 ${Q4X_TESTS:-qwen4exp recurrent sparse dsv4 deepseekv4} \
    >$OUT/q4x-tests.log 2>&1
  echo "GPU tests exit $? ($(( $(date +%s) - t0 )) s)"
  grep -E "^(test |RESULT)|panicked|test result" $OUT/q4x-tests.log
  wait $spid
  Q4X_SPEC=${Q4X_SPEC:-0} Q4X_DEPTH=${Q4X_DEPTH:-8192} bash "$0" q4x-llama
  ;;
q4x-llama)
  # Qwen3.8 Flash Next side by side with llama.cpp CUDA (issue 33), from the carry of `pack-ab`
  # plus target/gpu-data/llama-src.tar.gz (`scripts/build-llama-cpp-cuda.sh pack`) or, once built,
  # target/gpu-data/lb/llama-bench-cuda.tar.xz (a bundle this stage writes to $OUT). One GGUF of
  # the reduced geometry in llama.cpp's own layout (`vela synth --arch
  # qwen3.8-flash-next-12l-smallple`, Q4X_TYPE default q4_0) read by both engines:
  # scripts/bench-vs-llama.py, 3 interleaved rounds, pp512 + tg128 ($OUT/q4x-vs-llama.md) and,
  # with Q4X_DEPTH (e.g. 8192), tg128 at that depth ($OUT/q4x-vs-llama-d.md). While llama.cpp
  # builds: the MTP speculation numbers of the in-memory reduced geometry ($OUT/q4x-spec.md).
  A=target/gpu-data/ab
  mkdir -p "$OUT" "$VELA_CACHE/vocab" "$VELA_CACHE/llama.cpp-cuda"
  t0=$(date +%s)
  xz -dc $A/vela-new.xz >/tmp/vela-new && chmod +x /tmp/vela-new
  for f in $A/vocab-*.gguf.xz; do v=$(basename "$f" .gguf.xz); xz -dc "$f" >"$VELA_CACHE/vocab/ggml-$v.gguf"; done
  export VELA_NVRTC_LIB=$(ls /usr/local/cuda*/lib64/libnvrtc.so* 2>/dev/null | grep -v builtins | head -1)
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  llama_cuda_bg
  [ -f /tmp/q12.done ] ||
    /tmp/vela-new synth --arch qwen3.8-flash-next-12l-smallple --type ${Q4X_TYPE:-q4_0} -o /tmp/q12.gguf -t 8 >$OUT/q4x-synth.log 2>&1
  echo "synth exit $? ($(( $(date +%s) - t0 )) s) $(ls -la /tmp/q12.gguf)"
  [ "${Q4X_SPEC:-1}" = 1 ] && timeout 240 /tmp/vela-new bench -m synth:qwen3.8-flash-next-12l:${Q4X_TYPE:-q4_0} --device cuda \
    --spec-cost -d 512 -r 3 --draft-max 7 --spec-accept 0.5,0.7,0.9 -n 128 2>&1 | tee $OUT/q4x-spec.md
  wait $bpid
  tail -4 /tmp/llama-build.log; echo "llama.cpp ready ($(( $(date +%s) - t0 )) s)"
  B=(python3 scripts/bench-vs-llama.py --vela /tmp/vela-new --flavors cuda --threads 16 --reps 3
     "--llama-args=-ngl 99" "--vela-args=--device cuda" --models /tmp/q12.gguf)
  timeout ${Q4X_PPTG_S:-240} "${B[@]}" --out $OUT/q4x-vs-llama.md --json-out $OUT/q4x-vs-llama.json 2>$OUT/q4x-vs-llama.log
  echo "pp/tg done ($(( $(date +%s) - t0 )) s)"
  [ -n "${Q4X_DEPTH:-}" ] && timeout 300 "${B[@]}" -p 0 -n 128 --depth $Q4X_DEPTH --out $OUT/q4x-vs-llama-d.md 2>>$OUT/q4x-vs-llama.log
  /tmp/vela-new bench -m /tmp/q12.gguf --device cuda -p 0 -n 4 -r 1 --json 2>/dev/null |
    python3 -c "import json,sys; j=json.load(sys.stdin); print('weight bytes per token', j['weight_bytes_per_token'])"
  echo "done ($(( $(date +%s) - t0 )) s)"
  ;;
pack-g5x)
  P=target/gpu-data/g5x
  rm -rf $P && mkdir -p $P
  xz -T2 -6 -c target/release/vela >$P/vela-new.xz
  bin=$(ls -t target/release/deps/gpu-* | grep -v '\.d$' | head -1)
  xz -T2 -6 -c "$bin" >$P/gpu-test-new.xz
  src=${VELA_CACHE_HERE:-$HOME/.cache/vela}
  xz -T2 -6 -c $src/llama-cpp-python/vendor/llama.cpp/models/ggml-vocab-qwen35.gguf >$P/vocab-qwen35.gguf.xz
  tar cJf $P/glm5-mtp.tar.xz -C $src/golden glm5/mtp
  [ -s target/gpu-data/lb/llama-bench-cuda.tar.xz ] || ls -la target/gpu-data/llama-src.tar.gz
  du -sh $P
  ;;
g5x)
  P=target/gpu-data/g5x
  mkdir -p "$OUT" "$VELA_CACHE/vocab" "$VELA_CACHE/golden"
  t0=$(date +%s)
  xz -dc $P/vela-new.xz >/tmp/vela-new && xz -dc $P/gpu-test-new.xz >/tmp/gpu-test-new && chmod +x /tmp/vela-new /tmp/gpu-test-new
  xz -dc $P/vocab-qwen35.gguf.xz >"$VELA_CACHE/vocab/ggml-vocab-qwen35.gguf"
  tar xJf $P/glm5-mtp.tar.xz -C "$VELA_CACHE/golden"
  export VELA_NVRTC_LIB=$(ls /usr/local/cuda*/lib64/libnvrtc.so* 2>/dev/null | grep -v builtins | head -1)
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  free -g | head -2; nproc
  llama_cuda_bg
  # The GGUF meanwhile (the tests are GPU-bound).
  (/tmp/vela-new synth --arch glm5-flash-12l --type ${G5X_TYPE:-q4_0} -o /tmp/g12.gguf -t 8 >$OUT/g5x-synth.log 2>&1 &&
     touch /tmp/g12.done) &
  spid=$!
  VELA_REQUIRE_GPU=1 timeout ${G5X_TESTS_S:-200} /tmp/gpu-test-new --test-threads 1 ${G5X_TESTS:-glm5 recurrent sparse host_experts mtp} \
    >$OUT/g5x-tests.log 2>&1
  echo "GPU tests: exit $? $(grep -E '^test result' $OUT/g5x-tests.log) ($(( $(date +%s) - t0 )) s)"
  grep -E "^test .*(FAILED|ignored)|RESULT|panicked" $OUT/g5x-tests.log | head -30
  wait $spid
  echo "synth $(ls /tmp/g12.done 2>&1) ($(( $(date +%s) - t0 )) s) $(tail -1 $OUT/g5x-synth.log)"
  m=/tmp/g12.gguf
  nvidia-smi --query-gpu=timestamp,memory.used --format=csv,noheader -lms 1000 >$OUT/g5x-mem.csv &
  smi=$!
  timeout 150 /tmp/vela-new bench -m $m --device cuda -p 512 -n 128 -r 3 2>&1 | tee $OUT/g5x-bench.md
  echo "vela pp/tg done ($(( $(date +%s) - t0 )) s)"
  kill $smi; echo "peak GPU memory: $(sort -t, -k2 -n $OUT/g5x-mem.csv | tail -1)"
  timeout 120 /tmp/vela-new bench -m $m --device cuda --spec-cost -d 512 -r 3 --draft-max 7 2>&1 | tee $OUT/g5x-cost.md
  timeout 150 /tmp/vela-new bench -m $m --device cuda --spec-accept 0.5,0.7,0.9 -d 512 -n 128 -r 2 --draft-max 5 2>&1 |
    tee $OUT/g5x-spec.md
  echo "vela spec done ($(( $(date +%s) - t0 )) s)"
  wait $bpid
  tail -3 /tmp/llama-build.log; echo "llama.cpp ready ($(( $(date +%s) - t0 )) s)"
  timeout 120 /tmp/llama-bench-cuda/llama-bench -m $m -ngl 99 -p 64 -n 16 -r 1 2>&1 | tail -4
  echo "done ($(( $(date +%s) - t0 )) s)"
  ;;
g5x-llama)
  mkdir -p "$OUT" "$VELA_CACHE/llama.cpp-cuda"
  t0=$(date +%s)
  export VELA_NVRTC_LIB=$(ls /usr/local/cuda*/lib64/libnvrtc.so* 2>/dev/null | grep -v builtins | head -1)
  [ -x /tmp/vela-new ] && [ -f /tmp/g12.done ] || { echo "run the g5x or g5x-ab stage on this machine first"; exit 1; }
  # A detached build of g5x-ab (G5X_LLAMA_BG=1) still running: wait for it.
  while [ -f /tmp/llama-build.log ] && ! grep -q "build exit" /tmp/llama-build.log; do sleep 5; done
  llama_cuda_bg
  wait $bpid
  B=(python3 scripts/bench-vs-llama.py --vela /tmp/vela-new --flavors cuda --threads 16 --reps ${G5X_REPS:-3}
     "--llama-args=-ngl 99" "--vela-args=--device cuda" --models /tmp/g12.gguf)
  timeout ${G5X_PPTG_S:-240} "${B[@]}" --out $OUT/g5x-vs-llama.md --json-out $OUT/g5x-vs-llama.json 2>$OUT/g5x-vs-llama.log
  echo "pp/tg done ($(( $(date +%s) - t0 )) s)"
  for dep in ${G5X_DEPTHS:-8192 65536}; do
    timeout ${G5X_DEPTH_S:-300} "${B[@]}" -p 0 -n 128 --depth $dep --out $OUT/g5x-vs-llama-d$dep.md 2>>$OUT/g5x-vs-llama.log
    echo "depth $dep done ($(( $(date +%s) - t0 )) s)"
  done
  /tmp/vela-new bench -m /tmp/g12.gguf --device cuda -p 0 -n 4 -r 1 --json 2>/dev/null |
    python3 -c "import json,sys; j=json.load(sys.stdin); print('weight bytes per token', j['weight_bytes_per_token'])"
  tail -30 $OUT/g5x-vs-llama.log
  ;;
g5x-ab)
  P=target/gpu-data/g5x
  mkdir -p "$OUT" "$VELA_CACHE/vocab" "$VELA_CACHE/golden"
  t0=$(date +%s)
  xz -dc $P/vela-new.xz >/tmp/vela-new && xz -dc $P/gpu-test-new.xz >/tmp/gpu-test-new &&
    xz -dc target/gpu-data/g5x-vela-old.xz >/tmp/vela-old && chmod +x /tmp/vela-new /tmp/vela-old /tmp/gpu-test-new
  xz -dc $P/vocab-qwen35.gguf.xz >"$VELA_CACHE/vocab/ggml-vocab-qwen35.gguf"
  tar xJf $P/glm5-mtp.tar.xz -C "$VELA_CACHE/golden"
  export VELA_NVRTC_LIB=$(ls /usr/local/cuda*/lib64/libnvrtc.so* 2>/dev/null | grep -v builtins | head -1)
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  # G5X_LLAMA_BG=1: llama.cpp CUDA builds detached meanwhile, for a g5x-llama call right after
  # this one on the same machine (it waits for the build).
  if [ "${G5X_LLAMA_BG:-0}" = 1 ] && [ ! -x /tmp/llama-bench-cuda/llama-bench ]; then
    setsid nohup bash -c 'nice -n 19 bash scripts/build-llama-cpp-cuda.sh build >/tmp/llama-build.log 2>&1; rc=$?
      mkdir -p /tmp/llama-bench-cuda && cp /tmp/llama-cuda/build/bin/llama-bench /tmp/llama-bench-cuda/ &&
      find /tmp/llama-cuda/build -name "*.so*" -exec cp -P {} /tmp/llama-bench-cuda/ \;
      echo "build exit $rc" >>/tmp/llama-build.log' >/dev/null 2>&1 </dev/null &
  fi
  m=/dev/shm/g12.gguf
  (/tmp/vela-new synth --arch glm5-flash-12l --type ${G5X_TYPE:-q4_0} -o $m -t 14 >$OUT/g5x-synth.log 2>&1 &&
     touch /tmp/g12s.done /tmp/g12.done && ln -sfn $m /tmp/g12.gguf) &
  spid=$!
  VELA_REQUIRE_GPU=1 timeout ${G5X_TESTS_S:-150} /tmp/gpu-test-new --test-threads 1 ${G5X_TESTS:-sparse dsv4_ops hyper_connection glm5 small_ops matmul_and_get_rows elementwise_ops} \
    >$OUT/g5x-ab-tests.log 2>&1
  echo "GPU tests: exit $? $(grep -E '^test result' $OUT/g5x-ab-tests.log) ($(( $(date +%s) - t0 )) s)"
  grep -E "^test .*(FAILED|ignored)|panicked" $OUT/g5x-ab-tests.log | head -20
  wait $spid
  echo "synth $(ls /tmp/g12s.done 2>&1) ($(( $(date +%s) - t0 )) s) $(tail -1 $OUT/g5x-synth.log)"
  for r in $(seq ${G5X_ROUNDS:-1}); do
    for b in new old; do
      echo "$b d8192 round $r: $(timeout 100 /tmp/vela-$b bench -m $m --device cuda -p 0 -n 128 -d 8192 -r 3 2>/dev/null | grep -E '^\| g' | awk -F'|' '{print $4 $5}')" | tee -a $OUT/g5x-ab.md
    done
    for b in new old; do
      echo "$b d0 round $r: $(timeout 60 /tmp/vela-$b bench -m $m --device cuda -p 512 -n 128 -r 3 2>/dev/null | grep -E '^\| g' | awk -F'|' '{print $4 $5}' | tr '\n' ' ')" | tee -a $OUT/g5x-ab.md
    done
    # The new build without decode graphs (the control for the graphs alone).
    [ "${G5X_NOGRAPH:-1}" = 1 ] &&
      echo "new-nograph d0 round $r: $(VELA_CUDA_GRAPH=0 timeout 60 /tmp/vela-new bench -m $m --device cuda -p 0 -n 128 -r 3 2>/dev/null | grep -E '^\| g' | awk -F'|' '{print $4 $5}')" | tee -a $OUT/g5x-ab.md
    echo "round $r done ($(( $(date +%s) - t0 )) s)"
  done
  VELA_CUDA_DEBUG=1 timeout 60 /tmp/vela-new bench -m $m --device cuda -p 0 -n 64 -r 1 2>&1 | grep -E "decode graphs|^\| g"
  [ "${G5X_PROFILE:-1}" = 1 ] && VELA_CUDA_PROFILE=1 timeout 60 /tmp/vela-new bench -m $m --device cuda -p 0 -n 32 >$OUT/g5x-ab-prof.txt 2>&1
  head -30 $OUT/g5x-ab-prof.txt
  [ -f /tmp/llama-build.log ] && tail -2 /tmp/llama-build.log
  echo "done ($(( $(date +%s) - t0 )) s)"
  ;;
pack-pc)
  # One small carry (target/gpu-data/pc): this tree's vela and the Llama 3 tokenizer source.
  P=target/gpu-data/pc
  rm -rf $P && mkdir -p $P
  xz -T2 -6 -c target/release/vela >$P/vela.xz
  xz -T2 -6 -c "${VELA_CACHE_HERE:-$HOME/.cache/vela}/llama-cpp-python/vendor/llama.cpp/models/ggml-vocab-llama-bpe.gguf" >$P/vocab-llama-bpe.gguf.xz
  du -sh $P
  ;;
pc)
  # The persistent prefix cache on the GPU: a synth Llama-3-8B Q4_0, turn two of a PC_TOKENS
  # prompt (default 32768) loaded from --cache-dir after a restart vs evaluated again
  # (scripts/bench-cache-dir.py, PC_ROUNDS rounds, default 3): $OUT/pc.md
  P=target/gpu-data/pc
  mkdir -p "$OUT" "$VELA_CACHE/vocab"
  t0=$(date +%s)
  xz -dc $P/vela.xz >/tmp/vela && chmod +x /tmp/vela
  xz -dc $P/vocab-llama-bpe.gguf.xz >"$VELA_CACHE/vocab/ggml-vocab-llama-bpe.gguf"
  export VELA_NVRTC_LIB=$(ls /usr/local/cuda*/lib64/libnvrtc.so* 2>/dev/null | grep -v builtins | head -1)
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  df -h /tmp | tail -1
  /tmp/vela synth --arch llama3-8b --type q4_0 -o /dev/shm/l8.gguf -t 14 2>&1 | tail -1
  echo "synth ($(( $(date +%s) - t0 )) s)"
  PYTHONUNBUFFERED=1 python3 scripts/bench-cache-dir.py --vela /tmp/vela --model /dev/shm/l8.gguf --device cuda \
    --threads 16 --tokens ${PC_TOKENS:-32768} --rounds ${PC_ROUNDS:-3} | tee $OUT/pc.md
  echo "done ($(( $(date +%s) - t0 )) s)"
  ;;
*) echo "unknown stage $stage" >&2; exit 1 ;;
esac
