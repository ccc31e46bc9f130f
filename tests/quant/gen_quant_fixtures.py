#!/usr/bin/env python3
"""Writes the oracle fixtures for tests/quant (test_quant_ref and friends).

Every expected value here comes from gguf-py (PyPI `gguf`, whose numpy (de)quantizers are
bit-exact with ggml) or from numpy itself, never from ds4cpp:

  <fmt>.blocks          random raw blocks (random bytes, then valid finite scales written in)
  <fmt>.dequant.f32     gguf.quants.dequantize of those blocks
                        (q8_k: gguf-py has no Q8_K, so numpy computes d * q, see q8_k_dequantize)
  q8_0.quantize.in.f32 / q8_0.quantize.out      gguf.quants.quantize(..., Q8_0)
  q8_k.quantize.in.f32 / q8_k.quantize.out      the ds4 activation quantizer of docs/MODEL.md 5.5,
                                                written out in numpy below (q8_k_quantize)
  f16_all.f32           numpy float16 -> float32 of all 65536 bit patterns
  f32_to_f16.in.f32 / f32_to_f16.out.u16        numpy float32 -> float16 (round to nearest even)
  f32_to_bf16.in.f32 / f32_to_bf16.out.u16      gguf.quants.quantize(..., BF16) (ggml rounding)
  iq2xxs_grid.u8        gguf-py's IQ2_XXS grid, 256 entries x 8 bytes
  iq2_ksigns.u8         gguf-py's IQ2 sign table, 128 bytes
  ggml_quant_sizes.txt  gguf-py's GGML_QUANT_SIZES: "id name block_elems block_bytes" per line

All files are little-endian. Run from anywhere:
    python3 tests/quant/gen_quant_fixtures.py [--out DIR]
(default DIR is tests/quant/fixtures next to this script). Fixed seeds: re-running gives the
same bytes, which tests/quant/test_fixtures_current.py checks.
"""
from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
from gguf import quants
from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType as QT

SEED = 20240611
N_SMALL_BLOCKS = 512   # Q8_0 and MXFP4 blocks (32 values each)
N_SUPER_BLOCKS = 128   # Q2_K, Q4_K, IQ2_XXS and Q8_K super-blocks (256 values each)
N_FLOAT_VALUES = 4096  # F16 / BF16 rows


def random_f16_scales(rng: np.random.Generator, n: int) -> np.ndarray:
    """Finite f16 bit patterns of both signs: mostly normals in [2^-14, 2^6), some subnormals,
    a few zeros, so that every dequantized value is finite."""
    sign = rng.integers(0, 2, n, dtype=np.uint16) << 15
    exponent = rng.integers(1, 21, n, dtype=np.uint16)  # biased 1..20: 2^-14 .. 2^5
    mantissa = rng.integers(0, 1024, n, dtype=np.uint16)
    kind = rng.random(n)
    exponent = np.where(kind < 0.05, 0, exponent)  # subnormal (or zero when mantissa is 0)
    mantissa = np.where(kind > 0.98, 0, mantissa)
    exponent = np.where(kind > 0.99, 0, exponent)  # exact zero
    return (sign | (exponent.astype(np.uint16) << 10) | mantissa).astype(np.uint16)


def random_blocks(rng: np.random.Generator, qtype: QT, n_blocks: int) -> np.ndarray:
    """Random bytes for n_blocks blocks, with the scale fields replaced by finite values."""
    type_size = GGML_QUANT_SIZES[qtype][1]
    blocks = rng.integers(0, 256, (n_blocks, type_size), dtype=np.uint8)

    def put_f16(offset: int) -> None:
        blocks[:, offset:offset + 2] = random_f16_scales(rng, n_blocks).view(np.uint8).reshape(-1, 2)

    if qtype == QT.Q8_0:
        put_f16(0)
    elif qtype == QT.Q2_K:
        put_f16(80)  # d
        put_f16(82)  # dmin
    elif qtype == QT.Q4_K:
        put_f16(0)  # d
        put_f16(2)  # dmin
    elif qtype == QT.IQ2_XXS:
        put_f16(0)
    elif qtype == QT.MXFP4:
        # E8M0 exponent: 0..250 keeps 12 * 2^(e-128) finite; 0, 1 and 2 hit the subnormal cases.
        blocks[:, 0] = rng.integers(0, 251, n_blocks, dtype=np.uint8)
        blocks[:3, 0] = [0, 1, 2]
    else:
        raise ValueError(qtype)
    return blocks


def random_finite_f16(rng: np.random.Generator, n: int) -> np.ndarray:
    bits = rng.integers(0, 1 << 16, n, dtype=np.uint32).astype(np.uint16)
    return np.where((bits & 0x7C00) == 0x7C00, bits & 0xBFFF, bits).astype(np.uint16)


def random_finite_bf16(rng: np.random.Generator, n: int) -> np.ndarray:
    bits = rng.integers(0, 1 << 16, n, dtype=np.uint32).astype(np.uint16)
    return np.where((bits & 0x7F80) == 0x7F80, bits & 0xBFFF, bits).astype(np.uint16)


# Q8_K block: f32 d, int8 q[256], int16 bsums[16] (292 bytes). gguf-py has no Q8_K class.
Q8K_DTYPE = np.dtype([("d", "<f4"), ("q", "i1", 256), ("bsums", "<i2", 16)])
assert Q8K_DTYPE.itemsize == 292


def random_q8_k_blocks(rng: np.random.Generator, n_blocks: int) -> np.ndarray:
    blocks = np.zeros(n_blocks, dtype=Q8K_DTYPE)
    # The power in float64, then rounded (as activation_rows does): numpy's float32 power is
    # not the same to the last bit across numpy versions and CPUs (2.4 on an AVX2 dispatch gave
    # other bits than the committed fixture), a float64 power rounded to f32 is.
    magnitude = (10.0 ** rng.uniform(-6, 2, n_blocks).astype(np.float32).astype(np.float64)).astype(np.float32)
    sign = np.where(rng.random(n_blocks) < 0.5, np.float32(-1), np.float32(1))
    blocks["d"] = (magnitude * sign).astype(np.float32)
    blocks["q"] = rng.integers(-128, 128, (n_blocks, 256), dtype=np.int8)
    blocks["bsums"] = blocks["q"].astype(np.int32).reshape(n_blocks, 16, 16).sum(axis=2)
    return blocks


def q8_k_dequantize(blocks: np.ndarray) -> np.ndarray:
    """value_i = d * q_i, one f32 multiply (ggml dequantize_row_q8_K)."""
    return (blocks["d"].reshape(-1, 1) * blocks["q"].astype(np.float32)).astype(np.float32)


def q8_k_quantize(x: np.ndarray) -> np.ndarray:
    """docs/MODEL.md 5.5: vmax = the first element of largest |x| (signed); iscale = -127/vmax;
    q = clamp(rint(iscale*x), -128, 127) (round half to even); d = 1/iscale; all zero if
    vmax == 0; bsums[k] = sum of q[16k .. 16k+15]. All arithmetic in f32."""
    x = x.astype(np.float32).reshape(-1, 256)
    out = np.zeros(x.shape[0], dtype=Q8K_DTYPE)
    for b, row in enumerate(x):
        vmax = row[np.argmax(np.abs(row))]  # argmax returns the first maximal index
        if vmax == 0:
            continue
        iscale = np.float32(-127.0) / vmax
        q = np.clip(np.rint(iscale * row), -128, 127).astype(np.int8)
        out[b]["d"] = np.float32(1.0) / iscale
        out[b]["q"] = q
        out[b]["bsums"] = q.astype(np.int32).reshape(16, 16).sum(axis=1)
    return out


def activation_rows(rng: np.random.Generator, n_blocks: int, block: int) -> np.ndarray:
    """f32 blocks for the activation quantizers: gaussian blocks of varied scale, plus edge
    cases (all zero, one nonzero, max-abs negative, ties of |max|, values that land near .5
    after scaling)."""
    x = rng.standard_normal((n_blocks, block)).astype(np.float32)
    x *= (np.float32(10.0) ** rng.uniform(-4, 3, (n_blocks, 1))).astype(np.float32)
    x[0] = 0
    x[1] = 0
    x[1, 5] = -3.5
    x[2, 7] = -np.abs(x[2]).max() * 2  # largest magnitude is negative
    x[3, 0] = 1.0
    x[3, 1] = -1.0
    x[3, 2:] = rng.uniform(-0.9, 0.9, block - 2)  # tie between +1 and -1 for max |x|
    # values k/2 * amax/127: x*id falls close to .5 boundaries
    x[4] = (rng.integers(-254, 255, block) / 2 * (3.0 / 127)).astype(np.float32)
    x[4, 0] = 3.0
    return x


def f32_conversion_inputs(rng: np.random.Generator) -> np.ndarray:
    """f32 values that exercise f16 rounding: all exponents around the f16 range, exact ties
    half-way between two f16 values, the overflow edge, subnormals, signed zeros, infinities."""
    n = 8192
    exps = rng.integers(127 - 30, 127 + 20, n, dtype=np.uint32)
    bits = (rng.integers(0, 2, n, dtype=np.uint32) << 31) | (exps << 23) | rng.integers(0, 1 << 23, n, dtype=np.uint32)
    values = bits.view(np.float32)
    # exact ties: an f16 value plus half an f16 ulp, for normal and subnormal f16 values
    h = random_finite_f16(rng, 1024)
    lo = h.view(np.float16).astype(np.float32)
    hi = (h + 1).astype(np.uint16).view(np.float16).astype(np.float32)
    ties = ((lo.astype(np.float64) + hi.astype(np.float64)) / 2).astype(np.float32)
    ties = ties[np.isfinite(ties) & (np.abs(ties) < 65504)]
    specials = np.array([0.0, -0.0, np.inf, -np.inf, 65504.0, 65519.99, 65520.0, -65520.0, 1e10,
                         2.0**-24, 2.0**-25, 2.0**-25 * 1.0000001, 2.0**-26, 2.0**-14, 1e-45, -1e-45,
                         6.1e-05, 1.0, -1.0, 0.1, 1.0 / 3.0], dtype=np.float32)
    return np.concatenate([values, ties, specials]).astype(np.float32)


def bf16_conversion_inputs(rng: np.random.Generator) -> np.ndarray:
    bits = rng.integers(0, 1 << 32, 8192, dtype=np.uint64).astype(np.uint32)
    # ties half-way between two bf16 values, and NaNs (quiet and signalling) and infinities
    ties = (rng.integers(0, 1 << 16, 512, dtype=np.uint32) << 16) | np.uint32(0x8000)
    specials = np.array([0x7F800000, 0xFF800000, 0x7FC00000, 0x7F800001, 0xFFFFFFFF, 0x7F7FFFFF,
                         0x7F7F8000, 0x00000001, 0x80008000, 0x3F808000, 0x3F818000], dtype=np.uint32)
    return np.concatenate([bits, ties, specials]).view(np.float32)


def write(out: Path, name: str, data: np.ndarray | bytes) -> None:
    raw = data if isinstance(data, bytes) else np.ascontiguousarray(data).tobytes()
    (out / name).write_bytes(raw)


def generate(out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(SEED)

    # dequantization: random valid blocks and gguf-py's answer
    for qtype, n_blocks in ((QT.Q8_0, N_SMALL_BLOCKS), (QT.MXFP4, N_SMALL_BLOCKS),
                            (QT.Q2_K, N_SUPER_BLOCKS), (QT.Q4_K, N_SUPER_BLOCKS),
                            (QT.IQ2_XXS, N_SUPER_BLOCKS)):
        blocks = random_blocks(rng, qtype, n_blocks)
        values = quants.dequantize(blocks, qtype).astype(np.float32)
        assert values.shape == (n_blocks, GGML_QUANT_SIZES[qtype][0])
        assert np.isfinite(values).all(), qtype.name
        write(out, f"{qtype.name.lower()}.blocks", blocks)
        write(out, f"{qtype.name.lower()}.dequant.f32", values)

    f16 = random_finite_f16(rng, N_FLOAT_VALUES)
    write(out, "f16.blocks", f16)
    write(out, "f16.dequant.f32", quants.dequantize(f16.view(np.uint8), QT.F16).astype(np.float32))
    bf16 = random_finite_bf16(rng, N_FLOAT_VALUES)
    write(out, "bf16.blocks", bf16)
    write(out, "bf16.dequant.f32", quants.dequantize(bf16.view(np.uint8), QT.BF16).astype(np.float32))

    q8k = random_q8_k_blocks(rng, N_SUPER_BLOCKS)
    write(out, "q8_k.blocks", q8k)
    write(out, "q8_k.dequant.f32", q8_k_dequantize(q8k))

    # activation quantizers
    x = activation_rows(rng, 256, 32)
    write(out, "q8_0.quantize.in.f32", x)
    write(out, "q8_0.quantize.out", quants.quantize(x, QT.Q8_0))
    x = activation_rows(rng, 48, 256)
    write(out, "q8_k.quantize.in.f32", x)
    write(out, "q8_k.quantize.out", q8_k_quantize(x))

    # float conversions
    all_f16 = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16)
    write(out, "f16_all.f32", all_f16.view(np.float16).astype(np.float32))
    x = f32_conversion_inputs(rng)
    write(out, "f32_to_f16.in.f32", x)
    with np.errstate(over="ignore"):  # values past 65520 become inf, as they should
        write(out, "f32_to_f16.out.u16", x.astype(np.float16).view(np.uint16))
    x = bf16_conversion_inputs(rng)
    write(out, "f32_to_bf16.in.f32", x)
    write(out, "f32_to_bf16.out.u16", quants.quantize(x, QT.BF16).view(np.uint16))

    # IQ2_XXS tables as gguf-py holds them
    quants.IQ2_XXS.init_grid()
    grid = quants.IQ2_XXS.grid.reshape(256, 8)
    write(out, "iq2xxs_grid.u8", grid.astype(np.uint8))
    write(out, "iq2_ksigns.u8", bytes(quants.IQ2_XXS.ksigns))

    lines = [f"{int(t)} {t.name} {b} {s}" for t, (b, s) in sorted(GGML_QUANT_SIZES.items(), key=lambda kv: int(kv[0]))]
    (out / "ggml_quant_sizes.txt").write_text("\n".join(lines) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "fixtures")
    args = parser.parse_args()
    generate(args.out)


if __name__ == "__main__":
    main()
