"""What the CLI tests share: running a built tool, and writing the tiny synthetic model."""
import os
import subprocess

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def run(tool, name, *args, timeout=300):
    """Runs the built tool `name` with `args`: the CompletedProcess, stdout and stderr as text."""
    return subprocess.run([tool(name), *args], capture_output=True, text=True, errors="replace", timeout=timeout)


def write_tiny(tool, path, quant="q8_0", seed=3):
    """`ds4-mkmodel --shape tiny` with the real vocabulary at `path`; returns the path as a string."""
    subprocess.run([tool("ds4-mkmodel"), "--shape", "tiny", "--quant", quant, "--seed", str(seed), "--out",
                    str(path), "-q", "--vocab", os.path.join(REPO, "models", "ds4-vocab.gguf")],
                   check=True, timeout=300)
    return str(path)
