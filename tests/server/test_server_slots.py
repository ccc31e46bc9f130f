"""ds4-server with several session slots (docs/SERVER.md, Sessions and KV reuse; Queue; Keep-alive):
each slot keeps its own prefix, a request takes the slot with the longest reusable prefix, greedy
answers of concurrent requests equal the same requests one at a time, a full queue answers 503
with Retry-After, a queued client that disconnects leaves the queue, a non-streamed request whose
client disconnects is cancelled, and streams get `: keep-alive` comments while nothing else is
written (a long prefill, a wait in the queue)."""
import http.client
import json
import re
import socket
import threading
import time
import urllib.request

import pytest

from ds4_server_harness import MODEL_ID, post, rendered_chat, start_server

CHAT, COMPLETIONS, MESSAGES = "/v1/chat/completions", "/v1/completions", "/v1/messages"
KEEPALIVE = 0.05  # the prefill below takes 0.38 s on an idle 2-core Zen 4: > 4 intervals


@pytest.fixture(scope="module")
def slots_server(tool, tmp_path_factory):
    s = start_server(tool, tmp_path_factory.mktemp("slots") / "server.log",
                     "--parallel", "2", "--queue", "1", "--keepalive", str(KEEPALIVE))
    yield s
    s.stop()
    assert s.proc.returncode == 0, s.log()


@pytest.fixture(scope="module")
def oa(slots_server, openai_mod):
    c = openai_mod.OpenAI(base_url=slots_server.url + "/v1", api_key="unused", max_retries=0, timeout=60)
    yield c
    c.close()


@pytest.fixture(scope="module")
def an(slots_server, anthropic_mod):
    c = anthropic_mod.Anthropic(base_url=slots_server.url, api_key="unused", max_retries=0, timeout=60)
    yield c
    c.close()


def health(server):
    with urllib.request.urlopen(server.url + "/health", timeout=10) as r:
        return json.loads(r.read())


def wait_for(pred, what, server, timeout=30):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if pred():
            return
        time.sleep(0.02)
    pytest.fail(f"timed out waiting for {what}: /health {health(server)}\n{server.log()[-3000:]}")


def log_lines(server, start):
    """The per-request lines logged since byte `start` of the log: (path, slot, cached, text)."""
    out = []
    for ln in server.log()[start:].splitlines():
        m = re.match(r"ds4-server: (\S+) slot (\d+) prompt (\d+) tokens \((\d+) cached", ln)
        if m:
            out.append((m.group(1), int(m.group(2)), int(m.group(4)), ln))
    return out


def raw_request(server, path, body):
    """Sends a POST on a raw socket and returns the socket, unread."""
    data = json.dumps(body).encode()
    sock = socket.create_connection(("127.0.0.1", server.port), timeout=60)
    sock.sendall(f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 f"Content-Length: {len(data)}\r\n\r\n".encode() + data)
    return sock


def hold(server, tag):
    """A long greedy stream (up to the context's end) that runs until the returned socket is
    closed; returns once its first text has arrived, so that it holds a slot."""
    sock = raw_request(server, COMPLETIONS, {"prompt": f"Renzo e Lucia {tag}", "max_tokens": 100000,
                                             "temperature": 0, "stream": True})
    got = b""
    while got.count(b"data: ") < 2:
        chunk = sock.recv(65536)
        assert chunk, got
        got += chunk
    return sock


def release(server, socks):
    for s in socks:
        s.close()
    wait_for(lambda: health(server)["slots"]["busy"] == 0 and health(server)["queue"]["waiting"] == 0,
             "the slots to be free", server)


def chat(client, messages, **kw):
    return client.chat.completions.create(model=MODEL_ID, messages=messages, temperature=0, **kw)


def test_health_reports_slots_and_queue(slots_server):
    assert health(slots_server) == {"status": "ok", "model": MODEL_ID, "slots": {"total": 2, "busy": 0, "free": 2},
                                    "queue": {"waiting": 0, "max": 1}}
    socks = [hold(slots_server, "h1")]
    try:
        h = health(slots_server)
        assert h["slots"] == {"total": 2, "busy": 1, "free": 1} and h["queue"]["waiting"] == 0
    finally:
        release(slots_server, socks)


def test_two_conversations_each_keep_their_own_prefix(slots_server, oa, an, count_tokens):
    """A then B then A then B: with one slot B would evict A; with two each resumes its own."""
    start = len(slots_server.log())
    a1 = [{"role": "user", "content": "Chi era don Abbondio? Conversazione A."}]
    b1 = [{"role": "user", "content": "Dove si trova Lecco? Conversazione B, un'altra storia."}]
    ra1 = chat(oa, a1, max_tokens=6)
    rb1 = an.messages.create(model=MODEL_ID, max_tokens=6, extra_body={"temperature": 0}, messages=b1)
    pa1 = count_tokens(rendered_chat("", [("user", a1[0]["content"])]))
    pb1 = count_tokens(rendered_chat("", [("user", b1[0]["content"])]))
    assert ra1.usage.prompt_tokens == len(pa1)
    assert rb1.usage.input_tokens + rb1.usage.cache_read_input_tokens == len(pb1)
    a2 = a1 + [{"role": "assistant", "content": "XQ risposta finta"}, {"role": "user", "content": "E poi?"}]
    b2 = b1 + [{"role": "assistant", "content": "KZ risposta finta"}, {"role": "user", "content": "Perché?"}]
    ra2 = chat(oa, a2, max_tokens=4)
    rb2 = an.messages.create(model=MODEL_ID, max_tokens=4, extra_body={"temperature": 0}, messages=b2)
    assert ra2.usage.prompt_tokens_details.cached_tokens == len(pa1)
    assert rb2.usage.cache_read_input_tokens == len(pb1)
    lines = log_lines(slots_server, start)
    assert [ln[0] for ln in lines] == [CHAT, MESSAGES, CHAT, MESSAGES], lines
    slot_a, slot_b = lines[0][1], lines[1][1]
    assert slot_a != slot_b and lines[2][1] == slot_a and lines[3][1] == slot_b, lines


def test_the_slot_with_the_longest_prefix_is_chosen_over_the_least_recently_used(slots_server, oa, count_tokens):
    start = len(slots_server.log())
    long1 = [{"role": "user", "content": "Quel ramo del lago di Como, che volge a mezzogiorno, tra due catene "
                                         "non interrotte di monti, tutto a seni e a golfi. " * 3}]
    short1 = [{"role": "user", "content": "Addio, monti sorgenti dall'acque."}]
    chat(oa, long1, max_tokens=2)
    chat(oa, short1, max_tokens=2)
    # The least recently used slot is the long conversation's, but the other holds this prefix.
    short2 = short1 + [{"role": "assistant", "content": "QX"}, {"role": "user", "content": "Ed elevati al cielo?"}]
    r = chat(oa, short2, max_tokens=2)
    assert r.usage.prompt_tokens_details.cached_tokens == len(count_tokens(rendered_chat("", [("user", short1[0]["content"])])))
    long2 = long1 + [{"role": "assistant", "content": "QX"}, {"role": "user", "content": "Continua."}]
    r = chat(oa, long2, max_tokens=2)
    assert r.usage.prompt_tokens_details.cached_tokens == len(count_tokens(rendered_chat("", [("user", long1[0]["content"])])))
    slots = [ln[1] for ln in log_lines(slots_server, start)]
    assert len(slots) == 4 and slots[0] != slots[1] and slots[2] == slots[1] and slots[3] == slots[0], slots


def test_concurrent_greedy_answers_equal_sequential_ones(slots_server, oa, an):
    start = len(slots_server.log())
    prompts = [f"Racconta di {who}." for who in ("Renzo", "Lucia", "don Rodrigo", "fra Cristoforo", "l'Innominato", "Agnese")]

    def one(i, stream):
        msgs = [{"role": "user", "content": prompts[i]}]
        if i % 3 == 2:  # Anthropic
            if stream:
                with an.messages.stream(model=MODEL_ID, max_tokens=48, extra_body={"temperature": 0}, messages=msgs) as s:
                    return "".join(s.text_stream)
            r = an.messages.create(model=MODEL_ID, max_tokens=48, extra_body={"temperature": 0}, messages=msgs)
            return r.content[0].text
        if stream:
            return "".join(c.choices[0].delta.content or "" for c in chat(oa, msgs, max_tokens=48, stream=True)
                           if c.choices)
        return chat(oa, msgs, max_tokens=48).choices[0].message.content

    sequential = [one(i, False) for i in range(len(prompts))]
    assert all(sequential)
    results, errors = [None] * len(prompts), []

    def run(i):
        try:
            results[i] = one(i, i % 2 == 1)
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(repr(e))

    # Two at a time fill both slots (a third would wait in the queue of one, a fourth get a 503).
    for pair in ((0, 1), (2, 3), (4, 5)):
        threads = [threading.Thread(target=run, args=(i,)) for i in pair]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert not errors, errors
    assert results == sequential
    lines = log_lines(slots_server, start)
    assert {ln[1] for ln in lines[len(prompts):]} == {0, 1}, lines


def test_full_queue_answers_503_with_retry_after(slots_server):
    socks = [hold(slots_server, "q1"), hold(slots_server, "q2")]
    try:
        socks.append(raw_request(slots_server, CHAT, {"messages": [{"role": "user", "content": "in coda"}],
                                                      "max_tokens": 2}))
        wait_for(lambda: health(slots_server)["queue"]["waiting"] == 1, "the request to queue", slots_server)
        for path, body in ((CHAT, {"messages": [{"role": "user", "content": "troppi"}], "max_tokens": 2}),
                           (COMPLETIONS, {"prompt": "troppi", "max_tokens": 2, "stream": True})):
            req = urllib.request.Request(slots_server.url + path, data=json.dumps(body).encode(), method="POST")
            with pytest.raises(urllib.error.HTTPError) as e:
                urllib.request.urlopen(req, timeout=30)
            assert e.value.code == 503 and e.value.headers["Retry-After"] == "1"
            err = json.loads(e.value.read())["error"]
            assert err["type"] == "server_error" and err["code"] == "server_busy" and "--queue 1" in err["message"]
        s, body, _ = post(slots_server, MESSAGES, {"messages": [{"role": "user", "content": "troppi"}], "max_tokens": 2})
        assert s == 503 and body["type"] == "error" and body["error"]["type"] == "overloaded_error", body
        assert health(slots_server)["slots"]["busy"] == 2
    finally:
        release(slots_server, socks)
    assert post(slots_server, CHAT, {"messages": [{"role": "user", "content": "ora sì"}], "max_tokens": 2})[0] == 200


@pytest.mark.parametrize("stream", [False, True])
def test_a_queued_client_that_disconnects_leaves_the_queue(slots_server, stream):
    socks = [hold(slots_server, "d1"), hold(slots_server, "d2")]
    try:
        before = slots_server.log().count("left the queue: client disconnected")
        q = raw_request(slots_server, CHAT, {"messages": [{"role": "user", "content": "me ne vado"}],
                                             "max_tokens": 2, "stream": stream})
        wait_for(lambda: health(slots_server)["queue"]["waiting"] == 1, "the request to queue", slots_server)
        q.close()
        wait_for(lambda: health(slots_server)["queue"]["waiting"] == 0, "the request to leave", slots_server, 10)
        assert health(slots_server)["slots"]["busy"] == 2  # it left; it was not served
        wait_for(lambda: slots_server.log().count("left the queue: client disconnected") == before + 1,
                 "the log line", slots_server, 10)
        # The place is free again: another request can queue, and runs once a slot frees.
        result = {}
        t = threading.Thread(target=lambda: result.update(r=post(slots_server, CHAT, {
            "messages": [{"role": "user", "content": "dopo"}], "max_tokens": 2})))
        t.start()
        wait_for(lambda: health(slots_server)["queue"]["waiting"] == 1, "the next request to queue", slots_server)
        socks.pop().close()
        t.join(30)
        assert result["r"][0] == 200
    finally:
        release(slots_server, socks)


def test_a_non_streamed_request_whose_client_disconnects_is_cancelled(slots_server):
    start = len(slots_server.log())
    sock = raw_request(slots_server, COMPLETIONS, {"prompt": "Renzo e Lucia, non in streaming", "max_tokens": 100000,
                                                   "temperature": 0})
    wait_for(lambda: health(slots_server)["slots"]["busy"] == 1, "the request to run", slots_server)
    time.sleep(0.3)
    sock.close()
    wait_for(lambda: health(slots_server)["slots"]["busy"] == 0, "the slot to be freed", slots_server, 10)
    lines = log_lines(slots_server, start)
    assert len(lines) == 1 and "client disconnected" in lines[0][3], lines
    n = int(lines[0][3].split("completion ")[1].split(" ")[0])
    assert 0 < n < 4000, lines  # the context's end is ~4080 tokens away


def read_sse(resp):
    """The lines of an SSE response as they come, each with the time it arrived."""
    buf = b""
    while True:
        chunk = resp.read1(65536) if hasattr(resp, "read1") else resp.read(1)
        if not chunk:
            return
        buf += chunk
        while b"\n" in buf:
            line, buf = buf.split(b"\n", 1)
            yield time.time(), line.decode()


@pytest.mark.parametrize("api", ["openai", "anthropic"])
def test_keepalive_comments_arrive_during_a_long_prefill(slots_server, api):
    # ~3700 tokens never seen before: a prefill of about a second or more on the tiny model.
    text = " ".join(f"parola{i} del lago {i * 7919 % 1000}" for i in range(530)) + f" {api} {time.time()}"
    if api == "openai":
        path, body = CHAT, {"messages": [{"role": "user", "content": text}], "max_tokens": 3, "stream": True}
        is_text = lambda ln: '"content":"' in ln and '"content":""' not in ln  # noqa: E731
    else:
        path, body = MESSAGES, {"messages": [{"role": "user", "content": text}], "max_tokens": 3, "stream": True}
        is_text = lambda ln: "content_block_delta" in ln  # noqa: E731
    start = len(slots_server.log())
    conn = http.client.HTTPConnection("127.0.0.1", slots_server.port, timeout=60)
    conn.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
    resp = conn.getresponse()
    assert resp.status == 200
    t0 = time.time()
    comments, first_text, lines = [], None, []
    for t, ln in read_sse(resp):
        lines.append(ln)
        if ln == ": keep-alive" and first_text is None:
            comments.append(t - t0)
        if ln.startswith("data: ") and is_text(ln) and first_text is None:
            first_text = t - t0
    conn.close()
    assert first_text is not None, lines
    prefill = float(re.search(r"cached, ([\d.]+) s\)", log_lines(slots_server, start)[0][3]).group(1))
    assert prefill > 4 * KEEPALIVE, "the prompt is too short to test keep-alive"
    # A comment per KEEPALIVE of silence, before the first text. The bound is loose: on a loaded
    # machine the writer's thread and this reader may be late (and read several at once).
    assert len(comments) >= max(3, int(prefill / KEEPALIVE / 3)), (comments, prefill)
    assert comments[0] < first_text
    end = "data: [DONE]" if api == "openai" else "event: message_stop"
    assert end in lines, lines


@pytest.mark.parametrize("api", ["openai", "anthropic"])
def test_the_sdks_read_streams_that_start_with_keepalive_comments(slots_server, oa, an, api):
    msgs = [{"role": "user", "content": "Renzo"}]

    def stream():
        if api == "openai":
            return "".join(c.choices[0].delta.content or "" for c in chat(oa, msgs, max_tokens=8, stream=True)
                           if c.choices)
        with an.messages.stream(model=MODEL_ID, max_tokens=8, extra_body={"temperature": 0}, messages=msgs) as s:
            return "".join(s.text_stream)

    socks = [hold(slots_server, "k1"), hold(slots_server, "k2")]
    got = {}
    try:
        # Queued behind two busy slots, the stream gets only comments for a while (Anthropic's
        # starts with them: message_start comes once a slot is taken).
        t = threading.Thread(target=lambda: got.update(text=stream()))
        t.start()
        wait_for(lambda: health(slots_server)["queue"]["waiting"] == 1, "the stream to queue", slots_server)
        time.sleep(5 * KEEPALIVE)
        socks.pop().close()
        t.join(30)
    finally:
        release(slots_server, socks)
    if api == "openai":
        want = chat(oa, msgs, max_tokens=8).choices[0].message.content
    else:
        want = an.messages.create(model=MODEL_ID, max_tokens=8, extra_body={"temperature": 0}, messages=msgs).content[0].text
    assert got["text"] == want and want
