"""ds4-server's HTTP surface without the SDK (docs/SERVER.md): errors, limits, API key, CORS,
disconnects, bind failure, exit codes, and a few hundred malformed bodies."""
import json
import os
import random
import re
import socket
import subprocess
import time
import urllib.request

import pytest

from ds4_server_harness import MODEL, MODEL_ID, post, start_server

CHAT = "/v1/chat/completions"
GOOD = {"model": MODEL_ID, "messages": [{"role": "user", "content": "Renzo"}], "max_tokens": 2, "temperature": 0}


def is_error(status, body, want=None):
    return ((status == want) if want else 400 <= status < 500) and isinstance(body, dict) \
        and isinstance(body.get("error"), dict) and isinstance(body["error"].get("message"), str) \
        and "type" in body["error"] and "code" in body["error"]


def get(server, path, headers=None):
    req = urllib.request.Request(server.url + path, headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, json.loads(r.read() or b"null"), dict(r.headers)
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"null"), dict(e.headers)


def test_health_and_unknown_routes(server):
    assert get(server, "/health")[:2] == (200, {"status": "ok", "model": MODEL_ID,
                                                "slots": {"total": 1, "busy": 0, "free": 1},
                                                "queue": {"waiting": 0, "max": 16}})
    s, body, _ = get(server, "/v1/nothing")
    assert is_error(s, body, 404)
    s, body, _ = get(server, "/v1/models/unknown")
    assert is_error(s, body, 404) and body["error"]["code"] == "model_not_found"
    s, body, _ = post(server, "/v1/nope", GOOD)
    assert is_error(s, body, 404)


@pytest.mark.parametrize("body", [
    b"", b"not json", b"[1,2]", b'"str"', b"{", b'{"messages": [', b"null",
    b'{"messages": "hi"}', b'{"messages": [1]}', b'{"messages": [{"role": "robot", "content": "x"}]}',
    b'{"messages": [{"role": "user", "content": 5}]}', b'{"messages": [{"role": 3}]}',
    b'{"messages": [{"role": "user", "content": [{"type": "text"}]}]}',
    b'{"messages": [{"role": "user", "content": "x"}], "max_tokens": 1.5}',
    b'{"messages": [{"role": "user", "content": "x"}], "max_tokens": "3"}',
    b'{"messages": [{"role": "user", "content": "x"}], "temperature": 1e400}',
    b'{"messages": [{"role": "user", "content": "x"}], "top_p": 7}',
    b'{"messages": [{"role": "user", "content": "x"}], "stream": "yes"}',
    b'{"messages": [{"role": "user", "content": "x"}], "stop": [1]}',
    b'{"messages": [{"role": "user", "content": "x"}], "seed": "s"}',
    b'{"messages": [{"role": "user", "content": "x"}], "reasoning_effort": "extreme"}',
    b'{"messages": [{"role": "user", "content": "x"}], "thinking": "on"}',
    b'{"messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function"}]}',
    b'{"messages": [{"role": "user", "content": "x"}], "x": ' + b"[" * 300 + b"]" * 300 + b"}",
    b"[" * 100000,
    b'{"messages": [{"role": "user", "content": "\xff\xfe"}]}',
])
def test_malformed_chat_bodies(server, body):
    s, parsed, raw = post(server, CHAT, body, raw=True)
    assert is_error(s, parsed, 400), (s, raw[:200])


def test_completion_field_errors(server):
    for body in [{}, {"prompt": 3}, {"prompt": ["a", "b"]}, {"prompt": "x", "max_tokens": -1.5},
                 {"prompt": "x", "min_p": -0.1}]:
        s, parsed, raw = post(server, "/v1/completions", body)
        assert is_error(s, parsed, 400), (body, s, raw)
    s, parsed, _ = post(server, "/v1/completions", {"prompt": "x", "max_tokens": 0})
    assert s == 200 and parsed["choices"][0]["finish_reason"] == "length"
    assert parsed["usage"]["completion_tokens"] == 0


def test_body_above_the_limit_is_413(server):
    s, parsed, _ = post(server, CHAT, b"{" + b" " * (17 << 20) + b"}", raw=True)
    assert is_error(s, parsed, 413)


def test_options_and_no_cors_by_default(server):
    req = urllib.request.Request(server.url + CHAT, method="OPTIONS")
    with urllib.request.urlopen(req, timeout=10) as r:
        assert r.status == 204
        assert "Access-Control-Allow-Origin" not in r.headers


def fuzz_bodies(rng, n):
    good = json.dumps(GOOD).encode()
    fields = {"messages": [None, 1, "x", [None], [{"role": 1}], [{"content": {}}], {}],
              "max_tokens": ["1", 1.25, [], {}, True, -2.5],
              "temperature": ["0", [], 1e300, -1e-300 - 1, 101],
              "top_p": [2, "1", -3], "min_p": [1.5, "0"], "top_k": [1.5, "k", []],
              "seed": [0.5, "7", []], "stop": [3, [None], {"a": 1}, ["x" * 2000]],
              "stream": [1, "true", []], "stream_options": [3, "x", {"include_usage": 1}],
              "thinking": [1, "x", {"type": "maybe"}], "reasoning_effort": [3, "huge"], "model": [1, []]}
    out = []
    for i in range(n):
        kind = i % 5
        if kind == 0:  # random bytes
            out.append(bytes(rng.randrange(256) for _ in range(rng.randrange(1, 200))))
        elif kind == 1:  # truncated valid JSON
            out.append(good[:rng.randrange(1, len(good) - 1)])
        elif kind == 2:  # one field of a wrong type or out of range
            body = dict(GOOD)
            key = rng.choice(sorted(fields))
            body[key] = rng.choice(fields[key])
            out.append(json.dumps(body).encode())
        elif kind == 3:  # deep nesting
            d = rng.randrange(257, 5000)
            out.append(b'{"messages": ' + b"[" * d + b"]" * d + b"}")
        else:  # a valid body with bytes flipped inside its structure
            b = bytearray(good)
            for _ in range(rng.randrange(1, 4)):
                b[rng.randrange(len(b))] = rng.choice(b'{}[]:,"\\\x00\xff')
            out.append(bytes(b))
    return out


def test_fuzz_malformed_bodies(server):
    rng = random.Random(20261201)
    answered = 0
    for body in fuzz_bodies(rng, 400):
        s, parsed, raw = post(server, CHAT, body, raw=True)
        if s == 200:  # a flipped byte may leave a valid request (e.g. inside a string)
            assert parsed["object"] == "chat.completion", raw[:200]
            continue
        assert is_error(s, parsed), (body[:120], s, raw[:200])
        answered += 1
    assert answered > 350
    assert get(server, "/health")[0] == 200
    s, parsed, _ = post(server, CHAT, GOOD)
    assert s == 200 and parsed["choices"][0]["message"]["role"] == "assistant"
    assert "internal error" not in server.log()


def test_disconnect_stops_the_generation(server):
    body = json.dumps({**GOOD, "max_tokens": 3000, "stream": True}).encode()
    sock = socket.create_connection(("127.0.0.1", server.port), timeout=30)
    sock.sendall(b"POST " + CHAT.encode() + b" HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 + b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
    got = b""
    while got.count(b"data: ") < 3:
        chunk = sock.recv(4096)
        assert chunk, got
        got += chunk
    sock.close()
    deadline = time.time() + 30
    while "client disconnected" not in server.log() and time.time() < deadline:
        time.sleep(0.05)
    line = [ln for ln in server.log().splitlines() if "client disconnected" in ln]
    assert line, server.log()
    n = int(line[-1].split("completion ")[1].split(" ")[0])
    assert n < 3000
    s, parsed, _ = post(server, CHAT, GOOD)  # the slot is free again
    assert s == 200


@pytest.fixture(scope="module")
def keyed_server(tool, tmp_path_factory):
    s = start_server(tool, tmp_path_factory.mktemp("keyed") / "server.log", "--api-key", "sekrit", "--cors")
    yield s
    s.stop()


def test_api_key(keyed_server):
    import openai  # noqa: F401  (the conftest fixture explains a missing package)
    s, body, headers = get(keyed_server, "/v1/models")
    assert is_error(s, body, 401)
    assert headers.get("Access-Control-Allow-Origin") == "*"
    s, body, _ = post(keyed_server, CHAT, GOOD, headers={"Authorization": "Bearer wrong"})
    assert is_error(s, body, 401)
    assert get(keyed_server, "/health")[0] == 200
    s, body, _ = get(keyed_server, "/v1/models", headers={"Authorization": "Bearer sekrit"})
    assert s == 200 and body["data"][0]["id"] == MODEL_ID


def test_api_key_with_the_sdk(keyed_server, openai_mod):
    bad = openai_mod.OpenAI(base_url=keyed_server.url + "/v1", api_key="wrong", max_retries=0)
    with pytest.raises(openai_mod.AuthenticationError):
        bad.models.list()
    bad.close()
    ok = openai_mod.OpenAI(base_url=keyed_server.url + "/v1", api_key="sekrit", max_retries=0)
    r = ok.chat.completions.create(model=MODEL_ID, messages=[{"role": "user", "content": "Lucia"}], max_tokens=2)
    assert r.usage.completion_tokens >= 1
    ok.close()


def test_bind_failure_exits_1(tool, server):
    p = subprocess.run([tool("ds4-server"), "-m", MODEL, "--port", str(server.port), "--ctx", "256", "-t", "1"],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 1, p.stderr
    last = p.stderr.strip().splitlines()[-1]
    assert last.startswith("ds4-server: cannot listen on 127.0.0.1:") and str(server.port) in last


def test_exit_codes(tool, tmp_path):
    exe = tool("ds4-server")
    p = subprocess.run([exe, "--help"], capture_output=True, text=True)
    assert p.returncode == 0 and "--api-key" in p.stdout and "Exit status" in p.stdout
    footer = p.stdout.rstrip("\n").splitlines()[-1]
    assert footer.startswith("Exit status: 0 ok, 1 runtime failure") and "130 interrupted" in footer
    p = subprocess.run([exe, "--version"], capture_output=True, text=True)
    assert p.returncode == 0 and re.fullmatch(r"ds4cpp [\d.]+\n", p.stdout)
    with open("/dev/full", "w") as full:
        p = subprocess.run([exe, "--version"], stdout=full, stderr=subprocess.PIPE, text=True, timeout=60)
    assert p.returncode == 1 and p.stderr.startswith("ds4-server: cannot write standard output")
    p = subprocess.run([exe, "--no-such-flag"], capture_output=True, text=True)
    assert p.returncode == 2 and p.stderr.endswith("(see --help)\n") and p.stderr.count("\n") == 1
    for args in (["--bogus"], ["--port", "70000"], ["--backend", "tpu"], ["-m", str(tmp_path / "none.gguf")],
                 ["-m", str(tmp_path)]):
        p = subprocess.run([exe, *args], capture_output=True, text=True, timeout=60)
        assert p.returncode == 2, (args, p.stderr)
        assert len(p.stderr.strip().splitlines()) == 1 and p.stderr.startswith("ds4-server: "), p.stderr


def test_sigint_exits_130(tool, tmp_path):
    s = start_server(tool, tmp_path / "server.log")
    s.proc.send_signal(2)
    assert s.proc.wait(timeout=20) == 130


def test_concurrent_requests_are_served_one_at_a_time(server):
    """Requests in parallel wait for the one slot; each gets the answer it gets alone."""
    import concurrent.futures
    bodies = [{**GOOD, "messages": [{"role": "user", "content": w}], "max_tokens": 8}
              for w in ["Renzo", "Lucia", "Agnese", "don Abbondio", "Renzo", "Lucia"]]
    alone = [post(server, CHAT, b)[1]["choices"][0]["message"]["content"] for b in bodies]
    with concurrent.futures.ThreadPoolExecutor(6) as ex:
        results = list(ex.map(lambda b: post(server, CHAT, b), bodies))
    assert [s for s, _, _ in results] == [200] * 6
    assert [p["choices"][0]["message"]["content"] for _, p, _ in results] == alone
