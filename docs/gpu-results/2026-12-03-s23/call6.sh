# Session 23, call 6: the error paths on the GPU machine, each must be one clear line and a
# non-zero exit, no panic: no GPU visible; a device index that does not exist; NVRTC missing
# and NVRTC not a library; a KV cache over the free memory (--ctx); weights over the free memory
# (a torch process holds all but ~0.3 GiB first). Model: synth Qwen2.5-0.5B Q4_K_M.
E=target/gpu-data/err; V=$E/vela; chmod +x $V
mkdir -p /tmp/voc && cp $E/ggml-vocab-qwen2.gguf /tmp/voc/
M=/tmp/q05.gguf; $V synth --arch qwen2.5-0.5b --type q4_k_m --tokenizer /tmp/voc/ggml-vocab-qwen2.gguf -o $M -t 16 >/dev/null 2>&1 || echo "synth failed"
r() { echo "== $1"; shift; timeout 60 "$@" --prompt hi --max-tokens 4 --temperature 0 > /tmp/o.txt 2>&1; rc=$?; tail -3 /tmp/o.txt | cut -c1-300; echo "exit $rc"; }
r "baseline" $V run -m $M --device cuda
r "no GPU visible (CUDA_VISIBLE_DEVICES=)" env CUDA_VISIBLE_DEVICES= $V run -m $M --device cuda
r "device index 7" $V run -m $M --device cuda:7
r "NVRTC missing" env VELA_NVRTC_LIB=/nonexistent/libnvrtc.so VELA_CACHE=/tmp/fresh-cache1 $V run -m $M --device cuda
echo garbage > /tmp/notalib.so
r "NVRTC not a library" env VELA_NVRTC_LIB=/tmp/notalib.so VELA_CACHE=/tmp/fresh-cache2 $V run -m $M --device cuda
r "KV over free memory (--ctx 100000000)" $V run -m $M --device cuda --ctx 100000000
python3 - <<'PY' &
import torch, time
free, total = torch.cuda.mem_get_info()
x = torch.empty(free - (300 << 20), dtype=torch.uint8, device="cuda")
open("/tmp/held", "w").write(f"{free} {total}")
time.sleep(40)
PY
for i in $(seq 60); do [ -f /tmp/held ] && break; sleep 0.5; done; echo "torch holds: $(cat /tmp/held)"
r "weights over free memory (torch holds the GPU)" $V run -m $M --device cuda
r "auto device with the GPU full" $V run -m $M
kill %1 2>/dev/null; wait
