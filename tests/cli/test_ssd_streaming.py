"""SSD streaming flags of ds4, ds4-bench and ds4-test (tools/common/ssd_streaming_option.h, docs/CLI.md,
docs/SSD_STREAMING.md): the start-up lines, the statistics at exit, the floor refused with exit 2, `auto`, a
bad budget, flags without --ssd-streaming, the CUDA backend refused, the ds4-bench CSV columns, ds4-test
--ssd-streaming-cache-pressure, the popularity file, and the resident set size of a streaming run.

The model: a synthetic one in the published q2 expert types with 8 layers of 256 experts (6 used) of 0.11 MiB
each, so the routed experts are about two thirds of the file (216 of 333 MiB).
"""
import csv
import io
import json
import os
import re
import subprocess
import time

import pytest
from cli_run import run

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TEXT = os.path.join(REPO, "bench", "data", "promessi_sposi.txt")
SHAPE = '{"n_layer": 8, "n_expert": 256, "n_expert_used": 6, "n_ff_exp": 512}'
N_EXPERTS = 8 * 256
# What a process of ds4 holds besides the weights it maps and the expert cache: the binary and its
# libraries, the tokenizer of the real vocabulary, the KV cache of -c 256, the batch buffers. Measured at
# 66 MiB for `ds4 --dump-tokens` (no weights) and 58 MiB above weights + cache for a streaming run.
OVERHEAD = 96 * 2**20


@pytest.fixture(scope="module")
def model(tool, tmp_path_factory):
    d = tmp_path_factory.mktemp("ssd")
    (d / "shape.json").write_text(SHAPE)
    path = d / "wide-q2.gguf"
    subprocess.run([tool("ds4-mkmodel"), "--shape", str(d / "shape.json"), "--quant", "q2", "--seed", "2",
                    "--out", str(path), "-q", "--vocab", os.path.join(REPO, "models", "ds4-vocab.gguf")],
                   check=True, timeout=600)
    return str(path)


@pytest.fixture
def cache_dir(tmp_path):
    return str(tmp_path / "cache")


def ds4_args(model, *more, n=16):
    return ["-m", model, "-p", "Write a haiku about the sea", "-n", str(n), "--temp", "0", "--nothink", "-c", "256",
            "-t", "2", *more]


def stream(cache_dir, budget, *more):
    return ["--ssd-streaming", "--ssd-streaming-cache-experts", budget, "--ssd-streaming-cache-dir", cache_dir,
            *more]


def last_line(p):
    lines = [ln for ln in p.stderr.splitlines() if ln.strip()]
    return lines[-1] if lines else ""


STATS = re.compile(r"^ds4: SSD streaming stats: (\d+) entries, (\d+) hits, (\d+) misses, hit rate ([0-9.]+)%, "
                   r"(\d+) bytes read \([0-9.]+ [MG]iB\), read bandwidth during misses ([0-9.]+ GiB/s|-), "
                   r"I/O wait [0-9.]+ s, preloaded (\d+), prefetched unused \d+$", re.M)


def test_startup_lines_stats_and_identical_text(tool, model, cache_dir):
    resident = run(tool, "ds4", *ds4_args(model))
    assert resident.returncode == 0, resident.stderr
    assert "SSD streaming" not in resident.stderr
    p = run(tool, "ds4", *ds4_args(model, *stream(cache_dir, "10%", "--ssd-streaming-cold")))
    assert p.returncode == 0, p.stderr
    assert p.stdout == resident.stdout  # the same text at a tenth of the experts
    m = re.search(r"^ds4: SSD streaming cache budget ([0-9.]+) MiB / ([0-9.]+) MiB per expert = (\d+) experts "
                  r"\(10\.0% of the 2048 routed experts\)$", p.stderr, re.M)
    assert m, p.stderr
    assert int(m.group(3)) == N_EXPERTS // 10
    assert re.search(r"^ds4: SSD streaming: resident \(mapped\): the non-routed weights, [0-9.]+ MiB \(\d+ bytes\); "
                     r"streamed: the routed experts, 216\.00 MiB \(8 layers x 256 experts", p.stderr, re.M), p.stderr
    assert re.search(r"^ds4: SSD streaming: reader (io_uring|pread pool) \(.*reads in flight\), O_DIRECT (on|off)",
                     p.stderr, re.M), p.stderr
    assert "ds4: SSD streaming: cold start (--ssd-streaming-cold): nothing preloaded" in p.stderr
    s = STATS.search(p.stderr)
    assert s, p.stderr
    entries, hits, misses, preloaded = int(s.group(1)), int(s.group(2)), int(s.group(3)), int(s.group(7))
    assert entries == N_EXPERTS // 10 and preloaded == 0
    assert misses > entries and hits + misses > 0  # a small cache evicts and reads again
    assert int(s.group(5)) == misses * 110592  # bytes read = misses x the expert's payload
    assert "ds4: SSD streaming: popularity saved to " + cache_dir in p.stderr


def test_popularity_preloads_the_next_run(tool, model, cache_dir):
    first = run(tool, "ds4", *ds4_args(model, *stream(cache_dir, "25%")))
    assert first.returncode == 0, first.stderr
    assert "from the router's bias and hash tables (no saved expert popularity" in first.stderr, first.stderr
    files = os.listdir(cache_dir)
    assert len(files) == 1 and files[0].startswith("wide-q2.gguf-") and files[0].endswith(".popularity"), files
    again = run(tool, "ds4", *ds4_args(model, *stream(cache_dir, "25%")))
    assert again.returncode == 0, again.stderr
    assert re.search(r"preloaded 512 experts \([0-9.]+ MiB\) from the popularity file ", again.stderr), again.stderr
    assert again.stdout == first.stdout
    hits = [int(STATS.search(p.stderr).group(2)) for p in (first, again)]
    assert hits[1] > hits[0], hits
    limited = run(tool, "ds4", *ds4_args(model, *stream(cache_dir, "25%", "--ssd-streaming-preload-experts", "7")))
    assert "SSD streaming: preloaded 7 experts" in limited.stderr, limited.stderr


def test_budget_below_the_floor_is_refused_with_exit_2(tool, model, cache_dir):
    for name, args in [("ds4", ds4_args(model)),
                       ("ds4-bench", ["-m", model, "--prompt-file", TEXT, "--ctx-start", "16", "--ctx-max", "16",
                                      "-n", "2", "-t", "2"])]:
        for budget in ["5", "0.5MB"]:
            p = run(tool, name, *args, *stream(cache_dir, budget))
            assert p.returncode == 2, (name, budget, p.stderr)
            assert re.fullmatch(rf"{name}: SSD streaming cache budget of \d+ experts \(.*\) is below the floor of 6 "
                                r"experts \([0-9.]+ MiB\): one token's 6 experts of one layer must fit", last_line(p)), \
                last_line(p)
    assert run(tool, "ds4", *ds4_args(model, *stream(cache_dir, "6"))).returncode == 0  # the floor itself


def test_auto_states_its_arithmetic(tool, model, cache_dir):
    p = run(tool, "ds4", *ds4_args(model, "--ssd-streaming", "--ssd-streaming-cache-dir", cache_dir))
    assert p.returncode == 0, p.stderr
    m = re.search(r"^ds4: SSD streaming cache budget auto: MemAvailable ([0-9.]+) GiB - resident weights ([0-9.]+) "
                  r"MiB - margin ([0-9.]+) GiB \(KV cache, buffers: a tenth of MemAvailable, at least 1 GiB\) = "
                  r"([0-9.]+) GiB$", p.stderr, re.M)
    assert m, p.stderr
    avail, resident, margin, budget = (float(x) for x in m.groups())
    assert margin >= 1.0 and abs(avail - resident / 1024 - margin - budget) < 0.02
    # every expert of this small model fits the machine's memory
    assert "= 2048 experts (100.0% of the 2048 routed experts: every expert fits)" in p.stderr, p.stderr
    explicit = run(tool, "ds4", *ds4_args(model, *stream(cache_dir, "auto")))
    assert "SSD streaming cache budget auto: MemAvailable" in explicit.stderr


@pytest.mark.parametrize("value", ["banana", "", "-5", "10%%", "0%", "101%", "1e3GB", "GB", "16TB", "0", "1.5",
                                   "9" * 40])
def test_bad_budget_is_a_clear_usage_error(tool, model, cache_dir, value):
    p = run(tool, "ds4", *ds4_args(model, *stream(cache_dir, value)))
    assert p.returncode == 2, (value, p.stderr)
    line = last_line(p)
    assert line.startswith("ds4: --ssd-streaming-cache-experts: "), line
    if value == "banana":
        assert line == ("ds4: --ssd-streaming-cache-experts: must be a count of experts (N), a share of them (N%), "
                        "a size (NGB or NMB, GiB or MiB) or auto, got 'banana' (see --help)"), line


@pytest.mark.parametrize("name", ["ds4", "ds4-bench", "ds4-test"])
def test_flags_need_ssd_streaming(tool, model, cache_dir, name):
    base = {"ds4": ds4_args(model), "ds4-test": ["--kv-roundtrip", "-t", "2"],
            "ds4-bench": ["-m", model, "--prompt-file", TEXT, "--ctx-start", "16", "--ctx-max", "16", "-n", "2"]}[name]
    for flag in [["--ssd-streaming-cold"], ["--ssd-streaming-cache-experts", "64"],
                 ["--ssd-streaming-preload-experts", "3"], ["--ssd-streaming-reader", "pool"],
                 ["--ssd-streaming-host-cache", "64"]]:
        p = run(tool, name, *base, *flag)
        assert p.returncode == 2 and last_line(p) == f"{name}: {flag[0]} needs --ssd-streaming", (flag, p.stderr)
    # The host tier is the CUDA backend's; on the CPU the one cache is in host memory.
    p = run(tool, name, *base, "--ssd-streaming", "--ssd-streaming-host-cache", "64")
    assert p.returncode == 2, p.stderr
    assert last_line(p).startswith(f"{name}: --ssd-streaming-host-cache sizes the host tier of the CUDA backend"), \
        last_line(p)
    p = run(tool, name, *base, "--ssd-streaming", "--ssd-streaming-host-cache", "mapped")
    assert p.returncode == 2, p.stderr
    assert last_line(p).startswith(f"{name}: --ssd-streaming-host-cache sizes the host tier of the CUDA backend"), \
        last_line(p)
    p = run(tool, name, *base, "--ssd-streaming", "--ssd-streaming-host-cache", "0")
    assert p.returncode == 2 and "--ssd-streaming-host-cache" in last_line(p), p.stderr
    # mapped is a host tier's form only, and the host tier's refusal names it.
    p = run(tool, name, *base, "--ssd-streaming", "--ssd-streaming-cache-experts", "mapped")
    assert p.returncode == 2 and "--ssd-streaming-cache-experts" in last_line(p), p.stderr
    assert "mapped" not in last_line(p).split("got")[0], last_line(p)
    p = run(tool, name, *base, "--ssd-streaming", "--ssd-streaming-host-cache", "banana")
    assert p.returncode == 2, p.stderr
    assert "a size (NGB or NMB, GiB or MiB), auto or mapped, got 'banana'" in last_line(p), last_line(p)
    p = run(tool, name, *base, "--ssd-streaming", "--ssd-streaming-cold", "--ssd-streaming-preload-experts", "3")
    assert p.returncode == 2 and "exclude each other" in last_line(p), p.stderr
    p = run(tool, name, *base, "--ssd-streaming", "--ssd-streaming-reader", "mmap")
    assert p.returncode == 2 and "--ssd-streaming-reader" in last_line(p), p.stderr
    h = run(tool, name, "--help")
    for flag in ["--ssd-streaming", "--ssd-streaming-cache-experts", "--ssd-streaming-cold",
                 "--ssd-streaming-preload-experts", "--ssd-streaming-cache-dir", "--ssd-streaming-reader",
                 "--ssd-streaming-buffered", "--ssd-streaming-host-cache"]:
        assert re.search(rf"^\s+{flag}\b", h.stdout, re.M), (name, flag)
    assert "N|N%|NGB|NMB|auto|mapped" in h.stdout, name


def test_bench_csv_has_the_ssd_columns_only_when_streaming(tool, model, cache_dir):
    args = ["-m", model, "--prompt-file", TEXT, "--ctx-start", "16", "--ctx-max", "32", "--step-incr", "16", "-n",
            "8", "-t", "2"]
    resident = run(tool, "ds4-bench", *args)
    assert resident.returncode == 0, resident.stderr
    header = resident.stdout.splitlines()[0].split(",")
    assert header[-1] == "tokens_sha256" and not any(c.startswith("ssd_") for c in header)
    p = run(tool, "ds4-bench", *args, *stream(cache_dir, "10%", "--ssd-streaming-cold"))
    assert p.returncode == 0, p.stderr
    rows = list(csv.DictReader(io.StringIO(p.stdout)))
    assert list(rows[0])[:len(header)] == header  # the resident columns first, unchanged
    assert list(rows[0])[len(header):] == ["ssd_entries", "ssd_hits", "ssd_misses", "ssd_hit_rate", "ssd_bytes_read",
                                           "ssd_read_gibps", "ssd_io_wait_ms", "ssd_gen_hit_rate",
                                           "ssd_gen_bytes_per_token"]
    base = list(csv.DictReader(io.StringIO(resident.stdout)))
    for r, b in zip(rows, base):
        assert r["tokens_sha256"] == b["tokens_sha256"]  # the same tokens as resident
        assert int(r["ssd_entries"]) == N_EXPERTS // 10
        assert int(r["ssd_misses"]) > 0 and int(r["ssd_bytes_read"]) == int(r["ssd_misses"]) * 110592
        assert 0 <= float(r["ssd_hit_rate"]) <= 1 and float(r["ssd_read_gibps"]) > 0
        assert int(r["ssd_gen_bytes_per_token"]) > 0
    assert re.search(r"^ds4-bench: SSD streaming stats: ", p.stderr, re.M), p.stderr


def test_ds4_test_cache_pressure_mode(tool):
    p = run(tool, "ds4-test", "--ssd-streaming-cache-pressure", "-t", "2", timeout=600)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-2000:]
    checks = [ln for ln in p.stdout.splitlines() if ln.startswith(("PASS", "FAIL", "SKIP"))]
    assert len(checks) == 8 and all(ln.startswith("PASS ssd-streaming-cache-pressure: synthetic: budget ")
                                    for ln in checks), checks
    for share in ["2.1%), cold", "4.2%), preloaded", "9.9%), cold", "25.0%), preloaded"]:
        assert any(share in ln for ln in checks), share
    assert re.search(r"^# ssd-streaming-cache-pressure: model +budget +share +host +start +hits +misses +hit rate +bytes "
                     r"read +logits$", p.stdout, re.M), p.stdout
    assert p.stdout.count(" identical\n") == 8 and "DIFFERENT" not in p.stdout
    assert "8 passed, 0 failed, 0 skipped" in p.stdout


def peak_rss(cmd):
    """VmHWM of the process from /proc, polled until it exits (the kernel keeps the peak, so the last reading is
    the peak at that time); with its stderr and exit code."""
    p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, errors="replace")
    hwm = 0
    while p.poll() is None:
        try:
            with open(f"/proc/{p.pid}/status") as f:
                for line in f:
                    if line.startswith("VmHWM:"):
                        hwm = max(hwm, int(line.split()[1]) * 1024)
        except OSError:
            pass
        time.sleep(0.002)
    return hwm, p.stderr.read(), p.returncode


def test_resident_set_stays_below_resident_weights_plus_budget_plus_overhead(tool, model, cache_dir):
    args = [tool("ds4"), *ds4_args(model, n=64)]
    hwm, err, rc = peak_rss(args + stream(cache_dir, "10%", "--ssd-streaming-cold"))
    assert rc == 0, err
    resident = int(re.search(r"the non-routed weights, [0-9.]+ MiB \((\d+) bytes\)", err).group(1))
    budget = float(re.search(r"cache budget ([0-9.]+) MiB / ", err).group(1)) * 2**20
    assert "O_DIRECT on" in err, err  # no page-cache copy of the experts read
    bound = resident + budget + OVERHEAD
    assert 0 < hwm < bound, f"VmHWM {hwm / 2**20:.1f} MiB >= {bound / 2**20:.1f} MiB"
    # The bound means something: the resident run maps every expert and goes above it.
    full, err, rc = peak_rss(args)
    assert rc == 0, err
    assert full > bound, f"resident VmHWM {full / 2**20:.1f} MiB <= {bound / 2**20:.1f} MiB"


def test_cuda_device_tier_below_the_floor_is_bad_input(tool, model, cache_dir):
    # On CUDA --ssd-streaming-cache-experts is the device tier; a count below one token's experts
    # of one layer is refused with the file's checks, before any device is asked (exit 2 on any
    # machine, with or without a GPU or a CUDA build).
    n_used = json.loads(SHAPE)["n_expert_used"]
    p = run(tool, "ds4", *ds4_args(model, "--cuda", *stream(cache_dir, str(n_used - 1))))
    assert p.returncode == 2, p.stderr
    assert f"device tier of {n_used - 1} experts is below the floor of {n_used}" in last_line(p), last_line(p)
