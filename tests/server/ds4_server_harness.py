"""What the ds4-server tests share: starting a server on a free port over the README's model
(models/promessi-mini-q8_0.gguf: the real tokenizer, tiny weights), raw HTTP posts, and the
prompt texts as docs/SERVER.md renders them (rendered_chat)."""
import json
import os
import re
import subprocess
import time
import urllib.error
import urllib.request

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MODEL = os.path.join(REPO, "models", "promessi-mini-q8_0.gguf")
MODEL_ID = "promessi-mini-q8_0"
CTX = 4096

BOS, EOS = "<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>"
USER, ASSISTANT = "<｜User｜>", "<｜Assistant｜>"


class Server:
    def __init__(self, proc, port, log_path):
        self.proc, self.port, self.log_path = proc, port, log_path
        self.url = f"http://127.0.0.1:{port}"

    def log(self):
        with open(self.log_path, encoding="utf-8", errors="replace") as f:
            return f.read()

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def start_server(tool, log_path, *args):
    """Starts ds4-server on a free port (--port 0), waits for its 'listening on' line and /health."""
    log = open(log_path, "w")
    proc = subprocess.Popen([tool("ds4-server"), "-m", MODEL, "--port", "0", "--ctx", str(CTX), "-t", "2", "-n", "16", *args],
                            stdout=subprocess.DEVNULL, stderr=log)
    log.close()
    deadline = time.time() + 60
    port = None
    while time.time() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"ds4-server exited with {proc.returncode}:\n{open(log_path).read()}")
        m = re.search(r"listening on http://127\.0\.0\.1:(\d+)", open(log_path).read())
        if m:
            port = int(m.group(1))
            break
        time.sleep(0.05)
    if port is None:
        proc.kill()
        pytest.fail(f"ds4-server did not start:\n{open(log_path).read()}")
    server = Server(proc, port, log_path)
    while time.time() < deadline:
        try:
            with urllib.request.urlopen(server.url + "/health", timeout=5) as r:
                if r.status == 200:
                    return server
        except OSError:
            time.sleep(0.05)
    server.stop()
    pytest.fail("ds4-server did not answer /health")


def post(server, path, body, headers=None, raw=False):
    """POSTs bytes or a JSON value; returns (status, parsed JSON body or None, raw bytes)."""
    data = body if raw else json.dumps(body).encode()
    req = urllib.request.Request(server.url + path, data=data, method="POST",
                                 headers={"Content-Type": "application/json", **(headers or {})})
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            status, payload = r.status, r.read()
    except urllib.error.HTTPError as e:
        status, payload = e.code, e.read()
    try:
        parsed = json.loads(payload)
    except ValueError:
        parsed = None
    return status, parsed, payload


def rendered_chat(system, turns):
    """docs/SERVER.md, Prompt rendering: BOS, system, then USER text / ASSISTANT </think> text EOS,
    ending ASSISTANT </think> (non-thinking)."""
    out = BOS + system
    for role, text in turns:
        out += (USER + text) if role == "user" else (ASSISTANT + "</think>" + text + EOS)
    return out + ASSISTANT + "</think>"


def openai_chat(server, messages, **kw):
    """The oracle of the other chat-like APIs: the same conversation through /v1/chat/completions
    (temperature 0 and max_tokens 24 unless given); returns (choice, usage)."""
    body = {"model": MODEL_ID, "messages": messages, "temperature": 0, "max_tokens": 24, **kw}
    s, parsed, raw = post(server, "/v1/chat/completions", body)
    assert s == 200, raw
    return parsed["choices"][0], parsed["usage"]


def sse_events(raw):
    """(name, data) per event of a stream of named events (Anthropic, Responses): each is one
    `event:` and one `data:` line, data.type being the name."""
    out = []
    for block in raw.decode().split("\n\n"):
        if not block.strip():
            continue
        lines = block.split("\n")
        assert len(lines) == 2 and lines[0].startswith("event: ") and lines[1].startswith("data: "), block
        name, data = lines[0][len("event: "):], json.loads(lines[1][len("data: "):])
        assert data["type"] == name, block
        out.append((name, data))
    return out
