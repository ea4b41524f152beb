#!/usr/bin/env python3
"""Golden outputs for `vela-template`: chat templates rendered by Python jinja2 exactly as HF does.

Regenerate (re-runnable, deterministic, overwrites the manifest):

    python3 scripts/gen-template-golden.py

Inputs:
  * every `models/templates/*.jinja` of the llama.cpp source tree
    (`$VELA_CACHE/llama-cpp-python/vendor/llama.cpp`),
  * `tokenizer.chat_template` embedded in the real GGUF models in `$VELA_CACHE/models`
    (SmolLM2, Qwen2.5-coder, gemma-3; read with gguf-py's GGUFReader). Missing files are skipped.

Output: `$VELA_CACHE/golden/templates/manifest.json` (VELA_CACHE defaults to ~/.cache/vela):

    {"fixed_now": [Y, M, D, h, m, s],
     "conversations": [{"name", "messages", "tools"?, "add_generation_prompt", "extra"}],
     "templates": [{"name", "source", "bos_token", "eos_token",
                    "compile_error"?,
                    "results": {conv_name: {"output": str} | {"error": str}}}]}

The environment replicates transformers 5.x `utils/chat_template_utils.py` +
`tokenization_utils_base.apply_chat_template`:
  * `ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
    extensions=[AssistantTracker-like {% generation %} tag, jinja2.ext.loopcontrols])`
  * filter `tojson` = `json.dumps(x, ensure_ascii=False, indent, separators, sort_keys)`
  * globals `raise_exception`, `strftime_now` (here with a FIXED clock, see FIXED_NOW),
    `dict`, `namespace` (HF's underscore-rejecting namespace)
  * messages: keys whose value is None are dropped, reasoning aliased
    (`thinking`/`reasoning_content`), as HF 5.x does
  * context: messages, tools (None when not given), documents=None, add_generation_prompt,
    bos_token, eos_token, then the extra kwargs (which override the special tokens).
Cases where jinja2 itself raises are recorded as {"error": ...}; the Rust test skips them.

Second output, `$VELA_CACHE/golden/templates/roundtrip.json` (same layout, conversations from
ROUNDTRIP_CONVERSATIONS, only templates that define Gemma 4 tool calls, i.e. contain
`<|tool_call>`): the prompts of a full tool-call round trip (system + tools + user; the assistant
turn that vela-server's Gemma 4 output parser produces from a model answer with thinking and tool
calls, plus the tool results; the final answer). Used by vela-server's `parser_gemma4_tests.rs`.
"""

import copy
import json
import os
import sys
from datetime import datetime
from pathlib import Path

import jinja2
import jinja2.ext
import jinja2.nodes
import jinja2.utils
from jinja2.ext import Extension
from jinja2.sandbox import ImmutableSandboxedEnvironment

FIXED_NOW = datetime(2025, 3, 7, 14, 5, 9)  # Friday; must match the Rust test clock

CACHE = Path(os.environ.get("VELA_CACHE", Path.home() / ".cache" / "vela"))
LLAMA_SRC = CACHE / "llama-cpp-python" / "vendor" / "llama.cpp"
OUT = CACHE / "golden" / "templates" / "manifest.json"
GGUF_MODELS = [
    "SmolLM2-135M-Instruct.Q4_1.gguf",
    "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
    "gemma-3-270m-q4_k_m.gguf",
]

# ---------------------------------------------------------------------------------------------
# HF-equivalent environment


class GenerationTag(Extension):
    """`{% generation %}...{% endgeneration %}`: renders its body unchanged (tracking is off)."""

    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(["name:endgeneration"], drop_needle=True)
        return jinja2.nodes.CallBlock(self.call_method("_gen"), [], [], body).set_lineno(lineno)

    def _gen(self, caller):
        return caller()


def raise_exception(message):
    raise jinja2.exceptions.TemplateError(message)


def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                      sort_keys=sort_keys)


def strftime_now(fmt):
    return FIXED_NOW.strftime(fmt)


class TemplateDict:
    def __call__(self, *args, **kwargs):
        return dict(*args, **kwargs)

    def fromkeys(self, *args, **kwargs):
        return dict.fromkeys(*args, **kwargs)


class TemplateNamespace(jinja2.utils.Namespace):
    def __init__(*args, **kwargs):
        self, args = args[0], args[1:]
        attrs = dict(*args, **kwargs)
        for name in attrs:
            TemplateNamespace._check_name(name)
        jinja2.utils.Namespace.__init__(self, attrs)

    def __setitem__(self, name, value):
        TemplateNamespace._check_name(name)
        jinja2.utils.Namespace.__setitem__(self, name, value)

    @staticmethod
    def _check_name(name):
        if isinstance(name, str) and name.startswith("_"):
            raise jinja2.exceptions.SecurityError(
                f"Chat templates cannot store underscore-prefixed attributes on a namespace, "
                f"but got {name!r}. Please rename the attribute.")


def make_env():
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[GenerationTag, jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    env.globals["dict"] = TemplateDict()
    env.globals["namespace"] = TemplateNamespace
    return env


REASONING_FIELDS = ("reasoning_content", "thinking", "reasoning")


def prepare_messages(messages):
    """HF 5.x: drop None-valued keys, then alias the reasoning fields."""
    out = []
    for msg in messages:
        msg = {k: v for k, v in msg.items() if v is not None}
        reasoning = next((msg[k] for k in REASONING_FIELDS if msg.get(k) is not None), None)
        if reasoning is not None:
            msg = {"thinking": reasoning, **msg, "reasoning_content": reasoning}
        out.append(msg)
    return out


def render(template, bos, eos, conv):
    ctx = {"bos_token": bos, "eos_token": eos}
    ctx.update(copy.deepcopy(conv["extra"]))
    return template.render(
        messages=prepare_messages(copy.deepcopy(conv["messages"])),
        tools=copy.deepcopy(conv.get("tools")),
        documents=None,
        add_generation_prompt=conv["add_generation_prompt"],
        **ctx,
    )


# ---------------------------------------------------------------------------------------------
# Conversations

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Get the current weather for a city.",
            "parameters": {
                "type": "object",
                "properties": {
                    "location": {"type": "string", "description": "City name, e.g. Paris"},
                    "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
                    "days": {"type": "integer", "description": "Forecast days", "default": 1},
                },
                "required": ["location"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "search",
            "description": "Search the web for “quoted” text & return <results>.",
            "parameters": {
                "type": "object",
                "properties": {"query": {"type": "string"}, "limit": {"type": "number"}},
                "required": ["query"],
            },
        },
    },
]

SYSTEM = {"role": "system", "content": "You are a helpful assistant."}
TOOL_CALL_TURN = [
    {"role": "user", "content": "What's the weather in Paris?"},
    {
        "role": "assistant",
        "content": "",
        "tool_calls": [
            {
                "id": "call_0001",
                "type": "function",
                "function": {
                    "name": "get_weather",
                    "arguments": {"location": "Paris", "unit": "celsius", "days": 2},
                },
            }
        ],
    },
    {"role": "tool", "tool_call_id": "call_0001", "name": "get_weather",
     "content": "{\"temperature\": 21.5, \"condition\": \"sunny\"}"},
]

CONVERSATIONS = [
    {"name": "single_user", "add_generation_prompt": True, "extra": {},
     "messages": [{"role": "user", "content": "Hello!"}]},
    {"name": "single_user_no_gen", "add_generation_prompt": False, "extra": {},
     "messages": [{"role": "user", "content": "Hello!"}]},
    {"name": "system_user", "add_generation_prompt": True, "extra": {},
     "messages": [SYSTEM, {"role": "user", "content": "What is 2+2?"}]},
    {"name": "multi_turn", "add_generation_prompt": True, "extra": {},
     "messages": [SYSTEM,
                  {"role": "user", "content": "Hi, who are you?"},
                  {"role": "assistant", "content": "I am an assistant. How can I help?"},
                  {"role": "user", "content": "Tell me a joke.\nMake it short."}]},
    {"name": "multi_turn_ends_assistant", "add_generation_prompt": False, "extra": {},
     "messages": [{"role": "user", "content": "Hi!"},
                  {"role": "assistant", "content": "Hello! How can I help you today?"},
                  {"role": "user", "content": "Say 'ok'."},
                  {"role": "assistant", "content": "ok"}]},
    {"name": "tools_defined", "add_generation_prompt": True, "extra": {}, "tools": TOOLS,
     "messages": [SYSTEM, {"role": "user", "content": "What's the weather in Paris?"}]},
    {"name": "tool_call_roundtrip", "add_generation_prompt": True, "extra": {}, "tools": TOOLS,
     "messages": TOOL_CALL_TURN},
    {"name": "tool_call_then_answer", "add_generation_prompt": False, "extra": {}, "tools": TOOLS,
     "messages": [SYSTEM] + TOOL_CALL_TURN
     + [{"role": "assistant", "content": "It is 21.5 °C and sunny in Paris."}]},
    {"name": "reasoning", "add_generation_prompt": True, "extra": {},
     "messages": [{"role": "user", "content": "What is 17*3?"},
                  {"role": "assistant", "content": "17*3 = 51.",
                   "reasoning_content": "17*3 = 17*2 + 17 = 34 + 17 = 51."},
                  {"role": "user", "content": "And 17*4?"}]},
    {"name": "enable_thinking_false", "add_generation_prompt": True,
     "extra": {"enable_thinking": False},
     "messages": [{"role": "user", "content": "Answer quickly: capital of France?"}]},
    {"name": "content_parts", "add_generation_prompt": True, "extra": {},
     "messages": [SYSTEM,
                  {"role": "user", "content": [{"type": "text", "text": "Describe this:"},
                                               {"type": "text", "text": " a red apple."}]}]},
    {"name": "tool_calls_string_args", "add_generation_prompt": True, "extra": {}, "tools": TOOLS,
     "messages": [
         {"role": "user", "content": "Weather in Paris and Oslo? Also search news."},
         {"role": "assistant", "content": None, "tool_calls": [
             {"id": "call_a", "type": "function",
              "function": {"name": "get_weather", "arguments": "{\"location\": \"Oslo\"}"}},
             {"id": "call_b", "type": "function",
              "function": {"name": "search",
                           "arguments": {"query": "news", "limit": 3.0, "exact": True,
                                         "filters": None, "tags": [1, "a", 2.5e-7]}}}]},
         {"role": "tool", "tool_call_id": "call_a", "name": "get_weather", "content": "-3 °C"},
         {"role": "tool", "tool_call_id": "call_b", "name": "search", "content": "no news"}]},
    {"name": "thinking_enabled", "add_generation_prompt": True,
     "extra": {"enable_thinking": True, "reasoning_effort": "high"},
     "messages": [SYSTEM,
                  {"role": "user", "content": "Is 91 prime?"},
                  {"role": "assistant", "content": "No, 91 = 7*13.", "thinking": "Try 7: 7*13=91."},
                  {"role": "user", "content": "Is 97 prime?"}]},
    {"name": "tools_flat_schema", "add_generation_prompt": True, "extra": {},
     "tools": [t["function"] for t in TOOLS],
     "messages": [{"role": "user", "content": "Search for rust jinja."}]},
    {"name": "tools_cohere_schema", "add_generation_prompt": True, "extra": {},
     "tools": [{"name": "internet_search", "description": "Search the internet.",
                "parameter_definitions": {
                    "query": {"description": "Query to search", "type": "str", "required": True},
                    "max_results": {"description": "Result cap", "type": "int",
                                    "required": False}}}],
     "messages": [{"role": "user", "content": "Who won the 2022 World Cup?"}]},
    {"name": "custom_kwargs", "add_generation_prompt": True,
     "extra": {"functions": json.dumps([t["function"] for t in TOOLS], indent=2),
               "datetime": "2025-03-07", "custom_flag": [1, 2.0, None]},
     "messages": [SYSTEM, {"role": "user", "content": "Hi"}]},
    # A thinking model's call answered by a tool (the turn after the last user message keeps
    # its reasoning in GLM / Qwen3 templates), then the same history with earlier reasoning kept
    # by request (GLM's `clear_thinking`).
    {"name": "reasoning_tool_roundtrip", "add_generation_prompt": True,
     "extra": {"enable_thinking": True}, "tools": TOOLS,
     "messages": [SYSTEM, TOOL_CALL_TURN[0],
                  dict(TOOL_CALL_TURN[1], reasoning_content="Need the weather tool.\nCall it."),
                  TOOL_CALL_TURN[2]]},
    {"name": "reasoning_kept_by_kwarg", "add_generation_prompt": True,
     "extra": {"clear_thinking": False}, "tools": TOOLS,
     "messages": [TOOL_CALL_TURN[0],
                  dict(TOOL_CALL_TURN[1], reasoning_content="Need the weather tool."),
                  TOOL_CALL_TURN[2],
                  {"role": "assistant", "content": "21.5 °C, sunny.", "reasoning_content": "Read it."},
                  {"role": "user", "content": "And tomorrow?"}]},
    {"name": "unicode_and_markup", "add_generation_prompt": True, "extra": {},
     "messages": [{"role": "user",
                   "content": "  Grüße 👋 — <b>bold</b> & \"quotes\" {{ not a tag }}  "}]},
]

# Gemma 4 round trip (see the module docs). The assistant turns are exactly what vela-server
# builds from the parsed model output (`parser_gemma4_tests.rs` checks that), after the server's
# message normalization (null content -> "", JSON-string arguments -> objects).
G4_REASONING = "The user wants the weather in Paris.\nI should call get_weather."
G4_CALL_TURN = {
    "role": "assistant", "content": "", "reasoning_content": G4_REASONING,
    "tool_calls": [{"id": "call_1", "type": "function",
                    "function": {"name": "get_weather",
                                 "arguments": {"location": "Paris", "unit": "celsius"}}}]}
G4_TOOL_RESULT = {"role": "tool", "tool_call_id": "call_1",
                  "content": "{\"temperature\": 21.5, \"condition\": \"sunny\"}"}
G4_TWO_CALLS_TURN = {
    "role": "assistant", "content": "", "reasoning_content": "Two lookups.",
    "tool_calls": [
        {"id": "call_2", "type": "function",
         "function": {"name": "get_weather", "arguments": {"location": "Oslo", "days": 3}}},
        {"id": "call_3", "type": "function",
         "function": {"name": "search",
                      "arguments": {"query": "Oslo \"news\", today\n{x}", "limit": 2.5,
                                    "exact": True, "filters": {"lang": "en", "n": [1, 2]},
                                    "tags": ["a", "b"]}}}]}
G4_USER = {"role": "user", "content": "What's the weather in Paris?"}
G4_THINK = {"enable_thinking": True}
ROUNDTRIP_CONVERSATIONS = [
    {"name": "g4_prompt", "add_generation_prompt": True, "extra": G4_THINK, "tools": TOOLS,
     "messages": [SYSTEM, G4_USER]},
    {"name": "g4_after_tool", "add_generation_prompt": True, "extra": G4_THINK, "tools": TOOLS,
     "messages": [SYSTEM, G4_USER, G4_CALL_TURN, G4_TOOL_RESULT]},
    {"name": "g4_after_two_calls", "add_generation_prompt": True, "extra": G4_THINK,
     "tools": TOOLS,
     "messages": [SYSTEM, {"role": "user", "content": "Oslo weather and news?"},
                  G4_TWO_CALLS_TURN,
                  {"role": "tool", "tool_call_id": "call_2", "content": "-3 °C"},
                  {"role": "tool", "tool_call_id": "call_3", "content": "no news"}]},
    {"name": "g4_final_answer", "add_generation_prompt": False, "extra": G4_THINK,
     "tools": TOOLS,
     "messages": [SYSTEM, G4_USER, G4_CALL_TURN, G4_TOOL_RESULT,
                  {"role": "assistant", "content": "It is 21.5 °C and sunny in Paris."}]},
]

# ---------------------------------------------------------------------------------------------
# Templates

SPECIAL_PAIRS = [
    ("<|begin_of_text|>", "<|begin_of_text|>", "<|eot_id|>"),
    ("<|im_start|>", "<|im_start|>", "<|im_end|>"),
    ("<start_of_turn>", "<bos>", "<eos>"),
    ("[INST]", "<s>", "</s>"),
    ("<｜begin▁of▁sentence｜>", "<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>"),
    ("<|startoftext|>", "<|startoftext|>", "<|endoftext|>"),
]


def special_pair(source):
    for marker, bos, eos in SPECIAL_PAIRS:
        if marker in source:
            return bos, eos
    return "<s>", "</s>"


def gguf_templates():
    try:
        from gguf import GGUFReader
    except ImportError:
        print("gguf-py not installed; skipping embedded templates", file=sys.stderr)
        return []
    out = []
    for name in GGUF_MODELS:
        path = CACHE / "models" / name
        if not path.exists():
            print(f"SKIP missing {path}", file=sys.stderr)
            continue
        reader = GGUFReader(str(path))

        def get_str(key):
            f = reader.get_field(key)
            return None if f is None else f.contents()

        def token(key):
            f = reader.get_field(key)
            if f is None:
                return None
            toks = reader.get_field("tokenizer.ggml.tokens")
            return toks.contents(int(f.contents()))

        src = get_str("tokenizer.chat_template")
        if src is None:
            continue
        bos, eos = token("tokenizer.ggml.bos_token_id"), token("tokenizer.ggml.eos_token_id")
        dbos, deos = special_pair(src)
        out.append({"name": f"gguf:{name}", "source": src,
                    "bos_token": bos or dbos, "eos_token": eos or deos})
    return out


def write_roundtrip(env, templates):
    """Render ROUNDTRIP_CONVERSATIONS with the Gemma 4 templates into roundtrip.json."""
    out = []
    for t in templates:
        compiled = env.from_string(t["source"])
        results = {}
        for conv in ROUNDTRIP_CONVERSATIONS:
            results[conv["name"]] = {"output": render(compiled, t["bos_token"], t["eos_token"],
                                                      conv)}
        out.append({**t, "results": results})
    path = OUT.parent / "roundtrip.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"generator": "scripts/gen-template-golden.py",
                                "conversations": ROUNDTRIP_CONVERSATIONS, "templates": out},
                               ensure_ascii=False, indent=1), encoding="utf-8")
    print(f"{len(out)} Gemma 4 templates x {len(ROUNDTRIP_CONVERSATIONS)} round-trip renders "
          f"-> {path}")


def main():
    tdir = LLAMA_SRC / "models" / "templates"
    if not tdir.is_dir():
        sys.exit(f"llama.cpp templates not found at {tdir}")
    templates = []
    for p in sorted(tdir.glob("*.jinja")):
        src = p.read_text(encoding="utf-8")
        bos, eos = special_pair(src)
        templates.append({"name": p.stem, "source": src, "bos_token": bos, "eos_token": eos})
    templates += gguf_templates()

    env = make_env()
    write_roundtrip(env, [t for t in templates if "<|tool_call>" in t["source"]])
    n_ok = n_err = n_cerr = 0
    for t in templates:
        try:
            compiled = env.from_string(t["source"])
        except Exception as e:  # noqa: BLE001 - recorded, not hidden
            t["compile_error"] = f"{type(e).__name__}: {e}"
            t["results"] = {}
            n_cerr += 1
            continue
        results = {}
        for conv in CONVERSATIONS:
            try:
                results[conv["name"]] = {"output": render(compiled, t["bos_token"],
                                                          t["eos_token"], conv)}
                n_ok += 1
            except Exception as e:  # noqa: BLE001
                results[conv["name"]] = {"error": f"{type(e).__name__}: {e}"}
                n_err += 1
        t["results"] = results

    manifest = {
        "generator": "scripts/gen-template-golden.py",
        "jinja2_version": jinja2.__version__,
        "fixed_now": [FIXED_NOW.year, FIXED_NOW.month, FIXED_NOW.day,
                      FIXED_NOW.hour, FIXED_NOW.minute, FIXED_NOW.second],
        "conversations": CONVERSATIONS,
        "templates": templates,
    }
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(manifest, ensure_ascii=False, indent=1), encoding="utf-8")
    print(f"{len(templates)} templates ({n_cerr} failed to compile), {n_ok} renders ok, "
          f"{n_err} raised -> {OUT}")


if __name__ == "__main__":
    main()
