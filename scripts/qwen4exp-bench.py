#!/usr/bin/env python3
# vela-venv: torch
"""vela vs llama.cpp (CPU) on a reduced Qwen3.8 Flash Next geometry, side by side.

    $VELA_CACHE/venv-torch/bin/python scripts/qwen4exp-bench.py [--vela target/release/vela]
        [--type q8_0] [--reps 3 (0: only build the model)] [-p 256] [-n 32] [--threads 2] [--keep DIR]

Builds a random-weight `Qwen4ExpForCausalLM` (transformers 5.23) of a reduced geometry (the real
layer pattern and widths scaled down: 8 layers [GDN×3, QSA]×2, hidden 1024, 4 streams, 32
experts top-8 + shared; no n-gram injection, since llama.cpp requires ple_embed_dim ==
hidden_size and the table would dominate), converts it with llama.cpp 0c1e570's converter
(scripts/gen-qwen4exp-fixtures.py --gguf-child, then a one-entry merges list so llama.cpp's BPE
loader accepts the synthetic vocabulary: scripts/qwen4exp-vs-llama.py), quantizes it with
llama-quantize, then runs `llama-bench` and `vela bench` on the same GGUF, interleaved, `--reps`
rounds, and prints median and spread of pp and tg for both and their ratio.
"""
import argparse, json, os, re, statistics, subprocess, sys, tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
CACHE = os.environ.get("VELA_CACHE", os.path.expanduser("~/.cache/vela"))
LLAMA_BIN = os.path.join(CACHE, "llama.cpp-avx2/bin")

GEOMETRY = dict(
    vocab_size=32000, hidden_size=1024, num_hidden_layers=8,
    layer_types=["linear_attention"] * 3 + ["full_attention"] + ["linear_attention"] * 3 + ["full_attention"],
    num_attention_heads=8, num_key_value_heads=2, head_dim=256,
    rope_parameters={"rope_type": "default", "rope_theta": 10_000_000.0, "partial_rotary_factor": 0.25,
                     "mrope_section": [11, 11, 10], "mrope_interleaved": True},
    max_position_embeddings=4096, linear_conv_kernel_dim=4, linear_num_key_heads=4,
    linear_num_value_heads=12, linear_key_head_dim=128, linear_value_head_dim=128,
    hc_count=4, hc_lowrank=128, num_experts=32, num_experts_per_tok=8, moe_intermediate_size=256,
    shared_expert_intermediate_size=256, norm_topk_prob=True, indexer_n_heads=4, indexer_kv_heads=1,
    indexer_head_dim=128, indexer_budget=2048, indexer_compress_ratio=4, output_gate_type="sigmoid",
    ple_layer_ids=[], rms_norm_eps=1e-6, eos_token_id=2, bos_token_id=1, tie_word_embeddings=False,
)


def build(d: str) -> None:
    import torch
    from transformers import AutoTokenizer  # noqa: F401  (the converter imports it)
    from transformers.models.qwen4_exp import configuration_qwen4_exp as cq, modeling_qwen4_exp as mq
    torch.manual_seed(0)
    torch.set_num_threads(2)
    cfg = cq.Qwen4ExpTextConfig(**GEOMETRY)
    m = mq.Qwen4ExpForCausalLM(cfg).eval()
    with torch.no_grad():
        for name, p in m.named_parameters():
            if p.dim() == 1 and "norm" in name:
                p.normal_(0.0, 0.1)  # HF initialises the (1+w) norms to 0
    m.save_pretrained(d, safe_serialization=True)
    # A synthetic vocabulary (ids only), as the fixtures have.
    vocab = {f"<t{i}>": i for i in range(GEOMETRY["vocab_size"])}
    tok = {"version": "1.0", "truncation": None, "padding": None, "added_tokens": [],
           "normalizer": None, "pre_tokenizer": None, "post_processor": None, "decoder": None,
           "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                     "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False,
                     "ignore_merges": False, "vocab": vocab, "merges": []}}
    json.dump(tok, open(os.path.join(d, "tokenizer.json"), "w"))
    json.dump({"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": "<t2>", "bos_token": "<t1>"},
              open(os.path.join(d, "tokenizer_config.json"), "w"))


def vela_bench(cmd: list, p: int, n: int) -> tuple:
    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    pp = float(re.search(rf"pp{p}\s*\|\s*([0-9.]+)", out).group(1))
    tg = float(re.search(rf"tg{n}\s*\|\s*([0-9.]+)", out).group(1))
    return pp, tg


def llama_bench(cmd: list) -> tuple:
    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    rows = json.loads(out)
    pp = next(r["avg_ts"] for r in rows if r["n_prompt"] > 0 and r["n_gen"] == 0)
    tg = next(r["avg_ts"] for r in rows if r["n_gen"] > 0 and r["n_prompt"] == 0)
    return float(pp), float(tg)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--vela", default=os.path.join(HERE, "..", "target/release/vela"))
    ap.add_argument("--type", default="q8_0")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("-p", type=int, default=256)
    ap.add_argument("-n", type=int, default=32)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--keep", default=None, help="directory for the model files (reused when present)")
    a = ap.parse_args()
    work = a.keep or tempfile.mkdtemp(prefix="q4bench-")
    hf = os.path.join(work, "hf")
    gguf_q = os.path.join(work, f"model-{a.type}.gguf")
    if not os.path.exists(gguf_q):
        os.makedirs(hf, exist_ok=True)
        if not os.path.exists(os.path.join(hf, "model.safetensors")) and \
                not os.path.exists(os.path.join(hf, "model.safetensors.index.json")):
            build(hf)
        subprocess.run([sys.executable, os.path.join(HERE, "gen-qwen4exp-fixtures.py"), "--gguf-child", hf],
                       check=True, capture_output=True)
        import importlib.util
        spec = importlib.util.spec_from_file_location("q4vl", os.path.join(HERE, "qwen4exp-vs-llama.py"))
        q4vl = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(q4vl)
        f32 = os.path.join(work, "model-f32.gguf")
        q4vl.add_merges(os.path.join(hf, "model-f32.gguf"), f32)
        subprocess.run([os.path.join(LLAMA_BIN, "llama-quantize"), f32, gguf_q, a.type.upper()],
                       check=True, capture_output=True)
    if a.reps == 0:
        print(f"model: {gguf_q} (no benchmark: --reps 0)")
        return
    t = str(a.threads)
    runs = {"llama.cpp": [], "vela": []}
    for r in range(a.reps):
        order = ["llama.cpp", "vela"] if r % 2 == 0 else ["vela", "llama.cpp"]
        for who in order:
            if who == "llama.cpp":
                res = llama_bench([os.path.join(LLAMA_BIN, "llama-bench"), "-m", gguf_q, "-p", str(a.p),
                                   "-n", str(a.n), "-t", t, "-r", "1", "-o", "json"])
            else:
                res = vela_bench([a.vela, "bench", "-m", gguf_q, "--device", "cpu", "-t", t, "-p", str(a.p),
                                  "-n", str(a.n), "-r", "1"], a.p, a.n)
            runs[who].append(res)
            print(f"round {r + 1} {who}: pp{a.p} {res[0]:.1f} t/s, tg{a.n} {res[1]:.1f} t/s", flush=True)
    print(f"\n| engine | pp{a.p} t/s median (min-max) | tg{a.n} t/s median (min-max) |\n|---|---:|---:|")
    med = {}
    for who, v in runs.items():
        pp, tg = [x[0] for x in v], [x[1] for x in v]
        med[who] = (statistics.median(pp), statistics.median(tg))
        print(f"| {who} | {med[who][0]:.1f} ({min(pp):.1f}-{max(pp):.1f}) | {med[who][1]:.1f} ({min(tg):.1f}-{max(tg):.1f}) |")
    print(f"| vela / llama.cpp | {med['vela'][0] / med['llama.cpp'][0]:.2f} | {med['vela'][1] / med['llama.cpp'][1]:.2f} |")
    print(f"model: {gguf_q} ({os.path.getsize(gguf_q) / 2**20:.0f} MiB, {a.type})")


if __name__ == "__main__":
    main()
