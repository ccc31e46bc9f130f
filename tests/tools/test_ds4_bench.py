"""ds4-bench (tools/bench): the frontier CSV on the tiny model, --runs medians, and the release gate.

The gate is tested against baselines made by editing a CSV the tool itself wrote: slower than us
(passes), more than PCT faster than us (fails), other generated tokens (fails), other frontiers (fails).
"""
import csv
import io
import os
import re
import statistics
import subprocess

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TEXT = os.path.join(REPO, "bench", "data", "promessi_sposi.txt")
COLUMNS = ("ctx_tokens,prefill_tokens,prefill_tps,gen_tokens,gen_tps,kvcache_bytes,"
           "ttft_ms,first_decode_ms,p50_ms,p95_ms,max_rss_bytes,tokens_sha256").split(",")
SPEED = {"prefill_tps": "higher", "gen_tps": "higher", "ttft_ms": "lower", "first_decode_ms": "lower",
         "p50_ms": "lower", "p95_ms": "lower"}


@pytest.fixture(scope="module")
def tiny(tool, tmp_path_factory):
    path = tmp_path_factory.mktemp("bench") / "tiny.gguf"
    subprocess.run([tool("ds4-mkmodel"), "--shape", "tiny", "--quant", "q8_0", "--seed", "3", "--out", str(path),
                    "-q", "--vocab", os.path.join(REPO, "models", "ds4-vocab.gguf")], check=True)
    return str(path)


def bench(tool, tiny, *args):
    return subprocess.run([tool("ds4-bench"), "-m", tiny, "-t", "2", *args], capture_output=True, text=True,
                          timeout=300)


def small_sweep(tool, tiny, *args):
    return bench(tool, tiny, "--prompt-file", TEXT, "--ctx-start", "16", "--ctx-max", "48", "--step-incr", "16",
                 "-n", "8", *args)


def read_rows(text):
    rows = list(csv.DictReader(io.StringIO(text)))
    return rows


def write_rows(path, rows):
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=COLUMNS, lineterminator="\n")
        w.writeheader()
        w.writerows(rows)


@pytest.fixture(scope="module")
def measured(tool, tiny, tmp_path_factory):
    out = tmp_path_factory.mktemp("bench-csv") / "run.csv"
    p = small_sweep(tool, tiny, "--runs", "3", "--csv", str(out))
    assert p.returncode == 0, p.stderr
    return out, p.stderr


def test_csv_columns_and_frontiers(measured):
    out, _ = measured
    text = out.read_text()
    assert text.splitlines()[0] == ",".join(COLUMNS)
    rows = read_rows(text)
    assert [r["ctx_tokens"] for r in rows] == ["16", "32", "48"]
    assert all(r["prefill_tokens"] == "16" and r["gen_tokens"] == "8" for r in rows)
    for r in rows:
        assert re.fullmatch(r"[0-9a-f]{64}", r["tokens_sha256"])
        assert float(r["prefill_tps"]) > 0 and float(r["gen_tps"]) > 0
        assert float(r["ttft_ms"]) > 0 and 0 < float(r["p50_ms"]) <= float(r["p95_ms"])
        assert int(r["max_rss_bytes"]) > 10 * 2**20
    # the live KV state grows with the frontier
    kv = [int(r["kvcache_bytes"]) for r in rows]
    assert kv[0] < kv[1] < kv[2]


def test_rows_are_medians_of_the_runs(measured):
    """The CSV's throughputs are the medians of the per-run values ds4-bench printed while measuring."""
    out, stderr = measured
    per_run = {}
    for m in re.finditer(r"run (\d)/3 ctx (\d+): prefill 16 tokens ([\d.]+) t/s, gen 8 tokens ([\d.]+) t/s", stderr):
        per_run.setdefault(m.group(2), []).append((float(m.group(3)), float(m.group(4))))
    rows = read_rows(out.read_text())
    assert sorted(per_run) == sorted(r["ctx_tokens"] for r in rows)
    for r in rows:
        runs = per_run[r["ctx_tokens"]]
        assert len(runs) == 3
        assert float(r["prefill_tps"]) == pytest.approx(statistics.median(p for p, _ in runs), abs=0.006)
        assert float(r["gen_tps"]) == pytest.approx(statistics.median(g for _, g in runs), abs=0.006)


def test_tokens_are_the_same_in_another_process(tool, tiny, measured):
    out, _ = measured
    p = small_sweep(tool, tiny)
    assert p.returncode == 0, p.stderr
    again = read_rows(p.stdout)
    first = read_rows(out.read_text())
    assert [(r["tokens_sha256"], r["kvcache_bytes"]) for r in again] == \
           [(r["tokens_sha256"], r["kvcache_bytes"]) for r in first]


def scaled(rows, factor):
    """Baseline `factor` times faster than `rows` (factor < 1: slower)."""
    out = []
    for r in rows:
        r = dict(r)
        for col, better in SPEED.items():
            v = float(r[col])
            r[col] = f"{v * factor:.3f}" if better == "higher" else f"{v / factor:.3f}"
        out.append(r)
    return out


def gate(tool, tiny, tmp_path, rows, pct="100"):
    base = tmp_path / "baseline.csv"
    write_rows(base, rows)
    return small_sweep(tool, tiny, "--baseline", str(base), "--max-regress", pct, "--csv", str(tmp_path / "new.csv"))


def test_gate_passes_against_a_slower_baseline(tool, tiny, measured, tmp_path):
    p = gate(tool, tiny, tmp_path, scaled(read_rows(measured[0].read_text()), 0.1))
    assert p.returncode == 0, p.stderr
    assert "gate passed" in p.stderr and "REGRESSION" not in p.stderr
    assert (tmp_path / "new.csv").exists()


def test_gate_fails_against_a_faster_baseline(tool, tiny, measured, tmp_path):
    p = gate(tool, tiny, tmp_path, scaled(read_rows(measured[0].read_text()), 10))
    assert p.returncode == 1, p.stderr
    assert "gate FAILED" in p.stderr
    for col in SPEED:
        assert re.search(rf"REGRESSION ctx 16 {col}: .* slower \(limit 100%\)", p.stderr), col


def test_gate_fails_on_other_tokens(tool, tiny, measured, tmp_path):
    rows = scaled(read_rows(measured[0].read_text()), 0.1)
    rows[1]["tokens_sha256"] = "0" * 64
    p = gate(tool, tiny, tmp_path, rows)
    assert p.returncode == 1, p.stderr
    assert re.search(r"MISMATCH ctx 32 tokens_sha256: [0-9a-f]{64} vs baseline 0{64}", p.stderr)
    assert "REGRESSION" not in p.stderr


def test_gate_fails_on_other_frontiers(tool, tiny, measured, tmp_path):
    rows = scaled(read_rows(measured[0].read_text()), 0.1)
    p = gate(tool, tiny, tmp_path, rows[:2])
    assert p.returncode == 1 and "MISMATCH ctx 48: no baseline row" in p.stderr


def test_step_mul_and_chat_prompt(tool, tiny):
    p = bench(tool, tiny, "--prompt-file", TEXT, "--ctx-start", "16", "--ctx-max", "40", "--step-mul", "1.5", "-n", "2")
    assert p.returncode == 0, p.stderr
    rows = read_rows(p.stdout)
    assert [(r["ctx_tokens"], r["prefill_tokens"]) for r in rows] == [("16", "16"), ("24", "8"), ("36", "12"),
                                                                        ("40", "4")]
    p = bench(tool, tiny, "--chat-prompt-file", os.path.join(REPO, "tests", "test-vectors", "prompts",
                                                             "long_code_audit.txt"),
              "-sys", "", "--ctx-start", "32", "--ctx-max", "32", "--gen-tokens", "3")
    assert p.returncode == 0, p.stderr
    (row,) = read_rows(p.stdout)
    assert row["ctx_tokens"] == "32" and row["gen_tokens"] == "3"


def test_usage_errors(tool, tiny):
    p = bench(tool, tiny, "--prompt-file", TEXT, "--metal")
    assert p.returncode == 2 and "not part of ds4cpp" in p.stderr
    p = bench(tool, tiny, "--prompt-file", TEXT, "--chat-prompt-file", TEXT)
    assert p.returncode == 2 and "exactly one of" in p.stderr
    p = bench(tool, tiny, "--prompt-file", TEXT, "--ctx-start", "16", "--ctx-max", "32", "-n", "4", "--ctx-alloc", "36")
    assert p.returncode == 2 and "must exceed --ctx-max + --gen-tokens = 36" in p.stderr
    p = bench(tool, tiny, "--chat-prompt-file", os.path.join(REPO, "tests", "test-vectors", "prompts",
                                                             "short_reasoning_plain.txt"), "--ctx-max", "4096")
    assert p.returncode == 2 and "the prompt has" in p.stderr
