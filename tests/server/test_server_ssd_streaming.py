"""ds4-server with --ssd-streaming (docs/SERVER.md, docs/SSD_STREAMING.md): the routed experts are
read from the model file through a small cache, and the answers are those of the resident server
(the logits are bit-identical, so greedy text and token counts are equal); the start-up line and
the cache's statistics at a clean exit are the engine tools'."""
import subprocess

from ds4_server_harness import MODEL, post, start_server

PROMPT = "Quel ramo del lago di Como"


def greedy(server):
    status, body, _ = post(server, "/v1/completions",
                           {"prompt": PROMPT, "max_tokens": 16, "temperature": 0})
    assert status == 200, body
    u = body["usage"]  # cached_tokens differs: each server has its own prefix cache
    return body["choices"][0]["text"], u["prompt_tokens"], u["completion_tokens"]


def test_streaming_server_answers_as_the_resident_one(tool, server, tmp_path):
    want = greedy(server)
    s = start_server(tool, tmp_path / "streaming.log", "--ssd-streaming",
                     "--ssd-streaming-cache-experts", "4", "--ssd-streaming-cache-dir", str(tmp_path))
    try:
        for _ in range(2):  # the second request finds some experts cached
            assert greedy(s) == want
        assert "SSD streaming cache budget" in s.log(), s.log()
    finally:
        s.stop()
    assert s.proc.returncode == 0, s.log()
    assert "SSD streaming stats:" in s.log(), s.log()


def test_streaming_budgets_below_the_floor_are_refused(tool):
    # The cache, the CUDA device tier given as a count (checked before any device is asked, so
    # on any machine), and the host tier flag without --cuda.
    for extra in (["--ssd-streaming-cache-experts", "1"], ["--cuda", "--ssd-streaming-cache-experts", "1"],
                  ["--ssd-streaming-host-cache", "8"]):
        r = subprocess.run([tool("ds4-server"), "-m", MODEL, "--port", "0", "--ssd-streaming", *extra],
                           capture_output=True, text=True, timeout=60)
        assert r.returncode == 2, (extra, r.stderr)
        assert "ssd-streaming" in r.stderr.lower() or "floor" in r.stderr, (extra, r.stderr)
