# binary: e5e8817 + mv_q4_0s_r4 / mv_q4_0s_x3_r4 and VELA_CUDA_MV_ROWS4_MIN (four rows per warp for split-row Q4_0 launches of >= that many rows; removed after this call)
source scripts/gpu-quick-env.sh
cd /tmp
[ -f /tmp/l8.gguf ] || /tmp/vela synth --arch llama3-8b --type q4_0 -o /tmp/l8.gguf -t 16 >/dev/null 2>&1
for v in x 4096; do echo "md5 r4min=$v $(VELA_CUDA_MV_ROWS4_MIN=$v /tmp/vela run -m /tmp/l8.gguf --device cuda --prompt 'The capital of France is' --max-tokens 32 --temperature 0 2>/dev/null | md5sum)"; done
B() { m=$1; tag=$2; shift 2; echo "== $m $tag $(env "$@" /tmp/vela bench -m /tmp/$m.gguf --device cuda -r 2 -p 0 -n 128 2>&1 | grep -oE 'tg128[^|]*\| [0-9.]+ ± [0-9.]+')"; }
for i in 1 2; do for v in x 4096 6000 16384; do B l8 r4min=$v VELA_CUDA_MV_ROWS4_MIN=$v; done; done
