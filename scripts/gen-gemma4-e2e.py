#!/usr/bin/env python3
# vela-venv: torch
"""A tiny random-weight Gemma 4 model with the REAL Gemma 4 tokenizer and chat template, for
end-to-end tests of `vela run/chat/serve` (tokenizer, template, tool/thinking parsing, server).

Regenerate (re-runnable; overwrites the output):

    scripts/prepare-test-data.sh      # runs this in $VELA_CACHE/venv-torch
or  $VELA_CACHE/venv-torch/bin/python scripts/gen-gemma4-e2e.py

Output: $VELA_CACHE/golden/gemma4_e2e/
    hf/                 Gemma4ForCausalLM.save_pretrained (float32) + config.json
    model-f32.gguf      llama.cpp's converter (vendored, 0c1e570) on hf/, with the tokenizer
                        (tokens, scores, types, merges, special ids, chat template) taken from
                        llama.cpp's models/ggml-vocab-gemma-4.gguf — i.e. Gemma 4's real vocabulary
                        of 262,144 tokens; the weights are random, so the text is gibberish.
    hf-assistant/       a random gemma4_assistant for it (transformers), and
    mtp-model-f32.gguf  the same through llama.cpp's converter: the file `vela run` discovers
                        next to model-f32.gguf for MTP speculative decoding
    llama_greedy.json   llama.cpp 0c1e570 on model-f32.gguf (F32 KV): tokenization (BOS added,
                        control tokens parsed? no: plain text) and 32 greedy tokens + top-2 margins
                        for 3 prompts (one crosses the 32-token window)
    meta.json           config

Geometry: 4 layers (3 sliding, window 32, + 1 full with attention_k_eq_v and proportional RoPE),
hidden 64, 2 heads, head dims 32 (sliding) / 64 (full), soft-capping 30, tied embeddings.
"""
import json
import os
import shutil
import sys
import tempfile

import torch
from transformers import Gemma4ForCausalLM, Gemma4TextConfig

CACHE = os.environ.get("VELA_CACHE", "/root/.cache/vela")
LLAMA_CPP = os.path.join(CACHE, "llama-cpp-python", "vendor", "llama.cpp")
OUT = os.path.join(CACHE, "golden", "gemma4_e2e")
VOCAB_GGUF = os.path.join(LLAMA_CPP, "models", "ggml-vocab-gemma-4.gguf")
PROMPTS = ["Hello, how are you?",
           "<|turn>user\nWrite a haiku about the sea.<turn|>\n<|turn>model\n",
           "The quick brown fox jumps over the lazy dog. " * 12]


def build_assistant(tcfg) -> None:
    """A random `gemma4_assistant` for the target (3 sliding + 1 full query-only layers reading
    the target's last sliding/full caches), as HF directory `hf-assistant/` and, through
    llama.cpp's converter, `mtp-model-f32.gguf` — the name `vela run` discovers next to
    `model-f32.gguf`."""
    import importlib.util
    spec = importlib.util.spec_from_file_location(
        "gen_gemma4_assistant", os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                             "gen-gemma4-assistant.py"))
    ga = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(ga)  # also applies its transformers 5.23 assistant-config fix
    tkw = tcfg
    atext = Gemma4TextConfig(**ga.assistant_text(tkw, hidden=32, heads=2, ff=64))
    acfg = ga.Gemma4AssistantConfig(text_config=atext, backbone_hidden_size=tkw["hidden_size"])
    asst = ga.Gemma4AssistantForCausalLM(acfg).eval().float()
    ga.randomize(asst, torch.Generator().manual_seed(4321))
    asst.tie_weights()
    work = os.path.join(OUT, "assistant-work")
    shutil.rmtree(work, ignore_errors=True)
    asst.save_pretrained(os.path.join(work, "assistant"), safe_serialization=True)
    ga.to_gguf(work)
    hf = os.path.join(OUT, "hf-assistant")
    shutil.rmtree(hf, ignore_errors=True)
    shutil.move(os.path.join(work, "assistant"), hf)
    if os.path.exists(os.path.join(work, "assistant.gguf")):
        shutil.move(os.path.join(work, "assistant.gguf"), os.path.join(OUT, "mtp-model-f32.gguf"))
    shutil.rmtree(work, ignore_errors=True)


def vocab_field():
    """(n_vocab, field(key) -> value) of llama.cpp's Gemma 4 vocabulary file."""
    sys.path[:0] = [LLAMA_CPP, os.path.join(LLAMA_CPP, "gguf-py")]
    import gguf

    vocab = gguf.GGUFReader(VOCAB_GGUF)

    def field(k):
        f = vocab.fields.get(k)
        return None if f is None else f.contents()

    return len(vocab.fields["tokenizer.ggml.tokens"].data), field


def target_kwargs(n_vocab: int, field) -> dict:
    """The tiny target's Gemma4TextConfig arguments (see the module docstring)."""
    return dict(
        vocab_size=n_vocab,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=4,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=32,
        global_head_dim=64,
        num_global_key_value_heads=1,
        attention_k_eq_v=True,
        layer_types=["sliding_attention"] * 3 + ["full_attention"],
        sliding_window=32,
        rope_parameters={
            "sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0},
            "full_attention": {"rope_type": "proportional", "partial_rotary_factor": 0.25,
                               "rope_theta": 1_000_000.0},
        },
        final_logit_softcapping=30.0,
        hidden_size_per_layer_input=0,
        vocab_size_per_layer_input=n_vocab,
        num_kv_shared_layers=0,
        max_position_embeddings=8192,
        bos_token_id=field("tokenizer.ggml.bos_token_id"),
        eos_token_id=field("tokenizer.ggml.eos_token_id"),
        pad_token_id=field("tokenizer.ggml.padding_token_id"),
        tie_word_embeddings=True,
    )


def to_gguf_real_vocab(hf: str, out: str, n_vocab: int, field) -> None:
    """llama.cpp's converter on the HF directory `hf`, with the real Gemma 4 tokenizer and chat
    template copied from llama.cpp's vocabulary file."""
    import convert_hf_to_gguf
    from conversion import gemma

    def set_vocab(self):
        w = self.gguf_writer
        w.add_tokenizer_model(field("tokenizer.ggml.model"))
        w.add_token_list(field("tokenizer.ggml.tokens"))
        w.add_token_scores(field("tokenizer.ggml.scores"))
        w.add_token_types(field("tokenizer.ggml.token_type"))
        w.add_token_merges(field("tokenizer.ggml.merges"))
        w.add_bos_token_id(field("tokenizer.ggml.bos_token_id"))
        w.add_eos_token_id(field("tokenizer.ggml.eos_token_id"))
        w.add_unk_token_id(field("tokenizer.ggml.unknown_token_id"))
        w.add_pad_token_id(field("tokenizer.ggml.padding_token_id"))
        w.add_mask_token_id(field("tokenizer.ggml.mask_token_id"))
        w.add_add_bos_token(bool(field("tokenizer.ggml.add_bos_token")))
        w.add_add_space_prefix(bool(field("tokenizer.ggml.add_space_prefix")))
        w.add_chat_template(field("tokenizer.chat_template"))

    gemma.Gemma4Model.set_vocab = set_vocab
    with tempfile.TemporaryDirectory() as tmp:
        for f in ("config.json", "model.safetensors"):
            shutil.copy(os.path.join(hf, f), tmp)
        with open(os.path.join(tmp, "tokenizer.json"), "w") as f:
            json.dump({"model": {"type": "BPE", "vocab": {f"<t{i}>": i for i in range(n_vocab)}},
                       "added_tokens": []}, f)
        argv = sys.argv
        try:
            sys.argv = ["convert", tmp, "--outfile", out, "--outtype", "f32"]
            convert_hf_to_gguf.main()
        finally:
            sys.argv = argv


def main() -> None:
    n_vocab, field = vocab_field()
    tkw = target_kwargs(n_vocab, field)
    cfg = Gemma4TextConfig(**tkw)
    torch.manual_seed(1234)
    model = Gemma4ForCausalLM(cfg).float().eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.copy_(1.0 + 0.1 * torch.randn_like(p))
            elif "layer_scalar" in name:
                p.fill_(1.0)
            else:
                p.normal_(0.0, 0.02 if "embed" in name else 1.0 / p.shape[-1] ** 0.5)
    os.makedirs(OUT, exist_ok=True)
    hf = os.path.join(OUT, "hf")
    shutil.rmtree(hf, ignore_errors=True)
    model.save_pretrained(hf, safe_serialization=True)

    to_gguf_real_vocab(hf, os.path.join(OUT, "model-f32.gguf"), n_vocab, field)
    build_assistant(tkw)

    # llama.cpp's own tokenization and greedy decode of the GGUF (F32 KV cache), for the Rust test.
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import llama_oracle
    gg = os.path.join(OUT, "model-f32.gguf")
    refs = []
    for text in PROMPTS:
        toks = llama_oracle.tokenize(gg, text, add_bos=True)
        ids, margins = llama_oracle.greedy_decode(gg, toks, 32, n_ctx=512, kv_f32=True,
                                                  stop_at_eog=False)
        refs.append({"text": text, "tokens": toks, "greedy": ids, "margins": margins})
    llama_oracle.unload(gg)
    with open(os.path.join(OUT, "llama_greedy.json"), "w") as f:
        json.dump(refs, f)
    with open(os.path.join(OUT, "meta.json"), "w") as f:
        json.dump({"n_vocab": n_vocab, "config": cfg.to_dict(), "vocab_from": VOCAB_GGUF}, f,
                  indent=1, default=str)
    print(f"gemma4_e2e: {OUT}/model-f32.gguf (vocab {n_vocab})")


if __name__ == "__main__":
    main()
