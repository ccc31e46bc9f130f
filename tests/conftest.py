"""Shared pytest fixtures: where the built binaries are (DS4_BIN_DIR, else DS4_BUILD_DIR, default build/).

Every skip is checked against tests/skip_allowlist.txt (tests/skip_allowlist.py): a skip for a
reason the list does not allow fails the run."""
import os
import shutil
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import skip_allowlist  # noqa: E402


def pytest_configure(config):
    skip_allowlist.pytest_configure(config)


@pytest.fixture(scope="session")
def bin_dir():
    """DS4_BIN_DIR names the binaries' folder directly; else DS4_BUILD_DIR (default build/) or its bin/."""
    if os.environ.get("DS4_BIN_DIR"):
        d = os.path.abspath(os.environ["DS4_BIN_DIR"])
    else:
        d = os.path.abspath(os.environ.get("DS4_BUILD_DIR", os.path.join(REPO, "build")))
        d = os.path.join(d, "bin") if os.path.isdir(os.path.join(d, "bin")) else d
    if not os.path.isdir(d):
        pytest.fail(f"build directory {d} not found: build first (cmake --preset release && cmake --build build)")
    return d


@pytest.fixture(scope="session")
def tool(bin_dir):
    def find(name):
        p = os.path.join(bin_dir, name)
        if not os.path.exists(p):
            pytest.fail(f"{p} not built")
        return p
    return find


@pytest.fixture
def tmp(tmp_path):
    yield tmp_path
    shutil.rmtree(tmp_path, ignore_errors=True)
