"""The skip allowlist (tests/skip_allowlist.py, tests/skip_allowlist.txt) has teeth: a pytest run or a
CTest JUnit file with a skip whose reason no rule allows fails, one with only allowed skips passes.

Inner pytest runs use the plugin exactly as tests/conftest.py does (`-p skip_allowlist`) on test files
written into a temporary folder; the CTest side parses JUnit files in the format `ctest
--output-junit` writes (CMake 3.25: status="notrun" and the test's output in <system-out>, where
GoogleTest prints "FILE:LINE: Skipped" then the message).
"""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import skip_allowlist as sa  # noqa: E402


# The inner runs check the mechanism against rules of their own, not the repo's list.
INNER_RULES = "test_inner.py::test_gpu  no CUDA device\n"


def run_inner(tmp_path: Path, body: str, **env) -> subprocess.CompletedProcess:
    (tmp_path / "test_inner.py").write_text(textwrap.dedent(body))
    (tmp_path / "rules.txt").write_text(INNER_RULES)
    e = dict(os.environ, PYTHONPATH=str(HERE), DS4_SKIP_ALLOWLIST=str(tmp_path / "rules.txt"))
    e.pop("DS4_ALLOW_ANY_SKIP", None)
    e.update(env)
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "skip_allowlist", "-q", "-rs", "-p",
                           "no:cacheprovider", str(tmp_path)], capture_output=True, text=True, env=e, timeout=120,
                          cwd=tmp_path)


ALLOWED_SKIP = """
    import pytest
    def test_passes():
        assert True
    def test_gpu():
        pytest.skip("no CUDA device on this machine")
"""

UNLISTED_SKIP = """
    import pytest
    def test_passes():
        assert True
    def test_oracle():
        pytest.skip("llama_cpp is not importable")
"""


def test_allowed_skip_passes(tmp_path):
    p = run_inner(tmp_path, ALLOWED_SKIP)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "allowed: test_inner.py::test_gpu: no CUDA device on this machine" in p.stdout


def test_unlisted_skip_fails_the_run_although_every_test_passed(tmp_path):
    p = run_inner(tmp_path, UNLISTED_SKIP)
    assert p.returncode == 1, p.stdout + p.stderr
    assert "NOT ALLOWED: test_inner.py::test_oracle: llama_cpp is not importable" in p.stdout
    assert "1 passed, 1 skipped" in p.stdout


def test_unlisted_module_skip_fails(tmp_path):
    p = run_inner(tmp_path, """
        import pytest
        pytest.importorskip("no_such_module_anywhere")
        def test_never():
            pass
    """)
    assert p.returncode == 1, p.stdout + p.stderr
    assert "NOT ALLOWED" in p.stdout and "no_such_module_anywhere" in p.stdout


def test_skipif_marker_is_checked(tmp_path):
    p = run_inner(tmp_path, """
        import pytest
        @pytest.mark.skipif(True, reason="safetensors missing")
        def test_marked():
            pass
    """)
    assert p.returncode == 1 and "NOT ALLOWED: test_inner.py::test_marked: safetensors missing" in p.stdout, p.stdout


def test_override_reports_without_failing(tmp_path):
    p = run_inner(tmp_path, UNLISTED_SKIP, DS4_ALLOW_ANY_SKIP="1")
    assert p.returncode == 0, p.stdout + p.stderr
    assert "NOT ALLOWED: test_inner.py::test_oracle" in p.stdout and "not failing" in p.stdout


def test_a_failure_stays_a_failure(tmp_path):
    p = run_inner(tmp_path, """
        def test_fails():
            assert False
    """)
    assert p.returncode == 1


def test_rules_are_scoped_to_their_tests():
    rules = sa.load_rules()
    assert sa.allowed(rules, "test_model_loading.RealModel.ShortGreedyContinuation",
                      "DS4_TEST_MODEL is not set: no published GGUF to run")
    # the same reason elsewhere is not allowed
    assert not sa.allowed(rules, "test_runtime_session.Session.Something", "DS4_TEST_MODEL is not set")
    assert not sa.allowed(rules, "tests/llamacpp/test_llamacpp_parity.py::test_f32_same_model[synthetic]",
                          "llama_cpp is not importable (ModuleNotFoundError: No module named 'llama_cpp')")
    assert not sa.allowed(rules, "tests/llamacpp/test_llamacpp_parity.py::test_f32_same_model[flash_ratios]",
                          "could not import 'torch': No module named 'torch'")
    assert sa.allowed(rules, "tests/model/test_convert.py::test_official_fp8_fp4_dequant",
                      "could not import 'torch': No module named 'torch'")
    # no GPU: only the CUDA kernel tests may say so
    assert sa.allowed(rules, "test_cuda.CudaQ8_0.ActivationQuantizerEqualsCpuOnRandomRows", "no CUDA device")
    assert not sa.allowed(rules, "tests/cli/test_cli.py::test_help", "no CUDA device")
    assert not sa.allowed(rules, "test_runtime_session.Session.Something", "no GPU")


def junit(cases: str) -> str:
    return f'<?xml version="1.0" encoding="UTF-8"?>\n<testsuite name="Linux" tests="3">\n{cases}\n</testsuite>\n'


PASSED = ('<testcase name="test_quant_ref.SimdLevelCap.Ds4SimdValues" classname="test_quant_ref.SimdLevelCap" '
          'time="0.01" status="run"><system-out>[ RUN      ] SimdLevelCap.Ds4SimdValues\n'
          '[       OK ] SimdLevelCap.Ds4SimdValues (0 ms)</system-out></testcase>')


def skipped_case(name: str, reason: str) -> str:
    test = name.split(".", 1)[1]
    return (f'<testcase name="{name}" classname="{name.rsplit(".", 1)[0]}" time="0.01" status="notrun">'
            f'<skipped message="SKIP_REGULAR_EXPRESSION_MATCHED"/><system-out>[ RUN      ] {test}\n'
            f'../tests/x.cpp:24: Skipped\n{reason}\n\n[  SKIPPED ] {test} (0 ms)</system-out></testcase>')


@pytest.mark.parametrize("reason,want_rc", [("DS4_TEST_MODEL is not set: no published GGUF to run", 0),
                                            ("model.gguf not present", 1)])
def test_ctest_junit(tmp_path, reason, want_rc):
    f = tmp_path / "ctest.xml"
    f.write_text(junit(PASSED + skipped_case("test_model_loading.RealModel.ShortGreedyContinuation", reason)))
    p = subprocess.run([sys.executable, str(HERE / "skip_allowlist.py"), "ctest", str(f)], capture_output=True,
                       text=True, timeout=60)
    assert p.returncode == want_rc, p.stdout
    assert f"RealModel.ShortGreedyContinuation: {reason}" in p.stdout
    assert "2 tests, 1 skipped" in p.stdout


def test_ctest_junit_without_tests_fails(tmp_path):
    f = tmp_path / "ctest.xml"
    f.write_text(junit(""))
    assert sa.check_ctest_junit(f, sa.load_rules()) == 1
