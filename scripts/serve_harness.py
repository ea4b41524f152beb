"""What the server end-to-end scripts share (test-server.py, test-structured.py): the check
list and a `vela serve` process on a free port with its log."""
import re, socket, subprocess, time

import httpx

FAIL = []


def check(cond, what):
    print(("  ok   " if cond else "  FAIL ") + what, flush=True)
    if not cond:
        FAIL.append(what)


def free_port():
    s = socket.socket(); s.bind(("127.0.0.1", 0)); p = s.getsockname()[1]; s.close(); return p


class Server:
    """`args.bin --model args.model --threads args.threads *extra` on a free port, its output in
    /tmp/<tag>-<port>.log; ready when /health answers (else SystemExit naming the log)."""

    def __init__(self, args, extra=(), tag="vela-test-server"):
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.log = open(f"/tmp/{tag}-{self.port}.log", "w+")
        cmd = [args.bin, "--model", args.model, "--port", str(self.port), "--threads", str(args.threads), *extra]
        self.p = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT)
        for _ in range(600):
            try:
                if httpx.get(self.base + "/health", timeout=1).status_code == 200:
                    break
            except Exception:
                pass
            time.sleep(0.1)
        else:
            self.stop()
            raise SystemExit("server did not start; see " + self.log.name)
        self.model = httpx.get(self.base + "/v1/models").json()["data"][0]["id"]

    def rss_kb(self):
        for line in open(f"/proc/{self.p.pid}/status"):
            if line.startswith("VmRSS"):
                return int(line.split()[1])

    def metric(self, name):
        t = httpx.get(self.base + "/metrics").text
        m = re.search(rf"^{name} (\S+)$", t, re.M)
        return float(m.group(1)) if m else None

    def logtext(self):
        self.log.flush(); self.log.seek(0); return self.log.read()

    def stop(self):
        if self.p.poll() is None:
            self.p.terminate(); self.p.wait(30)
