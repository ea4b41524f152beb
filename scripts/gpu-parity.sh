#!/usr/bin/env bash
# The llama.cpp parity set (scripts/check-parity.py, every prompt of the three real models) with
# vela on the GPU, and vela's decode speed on those models against a reference build, for a GPU
# machine reached only through the device tool (64 MiB per call, no network, the fixtures'
# llama.cpp logits too large to carry: vela's logits come back instead and are judged here).
#
#   here:   scripts/gpu-parity.sh pack OLD_VELA   # -> target/gpu-data/par: this tree's vela and
#                                                 #    GPU test binary, OLD_VELA, the fixtures'
#                                                 #    manifests, the models in 14 MiB parts, in
#                                                 #    carry groups (groups.txt, one line a call;
#                                                 #    each call carries manifest.txt too)
#   there:  scripts/gpu-parity.sh run             # once per carry group, back to back (the
#       machine keeps /tmp while warm): the carried files join /tmp/stash; then for each model
#       whose parts are all there and that this machine has not done yet: the model assembled
#       and checked, vela's logits and greedy texts on every parity prompt
#       (check-parity.py --record, PAR_JOBS at a time) -> $OUT/rec-KEY.tar.partNN, and tg128 of
#       the reference and this build alternating (PAR_ROUNDS rounds of `-r 3`) -> $OUT/ab-KEY.md;
#       with the first model, the whole GPU test binary on it -> $OUT/tests.log
#   here:   scripts/gpu-parity.sh judge FILES_AT...  # reassemble what came back and run
#       check-parity.py --replay on it (the fixtures' logits are here)
set -uo pipefail
stage=${1:?stage: pack|run|judge}
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
P=target/gpu-data/par
MODELS="smollm2:SmolLM2-135M-Instruct.Q4_1 gemma3:gemma-3-270m-q4_k_m qwen25:qwen2.5-coder-0.5b-instruct-q4_k_m"

case $stage in
pack)
  src=${VELA_CACHE_HERE:-$HOME/.cache/vela}
  old=${2:?reference vela binary}
  rm -rf $P.new && mkdir -p $P.new
  xz -T2 -6 -c target/release/vela >$P.new/vela.xz
  xz -T2 -6 -c "$old" >$P.new/vela-old.xz
  bin=$(ls -t target/release/deps/gpu-* | grep -v '\.d$' | head -1)
  xz -T2 -6 -c "$bin" >$P.new/gpu-test.xz
  # The fixtures' manifests and the models' checksums in one small file (8 carry paths a call).
  mkdir -p $P.new/meta/parity
  for km in $MODELS; do
    m=${km#*:}
    (cd "$src/models" && sha256sum $m.gguf) >$P.new/meta/m-$m.sha256
    mkdir -p $P.new/meta/parity/${km%%:*}
    cp "$src/golden/parity/${km%%:*}/manifest.json" $P.new/meta/parity/${km%%:*}/
  done
  tar czf $P.new/par-meta.tar.gz -C $P.new/meta . && rm -rf $P.new/meta
  printf '%s\n' vela.xz vela-old.xz gpu-test.xz par-meta.tar.gz >$P.new/order.txt
  # 14 MiB parts: four fill a call's carry, next to manifest.txt.
  for km in $MODELS; do
    m=${km#*:}
    split -b 14M -d "$src/models/$m.gguf" $P.new/m-$m.part
    (cd $P.new && ls m-$m.part*) >>$P.new/order.txt
  done
  rm -rf $P && mv $P.new $P
  python3 scripts/carry_groups.py $P $P/order.txt
  ;;
run)
  stash=/tmp/stash
  mkdir -p $stash "$OUT" /tmp/rec
  export VELA_CACHE=${VELA_CACHE_GPU:-/tmp/vela-cache}
  mkdir -p "$VELA_CACHE/models" "$VELA_CACHE/golden"
  for f in $P/*; do [ -f "$f" ] && cp -u "$f" $stash/; done
  echo "stash: $(ls $stash | wc -l) files, $(du -sh $stash | cut -f1)"
  export VELA_NVRTC_LIB=$(ls /usr/local/cuda*/lib64/libnvrtc.so* 2>/dev/null | grep -v builtins | head -1)
  if [ ! -x /tmp/vela ] && [ -s $stash/gpu-test.xz ] && [ -s $stash/par-meta.tar.gz ]; then
    for b in vela vela-old gpu-test; do xz -dc $stash/$b.xz >/tmp/$b && chmod +x /tmp/$b; done
    tar xzf $stash/par-meta.tar.gz -C $stash
    cp -r $stash/parity "$VELA_CACHE/golden/"
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  fi
  [ -x /tmp/vela ] || { echo "binaries not carried yet"; exit 0; }
  for km in $MODELS; do
    key=${km%%:*} m=${km#*:}
    [ -f /tmp/done-$key ] && continue
    complete=1
    while read -r size f; do
      case $f in m-$m.part*) [ "$(stat -c %s $stash/$f 2>/dev/null)" = "$size" ] || complete=0 ;; esac
    done <$stash/manifest.txt
    [ $complete = 1 ] || { echo "$key: parts still to come"; continue; }
    t0=$(date +%s)
    cat $stash/m-$m.part* >"$VELA_CACHE/models/$m.gguf"
    (cd "$VELA_CACHE/models" && sha256sum -c $stash/m-$m.sha256) || exit 1
    mp=$VELA_CACHE/models/$m.gguf
    if [ ! -f /tmp/tests-done ]; then
      VELA_REQUIRE_GPU=1 VELA_GPU_MODEL=$mp timeout ${PAR_TESTS_S:-300} /tmp/gpu-test --test-threads 1 \
        >$OUT/tests.log 2>&1
      echo "gpu tests on $key: exit $? $(grep -E '^test result' $OUT/tests.log)"
      grep -E '^test .* FAILED|panicked' $OUT/tests.log | head -20
      grep -E 'RESULT \| precise matmul .*NMSE to exact' $OUT/tests.log | head -40
      touch /tmp/tests-done
    fi
    # The kernels compiled once before the concurrent runs.
    /tmp/vela bench --model "$mp" --device cuda -p 16 -n 4 -r 1 >/dev/null 2>&1
    /tmp/vela-old bench --model "$mp" --device cuda -p 16 -n 4 -r 1 >/dev/null 2>&1
    python3 scripts/check-parity.py --vela /tmp/vela --models $key --record /tmp/rec --jobs ${PAR_JOBS:-4} ||
      echo "$key: some prompts failed to run"
    tar cf - -C /tmp/rec $key | split -b 15M -d - $OUT/rec-$key.tar.part
    {
      echo "| round | build | tg128 t/s |"
      echo "|---|---|---|"
      for r in $(seq ${PAR_ROUNDS:-3}); do
        order="vela-old vela"; [ $((r % 2)) = 0 ] && order="vela vela-old"
        for b in $order; do
          t=$(timeout 120 /tmp/$b bench --model "$mp" --device cuda -p 0 -n 128 -r 3 2>/dev/null |
              grep -o 'tg128[^|]*| [0-9.]* ± [0-9.]*' | grep -o '[0-9.]* ± [0-9.]*$')
          echo "| $r | $b | $t |"
        done
      done
    } | tee $OUT/ab-$key.md
    touch /tmp/done-$key
    echo "$key done in $(( $(date +%s) - t0 )) s"
  done
  ls -la $OUT
  ;;
judge)
  shift
  J=$(mktemp -d)
  for d in "$@"; do
    for k in $(ls "$d" | sed -n 's/^rec-\(.*\)\.tar\.part.*/\1/p' | sort -u); do
      cat "$d"/rec-$k.tar.part* | tar xf - -C "$J"
    done
  done
  keys=$(ls "$J" | paste -sd,)
  echo "recorded: $keys ($J)"
  python3 scripts/check-parity.py --replay "$J" --models "$keys"
  ;;
*)
  echo "unknown stage $stage" >&2
  exit 2
  ;;
esac
