#!/usr/bin/env python3
"""Expected outputs of the model's numeric primitives, from independent implementations:
ml_dtypes' float8_e4m3fn / float4_e2m1fn casts (round to nearest even) for the FP8 / FP4
simulations, scipy's Sylvester Hadamard matrix for the rotation. Writes fixtures/primitives.json.
    python3 tests/runtime/gen_primitive_fixtures.py
"""
import json
import os

import ml_dtypes
import numpy as np
import scipy.linalg

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures", "primitives.json")


def pow2_ceil(r):
    m, e = np.frexp(np.float32(r))  # r = m * 2^e, m in [0.5, 1)
    return np.float32(np.ldexp(np.float32(1.0), int(e - 1 if m == 0.5 else e)))


def block_sim(x, block, qmax, floor, dtype):
    x = x.astype(np.float32).copy()
    for b in range(0, len(x), block):
        blk = x[b:b + block]
        s = pow2_ceil(np.float32(max(np.abs(blk).max(), floor)) / np.float32(qmax))
        q = np.clip(blk / s, -qmax, qmax).astype(dtype).astype(np.float32)
        x[b:b + block] = q * s
    return x


def grid(dtype):
    """Every finite non-negative value of a small float format, ascending."""
    bits = np.arange(256, dtype=np.uint8) if dtype == ml_dtypes.float8_e4m3fn else np.arange(16, dtype=np.uint8)
    vals = bits.view(dtype).astype(np.float32) if dtype == ml_dtypes.float8_e4m3fn else \
        np.array([0, .5, 1, 1.5, 2, 3, 4, 6], np.float32)
    vals = vals[np.isfinite(vals) & (vals >= 0)]
    return np.unique(vals)


def vectors(rng, n, count, dtype, qmax):
    g = grid(dtype)
    mids = (g[:-1] + g[1:]) / 2  # exact ties between neighbouring codes
    out = []
    for i in range(count):
        mag = 10.0 ** rng.uniform(-6, 3)
        v = (rng.standard_normal(n) * mag).astype(np.float32)
        if i % 4 == 1:
            # A block scaled to exactly 2^-k, holding tie values of the grid at that scale.
            k = float(rng.integers(-4, 12))
            v = (rng.choice(mids, n) * rng.choice([-1, 1], n)).astype(np.float32) * np.float32(2.0 ** -k)
            v[::32] = np.float32(qmax * 2.0 ** -k)
        if i % 4 == 2:
            v[::3] = 0.0
        out.append(v.astype(np.float32))
    out.append(np.zeros(n, np.float32))
    return out


def main():
    rng = np.random.default_rng(20261130)
    fixtures = {"fp8": [], "fp4": [], "hadamard": []}
    for v in vectors(rng, 448, 24, ml_dtypes.float8_e4m3fn, 448.0) + vectors(rng, 48, 8, ml_dtypes.float8_e4m3fn, 448.0):
        fixtures["fp8"].append({"x": v.tolist(), "y": block_sim(v, 64, 448.0, 1e-4, ml_dtypes.float8_e4m3fn).tolist()})
    for v in vectors(rng, 128, 24, ml_dtypes.float4_e2m1fn, 6.0) + vectors(rng, 32, 8, ml_dtypes.float4_e2m1fn, 6.0):
        fixtures["fp4"].append({"x": v.tolist(), "y": block_sim(v, 32, 6.0, 7.052966104933725e-38, ml_dtypes.float4_e2m1fn).tolist()})
    for n in (32, 64, 128):
        for _ in range(4):
            v = rng.standard_normal(n).astype(np.float32)
            h = scipy.linalg.hadamard(n).astype(np.float64) @ v.astype(np.float64) / np.sqrt(n)
            fixtures["hadamard"].append({"x": v.tolist(), "y": h.tolist()})
    fixtures["generator"] = f"ml_dtypes {ml_dtypes.__version__}, scipy {scipy.__version__}, numpy {np.__version__}"
    os.makedirs(os.path.dirname(OUT), exist_ok=True)
    with open(OUT, "w") as f:
        json.dump(fixtures, f)
    print("wrote", OUT, os.path.getsize(OUT), "bytes")


if __name__ == "__main__":
    main()
