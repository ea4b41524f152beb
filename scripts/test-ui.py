#!/usr/bin/env python3
"""Browser test of the web chat UI that `vela serve` serves at `/` (crates/vela-server/src/ui/).

Usage: scripts/test-ui.py --bin target/release/examples/serve --model qwen2.5-coder-0.5b-instruct-q4_k_m.gguf
       [--threads 2] [--out DIR]

Playwright's Python package (`pip install playwright`; its own browser download is not used)
drives Debian's Chromium (/usr/bin/chromium, installed with apt-get when missing and running as
root). Two servers: one plain, one with `--api-key` and `--ctx 256`. Checks, each with a
screenshot in DIR (default `$VELA_CACHE/ui-test/`; every path is printed):
  a. the page loads and shows the model name from /props;
  b. an answer streams in (its text grows across several repaints) and its stats follow;
  c. Stop mid-answer aborts the request: /metrics counts a cancellation and the engine stops
     far short of max_tokens;
  d. a second conversation, then back to the first, whose messages are there;
  e. after a reload both conversations and the settings are still there;
  f. with --api-key the page asks for the key; a wrong key is refused with a message, the right
     one makes chat work;
  g. a prompt over the context shows the server's context_length_exceeded message;
  h. at phone width (375x740) the input and Send are on screen and the list is behind a toggle.
Also: no script error and no Content-Security-Policy violation in the console. Exit status 1
when a check failed.
"""
import argparse, os, subprocess, sys, time, types
from pathlib import Path

import httpx

import serve_harness
from serve_harness import FAIL, Server, check

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]
KEY = "ui-test-key"
SHOTS = []


def ensure_chromium():
    if os.path.exists(CHROMIUM):
        return
    if os.geteuid() != 0:
        raise SystemExit(f"{CHROMIUM} is missing: install Debian's chromium (apt-get install chromium) "
                         "or run this script as root to have it installed")
    print("installing chromium (apt-get)", flush=True)
    cmd = ["apt-get", "install", "-y", "-qq", "chromium"]
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    if subprocess.run(cmd, env=env).returncode != 0:
        subprocess.run(["apt-get", "update", "-qq"], check=True, env=env)
        subprocess.run(cmd, check=True, env=env)


def import_playwright():
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", "playwright"])
        try:
            from playwright.sync_api import sync_playwright
        except ImportError:
            raise SystemExit("the Python package playwright is missing: python3 -m pip install playwright")
    return sync_playwright


def keyed_server(args, extra):
    """A Server with --api-key: serve_harness reads /v1/models while starting, which now needs the key."""
    plain = serve_harness.httpx
    serve_harness.httpx = types.SimpleNamespace(
        get=lambda url, **kw: plain.get(url, headers={"Authorization": f"Bearer {KEY}"}, **kw))
    try:
        return Server(args, extra=["--api-key", KEY, *extra], tag="vela-test-ui")
    finally:
        serve_harness.httpx = plain


def metric(s, name):
    return s.metric(name) or 0.0


def until(cond, timeout, step=0.05):
    """Poll cond() until it is truthy (its value) or timeout seconds pass (None)."""
    t0 = time.time()
    while time.time() - t0 < timeout:
        v = cond()
        if v:
            return v
        time.sleep(step)
    return None


class UI:
    """One browser page on a server, with its console watched and screenshots numbered."""

    def __init__(self, ctx, base, out, console):
        self.page = ctx.new_page()
        self.base, self.out = base, out
        self.page.on("console", lambda m: console.append(f"{m.type}: {m.text}") if m.type in ("error", "warning") else None)
        self.page.on("pageerror", lambda e: console.append(f"pageerror: {e}"))

    def shot(self, name):
        path = self.out / f"{len(SHOTS) + 1:02d}-{name}.png"
        self.page.screenshot(path=str(path))
        SHOTS.append(path)
        print(f"       screenshot: {path}", flush=True)

    def goto(self):
        self.page.goto(self.base + "/", wait_until="load")

    def text(self, sel):
        loc = self.page.locator(sel)
        return loc.first.text_content() or "" if loc.count() else ""

    def set_field(self, name, value):
        p = self.page
        if p.locator("#settings").is_hidden():
            p.click("#toggle-settings")
        p.fill(f"#set-{name}", str(value))
        p.click("#settings-close")

    def watch_stream(self):
        """Record the last answer's text length and state at every DOM change."""
        self.page.evaluate("""() => {
            window.__obs = [];
            const box = document.getElementById('messages');
            if (window.__mo) window.__mo.disconnect();
            window.__mo = new MutationObserver(() => {
                const arts = box.querySelectorAll('article.assistant');
                const a = arts[arts.length - 1];
                if (a) window.__obs.push({len: a.querySelector('.content').textContent.length,
                                          state: a.dataset.state,
                                          stats: a.querySelector('.stats').textContent.length});
            });
            window.__mo.observe(box, {childList: true, subtree: true, characterData: true});
        }""")

    def send(self, text):
        n = self.page.locator("article.assistant").count()
        self.page.fill("#input", text)
        self.page.press("#input", "Enter")
        return n

    def last_answer(self):
        return self.page.locator("article.assistant").last

    def wait_answer(self, n_before, timeout=120):
        """Wait for answer n_before+1 to end; its state (done, stopped, error) or None."""
        def ended():
            arts = self.page.locator("article.assistant")
            if arts.count() <= n_before:
                return None
            st = arts.nth(n_before).get_attribute("data-state")
            return st if st in ("done", "stopped", "error") else None
        return until(ended, timeout, 0.1)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", default=os.path.join(os.environ.get("VELA_CACHE", str(Path.home() / ".cache" / "vela")), "ui-test"))
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for old in out.glob("*.png"):
        old.unlink()
    ensure_chromium()
    sync_playwright = import_playwright()
    t_start = time.time()
    console = []
    s = Server(args, tag="vela-test-ui")
    k = None
    try:
        print(f"server {s.base} model {s.model}", flush=True)
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
            try:
                ctx = browser.new_context(viewport={"width": 1280, "height": 800})
                ui = UI(ctx, s.base, out, console)
                main_checks(ui, s)
                phone_checks(ctx, s, out, console)
                k = keyed_server(args, ["--ctx", "256"])
                print(f"server {k.base} (--api-key, --ctx 256)", flush=True)
                key_checks(browser, k, out, console)
            finally:
                browser.close()
        bad = [c for c in console if c.startswith("pageerror") or "Content Security Policy" in c
               or ("error" in c and "Failed to load resource" not in c)]
        check(not bad, "no script errors or CSP violations in the console" + (f": {bad[:3]}" if bad else ""))
        for srv in (s, k):
            if srv:
                check(srv.p.poll() is None and "panicked" not in srv.logtext(), f"server {srv.base} alive, no panic")
    finally:
        s.stop()
        if k:
            k.stop()
    print(f"{len(SHOTS)} screenshot(s) in {out}; {time.time() - t_start:.0f} s")
    print(f"{len(FAIL)} failure(s)" + (": " + "; ".join(FAIL) if FAIL else ""))
    sys.exit(1 if FAIL else 0)


def main_checks(ui, s):
    p = ui.page
    print("== a. page load, model from /props")
    r = httpx.get(s.base + "/")
    check(r.status_code == 200 and "text/html" in r.headers.get("content-type", "")
          and "script-src 'self'" in r.headers.get("content-security-policy", ""), "GET / is the page, with a CSP")
    ui.goto()
    name = until(lambda: (t := ui.text("#model-name")) and t == s.model and t, 15)
    check(name == s.model, f"header shows the model from /props: {ui.text('#model-name')!r}")
    check("ctx" in ui.text("#model-ctx"), f"header shows the context: {ui.text('#model-ctx')!r}")
    p.fill("#input", "line one")
    p.press("#input", "Shift+Enter")
    p.keyboard.type("line two")
    check(p.input_value("#input") == "line one\nline two" and p.locator("article").count() == 0,
          "Shift+Enter adds a line, sends nothing")
    p.fill("#input", "")
    ui.shot("a-loaded")
    p.click("#toggle-settings")
    p.fill("#set-max_tokens", "48")
    ui.shot("a-settings")
    p.click("#settings-close")

    print("== b. a streamed answer with stats")
    ui.watch_stream()
    q1 = "What is the capital of France? Answer in one sentence."
    n = ui.send(q1)
    st = ui.wait_answer(n, 120)
    ans = ui.last_answer()
    text = ans.locator(".content").text_content() or ""
    check(st == "done", f"answer finished: state={st} text={text!r}")
    check("paris" in text.lower(), "the answer names Paris")
    obs = p.evaluate("window.__obs")
    grow = sorted({o["len"] for o in obs if o["state"] == "streaming" and 0 < o["len"] < len(text)})
    check(len(grow) >= 2, f"text grew while streaming: lengths {grow[:12]} before the final {len(text)}")
    stats = ans.locator(".stats").text_content() or ""
    check("TTFT" in stats and "tok generated" in stats and "prompt" in stats and "tok/s" in stats,
          f"stats after the end: {stats!r}")
    check(ans.locator(".stats").is_visible() and not any(o["state"] == "streaming" and o["stats"] for o in obs),
          "stats shown once the answer ended, not while streaming")
    ui.shot("b-answer")

    print("== c. Stop mid-answer cancels the request")
    max_tokens = 2000
    ui.set_field("max_tokens", max_tokens)
    c0, s0 = metric(s, "vela_cancelled_requests_total"), metric(s, "vela_engine_steps_total")
    n = ui.send("Write a 2000-word essay about the sea.")
    grew = until(lambda: len(ui.last_answer().locator(".content").text_content() or "") >= 150, 60)
    check(bool(grew), "the essay started streaming")
    p.click("#stop")
    st = ui.wait_answer(n, 15)
    check(st == "stopped", f"the answer is marked stopped: state={st}")
    counted = until(lambda: metric(s, "vela_cancelled_requests_total") > c0, 10)
    check(bool(counted), f"/metrics counted the cancellation (vela_cancelled_requests_total {c0} -> {metric(s, 'vela_cancelled_requests_total')})")
    s1 = metric(s, "vela_engine_steps_total")
    time.sleep(1.0)
    s2 = metric(s, "vela_engine_steps_total")
    check(s2 == s1, f"the engine stopped (steps {s1} -> {s2} a second later)")
    check(s1 - s0 < max_tokens / 4, f"generation ended far short of max_tokens: {s1 - s0:.0f} engine steps of {max_tokens}")
    check(p.locator("#send").is_enabled() and p.locator("#stop").is_hidden(), "Send is back, Stop hidden")
    stats = ui.last_answer().locator(".stats").text_content() or ""
    check("stopped" in stats, f"stats say stopped: {stats!r}")
    ui.shot("c-stopped")
    ui.set_field("max_tokens", 48)

    print("== d. a second conversation, then back to the first")
    p.click("#new-chat")
    check(p.locator("#conv-list li").count() == 2, f"two conversations listed: {p.locator('#conv-list li').count()}")
    check(p.locator("article").count() == 0, "the new conversation is empty")
    q2 = "Write a Python function that adds two numbers."
    n = ui.send(q2)
    st = ui.wait_answer(n, 120)
    check(st == "done", f"second conversation answered: {st}")
    code = ui.last_answer().locator(".code")
    check(code.count() >= 1 and code.first.locator(".tk-k").count() >= 1 and code.first.locator("button.copy").count() == 1,
          f"its code block is highlighted, with a language label and a Copy button: "
          f"{(code.first.locator('.lang').text_content() if code.count() else None)!r}")
    titles = p.locator("#conv-list .conv-open").all_text_contents()
    check(titles and titles[0] == q2 and any(t.startswith("What is the capital") for t in titles),
          f"titles from the first messages: {titles}")
    p.locator("#conv-list .conv-open", has_text="What is the capital").click()
    users = p.locator("article.user .text").all_text_contents()
    check(users[:1] == [q1] and q2 not in users, f"switched back: the first conversation's messages {[u[:30] for u in users]}")
    check(p.locator("article.assistant").count() == 2, "its two answers are there")
    ui.shot("d-switched-back")

    print("== e. reload keeps the history and settings")
    p.reload(wait_until="load")
    until(lambda: p.locator("#conv-list li").count() >= 2, 10)
    titles = p.locator("#conv-list .conv-open").all_text_contents()
    check(len(titles) == 2, f"both conversations after reload: {titles}")
    users = p.locator("article.user .text").all_text_contents()
    check(users[:1] == [q1], "the current conversation's messages are back")
    check("paris" in (p.locator("article.assistant .content").first.text_content() or "").lower(), "its answer too")
    check(p.input_value("#set-max_tokens") == "48", "settings kept (max_tokens 48)")
    p.locator("#conv-list .conv-open", has_text=q2).click()
    check(p.locator("article.user .text").all_text_contents() == [q2], "the second conversation too")
    ui.shot("e-reloaded")
    canned_checks(ui)


# A stream as the server sends it (keepalive comments, CRLF and LF line ends), with reasoning, a
# tool call in pieces, Markdown with raw HTML in it, timings on the finishing chunk and usage.
CANNED = "\r\n".join([": keepalive", "",
    'data: {"choices":[{"index":0,"delta":{"role":"assistant","content":""},"finish_reason":null}]}', "",
    'data: {"choices":[{"index":0,"delta":{"reasoning_content":"The user wants "}}]}', "",
    ": keepalive", "",
    'data: {"choices":[{"index":0,"delta":{"reasoning_content":"the weather."}}]}', ""]) + "\n\n".join([
    "",
    'data: {"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"call_1","type":"function","function":{"name":"get_weather","arguments":""}}]}}]}',
    'data: {"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":"{\\"city\\": \\"Pa"}}]}}]}',
    'data: {"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":"ris\\", \\"days\\": 2}"}}]}}]}',
    'data: {"choices":[{"index":0,"delta":{"content":"Checking **Paris** <b>now</b> <img src=x onerror=alert(1)>:\\n\\n```js\\nconst x = 1;\\n```"}}]}',
    'data: {"choices":[{"index":0,"delta":{},"finish_reason":"tool_calls"}],"timings":{"cache_n":8,"prompt_n":4,"prompt_ms":20.5,"prompt_per_second":195.1,"predicted_n":9,"predicted_ms":300,"predicted_per_second":30.0}}',
    'data: {"choices":[],"usage":{"prompt_tokens":12,"completion_tokens":9,"total_tokens":21,"prompt_tokens_details":{"cached_tokens":8}}}',
    "data: [DONE]", ""])


def canned_checks(ui):
    print("== reasoning, tool calls, Markdown safety, stats (a canned stream), rename, delete")
    p = ui.page
    seen = {}

    def fake(route):
        seen["body"] = route.request.post_data_json
        seen["auth"] = route.request.headers.get("authorization")
        route.fulfill(status=200, headers={"Content-Type": "text/event-stream"}, body=CANNED)
    p.route("**/v1/chat/completions", fake)
    p.click("#new-chat")
    n = ui.send("What's the weather in Paris?")
    st = ui.wait_answer(n, 10)
    p.unroute("**/v1/chat/completions")
    b = seen.get("body") or {}
    check(b.get("stream") is True and b.get("stream_options") == {"include_usage": True} and b.get("max_tokens") == 48
          and not {"temperature", "top_p", "top_k", "min_p", "seed"} & set(b) and seen.get("auth") is None,
          f"the request: stream with usage, max_tokens set, unset fields left out, no key: {sorted(b)}")
    a = ui.last_answer()
    check(st == "done", f"canned answer ended: {st}")
    det = a.locator("details.reasoning")
    check(det.is_visible() and det.locator("summary").text_content() == "Reasoning"
          and "The user wants the weather." in (det.text_content() or ""), "reasoning shown apart, collapsible")
    tool = a.locator(".tool")
    args = tool.locator("pre").text_content() if tool.count() else ""
    check(tool.count() == 1 and tool.locator(".tool-head code").text_content() == "get_weather"
          and '"city": "Paris",\n  "days": 2' in (args or ""), f"tool call with pretty JSON arguments: {args!r}")
    content = a.locator(".content")
    check(content.locator("strong").text_content() == "Paris" and content.locator("b, img").count() == 0
          and "<b>now</b>" in (content.text_content() or ""), "Markdown rendered, raw HTML shown as text")
    check(content.locator(".code .tk-k").first.text_content() == "const", "code highlighted")
    stats = a.locator(".stats").text_content() or ""
    check(all(x in stats for x in ("prompt 12 tok (8 cached)", "9 tok generated", "prefill 21 ms", "decode 30.0 tok/s",
                                   "finish: tool_calls")), f"stats from usage and timings: {stats!r}")
    ui.shot("i-canned-stream")
    li = p.locator("#conv-list li.current")
    li.locator(".conv-rename").click()
    p.fill(".conv-title-input", "Canned stream")
    p.press(".conv-title-input", "Enter")
    check(p.locator("#conv-list li.current .conv-open").text_content() == "Canned stream", "renamed")
    n_before = p.locator("#conv-list li").count()
    p.locator("#conv-list li.current .conv-delete").click()
    check(p.locator("#conv-list li").count() == n_before, "the first delete click only asks")
    p.locator("#conv-list li.current .conv-delete").click()
    check(p.locator("#conv-list li").count() == n_before - 1
          and "Canned stream" not in p.locator("#conv-list").text_content(), "the second deletes it")


def phone_checks(ctx, s, out, console):
    print("== h. phone width (375x740)")
    ui = UI(ctx, s.base, out, console)
    p = ui.page
    p.set_viewport_size({"width": 375, "height": 740})
    ui.goto()
    until(lambda: ui.text("#model-name") == s.model, 10)

    def on_screen(sel):
        b = p.locator(sel).bounding_box()
        return bool(b) and p.locator(sel).is_visible() and b["x"] >= 0 and b["y"] >= 0 \
            and b["x"] + b["width"] <= 375 and b["y"] + b["height"] <= 740
    check(on_screen("#input") and on_screen("#send"), "input and Send on screen")
    check(p.locator("#conv-list").is_hidden() and p.locator("#toggle-sidebar").is_visible(),
          "the conversation list is hidden behind the ☰ toggle")
    check(p.evaluate("document.documentElement.scrollWidth") <= 375, "no horizontal scrolling")
    ui.shot("h-phone")
    p.click("#toggle-sidebar")
    until(lambda: p.locator("#conv-list").is_visible(), 3)
    check(p.locator("#conv-list .conv-open").first.is_visible() and p.get_attribute("#toggle-sidebar", "aria-expanded") == "true",
          "the toggle opens the list")
    time.sleep(0.3)
    ui.shot("h-phone-list")
    p.locator("#conv-list .conv-open").last.click()
    until(lambda: p.locator("#conv-list").is_hidden(), 3)
    check(p.locator("#conv-list").is_hidden(), "picking a conversation closes the list")
    p.close()


def key_checks(browser, k, out, console):
    print("== f. --api-key: the page asks for the key")
    check(httpx.get(k.base + "/").status_code == 200 and httpx.get(k.base + "/ui/app.js").status_code == 200,
          "the page's files load without the key")
    check(httpx.get(k.base + "/v1/models").status_code == 401, "/v1/models still needs it")
    ctx = browser.new_context(viewport={"width": 1280, "height": 800})
    ui = UI(ctx, k.base, out, console)
    p = ui.page
    ui.goto()
    asked = until(lambda: p.locator("#auth").is_visible(), 10)
    check(bool(asked), "the key form is shown")
    ui.shot("f-key-asked")
    p.fill("#key-input", "wrong-key")
    p.click("#key-save")
    msg = until(lambda: (t := ui.text("#auth-msg")) and "Checking" not in t and t, 10) or ""
    check("rejected" in msg and "invalid or missing API key" in msg, f"a wrong key is refused: {msg!r}")
    check(p.locator("#auth").is_visible(), "the form stays")
    ui.shot("f-key-wrong")
    p.fill("#key-input", KEY)
    p.press("#key-input", "Enter")
    ok = until(lambda: p.locator("#auth").is_hidden() and ui.text("#model-name") == k.model, 10)
    check(bool(ok), f"the right key is accepted; model {ui.text('#model-name')!r}")
    ui.set_field("max_tokens", 24)
    n = ui.send("Say hello in five words.")
    st = ui.wait_answer(n, 120)
    text = ui.last_answer().locator(".content").text_content() or ""
    check(st == "done" and text.strip(), f"chat works with the key: {text!r}")
    ui.shot("f-key-chat")

    print("== g. a prompt over the context shows the server's message")
    words = ("The sea is wide and deep and full of life that moves with the tides. " * 150).strip()
    n = ui.send(f"Summarize this: {words}")
    st = ui.wait_answer(n, 60)
    err = ui.last_answer().locator(".error").text_content() or ""
    check(st == "error" and "maximum context length is 256 tokens" in err and "HTTP 400" in err,
          f"context error shown: {err[:160]!r}")
    check(ui.last_answer().locator(".error").is_visible(), "the error is visible")
    ui.shot("g-context-error")
    ctx.close()


if __name__ == "__main__":
    main()
