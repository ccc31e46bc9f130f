#!/usr/bin/env python3
"""Decode and prefill speed of llama.cpp (llama-cpp-python) and ds4cpp on the same GGUF, in one run.

Both engines get the same token ids: a prompt of --prompt-tokens ids from the book (tokenized by
ds4 --dump-tokens), then --gen-tokens greedy steps. llama.cpp: Llama.eval on the prompt, then one
token per eval; ds4cpp: ds4-bench with one frontier. Prints a table; speeds in tokens/s.

    python3 bench/compare_llamacpp.py --model small-q2.gguf --bin build/bin --threads 2
"""
import argparse
import csv
import json
import os
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def prompt_ids(bin_dir, model, n):
    text = open(os.path.join(REPO, "bench", "data", "promessi_sposi.txt"), encoding="utf-8").read()[: n * 8]
    out = subprocess.run([os.path.join(bin_dir, "ds4"), "-m", model, "--dump-tokens", "-p", text],
                         check=True, capture_output=True, text=True).stdout
    ids = json.loads(out.splitlines()[0])
    if len(ids) < n:
        sys.exit(f"only {len(ids)} prompt tokens")
    return ids[:n]


def llamacpp(model, ids, gen, threads):
    from llama_cpp import Llama
    llm = Llama(model_path=model, n_ctx=len(ids) + gen + 8, n_threads=threads, n_threads_batch=threads,
                n_batch=256, verbose=False)
    import numpy as np

    # Without logits_all, Llama.eval no longer copies logits into llm.scores (0.3.x); the context
    # holds the last evaluated token's row.
    def greedy():
        return int(np.ctypeslib.as_array(llm._ctx.get_logits(), shape=(llm.n_vocab(),)).argmax())

    t0 = time.perf_counter()
    llm.eval(ids)
    t1 = time.perf_counter()
    tok = greedy()
    steps = []
    for _ in range(gen):
        s = time.perf_counter()
        llm.eval([tok])
        steps.append(time.perf_counter() - s)
        tok = greedy()
    steps.sort()
    return len(ids) / (t1 - t0), gen / sum(steps), steps[len(steps) // 2] * 1e3


def ds4cpp(bin_dir, model, ids, gen, threads):
    with tempfile.TemporaryDirectory() as d:
        # ds4-bench reads a text; feed it the same ids' text by decoding them is lossy, so give it
        # the book and the same frontier length: the prompt ids are the book's first tokens too.
        out = os.path.join(d, "bench.csv")
        subprocess.run([os.path.join(bin_dir, "ds4-bench"), "-m", model, "-t", str(threads), "--prompt-file",
                        os.path.join(REPO, "bench", "data", "promessi_sposi.txt"), "--ctx-start", str(len(ids)),
                        "--ctx-max", str(len(ids)), "--gen-tokens", str(gen), "--csv", out],
                       check=True, capture_output=True)
        row = next(csv.DictReader(open(out)))
        return float(row["prefill_tps"]), float(row["gen_tps"]), float(row["p50_ms"])


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--bin", default=os.path.join(REPO, "build", "bin"))
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--prompt-tokens", type=int, default=128)
    ap.add_argument("--gen-tokens", type=int, default=16)
    a = ap.parse_args()
    ids = prompt_ids(a.bin, a.model, a.prompt_tokens)
    rows = [("ds4cpp", *ds4cpp(a.bin, a.model, ids, a.gen_tokens, a.threads)),
            ("llama.cpp", *llamacpp(a.model, ids, a.gen_tokens, a.threads))]
    print(f"model {os.path.basename(a.model)}, {a.prompt_tokens} prompt tokens, {a.gen_tokens} generated, "
          f"{a.threads} threads, load {os.getloadavg()[0]:.2f}")
    print("| engine | prefill t/s | decode t/s | decode p50 ms |\n|---|---|---|---|")
    for name, p, g, m in rows:
        print(f"| {name} | {p:.2f} | {g:.2f} | {m:.1f} |")


if __name__ == "__main__":
    main()
