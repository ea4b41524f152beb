# Session 20, call 7: (1) mv_layout.cu with every wait behind a branch (calls 3-4 had ptxas's
# hoisted waits in the split-row port, the tiles and the pure read): the layouts compared fairly;
# (2) vela's matvec waits behind a branch (mv_guard, default) vs unconditional
# (VELA_CUDA_DEFINES=MV_WAIT_UNGUARDED: mv_q4_ks's wait hoisted above its loads by ptxas 12.9)
# on q05, s2, g3, l8 at depth 0, 2 rounds interleaved; (3) the device-compiled cubins' SASS:
# loads before the first ACQBULK in each mv_ kernel (cuobjdump).
R=$PWD
source scripts/gpu-quick-env.sh
nvcc=$(command -v nvcc || ls /usr/local/cuda*/bin/nvcc 2>/dev/null | head -1)
cuobjdump=$(dirname $nvcc)/cuobjdump
$nvcc -O3 -arch=sm_90 crates/vela-cuda/bench/mv_layout.cu -o /tmp/mv_layout || exit 1
timeout 250 /tmp/mv_layout arena | tee $OUT/mv.txt | grep -E "FAIL|all products|down|gate"
cd /tmp
/tmp/vela synth --arch qwen2.5-0.5b --type q4_k_m -o /tmp/q05.gguf -t 8 >/dev/null 2>&1
/tmp/vela synth --arch smollm2-135m --type q4_1 --tokenizer /tmp/s2vocab.gguf -o /tmp/s2.gguf -t 8 >/dev/null 2>&1 || /tmp/vela synth --arch smollm2-135m --type q4_1 -o /tmp/s2.gguf -t 8 >/dev/null 2>&1
/tmp/vela synth --arch gemma3-270m --type q4_k_m --tokenizer /tmp/g3vocab.gguf -o /tmp/g3.gguf -t 8 >/dev/null 2>&1 || /tmp/vela synth --arch gemma3-270m --type q4_k_m -o /tmp/g3.gguf -t 8 >/dev/null 2>&1
/tmp/vela synth --arch llama3-8b --type q4_0 -o /tmp/l8.gguf -t 16 >/dev/null 2>&1
ls -la /tmp/*.gguf
B() { m=$1; tag=$2; d=$3; shift 3; echo "== $m $tag d$d $(env "$@" /tmp/vela bench -m /tmp/$m.gguf --device cuda -r 2 -p 0 -n 128 --depth $d 2>&1 | grep -oE 'tg128[^|]*\| [0-9.]+ ± [0-9.]+')"; }
for i in 1 2; do for m in q05 s2 g3 l8; do
  B $m guarded 0
  B $m unguarded 0 VELA_CUDA_DEFINES=MV_WAIT_UNGUARDED
done; done
for f in $VELA_CACHE/cuda-kernels/quant-sm90-*.cubin; do
  echo "== SASS $f"
  $cuobjdump -sass $f > /tmp/q.sass 2>&1
  python3 - /tmp/q.sass <<'PY'
import re,sys
txt=open(sys.argv[1]).read()
parts=re.split(r'\n\s*Function : (\S+)', txt)
for i in range(1,len(parts),2):
    name=parts[i]
    if not name.startswith('mv_'): continue
    lines=parts[i+1].split('\n')
    acq=[j for j,l in enumerate(lines) if 'ACQBULK' in l]
    mem=[j for j,l in enumerate(lines) if re.search(r'\bLDG|CCTL',l)]
    b=sum(1 for j in mem if acq and j<acq[0])
    if name.startswith(('mv_q4_ks','mv_q8_0_r2n','mv_q4_0s_r2','mv_q6_ks')): print(f'{name:28s} {b}')
PY
done
