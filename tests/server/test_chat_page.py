"""The chat page of ds4-server (docs/SERVER.md, Chat page) in headless Chromium, driven through the
W3C WebDriver HTTP protocol (Debian's chromium + chromium-driver) with urllib only.

The oracle of a streamed answer is the server itself: the request body the page sent
(window.ds4chat.lastRequest), replayed without streaming, must give the same text at temperature 0.
Stop must abort the fetch and the server must see the disconnect (its log line) and keep serving.
Tool calls cannot come from the tiny model (it writes no DSML), so their rendering is checked on a
canned stream that the test puts in place of fetch. A missing chromium or chromedriver fails the
tests (scripts/setup.sh installs both).

The screenshots go to DS4_CHAT_SCREENSHOTS (a folder) when set, else to pytest's tmp dir; each path
is printed."""
import base64
import json
import os
import re
import shutil
import socket
import subprocess
import time
import urllib.error
import urllib.request

import pytest

from ds4_server_harness import MODEL_ID, post, start_server

ELEMENT = "element-6066-11e4-a52e-4f735466cecf"  # the W3C key of an element reference
ENTER = "\ue007"
PROMPT = "Quel ramo del lago di Como"


def wait_for(check, timeout, what, interval=0.02):
    """check()'s first true value before the deadline, else a failure naming `what`."""
    deadline = time.time() + timeout
    while True:
        v = check()
        if v:
            return v
        if time.time() > deadline:
            pytest.fail(f"timed out after {timeout} s waiting for {what}")
        time.sleep(interval)


class WebDriver:
    """A chromedriver process and one headless Chromium session on it."""

    def __init__(self, chromedriver, chromium, log_path):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        self.proc = subprocess.Popen([chromedriver, f"--port={port}", f"--log-path={log_path}"],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.base = f"http://127.0.0.1:{port}"
        self.sid = None
        wait_for(self._ready, 30, "chromedriver to be ready", 0.1)
        caps = {"capabilities": {"alwaysMatch": {"browserName": "chrome", "goog:chromeOptions": {
            "binary": chromium,
            "args": ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                     "--window-size=1000,900"]}}}}
        self.sid = self._call("POST", "/session", caps)["value"]["sessionId"]

    def _ready(self):
        if self.proc.poll() is not None:
            pytest.fail(f"chromedriver exited with {self.proc.returncode}")
        try:
            return self._call("GET", "/status")["value"]["ready"]
        except OSError:
            return False

    def _call(self, method, path, body=None):
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.base + path, data=data, method=method,
                                     headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=60) as r:
                return json.loads(r.read())
        except urllib.error.HTTPError as e:
            raise AssertionError(f"WebDriver {method} {path}: {e.code} {e.read()[:2000]!r}") from None

    def cmd(self, method, path, body=None):
        return self._call(method, f"/session/{self.sid}{path}", body)["value"]

    def go(self, url):
        self.cmd("POST", "/url", {"url": url})

    def find(self, css):
        return self.cmd("POST", "/element", {"using": "css selector", "value": css})[ELEMENT]

    def find_all(self, css):
        return [e[ELEMENT] for e in self.cmd("POST", "/elements", {"using": "css selector", "value": css})]

    def click(self, css):
        self.cmd("POST", f"/element/{self.find(css)}/click", {})

    def type(self, css, text, clear=False):
        el = self.find(css)
        if clear:
            self.cmd("POST", f"/element/{el}/clear", {})
        self.cmd("POST", f"/element/{el}/value", {"text": text})

    def text(self, css):
        """The rendered text, as a user sees it."""
        return self.cmd("GET", f"/element/{self.find(css)}/text")

    def script(self, js, *args):
        return self.cmd("POST", "/execute/sync", {"script": js, "args": list(args)})

    def screenshot(self, path):
        png = base64.b64decode(self.cmd("GET", "/screenshot"))
        assert png.startswith(b"\x89PNG\r\n\x1a\n")
        with open(path, "wb") as f:
            f.write(png)
        print(f"chat page screenshot: {path}")
        return path

    def quit(self):
        try:
            if self.sid:
                self._call("DELETE", f"/session/{self.sid}")
        finally:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    chromium, chromedriver = shutil.which("chromium"), shutil.which("chromedriver")
    if not chromium or not chromedriver:
        pytest.fail("the chat page test needs Debian's chromium and chromium-driver "
                    "(apt-get install chromium chromium-driver; scripts/setup.sh installs them)")
    b = WebDriver(chromedriver, chromium, tmp_path_factory.mktemp("chromedriver") / "chromedriver.log")
    yield b
    b.quit()


@pytest.fixture(scope="module")
def screenshots(tmp_path_factory):
    d = os.environ.get("DS4_CHAT_SCREENSHOTS")
    if d:
        os.makedirs(d, exist_ok=True)
        return d
    return str(tmp_path_factory.mktemp("chat_page_screenshots"))


# The last answer as the page shows it; textContent, so that the text compares byte for byte.
LAST_ANSWER_JS = """
const all = document.querySelectorAll('#log .msg.assistant');
const m = all[all.length - 1];
if (!m) return null;
const t = m.querySelector('.thinking');
const err = m.querySelector('.error');
return {state: m.dataset.state, finish: m.dataset.finish || null,
        content: m.querySelector('.content').textContent,
        reasoning: t ? t.querySelector('.text').textContent : null, thinking_open: t ? t.open : null,
        tools: [...m.querySelectorAll('.tool-call')].map(c => [c.querySelector('.name').textContent,
                                                             c.querySelector('.args').textContent]),
        error: err ? err.textContent : null, meta: m.querySelector('.meta').textContent,
        answers: all.length, send_disabled: document.getElementById('send').disabled,
        stop_disabled: document.getElementById('stop').disabled};
"""


def last_answer(b):
    return b.script(LAST_ANSWER_JS)


def open_page(b, server):
    b.go(server.url + "/")
    # The page asks /health (which needs no key) for the model's name.
    wait_for(lambda: MODEL_ID in b.text("#model"), 10, "the model name on the page")


def settings(b, temperature=None, max_tokens=None, thinking=None, api_key=None):
    if not b.script("return document.getElementById('settings').open"):
        b.click("#settings summary")
    if temperature is not None:
        b.type("#temperature", str(temperature), clear=True)
    if max_tokens is not None:
        b.type("#max-tokens", str(max_tokens), clear=True)
    if api_key is not None:
        b.type("#api-key", api_key, clear=True)
    if thinking is not None and b.script("return document.getElementById('thinking').checked") != thinking:
        b.click("#thinking")


def finished_answer(b, answers, timeout=60):
    """Waits for answer number `answers` to leave the streaming state; returns it and the texts
    seen while it streamed."""
    seen = []

    def done():
        a = last_answer(b)
        if not a or a["answers"] < answers:
            return None
        if a["state"] == "streaming":
            seen.append(a["content"])
            assert not a["stop_disabled"] and a["send_disabled"], a
            return None
        return a
    return wait_for(done, timeout, "the answer to finish"), seen


def replay(server, body, headers=None):
    """The page's request without streaming: the oracle of the streamed text."""
    body = {k: v for k, v in body.items() if k not in ("stream", "stream_options")}
    s, parsed, raw = post(server, "/v1/chat/completions", body, headers=headers)
    assert s == 200, raw
    return parsed["choices"][0]


def test_page_is_served_without_touching_the_api_routes(server):
    for path, ctype in [("/", "text/html"), ("/index.html", "text/html"), ("/app.js", "text/javascript"),
                        ("/style.css", "text/css"), ("/favicon.svg", "image/svg+xml")]:
        with urllib.request.urlopen(server.url + path, timeout=10) as r:
            assert r.status == 200 and r.headers["Content-Type"].startswith(ctype), path
            assert "default-src 'self'" in r.headers["Content-Security-Policy"]
            assert r.headers["X-Content-Type-Options"] == "nosniff"
            assert r.read()
    for path in ["/nothing.js", "/webui/app.js", "/v1/nothing"]:
        with pytest.raises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(server.url + path, timeout=10)
        assert e.value.code == 404
        assert json.loads(e.value.read())["error"]["code"] == "not_found"


def test_streamed_answers_equal_the_greedy_answer(server, browser, screenshots):
    b = browser
    open_page(b, server)
    settings(b, temperature=0, max_tokens=40, thinking=False)
    b.type("#prompt", PROMPT)
    b.click("#send")
    a, seen = finished_answer(b, 1)
    assert a["state"] == "done" and a["finish"] in ("stop", "length") and a["content"], a
    assert a["reasoning"] is None and a["error"] is None and a["tools"] == [], a
    assert not a["send_disabled"] and a["stop_disabled"], a
    assert all(a["content"].startswith(s) for s in seen), (seen, a["content"])  # it only grew
    assert b.text("#log .msg.assistant .content")  # rendered, not only in the DOM

    req = b.script("return window.ds4chat.lastRequest")
    assert req["stream"] is True and req["temperature"] == 0 and req["max_tokens"] == 40, req
    assert req["messages"] == [{"role": "user", "content": PROMPT}], req
    oracle = replay(server, req)
    assert a["content"] == oracle["message"]["content"]
    assert a["finish"] == oracle["finish_reason"]

    # The second turn (sent with Enter) resends the whole conversation; the server resumes its
    # prefix, which the page's usage line reports.
    b.type("#prompt", "E poi?" + ENTER)
    a2, _ = finished_answer(b, 2)
    assert a2["state"] == "done" and a2["content"], a2
    req2 = b.script("return window.ds4chat.lastRequest")
    assert req2["messages"] == [{"role": "user", "content": PROMPT},
                                {"role": "assistant", "content": a["content"]},
                                {"role": "user", "content": "E poi?"}], req2
    assert a2["content"] == replay(server, req2)["message"]["content"]
    cached = re.search(r"\((\d+) cached\)", a2["meta"])
    assert cached and int(cached.group(1)) > 0, a2["meta"]
    b.screenshot(os.path.join(screenshots, "chat_page_two_turns.png"))


def test_stop_aborts_the_stream_and_the_server_sees_it(server, browser, screenshots):
    b = browser
    open_page(b, server)
    # A greedy stream up to the context's end (~4000 tokens, several seconds on the tiny model).
    settings(b, temperature=0, max_tokens=4000, thinking=False)
    for attempt in range(3):
        # On an idle machine the stream can reach its limit between the check below and the
        # click: that attempt shows nothing about Stop, so it is made again in a new chat.
        if attempt:
            b.click("#new-chat")
        log_start = len(server.log())
        b.type("#prompt", PROMPT)
        b.click("#send")
        first = wait_for(lambda: (last_answer(b) or {}).get("content"), 30,
                         "the first streamed text")
        wait_for(lambda: len(last_answer(b)["content"]) > len(first), 30,
                 "the streamed text to grow")
        assert last_answer(b)["state"] == "streaming"
        b.click("#stop")
        a = wait_for(lambda: (lambda x: x if x["state"] != "streaming" else None)(last_answer(b)),
                     10, "the page to show the stop")
        if not (a["state"] == "done" and a.get("finish") == "length"):
            break
    assert a["state"] == "stopped" and a["meta"] == "stopped" and a["error"] is None, a
    assert not a["send_disabled"] and a["stop_disabled"], a
    # What was shown stays in the conversation that the next turn resends.
    msgs = b.script("return window.ds4chat.messages")
    assert msgs[-1] == {"role": "assistant", "content": a["content"]}, msgs[-1]

    # The server noticed the closed connection and stopped well before the token limit.
    line = wait_for(lambda: re.search(r"/v1/chat/completions slot \d+ prompt \d+ tokens .*completion (\d+) "
                                      r"tokens .*client disconnected", server.log()[log_start:]),
                    10, "the server's 'client disconnected' line")
    assert int(line.group(1)) < 3500, line.group(0)
    with urllib.request.urlopen(server.url + "/health", timeout=10) as r:
        health = json.loads(r.read())
    assert health["status"] == "ok" and health["slots"]["busy"] == 0, health
    b.screenshot(os.path.join(screenshots, "chat_page_stopped.png"))

    # And it still answers the page.
    settings(b, max_tokens=8)
    b.type("#prompt", "Renzo")
    b.click("#send")
    a2, _ = finished_answer(b, 2)
    assert a2["state"] == "done" and a2["content"], a2


def test_thinking_setting(server, browser):
    """The Thinking box turns thinking on, and the page shows what the server answers. At
    temperature 0 the tiny model closes its think block at once, so the collapsed block of
    reasoning is checked on the canned stream below."""
    b = browser
    open_page(b, server)
    settings(b, temperature=0, max_tokens=16, thinking=True)
    try:
        b.type("#prompt", PROMPT)
        b.click("#send")
        a, _ = finished_answer(b, 1)
    finally:
        settings(b, thinking=False)  # the setting is kept in localStorage for the later tests
    assert a["state"] == "done", a
    req = b.script("return window.ds4chat.lastRequest")
    assert req["thinking"] == {"type": "enabled"}, req
    oracle = replay(server, req)["message"]
    assert (a["reasoning"] or "") == oracle.get("reasoning_content", "")
    assert a["content"] == oracle["content"]
    if a["reasoning"]:
        assert a["thinking_open"] is False, a


# A canned stream in place of fetch: events split across chunks, a keep-alive comment, markup in
# the model's text, reasoning, and a tool call whose arguments come in pieces.
FAKE_STREAM_JS = """
const chunk = (d) => 'data: ' + JSON.stringify({choices: [{index: 0, delta: d, finish_reason: null}]}) + '\\n\\n';
const text = ': keep-alive\\n\\n' + chunk({role: 'assistant', content: ''}) +
  chunk({reasoning_content: '<b>think</b>'}) + chunk({content: '<img src=x onerror=alert(1)> & more'}) +
  chunk({tool_calls: [{index: 0, id: 'call_1', type: 'function', function: {name: 'get_weather', arguments: ''}}]}) +
  chunk({tool_calls: [{index: 0, function: {arguments: '{"city":'}}]}) +
  chunk({tool_calls: [{index: 0, function: {arguments: ' "<Como>"}'}}]}) +
  'data: ' + JSON.stringify({choices: [{index: 0, delta: {}, finish_reason: 'tool_calls'}]}) + '\\n\\n' +
  'data: [DONE]\\n\\n';
const bytes = new TextEncoder().encode(text);
window.fetch = async (url, init) => {
  window.fakeRequest = {url: String(url), body: JSON.parse(init.body)};
  let i = 0;
  const body = new ReadableStream({pull(c) {  // 7-byte chunks: every event is split
    if (i >= bytes.length) { c.close(); return; }
    c.enqueue(bytes.slice(i, i + 7)); i += 7;
  }});
  return new Response(body, {status: 200, headers: {'Content-Type': 'text/event-stream'}});
};
"""


def test_tool_calls_and_markup_render_as_text(server, browser, screenshots):
    b = browser
    open_page(b, server)
    b.script(FAKE_STREAM_JS)
    b.type("#prompt", "<i>weather</i>")
    b.click("#send")
    a, _ = finished_answer(b, 1, timeout=10)
    assert a["state"] == "done" and a["finish"] == "tool_calls", a
    assert a["reasoning"] == "<b>think</b>" and a["thinking_open"] is False
    assert a["content"] == "<img src=x onerror=alert(1)> & more"
    assert a["tools"] == [["tool call: get_weather", '{"city": "<Como>"}']], a["tools"]
    assert b.find_all("#log img, #log b, #log i") == []  # nothing was parsed as HTML
    assert b.script("return document.querySelector('#log .msg.user .content').textContent") == "<i>weather</i>"
    assert b.script("return window.fakeRequest.url") == "v1/chat/completions"
    msgs = b.script("return window.ds4chat.messages")
    assert msgs[-1] == {"role": "assistant", "content": "<img src=x onerror=alert(1)> & more",
                        "reasoning_content": "<b>think</b>",
                        "tool_calls": [{"id": "call_1", "type": "function",
                                        "function": {"name": "get_weather", "arguments": '{"city": "<Como>"}'}}]}
    b.click("#log .thinking summary")  # opened, for the screenshot
    b.screenshot(os.path.join(screenshots, "chat_page_tool_call.png"))


# A fetch that answers nothing until it is aborted (no headers, no body): Stop comes first.
HANGING_FETCH_JS = """
window.fetch = (url, init) => new Promise((resolve, reject) => {
  init.signal.addEventListener('abort', () => reject(new DOMException('aborted', 'AbortError')));
});
"""


def test_stop_before_any_answer_takes_the_turn_back(server, browser):
    b = browser
    open_page(b, server)
    b.script(HANGING_FETCH_JS)
    b.type("#prompt", "Renzo e Lucia")
    b.click("#send")
    wait_for(lambda: b.script("return document.getElementById('stop').disabled") is False, 10,
             "the turn to start")
    b.click("#stop")
    a = wait_for(lambda: (lambda x: x if x and x["state"] != "streaming" else None)(last_answer(b)),
                 10, "the page to show the stop")
    assert a["state"] == "stopped" and not a["content"], a
    # Nothing came, so the conversation holds no lone user message and the text is back.
    assert b.script("return window.ds4chat.messages") == []
    assert b.script("return document.getElementById('prompt').value") == "Renzo e Lucia"
    assert b.script("return document.querySelector('#log .msg.user').classList.contains('failed')")

    # New chat during a turn: the page is ready at once, and the old turn does not touch the
    # new conversation when it settles.
    b.click("#send")
    wait_for(lambda: b.script("return document.getElementById('stop').disabled") is False, 10,
             "the second turn to start")
    b.click("#new-chat")
    assert b.script("return document.getElementById('send').disabled") is False
    assert b.script("return document.getElementById('stop').disabled") is True
    assert b.script("return window.ds4chat.messages") == []
    assert b.find_all("#log .msg") == []


def test_api_key(tool, browser, tmp_path):
    """With --api-key the page loads without a key; its calls fail with the server's message
    until the key is entered in the settings, then carry it."""
    key = "sk-chat-page"
    s = start_server(tool, tmp_path / "server.log", "--api-key", key)
    try:
        for path in ["/", "/app.js"]:
            with urllib.request.urlopen(s.url + path, timeout=10) as r:
                assert r.status == 200
        with pytest.raises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(s.url + "/v1/models", timeout=10)
        assert e.value.code == 401

        b = browser
        open_page(b, s)
        settings(b, temperature=0, max_tokens=8, thinking=False, api_key="")
        b.type("#prompt", "Renzo")
        b.click("#send")
        a, _ = finished_answer(b, 1)
        assert a["state"] == "error" and a["error"].startswith("401: missing API key"), a
        # The failed turn is taken back and its text put back in the box.
        assert b.script("return window.ds4chat.messages") == []
        assert b.script("return document.getElementById('prompt').value") == "Renzo"

        settings(b, api_key=key)
        b.click("#send")
        a, _ = finished_answer(b, 2)
        assert a["state"] == "done" and a["content"], a
        req = b.script("return window.ds4chat.lastRequest")
        assert req["messages"] == [{"role": "user", "content": "Renzo"}]
        assert a["content"] == replay(s, req, {"Authorization": "Bearer " + key})["message"]["content"]
    finally:
        s.stop()
    assert s.proc.returncode == 0, s.log()
