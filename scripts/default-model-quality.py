#!/usr/bin/env python3
"""Answer quality of the models vela can fetch (the default model's choice, README "Models"):
30 short questions with known answers (facts, arithmetic, language, code), asked through
`vela serve`'s chat API, greedy, each answer judged by whether it contains an accepted answer.
Prints a table: model, download size, correct answers, mean decode speed.

Usage: scripts/default-model-quality.py [--bin target/release/examples/serve] [--models DIR] [-v]
"""
import argparse, os, re, sys, time

import httpx

sys.path.insert(0, os.path.dirname(__file__))
from serve_harness import Server  # noqa: E402

QUESTIONS = [
    ("What is the capital of France?", ["paris"]),
    ("What is the capital of Japan?", ["tokyo"]),
    ("What is the capital of Italy?", ["rome"]),
    ("What is the capital of Germany?", ["berlin"]),
    ("What is the largest planet in our solar system?", ["jupiter"]),
    ("Which planet is known as the Red Planet?", ["mars"]),
    ("How many days are there in a week?", ["7", "seven"]),
    ("What is 12 + 7?", ["19"]),
    ("What is 9 times 8?", ["72"]),
    ("What is the square root of 81?", ["9", "nine"]),
    ("What is the chemical symbol for gold?", ["au"]),
    ("Who wrote Romeo and Juliet?", ["shakespeare"]),
    ("At what temperature in degrees Celsius does water boil at sea level?", ["100"]),
    ("At what temperature in degrees Fahrenheit does water freeze?", ["32"]),
    ("What color do you get when you mix blue and yellow?", ["green"]),
    ("What is the opposite of hot?", ["cold"]),
    ("How many legs does a spider have?", ["8", "eight"]),
    ("What language is mainly spoken in Brazil?", ["portuguese"]),
    ("Which Python built-in function returns the length of a list?", ["len"]),
    ("Which is the largest ocean on Earth?", ["pacific"]),
    ("How many continents are there?", ["7", "seven"]),
    ("Which element has atomic number 1?", ["hydrogen"]),
    ("Which animal is called the king of the jungle?", ["lion"]),
    ("What is the plural of mouse?", ["mice"]),
    ("How do you say thank you in Spanish?", ["gracias"]),
    ("In which year did World War II end?", ["1945"]),
    ("Which gas do plants absorb from the air for photosynthesis?", ["carbon dioxide", "co2", "co₂"]),
    ("How many minutes are there in an hour?", ["60", "sixty"]),
    ("Which SQL keyword filters the rows of a query?", ["where"]),
    ("What does HTML stand for?", ["hypertext markup language", "hyper text markup language"]),
]
MODELS = [("smollm2-135m-instruct", "SmolLM2-135M-Instruct.Q4_1.gguf"),
          ("gemma3-270m", "gemma-3-270m-q4_k_m.gguf"),
          ("qwen2.5-coder-0.5b-instruct", "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf")]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default="target/release/examples/serve")
    ap.add_argument("--models", default=os.path.join(os.environ.get("VELA_CACHE", os.path.expanduser("~/.cache/vela")), "models"))
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("-v", action="store_true", help="print every answer")
    args = ap.parse_args()
    rows = []
    for name, file in MODELS:
        path = os.path.join(args.models, file)
        if not os.path.exists(path):
            rows.append((name, None, "missing", "")); continue
        args.model = path
        s = Server(args, tag="vela-quality")
        try:
            props = httpx.get(s.base + "/props").json()
            if not props.get("chat_template"):
                rows.append((name, os.path.getsize(path), "no chat template (a base model)", "")); continue
            ok, rates = 0, []
            for q, accept in QUESTIONS:
                r = httpx.post(s.base + "/v1/chat/completions", timeout=600, json={
                    "messages": [{"role": "user", "content": q}], "temperature": 0, "max_tokens": 48}).json()
                a = r["choices"][0]["message"]["content"] or ""
                words = re.findall(r"[a-z0-9₂]+", a.lower())
                good = any((x in a.lower()) if " " in x else (x in words) for x in accept)
                ok += good
                rates.append(r["timings"]["predicted_per_second"])
                if args.v:
                    print(f"  {name}: {'ok ' if good else 'BAD'} {q!r} -> {a.strip()[:100]!r}", flush=True)
            rows.append((name, os.path.getsize(path), f"{ok}/{len(QUESTIONS)}", f"{sum(rates) / len(rates):.0f}"))
        finally:
            s.stop()
    print("| model | download | correct | decode t/s |\n|---|---:|---:|---:|")
    for name, size, score, rate in rows:
        mb = f"{size / 1e6:.0f} MB" if size else "-"
        print(f"| {name} | {mb} | {score} | {rate} |")


if __name__ == "__main__":
    main()
