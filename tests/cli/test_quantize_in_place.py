"""ds4-quantize refuses to write its input (same path, hard link, symbolic link, another spelling):
writing truncates the output before the input is read. The input must come out untouched."""
import hashlib
import os
import subprocess

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture(scope="module")
def model(tool, tmp_path_factory):
    d = tmp_path_factory.mktemp("inplace")
    path = d / "tiny.gguf"
    subprocess.run([tool("ds4-mkmodel"), "--shape", "tiny", "--quant", "f32", "--out", str(path), "-q",
                    "--vocab", os.path.join(REPO, "models", "ds4-vocab.gguf")], check=True, timeout=300)
    os.link(path, d / "hard.gguf")
    os.symlink(path, d / "soft.gguf")
    return path


def digest(path):
    return hashlib.sha256(open(path, "rb").read()).hexdigest()


@pytest.mark.parametrize("out", ["same", "hard", "soft", "dotted"])
def test_output_that_is_the_input_is_refused(tool, model, out):
    before, mtime = digest(model), os.stat(model).st_mtime_ns
    target = {"same": str(model), "hard": str(model.parent / "hard.gguf"), "soft": str(model.parent / "soft.gguf"),
              "dotted": "./" + model.name}[out]
    p = subprocess.run([tool("ds4-quantize"), str(model), target, "--quant", "q8_0"], capture_output=True,
                       text=True, cwd=model.parent, timeout=300)
    assert p.returncode == 2, p.stderr
    assert p.stderr == f"ds4-quantize: the output {target} is the input file {model}; write to another path\n"
    assert digest(model) == before and os.stat(model).st_mtime_ns == mtime


def test_a_different_output_is_written(tool, model, tmp_path):
    out = tmp_path / "q8.gguf"
    p = subprocess.run([tool("ds4-quantize"), str(model), str(out), "--quant", "q8_0", "-q"], capture_output=True,
                       text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    assert out.stat().st_size > 0 and digest(out) != digest(model)
