"""`cmake --install` gives a prefix that works on its own (cmake/install.cmake, tools/common/repo_paths).

The build is installed into a temporary prefix, which is then renamed (the binaries must find their
data from where they are, not from where they were installed). Every tool runs from an empty working
directory with DS4_NO_SOURCE_FALLBACK=1, so the source tree this build came from cannot be the one
that answers, and DS4_PRINT_PATHS=1 shows which place each data path came from.
"""
import os
import re
import shutil
import subprocess

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SUMMARY = re.compile(r"^(\d+) passed, (\d+) failed, (\d+) skipped$", re.M)
PATH_LINE = re.compile(r"^ds4: data (\S+) -> (.*) \((cwd|install|source|not found)\)$", re.M)
TOOLS = ("ds4", "ds4-test", "ds4-bench", "ds4-mkmodel", "ds4-quantize", "ds4-gguf-dump", "ds4-convert")
DATA = ("models/ds4-vocab.gguf", "models/promessi-mini-q8_0.gguf", "tests/test-vectors/official.vec",
        "tests/test-vectors/manifest.json",
        "tests/test-vectors/prompts/short_italian_fact.txt",
        "tests/test-vectors/official/short_italian_fact.official.json",
        "tests/model/fixtures/flash_mini/index.json", "tests/model/fixtures/flash_mini/model-f32.gguf")


@pytest.fixture(scope="module")
def prefix(bin_dir, tmp_path_factory):
    build = os.path.dirname(bin_dir) if os.path.basename(bin_dir) == "bin" else bin_dir
    base = tmp_path_factory.mktemp("install")
    first = base / "first"
    r = subprocess.run(["cmake", "--install", build, "--prefix", str(first)], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
    if not (first / "share" / "ds4cpp").is_dir():
        pytest.fail(f"{build} has no install rules for the data: reconfigure it (cmake -B {build})")
    moved = base / "moved"
    first.rename(moved)
    yield moved
    shutil.rmtree(base, ignore_errors=True)


@pytest.fixture
def run(prefix, tmp_path):
    """Runs an installed tool from an empty folder, the source-tree fallback off."""
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    env = {k: v for k, v in os.environ.items()
           if k not in ("DS4_TEST_MODEL", "DS4_TEST_VECTOR_FILE", "DS4_PARITY_GGUF_DIR")}
    env.update(DS4_NO_SOURCE_FALLBACK="1", DS4_PRINT_PATHS="1")

    def go(name, *args, timeout=600, bin_path=None):
        exe = bin_path or str(prefix / "bin" / name)
        # errors="replace": a random model's text can hold invalid UTF-8 (byte-level tokens), which
        # the CLI passes through as it comes.
        return subprocess.run([exe, *args], cwd=cwd, env=env, capture_output=True, text=True, errors="replace",
                              timeout=timeout)
    go.cwd = cwd
    return go


def lookups(stderr):
    return {rel: (path, origin) for rel, path, origin in PATH_LINE.findall(stderr)}


def test_layout(prefix):
    for t in TOOLS:
        assert os.access(prefix / "bin" / t, os.X_OK), t
    for rel in DATA:
        assert (prefix / "share" / "ds4cpp" / rel).is_file(), rel
    # Only the tools: unit tests and micro-benchmarks stay in the build.
    assert not (prefix / "bin" / "test_runtime_session").exists()
    assert not list((prefix / "share" / "ds4cpp").rglob("*.safetensors"))


def test_mkmodel_cli_and_ds4_test(prefix, run):
    r = run("ds4-mkmodel", "--shape", "tiny", "--out", "x.gguf", "-q")
    assert r.returncode == 0, r.stderr
    assert (run.cwd / "x.gguf").is_file()

    r = run("ds4", "-m", "x.gguf", "-p", "hi", "-n", "2", "-t", "2", "--seed", "7")
    assert r.returncode == 0, r.stderr

    r = run("ds4-test", "--all", "-t", "2")
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    m = SUMMARY.search(r.stdout)
    assert m and int(m.group(1)) > 0 and int(m.group(2)) == 0, r.stdout[-3000:]
    found = lookups(r.stderr)
    data = str(prefix / "share" / "ds4cpp")
    for rel in ("models/ds4-vocab.gguf", "tests/test-vectors/official.vec", "tests/model/fixtures"):
        assert rel in found, r.stderr
        path, origin = found[rel]
        assert origin == "install" and path == os.path.join(data, rel), (rel, path, origin)


def test_mkmodel_default_vocab_comes_from_the_prefix(prefix, run):
    r = run("ds4-mkmodel", "--shape", "tiny", "--out", "y.gguf", "-q")
    assert r.returncode == 0, r.stderr
    found = lookups(r.stderr)
    assert "models/ds4-vocab.gguf" in found, r.stderr
    path, origin = found["models/ds4-vocab.gguf"]
    assert origin == "install" and path == str(prefix / "share" / "ds4cpp" / "models" / "ds4-vocab.gguf")


def test_binary_without_its_prefix_finds_nothing(prefix, run, tmp_path):
    """The control: the same binary outside the prefix, fallback off, resolves no data at all."""
    lonely = tmp_path / "lonely" / "bin"
    lonely.mkdir(parents=True)
    shutil.copy2(prefix / "bin" / "ds4-test", lonely / "ds4-test")
    r = run("ds4-test", "--list", bin_path=str(lonely / "ds4-test"))
    assert r.returncode == 0, r.stderr
    found = lookups(r.stderr)
    assert found and all(origin == "not found" for _, origin in found.values()), r.stderr
