"""The published quant mixes end to end: ds4-quantize --quant q2, and ds4-convert --quant q2/q4 (an f16
conversion into a temporary file, then ds4-quantize), on the tiny flash_ratios model of tests/model
(hidden and expert widths 256, so its experts fit the 256-value IQ2_XXS / Q2_K / Q4_K blocks).

Each file must hold the mix's routed-expert types (gguf-py reads them), decode close to the f32
weights and load (`ds4 --inspect` names the mix). The converter must leave no temporary file behind,
whether it succeeds or fails, and say what is wrong when ds4-quantize is missing or refuses the model.

What the engine computes on a requantized file is checked on trained_ratios (flash_ratios' shape
trained on a synthetic language, tests/model/tiny_models.py: top-1 margins ~14 logits, so rounding
cannot flip a prediction): its q2 and q4 mixes, made by ds4-quantize from the f32 conversion and by
ds4-convert --quant from the checkpoint, must give at every position of its 159-token fixture
sequence the top-1 token of llama.cpp's deepseek4 on the same file (through llama-cpp-python, as in
tests/llamacpp) and of transformers on the f32 model (the committed fixture logits), with our
default settings (FP8/FP4 simulation on) and with the simulation off.
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

np = pytest.importorskip("numpy")
gguf = pytest.importorskip("gguf")

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests" / "model"))
import tiny_models as tm  # noqa: E402
from tiny_models import ds4_convert  # noqa: E402

sys.path.insert(0, str(REPO / "tests" / "llamacpp"))
import test_llamacpp_parity as llamacpp  # noqa: E402  (its llama.cpp runner and comparison helpers)

CONVERT = REPO / "tools" / "convert" / "ds4-convert"
ROUTED = ("ffn_gate_exps", "ffn_up_exps", "ffn_down_exps")
MIX_TYPES = {"q2": ("IQ2_XXS", "IQ2_XXS", "Q2_K"), "q4": ("Q4_K", "Q4_K", "Q4_K")}
# Relative rms error of each routed-expert tensor against the f32 weights (Gaussian-like), measured:
# IQ2_XXS 0.3436-0.3439, Q2_K 0.2963-0.2967, Q4_K 0.0712-0.0715 (tests/quant: 0.346, 0.295, 0.071).
MAX_REL_RMS = {"IQ2_XXS": 0.36, "Q2_K": 0.31, "Q4_K": 0.075}


@pytest.fixture(scope="module")
def hf_dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("hf")
    return {m: tm.write_hf_dir(m, root / m) for m in ("flash_ratios", "flash_mini")}


@pytest.fixture(scope="module")
def f32_gguf(hf_dirs, tmp_path_factory):
    out = tmp_path_factory.mktemp("f32") / "flash_ratios-f32.gguf"
    ds4_convert.convert(hf_dirs["flash_ratios"], out, "f32", log=lambda m: None)
    return out


def tensors_by_name(path: Path) -> dict:
    return {t.name: t for t in gguf.GGUFReader(str(path)).tensors}


def check_mix(tool, path: Path, f32: Path, mix: str) -> None:
    got, ref = tensors_by_name(path), tensors_by_name(f32)
    layers = sorted({int(n.split(".")[1]) for n in got if n.startswith("blk.")})
    for il in layers:
        for role, want in zip(ROUTED, MIX_TYPES[mix]):
            name = f"blk.{il}.{role}.weight"
            t = got[name]
            assert t.tensor_type.name == want, (name, t.tensor_type.name)
            x = np.asarray(ref[name].data, np.float64).reshape(-1)
            y = gguf.quants.dequantize(t.data, t.tensor_type).astype(np.float64).reshape(-1)
            err = np.sqrt(((x - y) ** 2).sum() / (x ** 2).sum())
            assert err < MAX_REL_RMS[want], (name, err)
    p = subprocess.run([tool("ds4"), "--inspect", "-m", str(path)], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    assert f"routed experts: {mix}" in p.stdout, p.stdout


def run_convert(hf: Path, out: Path, quant: str, quantizer: str):
    env = dict(os.environ, DS4_QUANTIZE=quantizer)
    return subprocess.run([str(CONVERT), str(hf), str(out), "--quant", quant], capture_output=True, text=True,
                          env=env, timeout=600)


def test_ds4_quantize_q2(tool, f32_gguf, tmp_path):
    out = tmp_path / "q2.gguf"
    p = subprocess.run([tool("ds4-quantize"), str(f32_gguf), str(out), "--quant", "q2", "-q"],
                       capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr
    check_mix(tool, out, f32_gguf, "q2")
    # rows are quantized in parallel: the file must not depend on the thread count
    for threads in ("1", "3"):
        other = tmp_path / f"q2-t{threads}.gguf"
        p = subprocess.run([tool("ds4-quantize"), str(f32_gguf), str(other), "--quant", "q2", "-q", "-t", threads],
                           capture_output=True, text=True, timeout=600)
        assert p.returncode == 0, p.stderr
        assert other.read_bytes() == out.read_bytes(), f"-t {threads} wrote a different file"


@pytest.mark.parametrize("mix", ["q2", "q4"])
def test_ds4_convert_requantized_mixes(tool, hf_dirs, f32_gguf, tmp_path, mix):
    out = tmp_path / f"{mix}.gguf"
    p = run_convert(hf_dirs["flash_ratios"], out, mix, tool("ds4-quantize"))
    assert p.returncode == 0, p.stderr
    assert sorted(os.listdir(tmp_path)) == [out.name], "the temporary f16 file must be removed"
    check_mix(tool, out, f32_gguf, mix)


def test_ds4_convert_q2_when_ds4_quantize_fails(tool, hf_dirs, tmp_path):
    # flash_mini's hidden width is 64: its experts cannot be stored in 256-value blocks
    out = tmp_path / "mini-q2.gguf"
    p = run_convert(hf_dirs["flash_mini"], out, "q2", tool("ds4-quantize"))
    assert p.returncode == 2  # the checkpoint cannot take this mix: bad input (docs/CLI.md)
    assert "ds4-quantize --quant q2 failed" in p.stderr and "cannot be stored as IQ2_XXS" in p.stderr, p.stderr
    assert os.listdir(tmp_path) == [], "neither the temporary f32 file nor a partial output may remain"


def test_ds4_convert_q2_without_ds4_quantize(hf_dirs, tmp_path, monkeypatch):
    p = run_convert(hf_dirs["flash_ratios"], tmp_path / "x.gguf", "q2", str(tmp_path / "no-such-binary"))
    # a DS4_QUANTIZE that names no program is a bad environment: exit 2 (docs/CLI.md)
    assert p.returncode == 2 and "DS4_QUANTIZE=" in p.stderr and "not an executable" in p.stderr, p.stderr
    assert os.listdir(tmp_path) == []
    # no DS4_QUANTIZE, no build/bin next to the script, nothing on PATH
    monkeypatch.delenv("DS4_QUANTIZE", raising=False)
    monkeypatch.setattr(ds4_convert, "__file__", str(tmp_path / "a" / "b" / "ds4_convert.py"))
    monkeypatch.setattr(ds4_convert.shutil, "which", lambda name: None)
    with pytest.raises(ds4_convert.ConvertError, match="need the C\\+\\+ requantizer ds4-quantize"):
        ds4_convert.convert(hf_dirs["flash_ratios"], tmp_path / "x.gguf", "q2")
    assert os.listdir(tmp_path) == []


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """trained_ratios: its HF checkpoint, f32 conversion, fixture tokens and transformers' logits."""
    import json
    d = tmp_path_factory.mktemp("trained")
    hf = tm.write_hf_dir("trained_ratios", d / "hf")
    f32 = d / "trained_ratios-f32.gguf"
    ds4_convert.convert(hf, f32, "f32", log=lambda m: None)
    idx = json.loads((tm.fixture_dir("trained_ratios") / "index.json").read_text(encoding="utf-8"))
    prompt = idx["prompts"][0]
    tokens = [int(t) for t in prompt["tokens"]]
    tf = np.fromfile(tm.fixture_dir("trained_ratios") / prompt["files"]["logits"]["file"],
                     dtype=np.float32).reshape(len(tokens), -1)
    return {"hf": hf, "f32": f32, "tokens": tokens, "tf": tf}


@pytest.mark.skipif(bool(llamacpp.LLAMA_IMPORT_ERROR), reason=f"llama_cpp is not importable "
                    f"({llamacpp.LLAMA_IMPORT_ERROR}): scripts/setup.sh installs llama-cpp-python 0.3.36")
@pytest.mark.parametrize("how", ["ds4-quantize", "ds4-convert"])
@pytest.mark.parametrize("mix", ["q2", "q4"])
def test_requantized_trained_model_top1_equals_llamacpp_and_transformers(tool, trained, tmp_path, mix, how):
    path = tmp_path / f"trained_ratios-{mix}.gguf"
    if how == "ds4-quantize":
        p = subprocess.run([tool("ds4-quantize"), str(trained["f32"]), str(path), "--quant", mix, "-q"],
                           capture_output=True, text=True, timeout=600)
    else:
        p = run_convert(trained["hf"], path, mix, tool("ds4-quantize"))
    assert p.returncode == 0, p.stderr
    check_mix(tool, path, trained["f32"], mix)
    tokens = trained["tokens"]
    lc = llamacpp.run_llama(path, tokens, tmp_path, "f32")
    ours = {"default (QAT sim on)": llamacpp.run_ours(tool, path, tokens, tmp_path, qat=True),
            "QAT sim off, f32 rows": llamacpp.run_ours(tool, path, tokens, tmp_path, qat=False, f16_rows=False)}
    want_lc, want_tf = lc.argmax(1), trained["tf"].argmax(1)
    margins = llamacpp.top1_margins(lc)
    print(f"\ntrained_ratios {mix} ({how}): llama.cpp top-1 margin median {np.median(margins):.3g}, "
          f"min {margins.min():.3g}")
    # the premise: the prediction is decisive (a broken quantizer would flatten the logits)
    assert np.median(margins) >= 5.0
    assert (want_lc == want_tf).all(), "llama.cpp on the requantized file and transformers on the f32 model disagree"
    for name, o in ours.items():
        got = o.argmax(1)
        print(llamacpp.fmt(f"trained_ratios {mix} ({how}) ours {name} vs llama.cpp", llamacpp.agreement(o, lc)))
        bad = np.flatnonzero(got != want_lc)
        assert bad.size == 0, f"{name}: top-1 differs from llama.cpp at positions {bad.tolist()}"
