#!/usr/bin/env python3
# vela-venv: torch
"""llama.cpp 0c1e570's own qwen4exp logits against transformers' on a tiny fixture.

    $VELA_CACHE/venv-torch/bin/python scripts/qwen4exp-vs-llama.py [fixture]   # default gdn_qsa

Converts the fixture with llama.cpp's converter (scripts/gen-qwen4exp-fixtures.py --gguf-child),
adds a one-entry merges list (the fixtures' synthetic vocabulary has none and llama.cpp's BPE
loader requires the key; the tests feed token ids, so it changes nothing), evaluates every prompt
with llama.cpp (scripts/llama_oracle.py, F16 KV) and prints the per-position NMSE against the
fixture's HF logits: where they agree and where they part. Expected (docs/qwen4exp-spec.md §10):
agreement at F16-KV level while the indexer keeps every block (positions < budget + ratio − 1),
then differences from llama.cpp's selection (budget + ratio − 1 tokens with a tail bias, and
compress ratios of 0 from the converter), which vela does not share (vela follows HF: its GGUF
and safetensors paths agree, `cargo test -p vela-models --test qwen4exp_hf`).
The PLE fixtures cannot run: llama.cpp requires ple_embed_dim == hidden_size (check_tensor_dims).
"""
import json, os, shutil, subprocess, sys, tempfile

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
CACHE = os.environ.get("VELA_CACHE", os.path.expanduser("~/.cache/vela"))
LLAMA = os.path.join(CACHE, "llama-cpp-python/vendor/llama.cpp")
sys.path[:0] = [HERE, os.path.join(LLAMA, "gguf-py")]
import gguf  # noqa: E402
import llama_oracle as lo  # noqa: E402


def add_merges(src: str, dst: str) -> None:
    r = gguf.GGUFReader(src)
    w = gguf.GGUFWriter(dst, arch=r.fields["general.architecture"].contents())
    for k, f in r.fields.items():
        if k.startswith("GGUF.") or k == "general.architecture":
            continue
        t = f.types[0]
        if t == gguf.GGUFValueType.ARRAY:
            w.add_key_value(k, f.contents(), t, sub_type=f.types[1] if len(f.types) > 1 else None)
        else:
            w.add_key_value(k, f.contents(), t)
    if "tokenizer.ggml.merges" not in r.fields:
        w.add_token_merges(["<t0> <t1>"])
    for t in r.tensors:
        shape = list(reversed([int(x) for x in t.shape]))
        w.add_tensor(t.name, np.array(t.data), raw_shape=shape, raw_dtype=t.tensor_type)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def main() -> None:
    name = sys.argv[1] if len(sys.argv) > 1 else "gdn_qsa"
    src = os.path.join(CACHE, "golden/qwen4exp", name)
    cfg = json.load(open(os.path.join(src, "config.json")))
    with tempfile.TemporaryDirectory() as tmp:
        d = os.path.join(tmp, name)
        os.makedirs(d)
        for f in os.listdir(src):
            if os.path.isfile(os.path.join(src, f)) and not f.endswith(".gguf"):
                shutil.copy(os.path.join(src, f), d)
        subprocess.run([sys.executable, os.path.join(HERE, "gen-qwen4exp-fixtures.py"), "--gguf-child", d],
                       check=True, capture_output=True)
        model = os.path.join(tmp, "model.gguf")
        add_merges(os.path.join(d, "model-f32.gguf"), model)
        p = json.load(open(os.path.join(src, "prompts.json")))
        budget, ratio = cfg["indexer_budget"], cfg["indexer_compress_ratio"]
        print(f"{name}: indexer budget {budget} tokens, blocks of {ratio}: every block kept below "
              f"position {budget + ratio - 1}")
        for prompt, toks in p["prompts"].items():
            lg = lo.eval_logits(model, toks, all_positions=True)
            ref = np.fromfile(os.path.join(src, f"logits_{prompt}.f32"), dtype="<f4").reshape(len(toks), -1)
            per = [lo.nmse(lg[t], ref[t]) for t in range(len(toks))]
            dense = per[: budget + ratio - 1]
            apart = [t for t in range(len(toks)) if per[t] > 1e-6]
            print(f"  {prompt:5} {len(toks):3} tokens: max NMSE while dense {max(dense):.1e}; "
                  f"first position above 1e-6: {apart[0] if apart else '-'} ({len(apart)} such), "
                  f"worst {max(per):.1e}; argmax equal at {int((lg.argmax(1) == ref.argmax(1)).sum())}/{len(toks)}")


if __name__ == "__main__":
    main()
