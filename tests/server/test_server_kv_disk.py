"""ds4-server's disk KV cache (docs/SERVER.md, Disk KV cache) on the tiny model: a restarted server
resumes from the checkpoints of the last one and answers as a server without them does; damaged,
truncated, foreign (another model's) and unfinished files are deleted at start or at lookup; the
directory stays under its budget; a conversation displaced from its slot is saved and resumed from
disk; a server killed (-9) in the middle of a write leaves nothing that a restart trips on; bad
flag values exit 2."""
import os
import re
import subprocess
import threading
import time

import pytest

import ds4_server_harness
from ds4_server_harness import MODEL, REPO, openai_chat, post, start_server

# Tiny prompts qualify with a minimum of 8 tokens; no alignment and no trim, so cold saves hold
# whole prompts.
KV = ("--kv-cache-min-tokens", "8", "--kv-cache-boundary-align-tokens", "0",
      "--kv-cache-boundary-trim-tokens", "0")
CONV1 = [{"role": "user", "content": "Quel ramo del lago di Como che volge a mezzogiorno"}]
TOKENS = 12


def conv2(answer1):
    return CONV1 + [{"role": "assistant", "content": answer1},
                    {"role": "user", "content": "E poi? Racconta ancora del lago e dei monti."}]


def kv_files(d):
    return sorted(n for n in os.listdir(d) if n.endswith(".kv"))


def start(tool, tmp_path, name, kv_dir, *args):
    return start_server(tool, tmp_path / f"{name}.log", "--kv-disk-dir", str(kv_dir), *KV, *args)


def stop(s):
    s.stop()
    assert s.proc.returncode == 0, s.log()


def ask(server, messages):
    choice, usage = openai_chat(server, messages, max_tokens=TOKENS)
    return choice["message"]["content"], usage


@pytest.fixture(scope="module")
def cold(tool, tmp_path_factory):
    """The answers of a server without a disk cache: the oracle."""
    s = start_server(tool, tmp_path_factory.mktemp("cold") / "server.log")
    text1, usage1 = ask(s, CONV1)
    text2, usage2 = ask(s, conv2(text1))
    stop(s)
    return {"text1": text1, "usage1": usage1, "text2": text2, "usage2": usage2}


def test_restart_resumes_from_the_checkpoints(tool, tmp_path, cold):
    d = tmp_path / "kv" / "cache"  # the parents are made too
    a = start(tool, tmp_path, "a", d)
    text, usage = ask(a, CONV1)
    assert (text, usage) == (cold["text1"], cold["usage1"])
    stop(a)
    assert oct(os.stat(d).st_mode & 0o777) == "0o700"
    log = a.log()
    assert re.search(r"kv disk: stored \d+ tokens \(cold\)", log), log
    assert re.search(r"kv disk: stored \d+ tokens \(shutdown\)", log), log
    assert len(kv_files(d)) == 2

    # The same prompt: all of it from disk, nothing evaluated, the same greedy answer.
    b = start(tool, tmp_path, "b", d)
    text, usage = ask(b, CONV1)
    assert text == cold["text1"]
    assert usage["prompt_tokens"] == cold["usage1"]["prompt_tokens"]
    assert usage["completion_tokens"] == cold["usage1"]["completion_tokens"]
    assert usage["prompt_tokens_details"]["cached_tokens"] == usage["prompt_tokens"]
    stop(b)
    assert "kv disk: loaded" in b.log()

    # A longer conversation on a fresh server: the longest checkpoint that is a prefix of it
    # (the first prompt, or the first prompt and the answer) is restored, the rest evaluated.
    c = start(tool, tmp_path, "c", d)
    text, usage = ask(c, conv2(cold["text1"]))
    assert text == cold["text2"]
    assert usage["prompt_tokens"] == cold["usage2"]["prompt_tokens"]
    assert usage["prompt_tokens_details"]["cached_tokens"] >= cold["usage1"]["prompt_tokens"]
    assert usage["prompt_tokens_details"]["cached_tokens"] < usage["prompt_tokens"]
    stop(c)


OTHER = [{"role": "user", "content": "Renzo e Lucia fuggono di notte dal paese, sul lago"}]


def test_a_displaced_conversation_is_saved_and_found_again(tool, tmp_path, cold):
    """One slot, two conversations: the second prompt is no continuation of the live session, so
    the live session (the first prompt and its answer) is saved (`evict`) before it is replaced;
    the first conversation's next turn is then resumed from that file, with the answers of a
    server without a disk cache."""
    d = tmp_path / "kv"
    a = start(tool, tmp_path, "a", d, "--kv-cache-cold-max-tokens", "0")  # no cold saves
    text, usage = ask(a, CONV1)
    assert (text, usage) == (cold["text1"], cold["usage1"])
    assert "(evict)" not in a.log()
    ask(a, OTHER)
    m = re.search(r"kv disk: stored (\d+) tokens \(evict\)", a.log())
    assert m, a.log()
    evicted = int(m.group(1))
    assert evicted > usage["prompt_tokens"]  # the answer's tokens too
    # The slot now holds the other conversation: only the evicted file can resume this one.
    text, usage = ask(a, conv2(cold["text1"]))
    assert text == cold["text2"]
    assert usage["prompt_tokens"] == cold["usage2"]["prompt_tokens"]
    assert usage["prompt_tokens_details"]["cached_tokens"] == evicted, a.log()
    assert "kv disk: loaded" in a.log()
    stop(a)


def flip(path, at):
    with open(path, "r+b") as f:
        f.seek(at)
        b = f.read(1)
        f.seek(at)
        f.write(bytes([b[0] ^ 0x40]))


def test_bad_files_are_deleted_and_answers_stay_right(tool, tmp_path, cold, monkeypatch):
    d = tmp_path / "kv"
    a = start(tool, tmp_path, "a", d)
    ask(a, CONV1)
    stop(a)
    cold_file = re.search(r"stored \d+ tokens \(cold\) in (\S+\.kv)", a.log()).group(1)

    # Checkpoints of another model of the same shape and vocabulary (another seed).
    foreign_model = tmp_path / "foreign.gguf"
    subprocess.run([tool("ds4-mkmodel"), "--shape", "tiny", "--quant", "q8_0", "--seed", "3", "--out",
                    str(foreign_model), "-q", "--vocab", os.path.join(REPO, "models", "ds4-vocab.gguf")],
                   check=True)
    fd = tmp_path / "foreign"
    monkeypatch.setattr(ds4_server_harness, "MODEL", str(foreign_model))
    f = start(tool, tmp_path, "foreign", fd)
    ask(f, CONV1)
    stop(f)
    monkeypatch.setattr(ds4_server_harness, "MODEL", MODEL)
    foreign = kv_files(fd)
    assert foreign
    for n in foreign:
        os.rename(fd / n, d / ("foreign-" + n))

    good = d / cold_file
    data = good.read_bytes()
    (d / "truncated.kv").write_bytes(data[: len(data) // 2])
    (d / "header.kv").write_bytes(data)
    flip(d / "header.kv", 29)        # the token count: the header checksum fails
    (d / "tail.kv").write_bytes(data + b"\0")
    (d / "junk.kv").write_bytes(b"not a checkpoint")
    (d / (cold_file + ".tmp.999999999.1")).write_bytes(data[:100])  # a writer long gone
    (d / "notes.txt").write_text("not ours")
    flip(good, len(data) // 2)       # the payload: found at lookup, by the checksum

    b = start(tool, tmp_path, "b", d)
    log = b.log()
    for n in ["truncated.kv", "header.kv", "tail.kv", "junk.kv"] + ["foreign-" + n for n in foreign]:
        assert f"rejected {n}:" in log, log
        assert not (d / n).exists()
    assert "another model" in log
    assert "removed the unfinished write" in log
    assert not any(".tmp." in n for n in os.listdir(d))
    assert (d / "notes.txt").exists()
    assert good.exists()  # its header is fine: it is checked whole when a prompt needs it

    text, usage = ask(b, CONV1)
    assert (text, usage) == (cold["text1"], cold["usage1"])  # cached_tokens 0: evaluated again
    assert re.search(rf"rejected {cold_file}: the checksum", b.log()), b.log()
    stop(b)
    assert kv_files(d)  # the new cold checkpoint (and the shutdown one)


def test_budget_keeps_the_directory_small(tool, tmp_path, cold):
    d = tmp_path / "kv"
    budget = 2 << 20  # a checkpoint of the tiny model is about 0.55 MiB (its logits mostly)
    s = start(tool, tmp_path, "a", d, "--kv-disk-space-mb", "2")
    last = None
    for i in range(6):
        last = [{"role": "user", "content": f"Domanda numero {i}: dove si trova il lago di Como?"}]
        ask(s, last)
        total = sum(os.path.getsize(d / n) for n in kv_files(d))
        assert 0 < total <= budget, (i, total)
    stop(s)
    assert "kv disk: evicted" in s.log()
    # The most recent checkpoint survived and serves the next server.
    s = start(tool, tmp_path, "b", d, "--kv-disk-space-mb", "2")
    _, usage = ask(s, last)
    assert usage["prompt_tokens_details"]["cached_tokens"] == usage["prompt_tokens"]
    stop(s)
    # A smaller budget at start evicts down to it at once.
    s = start(tool, tmp_path, "c", d, "--kv-disk-space-mb", "1")
    assert sum(os.path.getsize(d / n) for n in kv_files(d)) <= 1 << 20
    stop(s)


def test_kill_during_a_write_leaves_nothing_to_trip_on(tool, tmp_path, cold, monkeypatch):
    d = tmp_path / "kv"
    monkeypatch.setenv("DS4_KV_DISK_TEST_PAUSE_AFTER_BYTES", "4096")
    s = start(tool, tmp_path, "a", d)
    monkeypatch.delenv("DS4_KV_DISK_TEST_PAUSE_AFTER_BYTES")
    # The cold save after the prefill pauses half-way through its temp file; the request waits.
    def request():
        try:
            post(s, "/v1/chat/completions", {"messages": CONV1, "max_tokens": TOKENS, "temperature": 0})
        except OSError:
            pass  # the server is killed under it

    t = threading.Thread(target=request, daemon=True)
    t.start()
    deadline = time.time() + 30
    while "test pause after 4096 bytes" not in s.log():
        assert time.time() < deadline, s.log()
        time.sleep(0.05)
    tmps = [n for n in os.listdir(d) if ".tmp." in n]
    assert len(tmps) == 1 and os.path.getsize(d / tmps[0]) == 4096
    s.proc.kill()
    s.proc.wait()
    t.join(timeout=30)
    assert kv_files(d) == []

    b = start(tool, tmp_path, "b", d)
    assert f"removed the unfinished write {tmps[0]}" in b.log()
    assert os.listdir(d) == []
    text, usage = ask(b, CONV1)
    assert (text, usage) == (cold["text1"], cold["usage1"])
    stop(b)
    assert len(kv_files(d)) == 2


@pytest.mark.parametrize("args, message", [
    (("--kv-disk-space-mb", "0"), "--kv-disk-space-mb"),
    (("--kv-cache-min-tokens", "0"), "--kv-cache-min-tokens"),
    (("--kv-cache-min-tokens", "100", "--kv-cache-cold-max-tokens", "50"), "must be 0 or at least"),
    (("--kv-cache-continued-interval-tokens", "-1"), "--kv-cache-continued-interval-tokens"),
    (("--kv-cache-boundary-align-tokens", "x"), "--kv-cache-boundary-align-tokens"),
])
def test_bad_flag_values_exit_2(tool, tmp_path, args, message):
    p = subprocess.run([tool("ds4-server"), "-m", MODEL, "--port", "0", "--kv-disk-dir", str(tmp_path / "kv"), *args],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 2, p.stderr
    assert message in p.stderr


def test_kv_flags_need_a_directory_and_a_usable_one(tool, tmp_path):
    p = subprocess.run([tool("ds4-server"), "-m", MODEL, "--port", "0", "--kv-disk-space-mb", "10"],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 2 and "--kv-disk-space-mb needs --kv-disk-dir" in p.stderr, p.stderr
    (tmp_path / "file").write_text("x")
    p = subprocess.run([tool("ds4-server"), "-m", MODEL, "--port", "0", "--kv-disk-dir", str(tmp_path / "file")],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 2 and "--kv-disk-dir" in p.stderr, p.stderr



def test_trim_leaves_the_prompts_tail_out_of_the_cold_save(tool, tmp_path, cold):
    # The cold save point is the prompt length less the trim (no alignment); a restarted server
    # finds that prefix, evaluates the rest and answers as a server without the cache does.
    d, trim = tmp_path / "kv", 5
    args = ("--kv-disk-dir", str(d), "--kv-cache-min-tokens", "8",
            "--kv-cache-boundary-align-tokens", "0", "--kv-cache-boundary-trim-tokens", str(trim))
    a = start_server(tool, tmp_path / "a.log", *args)
    text, usage = ask(a, CONV1)
    assert (text, usage) == (cold["text1"], cold["usage1"])
    want = usage["prompt_tokens"] - trim
    assert re.search(rf"kv disk: stored {want} tokens \(cold\)", a.log()), a.log()
    stop(a)
    b = start_server(tool, tmp_path / "b.log", *args)
    text, usage = ask(b, CONV1)
    assert text == cold["text1"]
    assert usage["prompt_tokens_details"]["cached_tokens"] == want, b.log()
    stop(b)


def test_reject_different_quant_is_accepted(tool, tmp_path, cold):
    a = start(tool, tmp_path, "a", tmp_path / "kv", "--kv-cache-reject-different-quant")
    assert ask(a, CONV1) == (cold["text1"], cold["usage1"])
    stop(a)
