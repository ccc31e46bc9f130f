"""The engine against llama.cpp's deepseek4 (through llama-cpp-python) on the same token ids.

llama.cpp is an independent implementation of DeepSeek V4 Flash that loads the published GGUF
layout. Both engines evaluate the same token ids on the same GGUF and their logits are compared at
every position (ours: tests/llamacpp/ds4_dump_logits.cpp, token by token; llama.cpp: one prefill
batch, logits_all). docs/LLAMACPP.md has the numbers and explains them.

Models (llama.cpp only supports compression ratios 4 and 128 and an indexer head width that is a
multiple of its Hadamard block, so the tiny shapes that use ratio 8 or 16 cannot be loaded):
  * flash_ratios: the tiny transformers model of tests/model/tiny_models.py (ratios 4 and 128),
    converted by tools/convert/ds4_convert.py to f32 and q8_0, and requantized by ds4-quantize to
    the q4 mix (Q4_K routed experts); its 155-token fixture prompt.
  * synthetic: ds4-mkmodel's tiny shape with ratios [0,0,4,128,4,128], indexer heads 16 x 64, real
    vocabulary, in f32, q8_0 and q2 (IQ2_XXS / Q2_K routed experts); 160 fixed token ids.
  * trained_ratios: flash_ratios' ratios trained on a synthetic language (tiny_models.py), so that
    its logits have margins of ~15; f32, q8_0, q2 and q4 as flash_ratios; its 159-token sequence.

What is asserted:
  * f32: the same model. Our engine with its FP8/FP4 simulation off and f32 cache rows against
    llama.cpp with an f32 KV cache: top-1 equal at every position and max |diff| / max |logit|
    <= 1e-4 (measured ~1e-6). llama.cpp does not simulate the FP8 KV / FP4 indexer rounding: with
    the simulation on ours differs as much as from transformers (reported, not asserted).
  * q8_0 / q4 / q2: llama.cpp's CPU kernels round differently from ds4's (F16 weights take f16
    activations; the route weight multiplies the expert output after W2 instead of its input
    before, which changes the Q8_0 activation quantization), and these tiny models amplify any
    rounding change into flipped expert / indexer selections. The bound is llama.cpp's own
    spread: our agreement with llama.cpp (f32 KV, prefill) may not be worse than llama.cpp's
    agreement with itself when only its KV cache precision (f16 vs f32) or its batching (prefill vs
    token by token: its batched Q4_K kernels round differently) changes, by more than 5 points of
    top-1 or a factor 2 in max |diff| / max |logit|.
  * trained_ratios, every mix: top-1 equal on >= 99 % of positions (the target), whatever
    our QAT simulation and cache-row settings and llama.cpp's KV precision (measured: 100 %).

The llama.cpp side runs in a subprocess (this file run as a script), so that a llama.cpp abort
fails one test instead of killing pytest.

    python3 tests/llamacpp/test_llamacpp_parity.py llama MODEL.gguf TOKENS.json OUT.f32 [--kv f32|f16] [--batch N]
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[2]


def _llama_import_error() -> str:
    try:
        import llama_cpp  # noqa: F401
    except Exception as e:  # not installed, or its shared library does not load
        return f"{type(e).__name__}: {e}"
    return ""


LLAMA_IMPORT_ERROR = _llama_import_error()
needs_llama = pytest.mark.skipif(
    bool(LLAMA_IMPORT_ERROR),
    reason=f"llama_cpp is not importable ({LLAMA_IMPORT_ERROR}): scripts/setup.sh builds llama-cpp-python "
           "0.3.36 (the release bundling llama.cpp's deepseek4 architecture)")

# ds4-mkmodel's tiny preset, changed only where llama.cpp cannot follow (see the docstring); 16
# indexer heads also make an all-zero indexer score (every head's ReLU at 0: a tie that llama.cpp
# breaks differently from ds4's lowest-row rule) improbable.
LLAMA_TINY_SHAPE = {"compress_ratio": [0, 0, 4, 128, 4, 128], "idx_head_dim": 64, "n_idx_head": 16}
SYNTH_TOKENS = [int(t) for t in np.random.RandomState(7).randint(100, 129000, size=160)]
# Tokens evaluated alone at position 0 by test_quantized_first_position_exact_with_llamacpp_rounding:
# the whole prompt (155 / 160 tokens). The share that agrees to 1e-6 is a statistic, and on 48
# tokens 3 tokens moved it by 6 points when a kernel's float association changed.
N_FIRST = 160

# llama.cpp's LLAMA_EXPERT_GATING_FUNC_TYPE_SQRT_SOFTPLUS (docs/LLAMACPP.md).
GATING_SQRT_SOFTPLUS = 4


# --------------------------------------------------------------------------------------------
# llama.cpp side (subprocess)
# --------------------------------------------------------------------------------------------

_KEEP_ALIVE: list = []


def llama_main(argv) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("tokens")
    ap.add_argument("out")
    ap.add_argument("--kv", choices=("f16", "f32"), default="f16")
    ap.add_argument("--batch", type=int, default=512)
    ap.add_argument("--fresh", action="store_true", help="every token alone at position 0")
    a = ap.parse_args(argv)
    import ctypes

    import llama_cpp

    logs: list[str] = []

    # llama.cpp's default logger decodes every piece as UTF-8 and fails on partial vocabulary tokens
    @llama_cpp.llama_log_callback
    def log(level, text, user):
        logs.append(text.decode("utf-8", "replace"))

    llama_cpp.llama_log_set(log, ctypes.c_void_p(0))
    # llama.cpp keeps calling it until the context is freed (llama_free logs): it must outlive the
    # model, or a Llama collected after this function's locals calls a freed trampoline (a segfault
    # after the scores are written, seen with --batch 1)
    _KEEP_ALIVE.append(log)
    toks = json.loads(Path(a.tokens).read_text())
    kw = dict(model_path=a.model, n_ctx=max(256, len(toks) + 1), logits_all=True, verbose=False,
              n_threads=2, n_batch=a.batch, n_ubatch=a.batch)
    if a.kv == "f32":
        kw.update(type_k=llama_cpp.GGML_TYPE_F32, type_v=llama_cpp.GGML_TYPE_F32)
    try:
        m = llama_cpp.Llama(**kw)
        if a.fresh:  # reset() rewinds to position 0; eval() then clears the caches from there
            rows = []
            for t in toks:
                m.reset()
                m.eval([t])
                rows.append(np.array(m.scores[0], dtype=np.float32))
            scores = np.stack(rows)
        else:
            m.eval(toks)
            scores = np.asarray(m.scores[:len(toks)], dtype=np.float32)
        m.close()
    except Exception as e:  # the reason is in llama.cpp's log
        sys.stderr.write("".join(logs)[-4000:] + f"\n{e}\n")
        return 1
    np.ascontiguousarray(scores).tofile(a.out)
    return 0


def run_llama(model: Path, tokens: list[int], tmp: Path, kv: str, batch: int = 512,
              fresh: bool = False) -> np.ndarray:
    tok_file, out = tmp / "tokens.json", tmp / f"llama-{model.stem}-{kv}-{batch}-{int(fresh)}.f32"
    tok_file.write_text(json.dumps(tokens))
    p = subprocess.run([sys.executable, __file__, "llama", str(model), str(tok_file), str(out), "--kv", kv,
                        "--batch", str(batch)] + (["--fresh"] if fresh else []),
                       capture_output=True, text=True, timeout=600)
    if "unknown model architecture" in p.stderr:
        pytest.skip("this llama-cpp-python's llama.cpp has no deepseek4 architecture (0.3.36 has it)")
    assert p.returncode == 0, f"llama.cpp failed on {model.name}:\n{p.stderr[-4000:]}"
    return np.fromfile(out, dtype=np.float32).reshape(len(tokens), -1)


def run_ours(tool, model: Path, tokens: list[int], tmp: Path, qat: bool, f16_rows: bool | None = None,
             llama_rounding: bool = False, fresh: bool = False):
    out = tmp / f"ours-{model.stem}-{int(qat)}-{f16_rows}-{int(llama_rounding)}-{int(fresh)}.f32"
    cmd = [tool("ds4-dump-logits"), str(model), ",".join(map(str, tokens)), str(out), "--qat", str(int(qat)),
           "--llama-rounding", str(int(llama_rounding)), "--fresh", str(int(fresh)), "--threads", "2"]
    if f16_rows is not None:
        cmd += ["--f16-rows", str(int(f16_rows))]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr
    return np.fromfile(out, dtype=np.float32).reshape(len(tokens), -1)


def agreement(a: np.ndarray, b: np.ndarray) -> dict:
    """a against the reference b: top-1 equality (%), max |a - b|, max |b| and their ratio; the median
    over positions of that position's max |a - b| / max |b| (a flipped selection moves a few
    positions by O(1); this is the typical one)."""
    d, m = float(np.abs(a - b).max()), float(np.abs(b).max())
    return {"top1": 100.0 * float((a.argmax(1) == b.argmax(1)).mean()), "max_diff": d, "max_ref": m,
            "ratio": d / m, "median_ratio": float(np.median(np.abs(a - b).max(1))) / m}


def fmt(name: str, r: dict) -> str:
    return (f"{name:44s} top-1 {r['top1']:6.2f}%  max|diff| {r['max_diff']:.3g}  max|logit| {r['max_ref']:.3g}"
            f"  ratio {r['ratio']:.3g}  (median position {r.get('median_ratio', float('nan')):.3g})")


# --------------------------------------------------------------------------------------------
# models
# --------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def models(tool, tmp_path_factory):
    """name -> (gguf path, tokens, transformers logits or None), built on first use."""
    d = tmp_path_factory.mktemp("llamacpp")
    cache: dict = {}

    def get(name: str, quant: str):
        key = (name, quant)
        if key in cache:
            return cache[key]
        path = d / f"{name}-{quant}.gguf"
        if name in ("flash_ratios", "trained_ratios"):
            pytest.importorskip("safetensors", reason="the tiny transformers models need safetensors")
            sys.path.insert(0, str(REPO / "tests" / "model"))
            from make_tiny_models import build_gguf
            import tiny_models as tm
            if quant in ("f32", "f16", "q8_0"):
                build_gguf(name, path, quant)
            else:  # the converter writes f32; ds4-quantize makes the published expert types
                subprocess.run([tool("ds4-quantize"), str(get(name, "f32")[0]), str(path), "--quant", quant, "-q"],
                               check=True)
            idx = json.loads((tm.fixture_dir(name) / "index.json").read_text(encoding="utf-8"))
            prompt = idx["prompts"][0]
            tokens = [int(t) for t in prompt["tokens"]]
            tf = np.fromfile(tm.fixture_dir(name) / prompt["files"]["logits"]["file"],
                             dtype=np.float32).reshape(len(tokens), -1)
            cache[key] = (path, tokens, tf)
        else:
            shape = d / "llama_tiny_shape.json"
            shape.write_text(json.dumps(LLAMA_TINY_SHAPE))
            subprocess.run([tool("ds4-mkmodel"), "--shape", str(shape), "--quant", quant, "--seed", "1",
                            "--vocab", str(REPO / "models" / "ds4-vocab.gguf"), "--out", str(path), "-q"],
                           check=True)
            cache[key] = (path, SYNTH_TOKENS, None)
        return cache[key]

    yield get


# --------------------------------------------------------------------------------------------
# metadata llama.cpp needs (no llama.cpp required)
# --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["flash_ratios", "synthetic", "trained_ratios"])
def test_metadata_has_the_keys_llamacpp_reads(models, name):
    gguf = pytest.importorskip("gguf", reason="gguf-py is not installed")
    path, _, _ = models(name, "q8_0")
    r = gguf.GGUFReader(str(path))

    def kv(key):
        f = r.fields[key]
        return gguf.GGUFValueType(f.types[-1]).name, f.contents()

    # llama.cpp reads these with an exact type (a u64 is refused) ...
    assert kv("deepseek4.context_length")[0] == "UINT32"
    assert kv("deepseek4.rope.scaling.original_context_length")[0] == "UINT32"
    # ... requires the gating function to be sqrt(softplus) ...
    assert kv("deepseek4.expert_gating_func") == ("UINT32", GATING_SQRT_SOFTPLUS)
    # ... and without the scaling type would apply linear, not YaRN, scaling on compressed layers
    assert kv("deepseek4.rope.scaling.type") == ("STRING", "yarn")


# --------------------------------------------------------------------------------------------
# parity
# --------------------------------------------------------------------------------------------

@needs_llama
@pytest.mark.parametrize("name", ["flash_ratios", "synthetic"])
def test_f32_same_model(tool, models, name, tmp_path):
    path, tokens, tf = models(name, "f32")
    ours = run_ours(tool, path, tokens, tmp_path, qat=False)
    lc32 = run_llama(path, tokens, tmp_path, "f32")
    lc32_step = run_llama(path, tokens, tmp_path, "f32", batch=1)
    lc16 = run_llama(path, tokens, tmp_path, "f16")
    ours_qat = run_ours(tool, path, tokens, tmp_path, qat=True)
    ours_f16 = run_ours(tool, path, tokens, tmp_path, qat=False, f16_rows=True)
    res = {
        "ours (no QAT sim, f32 rows) vs llama.cpp f32 KV": agreement(ours, lc32),
        "ours vs llama.cpp f32 KV token by token": agreement(ours, lc32_step),
        "ours (no QAT sim, f16 rows) vs llama.cpp f16 KV": agreement(ours_f16, lc16),
        "ours (QAT sim) vs llama.cpp f16 KV": agreement(ours_qat, lc16),
    }
    if tf is not None:
        res["llama.cpp f32 KV vs transformers"] = agreement(lc32, tf)
    print("\n" + "\n".join(fmt(f"{name} f32: {k}", v) for k, v in res.items()))
    for k in ("ours (no QAT sim, f32 rows) vs llama.cpp f32 KV", "ours vs llama.cpp f32 KV token by token",
              "llama.cpp f32 KV vs transformers"):
        if k in res:
            assert res[k]["top1"] == 100.0 and res[k]["ratio"] <= 1e-4, fmt(k, res[k])


@needs_llama
@pytest.mark.parametrize("name,quant", [("flash_ratios", "q8_0"), ("flash_ratios", "q4"), ("synthetic", "q8_0"),
                                        ("synthetic", "q2")])
def test_quantized_within_llamacpp_spread(tool, models, name, quant, tmp_path):
    path, tokens, _ = models(name, quant)
    ours = run_ours(tool, path, tokens, tmp_path, qat=False)
    ours_qat = run_ours(tool, path, tokens, tmp_path, qat=True)
    lc32 = run_llama(path, tokens, tmp_path, "f32")
    lc16 = run_llama(path, tokens, tmp_path, "f16")
    lc32_step = run_llama(path, tokens, tmp_path, "f32", batch=1)
    res = {
        "ours (no QAT sim) vs llama.cpp f32 KV": agreement(ours, lc32),
        "ours (no QAT sim) vs llama.cpp f16 KV": agreement(ours, lc16),
        "ours (QAT sim) vs llama.cpp f16 KV": agreement(ours_qat, lc16),
        "llama.cpp f16 KV vs llama.cpp f32 KV": agreement(lc16, lc32),
        "llama.cpp token by token vs prefill (f32 KV)": agreement(lc32_step, lc32),
    }
    print("\n" + "\n".join(fmt(f"{name} {quant}: {k}", v) for k, v in res.items()))
    us = res["ours (no QAT sim) vs llama.cpp f32 KV"]
    selfs = [res["llama.cpp f16 KV vs llama.cpp f32 KV"], res["llama.cpp token by token vs prefill (f32 KV)"]]
    spread = {"top1": min(r["top1"] for r in selfs), "max_diff": max(r["max_diff"] for r in selfs),
              "max_ref": selfs[0]["max_ref"], "ratio": max(r["ratio"] for r in selfs)}
    assert us["top1"] >= spread["top1"] - 5.0, (fmt("ours", us), fmt("llama.cpp spread", spread))
    assert us["ratio"] <= 2.0 * max(spread["ratio"], 0.01), (fmt("ours", us), fmt("llama.cpp spread", spread))


@needs_llama
@pytest.mark.parametrize("name,quant", [("flash_ratios", "q8_0"), ("flash_ratios", "q4"), ("flash_ratios", "q2"),
                                        ("synthetic", "q8_0"), ("synthetic", "q4"), ("synthetic", "q2")])
def test_quantized_first_position_exact_with_llamacpp_rounding(tool, models, name, quant, tmp_path):
    """Every kernel of a quant mix against llama.cpp's, without any cache in between.

    Each token is evaluated alone at position 0, in a fresh context, by both engines. With
    ForwardOptions::llama_cpp_rounding (f16 activations for F16 weights, llama.cpp's x86 Q8_0
    activation rounding, route weight after W2) our arithmetic is llama.cpp's up to float
    reassociation, so most tokens must agree to ~1e-7 of the largest logit: every weight format's
    dot product, the Q8_0/Q8_K activation quantizers, the F16 mixes, norms, router, hash routing
    and the HC head, on a different path through the experts per token. A reassociation
    difference occasionally lands an activation on the other side of an f16 or int8 rounding
    boundary, and these random models amplify that one step (~5e-4) to ~1e-2 of the logits, so a
    few tokens differ; a wrong kernel would move every token. (Later positions add the cache;
    test_quantized_within_llamacpp_spread covers them.)"""
    path, tokens, _ = models(name, quant)
    tokens = tokens[:N_FIRST]
    ours = run_ours(tool, path, tokens, tmp_path, qat=False, f16_rows=False, llama_rounding=True, fresh=True)
    ours_default = run_ours(tool, path, tokens, tmp_path, qat=False, f16_rows=False, fresh=True)
    lc = run_llama(path, tokens, tmp_path, "f32", fresh=True)
    res = {"ours (llama.cpp rounding) vs llama.cpp": agreement(ours, lc),
           "ours (ds4 rounding) vs llama.cpp": agreement(ours_default, lc)}
    per_token = np.abs(ours - lc).max(1) / np.abs(lc).max(1)
    close = float((per_token <= 1e-6).mean())
    print("\n" + "\n".join(fmt(f"{name} {quant} position 0: {k}", v) for k, v in res.items()) +
          f"\n{name} {quant} position 0: tokens within 1e-6 with llama.cpp rounding: {100 * close:.1f}%")
    assert close >= 0.6, f"only {100 * close:.1f}% of first tokens agree to 1e-6: {np.round(per_token, 7)}"
    assert res["ours (llama.cpp rounding) vs llama.cpp"]["top1"] >= 95.0


def top1_margins(logits: np.ndarray) -> np.ndarray:
    """Per position: the largest logit minus the second largest."""
    s = np.sort(logits, axis=1)
    return s[:, -1] - s[:, -2]


@needs_llama
@pytest.mark.parametrize("quant", ["f32", "q8_0", "q2", "q4"])
def test_trained_model_top1_agrees_over_whole_sequences(tool, models, quant, tmp_path):
    """The target, on a model whose logits have margins: top-1 equal on >= 99 % of positions.

    trained_ratios (tests/model/tiny_models.py) is trained on a synthetic language and predicts it
    with top-1 margins of ~15 logits, where the random models' are ~0.1 and llama.cpp disagrees
    with itself on their top-1 when only its KV precision changes. Every position of its 159-token
    fixture sequence (which crosses the first ratio-128 row) is compared, for every pairing of our
    settings (QAT simulation off / on, f32 / f16 cache rows) with llama.cpp's KV precisions (f32,
    f16), in the f32 model, the converter's q8_0 and ds4-quantize's q2 and q4 mixes of it. Also
    asserted: the median over positions of max |diff| / max |logit| at most 2e-2 (measured
    <= 8.5e-3); the maximum, set by a router selection flipped at a near-tied position, is reported,
    with llama.cpp's agreement with itself (f16 vs f32 KV) and both engines' agreement with
    transformers (which runs the f32 model). For f32, the same bound as test_f32_same_model."""
    path, tokens, tf = models("trained_ratios", quant)
    ours = {"no QAT sim, f32 rows": run_ours(tool, path, tokens, tmp_path, qat=False, f16_rows=False),
            "no QAT sim, f16 rows": run_ours(tool, path, tokens, tmp_path, qat=False, f16_rows=True),
            "QAT sim (default)": run_ours(tool, path, tokens, tmp_path, qat=True)}
    lc = {"f32 KV": run_llama(path, tokens, tmp_path, "f32"), "f16 KV": run_llama(path, tokens, tmp_path, "f16")}
    res = {f"ours ({o}) vs llama.cpp {k}": agreement(ours[o], lc[k]) for o in ours for k in lc}
    res["llama.cpp f16 KV vs llama.cpp f32 KV"] = agreement(lc["f16 KV"], lc["f32 KV"])
    res["ours (no QAT sim, f32 rows) vs transformers f32"] = agreement(ours["no QAT sim, f32 rows"], tf)
    res["llama.cpp f32 KV vs transformers f32"] = agreement(lc["f32 KV"], tf)
    margins = {"ours (no QAT sim, f32 rows)": top1_margins(ours["no QAT sim, f32 rows"]),
               "llama.cpp f32 KV": top1_margins(lc["f32 KV"])}
    print("\n" + "\n".join(fmt(f"trained_ratios {quant}: {k}", v) for k, v in res.items()) + "\n" +
          "\n".join(f"trained_ratios {quant}: top-1 margin of {k}: median {np.median(m):.3g}, min {m.min():.3g}"
                    for k, m in margins.items()))
    # the premise: the model predicts with margins (a retrained or badly quantized one might not)
    assert np.median(margins["llama.cpp f32 KV"]) >= 5.0
    for k, r in res.items():
        if k.startswith("ours") and "llama.cpp" in k:
            assert r["top1"] >= 99.0, fmt(k, r)
            # the largest differences come from router near-ties (top-k gaps down to 2e-4) that one
            # engine's rounding flips at a few positions; the typical position agrees to ~5e-3
            assert r["median_ratio"] <= 0.02, fmt(k, r)
    if quant == "f32":  # the same model: as tight as test_f32_same_model
        r = res["ours (no QAT sim, f32 rows) vs llama.cpp f32 KV"]
        assert r["top1"] == 100.0 and r["ratio"] <= 1e-4, fmt("f32", r)


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "llama":
        sys.exit(llama_main(sys.argv[2:]))
    sys.exit(pytest.main([__file__, "-s", *sys.argv[1:]]))
