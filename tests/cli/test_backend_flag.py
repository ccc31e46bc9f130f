"""--backend cpu|cuda, --cuda and --cpu in ds4, ds4-bench and ds4-test (tools/common/backend_option.h), and
ds4-test --backend-parity (docs/CLI.md, "Backends").

A bad backend name is bad usage (exit 2, naming the choices). A CUDA backend that cannot start (a build
without it, or no device) is a runtime failure: exit 1 with the library's one-line message, while a bad model
file stays exit 2 whichever backend was asked for. `--backend cpu` is the default, output for output.

The CUDA cases hold on either kind of machine: where `--backend cuda` fails they check the failure, where it
works (a CUDA build on a GPU machine) they check what it prints instead, so they never skip.
"""
import csv
import io
import os
import re

import pytest
from cli_run import run, write_tiny

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TEXT = os.path.join(REPO, "bench", "data", "promessi_sposi.txt")
TOOLS = ["ds4", "ds4-bench", "ds4-test"]


@pytest.fixture(scope="module")
def tiny(tool, tmp_path_factory):
    return write_tiny(tool, tmp_path_factory.mktemp("backend") / "tiny.gguf")


def base_args(name, tiny):
    """Arguments of a short, valid run of each tool on the tiny model."""
    return {"ds4": ["-m", tiny, "-p", "Write a haiku about the sea", "-n", "8", "--temp", "0", "--nothink",
                    "-c", "256", "-t", "2"],
            "ds4-bench": ["-m", tiny, "--prompt-file", TEXT, "--ctx-start", "16", "--ctx-max", "32",
                          "--step-incr", "16", "-n", "4", "-t", "2"],
            "ds4-test": ["--kv-roundtrip", "-t", "2"]}[name]


@pytest.fixture(scope="module")
def cuda_works(tool, tiny):
    """Whether the CUDA backend starts here: a CUDA build on a machine with a device."""
    return run(tool, "ds4", "-m", tiny, "--inspect", "--cuda", "-t", "2").returncode == 0


def assert_cuda_failure(name, p):
    """Exit 1 and exactly one line on stderr, the tool's name then a message that names CUDA; no crash."""
    assert p.returncode == 1, (p.returncode, p.stdout[-2000:], p.stderr[-2000:])
    lines = p.stderr.splitlines()
    assert len(lines) == 1, p.stderr
    assert lines[0].startswith(f"{name}: ") and "cuda" in lines[0].lower(), lines[0]
    for mark in ("terminate called", "Traceback", "Segmentation fault", "Aborted", "core dumped"):
        assert mark not in p.stderr


@pytest.mark.parametrize("name", TOOLS)
@pytest.mark.parametrize("value", ["bogus", "", "CUDA", "metal", "cpu,cuda"])
def test_bad_backend_name_is_a_usage_error(tool, tiny, name, value):
    p = run(tool, name, *base_args(name, tiny), "--backend", value)
    assert p.returncode == 2, p.stderr
    assert p.stderr.count("\n") == 1, p.stderr
    assert p.stderr.startswith(f"{name}: --backend: must be cpu or cuda, got '{value}'"), p.stderr


@pytest.mark.parametrize("name", TOOLS)
@pytest.mark.parametrize("flags", [["--cpu", "--cuda"], ["--backend", "cpu", "--cuda"],
                                   ["--backend", "cuda", "--cpu"]])
def test_two_backends_at_once_are_a_usage_error(tool, tiny, name, flags):
    p = run(tool, name, *base_args(name, tiny), *flags)
    assert p.returncode == 2 and "name different backends" in p.stderr, p.stderr


@pytest.mark.parametrize("name", TOOLS)
def test_help_lists_the_backend_flags(tool, name):
    p = run(tool, name, "--help")
    assert p.returncode == 0
    assert "--backend" in p.stdout and "cpu|cuda" in p.stdout and "--cuda" in p.stdout and "--cpu" in p.stdout


def stderr_without_timings(text):
    """stderr less the lines that carry times (the speed line, ds4-bench's per-frontier lines)."""
    return [ln for ln in text.splitlines() if "t/s" not in ln]


def test_ds4_backend_cpu_is_the_default(tool, tiny):
    runs = [run(tool, "ds4", *base_args("ds4", tiny), *extra) for extra in ([], ["--backend", "cpu"], ["--cpu"])]
    for p in runs:
        assert p.returncode == 0, p.stderr
        assert re.search(r", backend cpu$", p.stderr, re.M), p.stderr  # the start-up line
        assert "backend=cpu," in p.stderr  # the context-buffers line
        assert "uploaded" not in p.stderr  # nothing to upload on the CPU
    assert runs[0].stdout and all(p.stdout == runs[0].stdout for p in runs)
    assert all(stderr_without_timings(p.stderr) == stderr_without_timings(runs[0].stderr) for p in runs)


def test_bench_backend_cpu_is_the_default(tool, tiny):
    def rows(p):
        assert p.returncode == 0, p.stderr
        assert "| backend cpu" in p.stderr and re.search(r", backend cpu$", p.stderr, re.M), p.stderr
        return [(r["ctx_tokens"], r["prefill_tokens"], r["gen_tokens"], r["tokens_sha256"])
                for r in csv.DictReader(io.StringIO(p.stdout))]
    default = rows(run(tool, "ds4-bench", *base_args("ds4-bench", tiny)))
    assert len(default) == 2
    assert rows(run(tool, "ds4-bench", *base_args("ds4-bench", tiny), "--backend", "cpu")) == default


def test_ds4_test_backend_cpu_is_the_default(tool):
    default = run(tool, "ds4-test", *base_args("ds4-test", None))
    assert default.returncode == 0 and default.stdout.endswith(" 0 failed, 0 skipped\n"), default.stdout
    p = run(tool, "ds4-test", *base_args("ds4-test", None), "--backend", "cpu")
    assert p.returncode == 0 and p.stdout == default.stdout


@pytest.mark.parametrize("name", TOOLS)
@pytest.mark.parametrize("flags", [["--backend", "cuda"], ["--cuda"]])
def test_backend_cuda(tool, tiny, cuda_works, name, flags):
    p = run(tool, name, *base_args(name, tiny), *flags)
    if not cuda_works:
        assert_cuda_failure(name, p)
        assert p.stdout == ""  # nothing ran
        return
    # A CUDA build on a GPU machine: the run works and says where the weights are.
    assert p.returncode == 0, p.stderr
    assert re.search(rf"^{name}: uploaded .* of weights \(\d+ bytes\) to .* in [\d.]+ s", p.stderr, re.M), p.stderr
    if name != "ds4-test":
        assert re.search(r", backend cuda \(.+\)$", p.stderr, re.M), p.stderr


def test_a_bad_model_file_stays_bad_input_with_cuda(tool, tiny, tmp_path):
    """The CUDA backend's failure is exit 1 only for a good file: a truncated one is exit 2, as on the CPU."""
    bad = tmp_path / "trunc.gguf"
    data = open(tiny, "rb").read()
    bad.write_bytes(data[: len(data) * 9 // 10])
    for name, args in [("ds4", ["-m", str(bad), "--inspect"]),
                       ("ds4-bench", ["-m", str(bad), "--prompt-file", TEXT, "--ctx-start", "16", "--ctx-max", "16"])]:
        for flags in ([], ["--cuda"]):
            p = run(tool, name, *args, "-t", "2", *flags)
            assert p.returncode == 2 and "truncated or corrupt file" in p.stderr, (name, flags, p.stderr)


def test_backend_parity_without_cuda_fails_with_the_reason(tool, tiny, cuda_works):
    p = run(tool, "ds4-test", "--backend-parity", "-t", "2", "-n", "4")
    if cuda_works:
        # The comparison ran: its two checks, and the per-step notes.
        assert p.returncode in (0, 1), p.stderr
        assert "max |cpu - cuda| / max |cpu|, steps 0-4:" in p.stdout, p.stdout
        assert re.search(r"^(PASS|FAIL) backend-parity: logits after the \d+-token prompt", p.stdout, re.M)
        assert re.search(r"^(PASS|FAIL) backend-parity: 4 greedy decode steps: (identical greedy tokens for 4 "
                         r"steps|first divergence at step \d+)", p.stdout, re.M), p.stdout
        return
    assert p.returncode == 1, p.stdout + p.stderr
    (fail,) = [ln for ln in p.stdout.splitlines() if ln.startswith("FAIL ")]
    assert fail.startswith("FAIL backend-parity: cannot start the CUDA backend: ") and "CUDA" in fail[40:], fail
    assert "PASS" not in p.stdout and "SKIP" not in p.stdout
    assert p.stdout.endswith("0 passed, 1 failed, 0 skipped\n")
    assert p.stderr == "ds4-test: 1 of 1 checks failed (see the report above)\n", p.stderr
    # with --cuda, the backend is refused before any mode: one line, exit 1
    assert_cuda_failure("ds4-test", run(tool, "ds4-test", "--backend-parity", "--cuda", "-t", "2"))
    # -m and a prompt of its own change nothing about that
    p = run(tool, "ds4-test", "--backend-parity", "-m", tiny, "-p", "hello", "-t", "2")
    assert p.returncode == 1 and "FAIL backend-parity: cannot start the CUDA backend" in p.stdout, p.stdout


@pytest.mark.parametrize("args, message", [
    (["--parity-bound", "-1"], "--parity-bound: must be from 0 to"),
    (["--parity-bound", "nan"], "--parity-bound: must be a number"),
    (["-n", "-1"], "--tokens: must be at least 0"),
    (["-n", "1.5"], "--tokens: must be a whole number"),
    (["-p", "a", "--prompt-file", TEXT], "specify only one prompt source"),
    (["--prompt-file", "/no/such/file"], "--prompt-file /no/such/file"),
    (["--prompt-file", REPO], "is a directory"),
])
def test_backend_parity_usage_errors(tool, args, message):
    p = run(tool, "ds4-test", "--backend-parity", "-t", "2", *args)
    assert p.returncode == 2 and message in p.stderr and p.stdout == "", p.stderr


def test_backend_parity_is_documented(tool):
    p = run(tool, "ds4-test", "--help")
    for flag in ("--backend-parity", "--parity-bound", "--prompt-file", "-n,--tokens"):
        assert flag in p.stdout, flag
    docs = open(os.path.join(REPO, "docs", "CLI.md"), encoding="utf-8").read()
    for word in ("--backend-parity", "--parity-bound", "--backend cuda", "--cuda"):
        assert word in docs, word
