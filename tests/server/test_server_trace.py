"""ds4-server --trace FILE (docs/SERVER.md, Trace file): one JSON record per generation request,
one per line, appended.

Each record is checked against oracles outside the trace code: the rendered prompt against the
transcript written by hand from docs/SERVER.md's rendering (ds4_server_harness.rendered_chat) and
its token count against ds4's tokenizer (`ds4 --dump-tokens`); the reused tokens, the generated
text, the token counts, the finish reason and the id against the API's own answer to the same
request (the SDK's or the raw JSON's); the body against what was sent."""
import datetime
import json
import os
import signal
import subprocess
import threading
import time

import pytest

from ds4_server_harness import EOS, MODEL, MODEL_ID, post, rendered_chat, start_server

CHAT = "/v1/chat/completions"
SYSTEM = "Sei un narratore."
USER_TEXT = "Quel ramo del lago di Como"


def records(path):
    """The records of a trace file: every line a whole JSON object, the file ending with a newline."""
    with open(path, encoding="utf-8") as f:
        data = f.read()
    assert data == "" or data.endswith("\n"), data[-200:]
    return [json.loads(line) for line in data.splitlines()]


@pytest.fixture(scope="module")
def traced(tool, tmp_path_factory):
    d = tmp_path_factory.mktemp("trace")
    path = d / "trace.jsonl"
    s = start_server(tool, d / "server.log", "--trace", str(path), "--parallel", "2")
    yield s, path
    s.stop()
    assert s.proc.returncode == 0, s.log()


def new_records(path, before, n, timeout=10):
    """The records after the first `before`, once there are n of them (a stream's record is written
    when its generation ends, which the client may see a moment before)."""
    deadline = time.time() + timeout
    while True:
        recs = records(path)[before:]
        if len(recs) >= n or time.time() > deadline:
            assert len(recs) == n, recs
            return recs
        time.sleep(0.05)


def check_common(rec, t0, t1):
    stamp = datetime.datetime.strptime(rec["time"], "%Y-%m-%dT%H:%M:%S.%fZ").replace(
        tzinfo=datetime.timezone.utc).timestamp()
    assert t0 - 1 <= stamp <= t1 + 1, (rec["time"], t0, t1)
    tm = rec["timings"]
    assert 0 <= tm["prefill_s"] and 0 <= tm["generation_s"]
    assert tm["prefill_s"] + tm["generation_s"] <= tm["total_s"] <= t1 - t0 + 1
    assert rec["prefill_tokens"] == rec["prompt_tokens"] - rec["cached_tokens"]
    assert rec["error"] is None and rec["disconnected"] is False
    assert rec["slot"] in (0, 1)


def test_chat_records_against_the_answers(traced, count_tokens):
    s, path = traced
    before = len(records(path))
    msgs = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": USER_TEXT}]
    body1 = {"model": MODEL_ID, "messages": msgs, "max_tokens": 6, "temperature": 0, "seed": 5}
    t0 = time.time()
    st, a1, raw = post(s, CHAT, body1)
    assert st == 200, raw
    answer = a1["choices"][0]["message"]["content"]
    msgs2 = msgs + [{"role": "assistant", "content": answer}, {"role": "user", "content": "E poi?"}]
    body2 = {"model": MODEL_ID, "messages": msgs2, "max_tokens": 4, "temperature": 0, "stop": ["zzz"]}
    st, a2, raw = post(s, CHAT, body2)
    assert st == 200, raw
    t1 = time.time()
    r1, r2 = new_records(path, before, 2)

    for rec, body, ans, turns in ((r1, body1, a1, [("user", USER_TEXT)]),
                                  (r2, body2, a2, [("user", USER_TEXT), ("assistant", answer), ("user", "E poi?")])):
        check_common(rec, t0, t1)
        rendered = rendered_chat(SYSTEM, turns)
        assert rec["prompt"] == rendered
        assert rec["prompt_tokens"] == len(count_tokens(rendered)) == ans["usage"]["prompt_tokens"]
        assert rec["cached_tokens"] == ans["usage"]["prompt_tokens_details"]["cached_tokens"]
        content = ans["choices"][0]["message"]["content"]
        # Every token chosen, decoded: the answer, and EOS written out when the model ended with it.
        if ans["choices"][0]["finish_reason"] == "length":
            assert rec["generated"] == content
        else:
            assert rec["generated"] in (content, content + EOS)
        assert rec["completion_tokens"] == ans["usage"]["completion_tokens"]
        assert rec["finish_reason"] == ans["choices"][0]["finish_reason"]
        assert rec["id"] == ans["id"] and rec["endpoint"] == CHAT and rec["stream"] is False
        assert json.loads(rec["body"]) == body
        assert rec["max_tokens"] == body["max_tokens"] and rec["sampling"]["temperature"] == 0
        assert rec["tool_calls"] == [] and rec["thinking"] is False
    assert r1["sampling"]["seed"] == 5
    assert r2["cached_tokens"] > 0  # the second turn reused the first


def test_stream_and_other_api_records(traced, client_for):
    s, path = traced
    oa, an = client_for(s)
    before = len(records(path))
    t0 = time.time()
    streamed = "".join(ch.choices[0].delta.content or "" for ch in oa.chat.completions.create(
        model="m", messages=[{"role": "user", "content": USER_TEXT}], max_tokens=5, temperature=0,
        stream=True) if ch.choices)
    with an.messages.stream(model="m", max_tokens=5, messages=[{"role": "user", "content": "Renzo"}],
                            extra_body={"temperature": 0}) as st:
        a_text = "".join(st.text_stream)
        a_msg = st.get_final_message()
    resp = oa.responses.create(model="m", input="Lucia", max_output_tokens=5, temperature=0)
    st_, comp, raw = post(s, "/v1/completions", {"prompt": "Don Abbondio", "max_tokens": 3, "temperature": 0})
    assert st_ == 200, raw
    t1 = time.time()
    recs = new_records(path, before, 4)
    for rec in recs:
        check_common(rec, t0, t1)
    chat, msg, rsp, cmp_ = recs
    assert chat["endpoint"] == CHAT and chat["stream"] is True
    assert chat["prompt"] == rendered_chat("", [("user", USER_TEXT)])
    assert chat["generated"] in (streamed, streamed + EOS)
    assert msg["endpoint"] == "/v1/messages" and msg["id"] == a_msg.id and msg["stream"] is True
    assert msg["prompt"] == rendered_chat("", [("user", "Renzo")])
    assert msg["generated"] in (a_text, a_text + EOS)
    assert msg["completion_tokens"] == a_msg.usage.output_tokens
    assert msg["cached_tokens"] == a_msg.usage.cache_read_input_tokens
    assert rsp["endpoint"] == "/v1/responses" and rsp["id"] == resp.id and rsp["stream"] is False
    assert rsp["prompt"] == rendered_chat("", [("user", "Lucia")])
    assert rsp["generated"] in (resp.output_text, resp.output_text + EOS)
    assert rsp["prompt_tokens"] == resp.usage.input_tokens
    assert cmp_["endpoint"] == "/v1/completions" and cmp_["id"] == comp["id"]
    assert cmp_["prompt_tokens"] == comp["usage"]["prompt_tokens"]
    assert cmp_["generated"] in (comp["choices"][0]["text"], comp["choices"][0]["text"] + EOS)


@pytest.fixture
def client_for():
    import anthropic
    import openai
    made = []

    def make(server):
        oa = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=60)
        an = anthropic.Anthropic(base_url=server.url, api_key="unused", max_retries=0, timeout=60)
        made.extend([oa, an])
        return oa, an
    yield make
    for c in made:
        c.close()


def test_tool_call_record(traced):
    s, path = traced
    before = len(records(path))
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]
    block = ('\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name="get_weather">\n<｜DSML｜parameter name="city" '
             'string="true">Lecco</｜DSML｜parameter>\n</｜DSML｜invoke>\n</｜DSML｜tool_calls>')
    st, ans, raw = post(s, CHAT, {"messages": [{"role": "user", "content": "Tempo?"},
                                              {"role": "assistant", "content": block, "prefix": True}],
                                 "tools": tools, "max_tokens": 4})
    assert st == 200, raw
    (rec,) = new_records(path, before, 1)
    (call,) = ans["choices"][0]["message"]["tool_calls"]
    assert rec["tool_calls"] == [{"name": "get_weather", "arguments": call["function"]["arguments"]}]
    assert rec["finish_reason"] == "tool_calls" and rec["generated"] == "" and rec["completion_tokens"] == 0
    assert rec["prompt"].endswith("<｜Assistant｜></think>" + block)  # the prefill is part of the prompt


def test_a_call_cut_by_a_disconnect_is_recorded_closed(traced):
    # The prefill stops inside a string value, so the model's own tokens stream as the city's
    # name; the client leaves while they do. The record's call is closed: its arguments are JSON
    # and begin with the prefilled text. (Which part of the server notices the client first, the
    # connection watch between tokens or a failed send, depends on timing; the engine closes the
    # calls either way.)
    s, path = traced
    before = len(records(path))
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]
    block = ('\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name="get_weather">\n<｜DSML｜parameter name="city" '
             'string="true">Lec')
    body = json.dumps({"messages": [{"role": "user", "content": "Tempo?"},
                                    {"role": "assistant", "content": block, "prefix": True}],
                       "tools": tools, "max_tokens": 3000, "stream": True, "temperature": 0}).encode()
    import urllib.request
    req = urllib.request.Request(s.url + CHAT, data=body, method="POST",
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as r:
        seen = b""
        while seen.count(b'"arguments"') < 3:  # the call's announcement and a few pieces
            seen += r.read1(256)
    (rec,) = new_records(path, before, 1)
    (call,) = rec["tool_calls"]
    args = json.loads(call["arguments"])
    assert set(args) == {"city"} and args["city"].startswith("Lec"), call
    assert rec["completion_tokens"] < 3000


def test_concurrent_requests_write_whole_records(traced):
    s, path = traced
    before = len(records(path))
    results = []

    def one(i):
        body = {"messages": [{"role": "user", "content": f"Richiesta {i} " + "parola " * 200}],
                "max_tokens": 6, "stream": i % 2 == 0}
        results.append(post(s, CHAT, body)[0])
    threads = [threading.Thread(target=one, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == [200] * 6
    recs = new_records(path, before, 6)
    assert sorted(json.loads(r["body"])["messages"][0]["content"].split()[1] for r in recs) == [str(i) for i in range(6)]


def test_a_bad_request_writes_no_record(traced):
    s, path = traced
    before = len(records(path))
    st, _, _ = post(s, CHAT, {"messages": "nope"})
    assert st == 400
    st, _, _ = post(s, CHAT, {"messages": [{"role": "user", "content": "x"}], "max_tokens": 1})
    assert st == 200
    (rec,) = new_records(path, before, 1)
    assert rec["completion_tokens"] == 1


def test_records_survive_kill_and_a_torn_tail_is_cut_at_start(tool, tmp_path):
    path = tmp_path / "t.jsonl"
    # A record of an earlier run, then one cut short by a crash inside its write.
    whole = json.dumps({"time": "2026-01-01T00:00:00.000Z", "id": "old"}, separators=(",", ":")) + "\n"
    path.write_text(whole + '{"time":"2026-01-01T00:00:01.000Z","id":"torn","prompt":"abc')
    s = start_server(tool, tmp_path / "a.log", "--trace", str(path))
    try:
        assert "removed an unfinished record of" in s.log()
        assert records(path) == [json.loads(whole)]
        # A long stream in progress when the server is killed: no record of it, the others whole.
        st, _, _ = post(s, CHAT, {"messages": [{"role": "user", "content": "Renzo"}], "max_tokens": 2})
        assert st == 200
        n = len(new_records(path, 1, 1))
        body = json.dumps({"messages": [{"role": "user", "content": "Lucia"}], "max_tokens": 3000,
                           "stream": True, "temperature": 0}).encode()
        import urllib.request
        req = urllib.request.Request(s.url + CHAT, data=body, method="POST",
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=60) as r:
            r.read(200)  # the stream runs
            s.proc.send_signal(signal.SIGKILL)
            s.proc.wait(timeout=20)
    finally:
        s.stop()
    recs = records(path)
    assert [r["id"] for r in recs][:1] == ["old"] and len(recs) == 1 + n

    # A file that does not end with a newline and whose last line is not a record keeps its text;
    # the records start on a line of their own.
    other = tmp_path / "notes.txt"
    other.write_text("my notes")
    s = start_server(tool, tmp_path / "b.log", "--trace", str(other))
    try:
        st, _, _ = post(s, CHAT, {"messages": [{"role": "user", "content": "Renzo"}], "max_tokens": 1})
        assert st == 200
        deadline = time.time() + 10
        while other.read_text().count("\n") < 2 and time.time() < deadline:
            time.sleep(0.05)
    finally:
        s.stop()
    lines = other.read_text().split("\n")
    assert lines[0] == "my notes" and json.loads(lines[1])["completion_tokens"] == 1 and lines[2] == ""


@pytest.mark.parametrize("content", [
    # a whole record that only lost its newline
    '{"time":"2026-01-01T00:00:00.000Z","id":"old"}\n{"time":"2026-01-01T00:00:01.000Z","id":"whole"}',
    # somebody else's one-line JSON file whose first key happens to be "time"
    '{"time":"12:00","note":"mine, unfinished',
])
def test_only_a_torn_record_of_a_trace_file_is_cut(tool, tmp_path, content):
    path = tmp_path / "t.jsonl"
    path.write_text(content)
    s = start_server(tool, tmp_path / "a.log", "--trace", str(path))
    try:
        assert "removed an unfinished record" not in s.log()
        assert "did not end with a newline: one was added" in s.log()
    finally:
        s.stop()
    assert path.read_text() == content + "\n"


@pytest.mark.parametrize("where", ["missing_dir", "directory", "fifo"])
def test_a_trace_file_that_cannot_be_opened_exits_2(tool, tmp_path, where):
    if where == "fifo":  # no reader: opening it would block the start
        os.mkfifo(tmp_path / "fifo")
        p = subprocess.run([tool("ds4-server"), "-m", MODEL, "--port", "0", "--trace",
                            str(tmp_path / "fifo")], capture_output=True, text=True, timeout=60)
        assert p.returncode == 2 and "--trace" in p.stderr, p.stderr
        return
    target = tmp_path / "no" / "such" / "t.jsonl" if where == "missing_dir" else tmp_path
    p = subprocess.run([tool("ds4-server"), "-m", MODEL, "--port", "0", "--trace", str(target)],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 2, p.stderr
    assert "--trace" in p.stderr and str(target) in p.stderr
    assert ("No such file" in p.stderr) if where == "missing_dir" else ("directory" in p.stderr)
    assert "listening" not in p.stderr


def test_help_names_the_flag(tool):
    p = subprocess.run([tool("ds4-server"), "--help"], capture_output=True, text=True, timeout=30)
    assert p.returncode == 0 and "--trace" in p.stdout
