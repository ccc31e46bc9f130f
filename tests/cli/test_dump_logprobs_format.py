"""`ds4 --dump-logprobs FILE` against the reference engine's format, field by field (docs/SURFACES.md 2.6).

The contract: the prompt is built as for generation (2.3); always greedy; at each step the top-k of
the current logits, the argmax is the selected token, the step is written, and the loop stops after
writing an EOS step, else after -n steps (clamped to ctx - prompt - 1). The layout, whitespace
included:

    {\n  "source":"ds4",\n  "prompt_tokens":N,\n  "ctx":N,\n  "top_k":N,\n  "steps":[\n
    STEP,\n ... STEP\n  ]\n}\n       with STEP = 4 spaces + {"step":i,"selected":TOKEN,"top_logprobs":[ENTRY,...]}
    TOKEN = {"id":N,"text":"...","bytes":[u8,...]}   ENTRY = {"token":TOKEN,"logit":%.9g,"logprob":%.9g}

top_logprobs sorted by descending logit, top_k entries; logprob = logit - logsumexp(all finite logits),
in double, raw logits; text JSON-escaped, and when the bytes are not valid UTF-8 every byte >= 0x80
written as \\u00XX (bytes is authoritative).

Oracles: the documented layout and formulas above; the logits themselves from ds4-dump-logits on the
same token ids (a separate path: token by token, full rows), so the top-k ids, logits and logprobs are
recomputed with numpy from the full rows; token bytes from `ds4 --dump-tokens`. To put tokens that
need escaping (a quote, a backslash, a newline, a control byte, a lone UTF-8 lead byte, a valid
multi-byte character) into the top-k, and to make the model choose EOS at a known step, rows of the
synthetic f32 model's output matrix are swapped in place (gguf-py): a swap moves two tokens' logits
and nothing else.
"""
from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest

np = pytest.importorskip("numpy")
gguf = pytest.importorskip("gguf")

REPO = Path(__file__).resolve().parents[2]
PROMPT = "The capital of Italy is"
BOS, USER, ASSISTANT, THINK_CLOSE = "<｜begin▁of▁sentence｜>", "<｜User｜>", "<｜Assistant｜>", "</think>"
EOS_TEXT = "<｜end▁of▁sentence｜>"
TOP_K = 8

STR = r'"(?:[^"\\\x00-\x1f]|\\["\\/bfnrt]|\\u[0-9a-fA-F]{4})*"'
INT = r"-?(?:0|[1-9][0-9]*)"
NUM = r"[-+0-9.eEinfa]+"
TOKEN = rf'\{{"id":{INT},"text":{STR},"bytes":\[(?:{INT}(?:,{INT})*)?\]\}}'
ENTRY = rf'\{{"token":{TOKEN},"logit":({NUM}),"logprob":({NUM})\}}'
STEP = rf'    \{{"step":{INT},"selected":{TOKEN},"top_logprobs":\[(?:{ENTRY}(?:,{ENTRY})*)?\]\}}'
FILE = re.compile(rf'\{{\n  "source":"ds4",\n  "prompt_tokens":{INT},\n  "ctx":{INT},\n  "top_k":{INT},\n'
                  rf'  "steps":\[\n(?:{STEP},\n)*{STEP}\n  \]\n\}}\n\Z')


def run(cmd, **kw):
    p = subprocess.run([str(c) for c in cmd], capture_output=True, timeout=300, **kw)
    assert p.returncode == 0, p.stderr.decode("utf-8", "replace")
    return p


@pytest.fixture(scope="module")
def model(tool, tmp_path_factory):
    path = tmp_path_factory.mktemp("dumplp") / "tiny-f32.gguf"
    run([tool("ds4-mkmodel"), "--shape", "tiny", "--quant", "f32", "--seed", "3", "--vocab",
         REPO / "models" / "ds4-vocab.gguf", "--out", path, "-q"])
    return path


def dump(tool, model: Path, out: Path, *extra, n=4, top_k=TOP_K, ctx=256):
    run([tool("ds4"), "-m", model, "-sys", "", "--nothink", "-p", PROMPT, "-n", n, "--dump-logprobs", out,
         "--logprobs-top-k", top_k, "-c", ctx, "-t", "2", *extra])
    return out.read_text(encoding="utf-8")


def token_ids(tool, model: Path, text: bytes, tmp: Path) -> list[int]:
    f = tmp / "text.bin"
    f.write_bytes(text)
    p = run([tool("ds4"), "-m", model, "--dump-tokens", "--prompt-file", f])
    return json.loads(p.stdout.split(b"\n", 1)[0])


def rendered_prompt_ids(tool, model, tmp):
    # docs/SURFACES.md 2.3 with -sys "" and --nothink: BOS, User, text, Assistant, </think>
    return token_ids(tool, model, (BOS + USER + PROMPT + ASSISTANT + THINK_CLOSE).encode(), tmp)


def full_logits(tool, model: Path, ids: list[int], tmp: Path) -> np.ndarray:
    out = tmp / "full.f32"
    run([tool("ds4-dump-logits"), model, ",".join(map(str, ids)), out, "--threads", "2"])
    return np.fromfile(out, dtype=np.float32).reshape(len(ids), -1)


def ordered(text: str):
    """The JSON with every object as a list of (key, value) pairs, in file order."""
    return json.loads(text, object_pairs_hook=lambda pairs: pairs)


def as_dict(pairs):
    return {k: v for k, v in pairs}


def expected_text(b: bytes) -> str:
    try:
        return b.decode("utf-8")
    except UnicodeDecodeError:
        return "".join(chr(c) for c in b)  # every byte >= 0x80 as \u00XX, the rest as themselves


def swap_rows(path: Path, pairs):
    r = gguf.GGUFReader(str(path), "r+")
    (w,) = [t for t in r.tensors if t.name == "output.weight"]
    assert w.tensor_type.name == "F32"
    rows = w.data  # memory-mapped [n_vocab, n_embd]
    for a, b in pairs:
        rows[[a, b]] = rows[[b, a]]
    r.data.flush()
    del r


def check_file(text: str, tool, model, tmp, *, top_k=TOP_K, ctx=256):
    """Everything the contract fixes, against the oracles; returns the parsed steps."""
    assert FILE.match(text), "layout differs from docs/SURFACES.md 2.6:\n" + text[:2000]
    top = ordered(text)
    assert [k for k, _ in top] == ["source", "prompt_tokens", "ctx", "top_k", "steps"]
    j = as_dict(top)
    assert j["source"] == "ds4" and j["ctx"] == ctx and j["top_k"] == top_k
    prompt = rendered_prompt_ids(tool, model, tmp)
    assert j["prompt_tokens"] == len(prompt)
    steps = j["steps"]
    ids = prompt + [as_dict(as_dict(s)["selected"])["id"] for s in steps]
    full = full_logits(tool, model, ids[:-1] if len(ids) > len(prompt) else ids, tmp)
    # the raw numbers, in file order: (logit text, logprob text) per entry
    numbers = re.findall(r'"logit":([^,]+),"logprob":([^}]+)\}', text)
    n = 0
    for i, s in enumerate(steps):
        assert [k for k, _ in s] == ["step", "selected", "top_logprobs"]
        s = as_dict(s)
        assert s["step"] == i
        row = full[len(prompt) - 1 + i].astype(np.float64)
        fin = row[np.isfinite(row)]
        lse = fin.max() + np.log(np.exp(fin - fin.max()).sum())
        want_ids = sorted(range(len(row)), key=lambda t: (-row[t], t))[:top_k]
        entries = s["top_logprobs"]
        assert len(entries) == top_k
        got_ids = []
        for e in entries:
            assert [k for k, _ in e] == ["token", "logit", "logprob"]
            e = as_dict(e)
            assert [k for k, _ in e["token"]] == ["id", "text", "bytes"]
            tok = as_dict(e["token"])
            got_ids.append(tok["id"])
            logit_s, logprob_s = numbers[n]
            n += 1
            # %.9g of the float32 logit, of the double logprob: the text is its own value's %.9g
            assert logit_s == "%.9g" % float(logit_s) and logprob_s == "%.9g" % float(logprob_s), (logit_s, logprob_s)
            assert np.float32(float(logit_s)) == np.float32(e["logit"])
            assert abs(e["logit"] - row[tok["id"]]) <= 1e-4 * np.abs(row).max(), (i, tok["id"])
            assert abs(e["logprob"] - (row[tok["id"]] - lse)) <= 1e-4, (i, tok["id"])
            b = bytes(tok["bytes"])
            assert tok["text"] == expected_text(b), (tok["id"], b, tok["text"])
        assert got_ids == want_ids, (i, got_ids, want_ids)
        logits = [as_dict(e)["logit"] for e in entries]
        assert logits == sorted(logits, reverse=True)
        sel = as_dict(s["selected"])
        assert sel == as_dict(as_dict(entries[0])["token"]), "selected must be the first (argmax) entry"
        # every entry's logprob is logit - the same logsumexp
        lses = [as_dict(e)["logit"] - as_dict(e)["logprob"] for e in entries]
        assert max(lses) - min(lses) < 1e-5
    assert n == len(numbers)
    return [as_dict(s) for s in steps]


def selected_ids(steps):
    return [as_dict(s["selected"])["id"] for s in steps]


def test_layout_numbers_and_top_k_against_the_full_logits(tool, model, tmp_path):
    text = dump(tool, model, tmp_path / "a.json")
    steps = check_file(text, tool, model, tmp_path)
    assert len(steps) == 4


def test_always_greedy(tool, model, tmp_path):
    a = dump(tool, model, tmp_path / "a.json")
    b = dump(tool, model, tmp_path / "b.json", "--temp", "1.5", "--seed", "7", "--min-p", "0")
    assert a == b


def test_escaping_of_text_and_bytes(tool, model, tmp_path):
    """Tokens whose text needs escaping are moved into step 0's top-k (ranks 2..7) by swapping their
    output rows with those of the tokens that held these ranks."""
    m = tmp_path / "m.gguf"
    m.write_bytes(model.read_bytes())
    first = as_dict(ordered(dump(tool, m, tmp_path / "orig.json"))).get("steps")
    ranks = [as_dict(as_dict(e)["token"])["id"] for e in as_dict(first[0])["top_logprobs"]]
    specials = [b'"', b"\\", b"\n", b"\x01", b"\xe4", "é".encode()]
    targets = []
    for s in specials:
        ids = token_ids(tool, m, s, tmp_path)
        assert len(ids) == 1, (s, ids)
        targets.append(ids[0])
    assert not set(targets) & set(ranks)
    swap_rows(m, list(zip(ranks[1:1 + len(targets)], targets)))
    text = dump(tool, m, tmp_path / "swapped.json")
    steps = check_file(text, tool, m, tmp_path)
    entries = [as_dict(as_dict(e)["token"]) for e in steps[0]["top_logprobs"]]
    assert [e["id"] for e in entries] == [ranks[0]] + targets + ranks[1 + len(targets):], entries
    by_bytes = {bytes(e["bytes"]): e for e in entries}
    for s in specials:
        assert by_bytes[s]["text"] == expected_text(s)
    # the raw escapes: quote and backslash escaped, no raw control byte, the lone 0xe4 as \u00e4
    # (any case of hex digits), the valid UTF-8 character unescaped or \u-escaped
    assert '"text":"\\"","bytes":[34]' in text and '"text":"\\\\","bytes":[92]' in text
    assert re.search(r'"text":"\\u00[eE]4","bytes":\[228\]', text)
    assert re.search(r'"text":"(\\n|\\u000[aA])","bytes":\[10\]', text)
    assert re.search(r'"text":"\\u0001","bytes":\[1\]', text)
    assert re.search(r'"text":"(é|\\u00[eE]9)","bytes":\[195,169\]', text)


def test_stops_after_writing_the_eos_step(tool, model, tmp_path):
    """With the output rows of EOS and of step 1's token swapped, the model chooses EOS at step 1: the
    file has two steps, the second selecting EOS, although -n allows four."""
    m = tmp_path / "m.gguf"
    m.write_bytes(model.read_bytes())
    steps = as_dict(ordered(dump(tool, m, tmp_path / "orig.json")))["steps"]
    sel = selected_ids([as_dict(s) for s in steps])
    eos = token_ids(tool, m, EOS_TEXT.encode(), tmp_path)
    assert len(eos) == 1 and eos[0] not in sel
    assert sel[1] != sel[0]
    swap_rows(m, [(sel[1], eos[0])])
    text = dump(tool, m, tmp_path / "eos.json", n=4)
    got = check_file(text, tool, m, tmp_path)
    assert len(got) == 2
    assert as_dict(got[1]["selected"])["id"] == eos[0]
    assert bytes(as_dict(got[1]["selected"])["bytes"]) == EOS_TEXT.encode()
    assert got[0] == as_dict(as_dict(ordered(dump(tool, model, tmp_path / "o2.json")))["steps"][0])


def test_steps_are_clamped_to_the_context(tool, model, tmp_path):
    """At most -n steps, and at most ctx - prompt - 1."""
    assert len(check_file(dump(tool, model, tmp_path / "n1.json", n=1), tool, model, tmp_path)) == 1
    n_prompt = len(rendered_prompt_ids(tool, model, tmp_path))
    ctx = n_prompt + 3
    steps = check_file(dump(tool, model, tmp_path / "c.json", n=10, ctx=ctx), tool, model, tmp_path, ctx=ctx)
    assert len(steps) == ctx - n_prompt - 1


def test_top_k_is_capped_at_128(tool, model, tmp_path):
    text = dump(tool, model, tmp_path / "k.json", n=1, top_k=200)
    steps = check_file(text, tool, model, tmp_path, top_k=128)
    assert len(steps[0]["top_logprobs"]) == 128
