"""ds4-convert follows the tools' conventions (docs/CLI.md): --version equal to the other tools',
the exit-code table in --help, and one-line errors with the documented codes for bad input:
2 for a missing folder, a folder without config.json, a truncated safetensors file, an output that is
a folder, a bad argument; never a Python traceback."""
import json
import os
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
CONVERT = os.path.join(REPO, "tools", "convert", "ds4-convert")

gguf = pytest.importorskip("gguf")
import tiny_models as tm  # noqa: E402


def convert(*args, cwd=None):
    return subprocess.run([CONVERT, *map(str, args)], capture_output=True, text=True, timeout=300, cwd=cwd)


def one_line_error(p, code):
    assert p.returncode == code, (p.returncode, p.stderr)
    assert "Traceback" not in p.stderr, p.stderr
    lines = [ln for ln in p.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("ds4-convert: "), p.stderr


def test_version_matches_the_other_tools(tool):
    want = subprocess.run([tool("ds4"), "--version"], capture_output=True, text=True).stdout.strip()
    p = convert("--version")
    assert p.returncode == 0 and p.stdout.strip() == want, (p.stdout, want)


def test_help_ends_with_the_exit_codes():
    p = convert("--help")
    assert p.returncode == 0
    assert "Exit status: 0 ok, 1 runtime failure" in p.stdout and "130 interrupted" in p.stdout


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory):
    return tm.write_hf_dir("odd_shapes", tmp_path_factory.mktemp("hf") / "odd_shapes")


def test_bad_input_is_one_line_exit_2(hf_dir, tmp_path):
    one_line_error(convert(tmp_path / "missing", tmp_path / "o.gguf"), 2)
    (tmp_path / "empty").mkdir()
    one_line_error(convert(tmp_path / "empty", tmp_path / "o.gguf"), 2)
    one_line_error(convert(hf_dir, tmp_path), 2)  # the output is a folder
    p = convert(hf_dir, tmp_path / "o.gguf", "--quant", "q3")
    assert p.returncode == 2 and "Traceback" not in p.stderr
    # a truncated safetensors file: its header claims more than the file holds
    bad = tmp_path / "bad"
    bad.mkdir()
    for f in os.listdir(hf_dir):
        src = os.path.join(hf_dir, f)
        data = open(src, "rb").read()
        (bad / f).write_bytes(data[: len(data) // 3] if f.endswith(".safetensors") else data)
    one_line_error(convert(bad, tmp_path / "o.gguf"), 2)
    # a config.json that is not JSON
    (bad / "config.json").write_text("{not json")
    one_line_error(convert(bad, tmp_path / "o.gguf"), 2)
