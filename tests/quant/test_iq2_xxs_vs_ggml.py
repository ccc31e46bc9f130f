"""Our IQ2_XXS quantizer against ggml's own, called through the ggml library that ships inside
llama-cpp-python (llama_cpp/lib/libggml-base.so): ggml_quantize_chunk(GGML_TYPE_IQ2_XXS, ...) with an
all-ones importance matrix (ggml refuses IQ2_XXS without one; ones are the weights we implement).
Our blocks come from build/bin/quantize-rows (tests/quant/quantize_rows.cpp). Both outputs are
decoded by gguf-py; we require our relative rms error within 3% of ggml's on the same rows, and the
blocks to be byte-identical (src/quant/iq2_xxs_quantize.cpp follows ggml's arithmetic step by step).

Run: DS4_BUILD_DIR=build python3 -m pytest -q tests/quant/test_iq2_xxs_vs_ggml.py
scripts/setup.sh installs llama-cpp-python and gguf-py; without them the test skips, which fails the run
(tests/skip_allowlist.txt does not allow it).
"""
from __future__ import annotations

import ctypes
import functools
import os
import subprocess
from pathlib import Path

import pytest

np = pytest.importorskip("numpy")
gguf_quants = pytest.importorskip("gguf.quants", reason="gguf-py (pip install gguf) decodes both outputs")
llama_cpp = pytest.importorskip(
    "llama_cpp", reason="llama-cpp-python is not installed: it carries the ggml library used as the oracle")
from gguf.constants import GGMLQuantizationType as QT  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
GGML_TYPE_IQ2_XXS = 16
BLOCK_BYTES = 66  # per 256 values
REL_RMS_TOLERANCE = 1.03


@functools.lru_cache(maxsize=1)
def ggml_library():
    lib_dir = Path(llama_cpp.__file__).resolve().parent / "lib"
    for name in ("libggml-base.so", "libggml.so"):
        for path in sorted(lib_dir.glob(name + "*")):
            lib = ctypes.CDLL(str(path))
            if hasattr(lib, "ggml_quantize_chunk"):
                lib.ggml_quantize_chunk.restype = ctypes.c_size_t
                lib.ggml_quantize_chunk.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64,
                                                    ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p]
                return lib
    pytest.skip(f"no ggml library exporting ggml_quantize_chunk under {lib_dir}")


def quantize_rows_binary() -> Path:
    if os.environ.get("DS4_BIN_DIR"):
        candidates = [Path(os.environ["DS4_BIN_DIR"])]
    else:
        build = Path(os.environ.get("DS4_BUILD_DIR", REPO / "build"))
        candidates = [build / "bin", build]
    for d in candidates:
        if (d / "quantize-rows").exists():
            return d / "quantize-rows"
    pytest.fail(f"quantize-rows not found in {', '.join(map(str, candidates))}: build the tests "
                "(cmake ... -DDS4_BUILD_TESTS=ON), or set DS4_BIN_DIR / DS4_BUILD_DIR")


def ggml_blocks(x: np.ndarray) -> np.ndarray:
    rows, n = x.shape
    x = np.ascontiguousarray(x, np.float32)
    imatrix = np.ones(n, np.float32)
    out = np.zeros(rows * n // 256 * BLOCK_BYTES, np.uint8)
    written = ggml_library().ggml_quantize_chunk(GGML_TYPE_IQ2_XXS, x.ctypes.data, out.ctypes.data, 0, rows, n,
                                                 imatrix.ctypes.data)
    assert written == out.nbytes
    return out.reshape(rows, -1)


def our_blocks(x: np.ndarray, tmp_path: Path) -> np.ndarray:
    rows, n = x.shape
    src, dst = tmp_path / "rows.f32", tmp_path / "rows.iq2_xxs"
    np.ascontiguousarray(x, np.float32).tofile(src)
    p = subprocess.run([str(quantize_rows_binary()), "IQ2_XXS", str(n), str(src), str(dst)],
                       capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    return np.fromfile(dst, np.uint8).reshape(rows, -1)


def relative_rms_error(x: np.ndarray, blocks: np.ndarray) -> float:
    y = gguf_quants.dequantize(blocks, QT.IQ2_XXS).astype(np.float64)
    return float(np.sqrt(((x - y) ** 2).sum() / (x.astype(np.float64) ** 2).sum()))


def rows_for(case: str) -> np.ndarray:
    rng = np.random.default_rng(20240611)
    if case == "gaussian":
        return rng.standard_normal((32, 4096)).astype(np.float32)
    if case == "gaussian_small_sigma":
        return (0.02 * rng.standard_normal((16, 4096))).astype(np.float32)
    if case == "uniform":
        return rng.uniform(-1, 1, (16, 4096)).astype(np.float32)
    if case == "half_zero":
        x = rng.standard_normal((16, 4096)).astype(np.float32)
        x[:, ::2] = 0
        return x
    if case == "outlier_and_zero_group":
        x = rng.standard_normal((8, 1024)).astype(np.float32)
        x[:, 300] = 1000
        x[:, 512 + 64:512 + 96] = 0  # one zero group in a nonzero block
        return x
    if case == "one_block_rows":
        return rng.standard_normal((64, 256)).astype(np.float32)
    raise ValueError(case)


CASES = ["gaussian", "gaussian_small_sigma", "uniform", "half_zero", "outlier_and_zero_group", "one_block_rows"]


@pytest.mark.parametrize("case", CASES)
def test_error_within_3_percent_of_ggml(case, tmp_path):
    x = rows_for(case)
    ours, theirs = our_blocks(x, tmp_path), ggml_blocks(x)
    e_ours, e_ggml = relative_rms_error(x, ours), relative_rms_error(x, theirs)
    print(f"{case}: relative rms error ours {e_ours:.5f}, ggml {e_ggml:.5f}")
    assert e_ours <= REL_RMS_TOLERANCE * e_ggml, (e_ours, e_ggml)


@pytest.mark.parametrize("case", CASES)
def test_blocks_identical_to_ggml(case, tmp_path):
    x = rows_for(case)
    ours, theirs = our_blocks(x, tmp_path), ggml_blocks(x)
    differ = (ours.reshape(-1, BLOCK_BYTES) != theirs.reshape(-1, BLOCK_BYTES)).any(axis=1)
    assert not differ.any(), (f"{int(differ.sum())} of {differ.size} blocks differ from ggml's (first: block "
                              f"{int(np.argmax(differ))}); if ggml's IQ2_XXS quantizer changed, compare the "
                              "error test above, which only asks for the same accuracy")
