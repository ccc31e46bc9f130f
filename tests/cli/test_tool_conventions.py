"""What every tool shares (docs/CLI.md): one --version string, and the exit-code table at the end of
--help, the same words as docs/CLI.md."""
import os
import re
import subprocess

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TOOLS = ["ds4", "ds4-bench", "ds4-test", "ds4-server", "ds4-quantize", "ds4-gguf-dump", "ds4-mkmodel"]


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


@pytest.mark.parametrize("name", TOOLS)
def test_output_that_cannot_be_written_exits_1(tool, name):
    """A full disk on stdout is a failed write (exit 1 and a message), not a success."""
    with open("/dev/full", "w") as full:
        p = subprocess.run([tool(name), "--version"], stdout=full, stderr=subprocess.PIPE, text=True, timeout=60)
    assert p.returncode == 1, p.stderr
    assert p.stderr.startswith(f"{name}: cannot write standard output"), p.stderr


def test_closed_pipe_is_a_failed_write_not_a_signal(tool):
    """`ds4 --dump-tokens ... | head -1` (megabytes of output): the tool ends with exit 1 and a
    message, not by SIGPIPE (141)."""
    vocab = os.path.join(REPO, "models", "ds4-vocab.gguf")
    book = os.path.join(REPO, "bench", "data", "promessi_sposi.txt")
    dump = subprocess.Popen([tool("ds4"), "-m", vocab, "--dump-tokens", "--prompt-file", book],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    dump.stdout.readline()
    dump.stdout.close()  # the reader goes away after one line
    _, err = dump.communicate(timeout=60)
    assert dump.returncode == 1, (dump.returncode, err)
    assert b"cannot write standard output" in err
