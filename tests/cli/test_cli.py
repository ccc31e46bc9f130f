"""The ds4 command line, end to end on a synthetic tiny model (docs/SURFACES.md 2)."""
import json
import os
import re
import signal
import struct
import subprocess

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture(scope="module")
def tiny(tool, tmp_path_factory):
    path = tmp_path_factory.mktemp("cli") / "tiny.gguf"
    subprocess.run([tool("ds4-mkmodel"), "--shape", "tiny", "--quant", "q8_0", "--seed", "3", "--out", str(path), "-q",
                    "--vocab", os.path.join(REPO, "models", "ds4-vocab.gguf")], check=True)
    return str(path)


def ds4(tool, *args, **kw):
    return subprocess.run([tool("ds4"), *args], capture_output=True, text=True, errors="replace", cwd=kw.get("cwd"),
                          timeout=300)


def test_help_and_usage_errors(tool, tiny):
    p = ds4(tool, "--help")
    assert p.returncode == 0 and "--dump-logprobs" in p.stdout and "--no-qat-sim" in p.stdout
    assert ds4(tool, "--no-such-flag").returncode == 2
    p = ds4(tool, "-m", tiny, "-p", "a", "--prompt-file", "x")
    assert p.returncode == 2 and "specify only one prompt source" in p.stderr
    assert ds4(tool, "-m", tiny, "-p", "a", "--temp", "-1").returncode == 2
    assert ds4(tool, "-m", tiny, "-p", "a", "--nothink", "--think").returncode == 2
    p = ds4(tool, "-m", tiny, "-p", "a", "--backend", "metal")
    assert p.returncode == 2 and "--backend: must be cpu or cuda, got 'metal'" in p.stderr


def test_missing_default_model_says_how_to_get_one(tool, tmp_path):
    p = ds4(tool, "-p", "hello", cwd=tmp_path)
    assert p.returncode == 1
    assert "ds4flash.gguf not found" in p.stderr and "ds4-mkmodel" in p.stderr and "ds4-convert" in p.stderr


def test_inspect_and_strict(tool, tiny, tmp_path):
    p = ds4(tool, "-m", tiny, "--inspect")
    assert p.returncode == 0
    assert "layer  2: ratio 4 + indexer, hash-routed" in p.stdout and "routed experts: q8_0" in p.stdout
    p = ds4(tool, "-m", tiny, "--inspect", "--strict")
    assert p.returncode == 2 and "not the published DeepSeek V4 Flash layout" in p.stderr
    data = open(tiny, "rb").read()
    bad = tmp_path / "bad.gguf"
    for cut in (5000, len(data) * 9 // 10):  # inside the metadata; inside the tensor data
        bad.write_bytes(data[:cut])
        p = ds4(tool, "-m", str(bad), "--inspect")
        assert p.returncode == 2 and "truncated or corrupt file" in p.stderr, p.stderr


def test_greedy_generation_is_deterministic_and_reports_speed(tool, tiny):
    args = ("-m", tiny, "-p", "Write a haiku about the sea", "-n", "12", "--temp", "0", "--nothink", "-t", "2")
    a, b = ds4(tool, *args), ds4(tool, *args)
    assert a.returncode == 0, a.stderr
    assert a.stdout == b.stdout and a.stdout.endswith("\n")
    assert "ds4: prefill:" in a.stderr and "generation:" in a.stderr and "context buffers" in a.stderr


def test_prompt_longer_than_context(tool, tiny):
    p = ds4(tool, "-m", tiny, "-p", "word " * 200, "-c", "64")
    assert p.returncode == 2 and "the context holds 64" in p.stderr


def gpt2_byte_decoder():
    """The inverse of GPT-2's bytes-to-unicode table: byte-level BPE token text back to bytes."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(bs, cs)}


@pytest.fixture(scope="module")
def vocab_bytes():
    """Token id -> bytes, read from the vocabulary with gguf-py, independently of the engine:
    normal tokens through the byte-level table, control tokens as their text."""
    import gguf  # a test dependency (tests/gguf uses it too); missing, the test fails
    r = gguf.GGUFReader(os.path.join(REPO, "models", "ds4-vocab.gguf"))
    f = r.fields["tokenizer.ggml.tokens"]
    types = r.fields["tokenizer.ggml.token_type"]
    dec = gpt2_byte_decoder()
    out = []
    for i, idx in enumerate(f.data):
        text = bytes(f.parts[idx]).decode("utf-8")
        ttype = int(types.parts[types.data[i]][0])
        out.append(text.encode("utf-8") if ttype != 1 else bytes(dec[c] for c in text))
    return out


def test_dump_logprobs_format_and_greedy_consistency(tool, tiny, tmp_path, vocab_bytes):
    out = tmp_path / "lp.json"
    p = ds4(tool, "-m", tiny, "-sys", "", "--nothink", "-p", "The capital of Italy is", "-n", "4",
            "--dump-logprobs", str(out), "--logprobs-top-k", "5", "-c", "256")
    assert p.returncode == 0, p.stderr
    text = out.read_text()
    assert text.startswith('{\n  "source":"ds4",\n  "prompt_tokens":')
    j = json.loads(text)
    assert j["top_k"] == 5 and j["ctx"] == 256 and 1 <= len(j["steps"]) <= 4
    toks = ds4(tool, "-m", tiny, "--dump-tokens", "-p", "The capital of Italy is")
    # BOS, User, text, Assistant, </think> around the text tokens (no system text)
    n_text = len(json.loads(toks.stdout.splitlines()[0]))
    assert j["prompt_tokens"] == n_text + 4
    for s in j["steps"]:
        top = s["top_logprobs"]
        assert s["selected"]["id"] == top[0]["token"]["id"]
        assert [t["logit"] for t in top] == sorted([t["logit"] for t in top], reverse=True)
        assert all(t["logprob"] <= 0 for t in top)
        # The bytes of each token are those of its vocabulary entry (gguf-py's reading of it).
        for t in [s["selected"]] + [a["token"] for a in top]:
            assert bytes(t["bytes"]) == vocab_bytes[t["id"]], t
    # The greedy path the dump took is the one plain greedy generation prints.
    gen = ds4(tool, "-m", tiny, "-sys", "", "--nothink", "-p", "The capital of Italy is", "-n", "4", "--temp", "0",
              "-c", "256")
    expect = b"".join(bytes(s["selected"]["bytes"]) for s in j["steps"]).decode("utf-8", "replace")
    assert gen.stdout.rstrip("\n") == expect.rstrip("\n")


def test_interactive_turns_and_commands(tool, tiny):
    script = "hello there\n/nothink\nsecond turn\n/ctx 0\n/bogus\n/quit\n"
    p = subprocess.run([tool("ds4"), "-m", tiny, "-n", "6", "--temp", "0"], input=script, capture_output=True,
                       text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    assert p.stderr.count("ds4: prefill:") == 2  # two turns answered
    assert "/ctx needs a positive number" in p.stderr and "unknown command /bogus" in p.stderr
    assert len([ln for ln in p.stdout.splitlines() if ln.strip()]) >= 2


SPEED = re.compile(r"^ds4: prefill: (\d+) tokens, ([\d.]+) s, ([\d.]+) t/s; generation: (\d+) tokens, ([\d.]+) s, "
                   r"([\d.]+) t/s; stopped: (length|eos|context full|interrupted)$", re.M)


def test_speed_line_counts_and_stop_reasons(tool, tiny):
    p = ds4(tool, "-m", tiny, "-p", "hi", "-n", "3", "--temp", "0", "--nothink", "-c", "256")
    assert p.returncode == 0, p.stderr
    (m,) = SPEED.findall(p.stderr)
    toks = ds4(tool, "-m", tiny, "--dump-tokens", "-p", "hi")
    n_text = len(json.loads(toks.stdout.splitlines()[0]))
    # BOS, the default system text, User, text, Assistant, </think>: the prompt holds the text's tokens and more
    assert int(m[0]) > n_text and int(m[3]) == 3 and m[6] == "length"
    # A context that fills up stops the answer, which says so: every position is used.
    p = ds4(tool, "-m", tiny, "-p", "hi", "-n", "1000", "--temp", "0", "--nothink", "-c", "48")
    assert p.returncode == 0, p.stderr
    (m,) = SPEED.findall(p.stderr)
    assert m[6] == "context full" and int(m[0]) + int(m[3]) == 48 + 1, m
    assert "the context is full (48 tokens); raise --ctx" in p.stderr


def test_ctx_above_the_model_is_clamped(tool, tiny):
    p = ds4(tool, "-m", tiny, "-p", "hi", "-n", "1", "-c", "100000")
    assert p.returncode == 0, p.stderr
    assert "--ctx 100000 is above the model's context length; using 4096" in p.stderr
    assert "(ctx=4096," in p.stderr
    p = ds4(tool, "-m", tiny, "-p", "hi", "-n", "1")  # the default, clamped without a notice
    assert p.returncode == 0 and "(ctx=4096," in p.stderr and "above the model's" not in p.stderr


def with_context_length(src, dst, value):
    """A copy of a GGUF whose deepseek4.context_length (a u32) says `value`."""
    data = bytearray(open(src, "rb").read())
    key = b"deepseek4.context_length"
    at = data.index(key) + len(key)
    assert struct.unpack_from("<I", data, at)[0] == 4  # GGUF type u32
    struct.pack_into("<I", data, at + 4, value)
    open(dst, "wb").write(data)


def kv_bytes(stderr):
    return int(re.search(r"context buffers [\d.]+ MiB, (\d+) bytes", stderr).group(1))


def test_context_too_large_for_memory_is_refused_with_the_numbers(tool, tiny, tmp_path):
    big = tmp_path / "big-ctx.gguf"
    with_context_length(tiny, big, 0xFFFFFFFF)
    # The cache grows by the same bytes per position at multiples of every compression ratio (4, 16):
    # two small contexts give the size of any other, as the engine allocates it.
    b1, b2 = (kv_bytes(ds4(tool, "-m", str(big), "-p", "hi", "-n", "1", "-c", str(c)).stderr) for c in (1024, 2048))
    ctx = 4294967168  # 2^32 - 128: a multiple of 16
    expect = b1 + (b2 - b1) // 1024 * (ctx - 1024)
    p = ds4(tool, "-m", str(big), "-p", "hi", "-n", "1", "-c", str(ctx))
    assert p.returncode == 1, p.stderr
    m = re.search(r"the KV cache of a (\d+)-token context needs ([\d.]+) GiB, ([\d.]+) GiB available \((\d+) bytes; "
                  r"lower --ctx\)", p.stderr)
    assert m, p.stderr
    assert int(m.group(1)) == ctx and int(m.group(4)) == expect and float(m.group(2)) == round(expect / 2**30, 2)
    avail = next(int(ln.split()[1]) * 1024 for ln in open("/proc/meminfo") if ln.startswith("MemAvailable:"))
    assert abs(float(m.group(3)) - avail / 2**30) < 2, (m.group(3), avail)
    assert "context buffers" not in p.stderr  # refused before allocating
    # In the chat the refusal leaves the session as it was.
    script = f"/ctx {ctx}\nhello\n/quit\n"
    p = subprocess.run([tool("ds4"), "-m", str(big), "-n", "2", "--temp", "0", "-c", "256"], input=script,
                       capture_output=True, text=True, errors="replace", timeout=300)
    assert p.returncode == 0, p.stderr
    assert "GiB available" in p.stderr and p.stderr.count("ds4: prefill:") == 1


def test_chat_context_full_suggests_a_way_out(tool, tiny):
    script = "hello\nagain\n/clear\nhi\n/quit\n"
    p = subprocess.run([tool("ds4"), "-m", tiny, "-n", "1000", "--temp", "0", "--nothink", "-c", "48"], input=script,
                       capture_output=True, text=True, errors="replace", timeout=300)
    assert p.returncode == 0, p.stderr
    stops = [m[6] for m in SPEED.findall(p.stderr)]
    assert stops == ["context full", "context full"], p.stderr  # "again" did not fit; after /clear "hi" did
    assert p.stderr.count("/ctx N for a larger one (the conversation is kept), /clear to start over") == 3
    assert "conversation cleared" in p.stderr


def test_ctrl_c_stops_a_one_shot_generation_with_exit_130(tool, tiny):
    proc = subprocess.Popen([tool("ds4"), "-m", tiny, "-p", "hi", "-n", "100000", "--temp", "0", "--nothink"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        assert proc.stdout.read(1), "no output before the signal"  # generation is under way
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == 130, err
    (m,) = SPEED.findall(err.decode())
    assert m[6] == "interrupted"


def test_inputs_and_environment_are_checked_before_the_model_loads(tool, tiny, tmp_path):
    # /dev/null is no model: each error below must come first, so it was checked before loading.
    p = ds4(tool, "-m", "/dev/null", "--prompt-file", str(tmp_path))
    assert p.returncode == 2 and p.stderr == f"ds4: --prompt-file {tmp_path} is a directory, not a file\n"
    p = ds4(tool, "-m", "/dev/null", "-p", "hi", "--dump-logprobs", str(tmp_path / "no" / "x.json"))
    assert p.returncode == 2 and p.stderr.startswith("ds4: cannot write --dump-logprobs") and "model" not in p.stderr
    for env in ({"DS4_THREADS": "lots"}, {"DS4_SIMD": "avx9"}):
        p = subprocess.run([tool("ds4"), "-m", "/dev/null", "-p", "hi"], capture_output=True, text=True,
                           env={**os.environ, **env}, timeout=60)
        assert p.returncode == 2 and p.stderr.startswith(f"ds4: {list(env)[0]}={list(env.values())[0]} is not"), p.stderr
    # an endless input ends in a message, not in exhausted memory
    p = ds4(tool, "-m", "/dev/null", "--prompt-file", "/dev/zero")
    assert p.returncode == 2 and p.stderr == "ds4: --prompt-file /dev/zero is larger than 256 MiB: not a prompt\n"
    p = ds4(tool, "-m", tiny, "-p", "hi", "-n", "0")
    assert p.returncode == 2 and p.stderr == "ds4: --tokens: must be at least 1, got 0 (see --help)\n"
    p = ds4(tool, "-m", tiny, "-p", "hi", "--temp", "nan")
    assert p.returncode == 2 and "--temp: must be a number from 0 to 100, got 'nan'" in p.stderr


def test_threads_above_the_cores_warn(tool, tiny):
    n = os.cpu_count() + 1
    p = ds4(tool, "-m", tiny, "-p", "hi", "-n", "1", "-t", str(n))
    assert p.returncode == 0, p.stderr
    assert f"ds4: warning: {n} threads on {os.cpu_count()} cores" in p.stderr
    assert f", {n} threads, SIMD " in p.stderr  # the start-up line


def test_startup_line(tool, tiny):
    p = ds4(tool, "-m", tiny, "-p", "hi", "-n", "1", "-t", "1")
    size = os.path.getsize(tiny) / 2**20
    assert re.search(rf'^ds4: model tiny.gguf "[^"]*" \({size:.2f} MiB\), routed experts q8_0, 6 layers, context '
                     rf'length 4096, 1 threads, SIMD (scalar|avx2|avx512|avx512vbmi), backend cpu$', p.stderr, re.M), p.stderr
