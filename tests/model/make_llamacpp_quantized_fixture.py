#!/usr/bin/env python3
"""llama.cpp's top-1 tokens on the quantized flash_ratios files, the reference of
tests/model/test_transformers_parity.cpp's TransformersDeviation.QuantizedMixes.

    # needs llama-cpp-python 0.3.36 (bundles llama.cpp's deepseek4) and a build with ds4-quantize;
    # writes tests/model/fixtures/flash_ratios_llamacpp/top1.json
    DS4_BUILD_DIR=build python3 tests/model/make_llamacpp_quantized_fixture.py

The quantized files are the ones CTest makes: the converter's f32 GGUF of flash_ratios
(make_tiny_models.py --gguf-dir) requantized by `ds4-quantize --quant q8_0|q4`. Their sha256 is
recorded: the C++ test compares it with the file it tests, so a quantizer change that makes these
numbers stale fails there instead of passing silently.

llama.cpp (tests/llamacpp/test_llamacpp_parity.py's subprocess mode) evaluates the fixture prompt of
flash_ratios (its 155 token ids: prompt and greedy continuation) on each file, with an f32 KV cache
(ours runs with f32 cache rows and the QAT simulation off, as transformers has none), once as one
prefill batch and once token by token: two runs of the same engine that differ only in its
batching. For each the fixture keeps the top-1 token at every position and how many of them equal
transformers' top-1 on the f32 model (fixtures/flash_ratios). The test requires our top-1
agreement with transformers on the quantized file to be at least the lower of llama.cpp's two:
an independent engine on the same file is the reference for how far quantization moves this
model's greedy tokens, not our own earlier measurement.
"""
from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path.insert(0, str(HERE))
import tiny_models as tm  # noqa: E402
from make_tiny_models import build_gguf  # noqa: E402

MIXES = ("q8_0", "q4")
OUT = HERE / "fixtures" / "flash_ratios_llamacpp" / "top1.json"
LLAMA = REPO / "tests" / "llamacpp" / "test_llamacpp_parity.py"
CONFIGS = {"f32 KV, one prefill batch": ["--kv", "f32", "--batch", "512"],
           "f32 KV, token by token": ["--kv", "f32", "--batch", "1"]}


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def main() -> int:
    import llama_cpp

    build = Path(os.environ.get("DS4_BUILD_DIR", REPO / "build"))
    quantize = build / "bin" / "ds4-quantize"
    if not quantize.exists():
        raise SystemExit(f"{quantize} not found: set DS4_BUILD_DIR")
    fx = json.loads((tm.fixture_dir("flash_ratios") / "index.json").read_text())
    (prompt,) = fx["prompts"]
    tokens = prompt["tokens"]
    ref = np.fromfile(tm.fixture_dir("flash_ratios") / prompt["files"]["logits"]["file"], "<f4")
    ref_top1 = ref.reshape(len(tokens), -1).argmax(1)
    out = {"format": 1, "generator": "tests/model/make_llamacpp_quantized_fixture.py",
           "llama_cpp_python_version": llama_cpp.__version__, "model": "flash_ratios",
           "prompt": prompt["name"], "tokens": tokens,
           "transformers_top1": [int(t) for t in ref_top1], "mixes": {}}
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        f32 = build_gguf("flash_ratios", tmp / "flash_ratios-f32.gguf", "f32")
        (tmp / "tokens.json").write_text(json.dumps(tokens))
        for mix in MIXES:
            g = tmp / f"flash_ratios-{mix}.gguf"
            subprocess.run([str(quantize), str(f32), str(g), "--quant", mix, "-q"], check=True)
            entry = {"gguf_sha256": sha256(g), "quantize": f"ds4-quantize flash_ratios-f32.gguf --quant {mix}",
                     "llamacpp": {}}
            for cname, args in CONFIGS.items():
                o = tmp / f"{mix}-{args[-1]}.f32"
                p = subprocess.run([sys.executable, str(LLAMA), "llama", str(g), str(tmp / "tokens.json"), str(o)]
                                   + args, capture_output=True, text=True, timeout=600)
                if p.returncode != 0:
                    raise SystemExit(f"llama.cpp failed on {mix}: {p.stderr[-2000:]}")
                top1 = np.fromfile(o, np.float32).reshape(len(tokens), -1).argmax(1)
                entry["llamacpp"][cname] = {"top1": [int(t) for t in top1],
                                            "top1_equal_to_transformers": int((top1 == ref_top1).sum())}
                print(f"{mix} {cname}: top-1 equal to transformers at "
                      f"{int((top1 == ref_top1).sum())}/{len(tokens)} positions")
            out["mixes"][mix] = entry
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(out, indent=1) + "\n")
    print(f"wrote {OUT} ({OUT.stat().st_size} bytes)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
