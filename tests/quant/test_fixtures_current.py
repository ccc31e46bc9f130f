"""The committed fixtures are exactly what gen_quant_fixtures.py writes today.

Run: python3 -m pytest tests/quant/test_fixtures_current.py
Needs numpy and gguf (gguf-py); skipped when they are missing.
"""
import filecmp
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("numpy")
pytest.importorskip("gguf")

HERE = Path(__file__).resolve().parent
COMMITTED = HERE / "fixtures"


def test_regenerated_fixtures_equal_committed(tmp_path):
    subprocess.run([sys.executable, str(HERE / "gen_quant_fixtures.py"), "--out", str(tmp_path)], check=True)
    fresh = sorted(p.name for p in tmp_path.iterdir())
    committed = sorted(p.name for p in COMMITTED.iterdir())
    assert fresh == committed, "the generator and tests/quant/fixtures list different files"
    _, mismatch, errors = filecmp.cmpfiles(COMMITTED, tmp_path, fresh, shallow=False)
    assert not mismatch and not errors, f"stale fixtures (rerun gen_quant_fixtures.py): {mismatch + errors}"


def test_fixtures_stay_small():
    total = sum(p.stat().st_size for p in COMMITTED.iterdir())
    assert total < 2 * 1024 * 1024, f"fixtures are {total} bytes"
