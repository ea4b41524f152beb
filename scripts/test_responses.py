"""`POST /v1/responses` end to end with the official openai client (test-server.py, kind qwen):
a function call and its answer from the tool result, streamed and not, the stream's event order,
a plain text answer, and the refusals of what this server does not keep."""
import json

import httpx

from serve_harness import check

TOOLS = [{"type": "function", "name": "get_weather", "description": "Get the current weather for a city",
          "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}},
         # A hosted tool: left out of the prompt (this server has none), not an error.
         {"type": "web_search"}]
SYSTEM = "You are a helpful assistant. Use the get_weather tool to answer weather questions."


def test_responses(s, client):
    print("== /v1/responses (openai client: function call, tool result, streaming)")
    inp = [{"role": "user", "content": "What is the weather in Paris right now?"}]
    r = client.responses.create(model=s.model, instructions=SYSTEM, input=inp, tools=TOOLS, temperature=0,
                                max_output_tokens=100)
    calls = [o for o in r.output if o.type == "function_call"]
    print(f"  output: {[o.type for o in r.output]} calls={[(c.name, c.arguments) for c in calls]}")
    check(r.status == "completed" and len(calls) == 1 and calls[0].name == "get_weather"
          and "paris" in json.loads(calls[0].arguments).get("city", "").lower(), "function_call get_weather(city=Paris)")
    check(r.usage.input_tokens > 0 and r.usage.output_tokens > 0, f"usage {r.usage.input_tokens} in, {r.usage.output_tokens} out")
    if not calls:
        return
    # The same request streamed: the same call, events in order, sequence numbers 0, 1, 2, ...
    events = list(client.responses.create(model=s.model, instructions=SYSTEM, input=inp, tools=TOOLS, temperature=0,
                                          max_output_tokens=100, stream=True))
    types = [e.type for e in events]
    seq = [e.sequence_number for e in events]
    done = [e.item for e in events if e.type == "response.output_item.done" and e.item.type == "function_call"]
    check(types[:2] == ["response.created", "response.in_progress"] and types[-1] == "response.completed",
          f"stream starts created/in_progress, ends completed ({len(types)} events)")
    check(seq == list(range(len(seq))), "sequence numbers count up from 0")
    check([(d.name, d.arguments) for d in done] == [(calls[0].name, calls[0].arguments)], "streamed call identical")
    check(events[-1].response.output[-1].type == "function_call", "completed response carries the items")
    # Turn 2: the call and its output go back; the answer uses the result.
    inp2 = inp + [{"type": "function_call", "call_id": calls[0].call_id, "name": calls[0].name, "arguments": calls[0].arguments},
                  {"type": "function_call_output", "call_id": calls[0].call_id,
                   "output": json.dumps({"city": "Paris", "temperature_c": 18, "sky": "sunny"})}]
    pieces = []
    final = None
    for e in client.responses.create(model=s.model, instructions=SYSTEM, input=inp2, tools=TOOLS, temperature=0,
                                     max_output_tokens=60, stream=True):
        if e.type == "response.output_text.delta":
            pieces.append(e.delta)
        elif e.type == "response.completed":
            final = e.response
    text = "".join(pieces)
    print(f"  final answer: {text!r}")
    check(final is not None and final.output_text == text and ("18" in text or "sunny" in text.lower()),
          "streamed answer uses the tool result and equals the completed response's text")
    check(final is not None and final.usage.input_tokens_details.cached_tokens > 0,
          f"turn 2 reused turn 1's prompt from the prefix cache ({final and final.usage.input_tokens_details.cached_tokens} cached)")
    # Refusals: a stored response, an image; a limit hit is `incomplete`.
    e = httpx.post(s.base + "/v1/responses", json={"model": s.model, "input": "hi", "previous_response_id": "resp_x"}).json()
    check(e.get("error", {}).get("param") == "previous_response_id", "previous_response_id → 400 naming it")
    r3 = client.responses.create(model=s.model, input="Count from 1 to 50.", max_output_tokens=4, temperature=0)
    check(r3.status == "incomplete" and r3.incomplete_details.reason == "max_output_tokens",
          f"max_output_tokens hit → incomplete ({r3.status})")
