# Session 19, call 3: the warp parts for head dim 128 too (VELA_CUDA_ATTN_WARP=3: 64 and 128;
# call 2 saw l8 +2.4 % at depth 0, +7.8 % at 512 with =1 now that the warp parts follow the
# keys), at more depths, and past 1,024 keys with the tensor-core decode from 4,096 keys for
# head dim 128 too (VELA_CUDA_WARP_FD_HD=128, VELA_CUDA_FD_MIN_BLOCKS=0: "w3x"). 2 rounds.
R=$PWD
source scripts/gpu-quick-env.sh
VELA_REQUIRE_GPU=1 timeout 200 /tmp/gpu-test --test-threads 1 attn:: > $OUT/t-attn.txt 2>&1
echo "attn tests rc=$?"; grep -E "test result|panicked|FAILED" $OUT/t-attn.txt | head -8
cd /tmp
/tmp/vela synth --arch llama3-8b --type q4_0 -o /tmp/l8.gguf -t 16 >/dev/null 2>&1
B() { m=$1; tag=$2; d=$3; shift 3; echo "== $m $tag d$d $(env "$@" /tmp/vela bench -m /tmp/$m.gguf --device cuda -r 2 -p 0 -n 128 --depth $d 2>&1 | grep -oE 'tg128[^|]*\| [0-9.]+ ± [0-9.]+')"; }
X="VELA_CUDA_ATTN_WARP=3 VELA_CUDA_WARP_FD_HD=128 VELA_CUDA_FD_MIN_BLOCKS=0"
for i in 1 2; do
  for d in 0 512; do B l8 def $d; B l8 w3 $d VELA_CUDA_ATTN_WARP=3; done
  for d in 1024 2048 3072; do B l8 def $d; B l8 w3x $d $X; done
done
for w in 2 3; do echo "md5 l8 w$w $(VELA_CUDA_ATTN_WARP=$w /tmp/vela run -m /tmp/l8.gguf --device cuda --prompt 'The capital of France is' --temperature 0 -n 64 2>/dev/null | md5sum)"; done
echo "md5 l8 w3x $(env $X /tmp/vela run -m /tmp/l8.gguf --device cuda --prompt 'The capital of France is' --temperature 0 -n 64 2>/dev/null | md5sum)"
