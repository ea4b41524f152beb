#!/usr/bin/env python3
"""Structured output of `vela serve` with a real model, through the official `openai` and
`anthropic` clients (docs/server.md, "Structured output").

Usage: scripts/test-structured.py --bin target/release/examples/serve --model QWEN.gguf
           [--n 200] [--tools 40] [--repeats 3] [--quick]

1. `--n` chat requests with `response_format` over the schemas below (json_schema strict,
   json_object), greedy and sampled: every answer must parse and validate (jsonschema) and end
   with `finish_reason: stop`.
2. `--tools` requests with `tool_choice: "required"` / a named function (and Anthropic
   `tool_choice: any` / `tool`): every answer must be a tool call of an allowed function whose
   arguments validate.
3. Streaming gives the same text as the whole response; a schema llguidance cannot handle is a
   400 naming the keyword; with `--lookup` a constrained request drafts nothing (speculation is
   off under a grammar) while a plain one does.
4. Unless --quick: the constrained path's cost per token: the same prompts with and without the
   schema, interleaved, `--repeats` rounds, decode tokens/s from `timings.predicted_per_second`
   (median, min-max) and the grammar's own time per token (`timings.grammar_ms`).

Needs `pip install openai anthropic httpx jsonschema`. Exits non-zero on any failure.
"""
import argparse, json, statistics, sys, time

import httpx
import jsonschema
import openai
import anthropic

from serve_harness import FAIL, check
from serve_harness import Server as _Server


class Server(_Server):
    """The harness's server with the official clients attached."""

    def __init__(self, args, extra=()):
        super().__init__(args, extra, tag="vela-test-structured")
        self.oai = openai.OpenAI(base_url=self.base + "/v1", api_key="x", max_retries=0, timeout=600)
        self.ant = anthropic.Anthropic(base_url=self.base, api_key="x", max_retries=0, timeout=600)


S = lambda **p: {"type": "string", **p}
I = lambda **p: {"type": "integer", **p}
N = lambda **p: {"type": "number", **p}
B = {"type": "boolean"}


def obj(props, required=None):
    return {"type": "object", "properties": props, "required": list(required if required is not None else props),
            "additionalProperties": False}


# (name, schema, prompt): each schema with a prompt that asks for that kind of data.
SCHEMAS = [
    ("person", obj({"name": S(maxLength=40), "age": I(minimum=0, maximum=130), "email": S(maxLength=60)}),
     "Invent a person: their name, age and email address."),
    ("weather", obj({"city": S(maxLength=40), "temperature_c": N(minimum=-90, maximum=60),
                     "conditions": {"enum": ["sunny", "cloudy", "rain", "snow", "storm"]}}),
     "Describe the weather in Paris today."),
    ("todo", obj({"title": S(maxLength=60), "items": {"type": "array", "items": obj({"task": S(maxLength=50), "done": B}),
                                                     "minItems": 1, "maxItems": 4}}),
     "Write a short todo list for moving house."),
    ("sentiment", obj({"label": {"enum": ["positive", "negative", "neutral"]}, "score": N(minimum=0, maximum=1)}),
     "Classify the sentiment of: 'The food was cold and the waiter ignored us.'"),
    ("code", obj({"language": {"enum": ["python", "rust", "javascript", "go"]}, "function_name": S(pattern="^[a-z_][a-z0-9_]*$", maxLength=30),
                  "lines": I(minimum=1, maximum=200)}),
     "Describe a function that reverses a string: its language, name and length in lines."),
    ("book", obj({"title": S(maxLength=60), "author": S(maxLength=40), "year": I(minimum=1400, maximum=2030),
                  "tags": {"type": "array", "items": S(maxLength=20), "maxItems": 3}}),
     "Recommend one classic novel."),
    ("point", obj({"x": N(), "y": N(), "label": {"anyOf": [S(maxLength=10), {"type": "null"}]}}),
     "Give a point on the unit circle with an optional label."),
    ("refs", {"$defs": {"addr": obj({"street": S(maxLength=40), "zip": S(pattern="^[0-9]{5}$")})},
              **obj({"home": {"$ref": "#/$defs/addr"}, "work": {"$ref": "#/$defs/addr"}})},
     "Give a home and a work address in the US."),
    ("flags", obj({"enabled": B, "retries": I(minimum=0, maximum=10), "mode": {"const": "strict"}}),
     "Give a configuration for a retrying HTTP client."),
    ("matrix", obj({"rows": {"type": "array", "items": {"type": "array", "items": I(minimum=0, maximum=9), "minItems": 2, "maxItems": 2},
                             "minItems": 2, "maxItems": 2}}),
     "Give a 2x2 matrix of small digits."),
    ("optional", obj({"id": I(minimum=1), "nickname": S(maxLength=20), "score": N()}, required=["id"]),
     "Create a user record."),
    ("json_object", None, "Return a JSON object describing a cat."),
]


def rf_of(name, schema):
    if schema is None:
        return {"type": "json_object"}
    return {"type": "json_schema", "json_schema": {"name": name, "strict": True, "schema": schema}}


def ask(s, name, schema, prompt, i, max_tokens=300):
    temp = 0 if i % 2 == 0 else 0.7
    r = s.oai.chat.completions.create(
        model="default", max_tokens=max_tokens, temperature=temp, seed=i,
        messages=[{"role": "system", "content": "You answer in JSON."}, {"role": "user", "content": prompt}],
        response_format=rf_of(name, schema))
    return r


def test_schemas(args, s):
    print(f"== {args.n} requests with response_format over {len(SCHEMAS)} schemas")
    parsed = valid = stopped = 0
    bad = []
    for i in range(args.n):
        name, schema, prompt = SCHEMAS[i % len(SCHEMAS)]
        r = ask(s, name, schema, prompt, i)
        text = r.choices[0].message.content or ""
        try:
            v = json.loads(text)
            parsed += 1
            jsonschema.validate(v, schema if schema is not None else {"type": "object"})
            valid += 1
        except Exception as e:
            bad.append((name, i, r.choices[0].finish_reason, str(e)[:120], text[:200]))
        stopped += r.choices[0].finish_reason == "stop"
    for b in bad[:10]:
        print("    bad:", b)
    print(f"  parsed {parsed}/{args.n}, validated {valid}/{args.n}, finish_reason stop {stopped}/{args.n}")
    check(parsed == args.n and valid == args.n, f"every response_format answer parses and validates ({valid}/{args.n})")
    check(stopped == args.n, f"every answer ended by the model, none cut by max_tokens ({stopped}/{args.n})")


TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "description": "Current weather of a city",
                                      "parameters": obj({"city": S(), "unit": {"enum": ["celsius", "fahrenheit"]}})}},
    {"type": "function", "function": {"name": "search_web", "description": "Search the web",
                                      "parameters": obj({"query": S(), "max_results": I(minimum=1, maximum=20)}, required=["query"])}},
    {"type": "function", "function": {"name": "send_email", "description": "Send an email",
                                      "parameters": obj({"to": S(), "subject": S(), "body": S()})}},
]
TOOL_PROMPTS = ["What's the weather like in Oslo?", "Find recent news about Rust 2024 edition.",
                "Tell Bob (bob@example.com) the meeting moved to 3pm.", "Hello! How are you today?"]


def params_of(name):
    return next(t["function"]["parameters"] for t in TOOLS if t["function"]["name"] == name)


def test_tools(args, s):
    print(f"== {args.tools} requests with a forced tool call")
    calls = ok = 0
    n = args.tools
    for i in range(n):
        prompt = TOOL_PROMPTS[i % len(TOOL_PROMPTS)]
        named = None if i % 2 == 0 else TOOLS[(i // 2) % len(TOOLS)]["function"]["name"]
        choice = "required" if named is None else {"type": "function", "function": {"name": named}}
        if i % 4 == 3:
            # Anthropic forced tool use.
            tc = {"type": "any"} if named is None else {"type": "tool", "name": named}
            m = s.ant.messages.create(model="default", max_tokens=300, extra_body={"temperature": 0.0 if i % 8 < 4 else 0.7},
                                      messages=[{"role": "user", "content": prompt}], tool_choice=tc,
                                      tools=[{"name": t["function"]["name"], "description": t["function"]["description"],
                                              "input_schema": t["function"]["parameters"]} for t in TOOLS])
            got = [(b.name, b.input) for b in m.content if b.type == "tool_use"]
            finish = m.stop_reason == "tool_use"
        else:
            r = s.oai.chat.completions.create(model="default", max_tokens=300, temperature=0 if i % 8 < 4 else 0.7, seed=i,
                                              messages=[{"role": "user", "content": prompt}], tools=TOOLS, tool_choice=choice)
            got = [(c.function.name, json.loads(c.function.arguments)) for c in (r.choices[0].message.tool_calls or [])]
            finish = r.choices[0].finish_reason == "tool_calls"
        calls += bool(got) and finish
        good = bool(got)
        for name, a in got:
            try:
                jsonschema.validate(a, params_of(name))
            except Exception:
                good = False
            if named is not None and name != named:
                good = False
        ok += good
        if not good:
            print("    bad:", i, named, got)
    check(calls == n, f"every forced request yields a tool call ({calls}/{n})")
    check(ok == n, f"every call is of an allowed function with valid arguments ({ok}/{n})")


def test_stream_and_errors(args, s):
    print("== streaming, unsupported schemas")
    name, schema, prompt = SCHEMAS[1]
    whole = ask(s, name, schema, prompt, 0).choices[0].message.content
    parts = []
    for ch in s.oai.chat.completions.create(model="default", max_tokens=300, temperature=0, seed=0, stream=True,
                                            messages=[{"role": "system", "content": "You answer in JSON."},
                                                      {"role": "user", "content": prompt}],
                                            response_format=rf_of(name, schema)):
        if ch.choices and ch.choices[0].delta.content:
            parts.append(ch.choices[0].delta.content)
    check("".join(parts) == whole, "streamed constrained output equals the whole response")
    body = {"messages": [{"role": "user", "content": "x"}],
            "response_format": {"type": "json_schema", "json_schema": {"name": "s", "schema": {"type": "object", "if": {"required": ["a"]}, "then": {}}}}}
    r = httpx.post(s.base + "/v1/chat/completions", json=body, timeout=60)
    msg = r.json().get("error", {}).get("message", "")
    check(r.status_code == 400 and "if" in msg, f"unsupported keyword: 400 naming it ({r.status_code}: {msg[:100]})")


def test_lookup(args):
    print("== speculation (--lookup) is off for constrained requests")
    s = Server(args, ["--lookup", "--draft-fixed"])
    try:
        name, schema, prompt = SCHEMAS[2]
        r = httpx.post(s.base + "/v1/chat/completions", timeout=600, json={
            "messages": [{"role": "user", "content": prompt}], "max_tokens": 300, "temperature": 0,
            "response_format": rf_of(name, schema)}).json()
        text = r["choices"][0]["message"]["content"]
        try:
            jsonschema.validate(json.loads(text), schema)
            good = True
        except Exception:
            good = False
        check(good and r["timings"]["draft_n"] == 0, f"constrained: valid, no drafts (draft_n {r['timings']['draft_n']})")
        rep = "Repeat exactly, five times, one per line: the quick brown fox jumps over the lazy dog."
        r = httpx.post(s.base + "/v1/chat/completions", timeout=600, json={
            "messages": [{"role": "user", "content": rep}], "max_tokens": 80, "temperature": 0}).json()
        check(r["timings"]["draft_n"] > 0, f"unconstrained: drafts (draft_n {r['timings']['draft_n']})")
    finally:
        s.stop()


def test_overhead(args, s):
    print(f"== cost per token: same prompts with and without the schema, interleaved, {args.repeats} rounds")
    rates = {"plain": [], "constrained": []}
    gms, shares = [], []
    picks = [SCHEMAS[k] for k in (0, 1, 2, 5, 8)]
    for rnd in range(args.repeats):
        per = {"plain": [], "constrained": []}
        for name, schema, prompt in picks:
            for mode in ("plain", "constrained") if rnd % 2 == 0 else ("constrained", "plain"):
                body = {"messages": [{"role": "system", "content": "You answer in JSON."}, {"role": "user", "content": prompt}],
                        "max_tokens": 96, "temperature": 0}
                if mode == "constrained":
                    body["response_format"] = rf_of(name, schema)
                t = httpx.post(s.base + "/v1/chat/completions", json=body, timeout=600).json()["timings"]
                per[mode].append((t["predicted_n"], t["predicted_ms"]))
                if mode == "constrained":
                    gms.append(t["grammar_ms"] / max(t["predicted_n"], 1))
                    shares.append(t["grammar_ms"] / t["predicted_ms"] * 100)
        for mode in per:
            n = sum(x for x, _ in per[mode]); ms = sum(y for _, y in per[mode])
            rates[mode].append(n * 1e3 / ms)
    for mode, r in rates.items():
        print(f"  {mode:12s} decode tok/s: median {statistics.median(r):.1f} (min {min(r):.1f}, max {max(r):.1f}) rounds {[round(x, 1) for x in r]}")
    med = lambda m: statistics.median(rates[m])
    print(f"  grammar time per token: median {statistics.median(gms):.3f} ms (min {min(gms):.3f}, max {max(gms):.3f}); "
          f"share of the constrained decode loop: median {statistics.median(shares):.2f} % (min {min(shares):.2f}, max {max(shares):.2f})")
    print(f"  overhead per token: {1e3 / med('constrained') - 1e3 / med('plain'):+.2f} ms "
          f"({(med('plain') / med('constrained') - 1) * 100:+.1f} % time per token)")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--n", type=int, default=200)
    ap.add_argument("--tools", type=int, default=40)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--quick", action="store_true", help="CI size: 12 schema requests (one per schema), 4 tool requests, no timing")
    ap.add_argument("--overhead-only", action="store_true", help="only the cost per token (part 4)")
    args = ap.parse_args()
    if args.overhead_only:
        s = Server(args)
        try:
            test_overhead(args, s)
        finally:
            s.stop()
        sys.exit(0)
    if args.quick:
        args.n, args.tools = 12, 4
    t0 = time.time()
    s = Server(args)
    try:
        test_schemas(args, s)
        test_tools(args, s)
        test_stream_and_errors(args, s)
        if not args.quick:
            test_overhead(args, s)
    finally:
        s.stop()
    test_lookup(args)
    print(f"{len(FAIL)} failed in {time.time() - t0:.0f} s")
    sys.exit(1 if FAIL else 0)


if __name__ == "__main__":
    main()
