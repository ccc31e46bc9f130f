"""What every tool shares (docs/CLI.md): one --version string, and the exit-code table at the end of
--help, the same words as docs/CLI.md."""
import os
import re
import subprocess

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TOOLS = ["ds4", "ds4-bench", "ds4-test", "ds4-quantize", "ds4-gguf-dump", "ds4-mkmodel"]


def project_version():
    text = open(os.path.join(REPO, "CMakeLists.txt")).read()
    return re.search(r"project\(ds4cpp VERSION ([\d.]+)", text).group(1)


@pytest.mark.parametrize("name", TOOLS)
def test_version(tool, name):
    p = subprocess.run([tool(name), "--version"], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0 and p.stdout == f"ds4cpp {project_version()}\n", p.stdout + p.stderr


@pytest.mark.parametrize("name", TOOLS)
def test_help_ends_with_the_exit_codes_of_the_docs(tool, name):
    p = subprocess.run([tool(name), "--help"], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    footer = p.stdout.rstrip("\n").splitlines()[-1]
    assert footer.startswith("Exit status: 0 ok, 1 runtime failure"), footer
    assert "2 bad arguments, environment or input file" in footer and "130 interrupted (Ctrl-C)" in footer
    docs = open(os.path.join(REPO, "docs", "CLI.md"), encoding="utf-8").read()
    assert footer in docs, "docs/CLI.md does not quote the --help footer"


@pytest.mark.parametrize("name", TOOLS)
def test_usage_error_is_one_line_and_exit_2(tool, name):
    p = subprocess.run([tool(name), "--no-such-flag"], capture_output=True, text=True, timeout=60)
    assert p.returncode == 2
    assert p.stderr.count("\n") == 1 and p.stderr.startswith(f"{name}: ") and p.stderr.endswith("(see --help)\n")
