"""--gpus LIST, --layer-split LIST and --split layers|tensors in ds4, ds4-bench, ds4-test and ds4-server (tools/common/backend_option.h,
docs/CLI.md "Several GPUs").

Malformed lists, --gpus with --cpu, and split layers that are 0 or not ascending are bad usage (exit 2, one
line naming the flag); a split at or past the layer count is bad input once the file is read (exit 2). On the
CPU backend --layer-split runs the ranges one after the other and prints what the unsplit run prints, token for
token. A device list on a machine where CUDA cannot start, or naming a device that does not exist, is a runtime
failure (exit 1, one line naming CUDA) on either kind of machine, so these cases never skip.
"""
import os
import re

import pytest
from cli_run import run, write_tiny

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TEXT = os.path.join(REPO, "bench", "data", "promessi_sposi.txt")
TOOLS = ["ds4", "ds4-bench", "ds4-test", "ds4-server"]


@pytest.fixture(scope="module")
def tiny(tool, tmp_path_factory):
    return write_tiny(tool, tmp_path_factory.mktemp("gpus") / "tiny.gguf")


def ds4_args(tiny):
    return ["-m", tiny, "-p", "Write a haiku about the sea", "-n", "12", "--temp", "0", "--nothink", "-c", "256",
            "-t", "2"]


def one_line_failure(name, p, code, *words):
    assert p.returncode == code, (p.returncode, p.stdout[-2000:], p.stderr[-2000:])
    lines = p.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"{name}: "), p.stderr
    for w in words:
        assert w in lines[0], lines[0]
    for mark in ("terminate called", "Traceback", "Segmentation fault", "Aborted", "core dumped"):
        assert mark not in p.stderr


@pytest.mark.parametrize("name", TOOLS)
@pytest.mark.parametrize("flags,words", [
    (["--gpus", "a"], ["--gpus", "separated by commas"]),
    (["--gpus", "0,,1"], ["--gpus", "separated by commas"]),
    (["--gpus", "-1"], []),  # CLI11 may take "-1" for a flag: exit 2 either way
    (["--gpus", "1024"], ["--gpus", "0 to 1023"]),
    (["--cpu", "--gpus", "0"], ["--cpu and --gpus name different backends"]),
    (["--layer-split", "0"], ["--layer-split", "ascending and above 0"]),
    (["--layer-split", "3,2"], ["--layer-split", "ascending and above 0"]),
    (["--layer-split", "2,x"], ["--layer-split", "separated by commas"]),
    (["--split", "tensors"], ["--split tensors: name two or more GPUs"]),
    (["--split", "tensors", "--gpus", "0"], ["--split tensors: name two or more GPUs"]),
    (["--split", "tensors", "--gpus", "0,1", "--layer-split", "2"], ["--split tensors and --layer-split"]),
    (["--split", "rows"], ["--split"]),
])
def test_malformed_placement_is_a_usage_error(tool, tiny, name, flags, words):
    args = {"ds4": ["-m", tiny, "-p", "x", "-n", "1"], "ds4-bench": ["-m", tiny, "--prompt-file", TEXT],
            "ds4-test": ["--kv-roundtrip"], "ds4-server": ["-m", tiny, "--port", "1"]}[name]
    p = run(tool, name, *args, *flags, "-t", "2")
    assert p.returncode == 2, (flags, p.stderr)
    if words:
        one_line_failure(name, p, 2, *words)


def test_a_split_past_the_last_layer_is_bad_input(tool, tiny):
    p = run(tool, "ds4", *ds4_args(tiny), "--layer-split", "6")  # the tiny shape has 6 layers
    one_line_failure("ds4", p, 2, "layer split at 6", "below the layer count (6)")


def test_cpu_layer_split_prints_what_the_unsplit_run_prints(tool, tiny):
    whole = run(tool, "ds4", *ds4_args(tiny))
    assert whole.returncode == 0 and whole.stdout, whole.stderr
    for split in ("1", "3", "2,4", "1,2,3,4,5"):
        p = run(tool, "ds4", *ds4_args(tiny), "--layer-split", split)
        assert p.returncode == 0, p.stderr
        assert p.stdout == whole.stdout, split


@pytest.mark.parametrize("name", ["ds4", "ds4-bench"])
def test_a_device_that_cannot_start_is_a_runtime_failure(tool, tiny, name):
    """Devices 1000 and 1001 exist nowhere: a machine without CUDA says so, one with CUDA names the device."""
    args = ds4_args(tiny) if name == "ds4" else ["-m", tiny, "--prompt-file", TEXT, "--ctx-start", "16",
                                                  "--ctx-max", "16", "-n", "2", "-t", "2"]
    p = run(tool, name, *args, "--gpus", "1000,1001")
    one_line_failure(name, p, 1)
    assert re.search(r"cuda|device", p.stderr, re.I), p.stderr
    assert p.stdout == ""


@pytest.mark.parametrize("name", TOOLS)
def test_help_lists_the_placement_flags(tool, name):
    p = run(tool, name, "--help")
    assert p.returncode == 0
    assert "--gpus LIST" in p.stdout and "--layer-split LIST" in p.stdout, p.stdout
    assert "--split" in p.stdout and "layers,tensors" in p.stdout, p.stdout
