"""The persistent prefix cache on a full disk (test-server.py, kind smol): `vela serve
--cache-dir` on a 256 KiB tmpfs (a private mount namespace, `unshare -m`), so every sequence the
cache spills there fails with ENOSPC. Each failure is an error line in the log and a count in
`/metrics`; serving goes on, and the shutdown still ends cleanly."""
import os, re, subprocess, tempfile, time

import httpx

from serve_harness import check, free_port


def test_full_disk(args):
    print("== prefix cache on a full disk (--cache-dir on a 256 KiB tmpfs)")
    d = tempfile.mkdtemp(prefix="vela-full-disk-")
    probe = subprocess.run(["unshare", "-m", "sh", "-c", f"mount -t tmpfs -o size=256k none {d}"],
                           capture_output=True, text=True)
    if probe.returncode != 0:
        print(f"  SKIP: no private tmpfs here ({probe.stderr.strip()})")
        return
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    log = open(f"/tmp/vela-full-disk-{port}.log", "w+")
    serve = (f"mount -t tmpfs -o size=256k none {d} && exec {args.bin} --model {args.model} --port {port} "
             f"--threads {args.threads} --cache-dir {d} --cache-mb 1 --parallel 1 --ctx 1024")
    p = subprocess.Popen(["unshare", "-m", "sh", "-c", serve], stdout=log, stderr=subprocess.STDOUT)
    try:
        for _ in range(600):
            try:
                if httpx.get(base + "/health", timeout=1).status_code == 200:
                    break
            except Exception:
                pass
            time.sleep(0.1)

        def errors():
            m = re.search(r"^vela_prefix_cache_disk_errors_total (\S+)$", httpx.get(base + "/metrics").text, re.M)
            return float(m.group(1)) if m else None

        ok = []
        # Distinct conversations of ~40 tokens (~0.9 MiB of KV each): a 1 MiB memory cache
        # evicts, and every eviction spills to the full disk.
        for i in range(4):
            msgs = [{"role": "user", "content": f"Conversation {i}: " + "tell me about the sea. " * 6}]
            r = httpx.post(base + "/v1/chat/completions", timeout=120,
                           json={"messages": msgs, "max_tokens": 4, "temperature": 0})
            ok.append(r.status_code == 200 and bool(r.json()["choices"][0]["message"]["content"]))
        t0 = time.time()
        while (errors() or 0) < 1 and time.time() - t0 < 30:
            time.sleep(0.2)
        n = errors()
        check(all(ok), f"every request answered while the disk was full ({ok})")
        check(n is not None and n >= 1, f"vela_prefix_cache_disk_errors_total counted the failed writes ({n})")
        r = httpx.post(base + "/v1/chat/completions", timeout=120,
                       json={"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2})
        check(r.status_code == 200, "still serving after the errors")
        p.terminate()
        code = p.wait(60)
        log.flush(); log.seek(0); text = log.read()
        lines = [l for l in text.splitlines() if "prefix cache:" in l and "ERROR" in l]
        print(f"  log: {lines[0].strip()[:160] if lines else '(none)'}")
        check(any("No space left on device" in l for l in lines), "an ERROR line names the full disk")
        check(code == 0 and "server stopped" in text and "panicked" not in text,
              f"shutdown (saves fail too) still exits 0 ({code})")
    finally:
        if p.poll() is None:
            p.kill()
        os.rmdir(d)
