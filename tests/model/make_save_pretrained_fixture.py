#!/usr/bin/env python3
"""What transformers' own save_pretrained writes for a DeepSeek V4 model: names, shapes, dtypes.

    # needs torch + transformers (5.24); writes tests/model/fixtures/save_pretrained/<model>.json
    python3 tests/model/make_save_pretrained_fixture.py [--models odd_shapes,flash_ratios]

A DeepseekV4ForCausalLM built from the tiny model's config (not loaded from a file), given the
tiny model's weights with load_state_dict, then save_pretrained: transformers 5.24 then writes the
official DeepSeek leaf names under a `model.` prefix (`model.layers.3.ffn.experts.0.w1.weight`,
`model.layers.0.attn.wq_a.weight`, `model.layers.0.attn.norm.weight`), `model.embed_tokens.weight`,
`model.hc_head.hc_fn` and `head.weight` (it reverts its load-time renaming, and the renamings
anchored at the start of a name do not match under `model.`). A model loaded from a
transformers-named checkpoint is saved under transformers' names instead (the make_tiny_models.py
oracle checks that case).

For every saved tensor the fixture records its shape, dtype and where its values come from in
the model's state_dict: the name, and for the per-expert tensors the expert and the rows of the
fused tensor. The sources are found by value (every tiny-model tensor is random, so each saved
tensor equals exactly one state_dict tensor or slice), not by any renaming of ours. The saved
config.json is recorded too (transformers writes its nested rope_parameters and every default).
tests/model/test_convert.py rebuilds the saved checkpoint from this list without torch and
converts it; with transformers installed it also runs the whole round trip itself.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import sys
import tempfile
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import tiny_models as tm  # noqa: E402

MODELS = ("odd_shapes", "flash_ratios")
FIXTURE_DIR = HERE / "fixtures" / "save_pretrained"


def fresh_model(name: str):
    """DeepseekV4ForCausalLM(config) holding the tiny model's weights, float32."""
    import copy

    import torch
    from transformers import DeepseekV4Config, DeepseekV4ForCausalLM

    cfg = DeepseekV4Config.from_dict(copy.deepcopy(tm.hf_config(name)))
    model = DeepseekV4ForCausalLM(cfg).to(torch.float32)
    model.load_state_dict({k: torch.from_numpy(v) for k, v in tm.build_weights(name).items()}, strict=True)
    return model.eval()


def saved_tensors(folder: Path) -> dict[str, np.ndarray]:
    from safetensors.numpy import load_file

    out = {}
    for f in sorted(folder.glob("*.safetensors")):
        out.update(load_file(str(f)))
    return out


def _key(a: np.ndarray) -> str:
    a = np.ascontiguousarray(a)
    return hashlib.sha256(f"{a.dtype.str}|{a.shape}|".encode() + a.tobytes()).hexdigest()


def sources(name: str) -> dict[str, dict]:
    """Content hash -> where in the state_dict such values are: the tensor, or one expert's slab
    (or half slab, for the fused gate/up tensor)."""
    out: dict[str, dict] = {}
    for k, v in tm.build_weights(name).items():
        out.setdefault(_key(v), {"source": k})
        if v.ndim == 3:  # fused experts [E, ...]
            for e in range(v.shape[0]):
                out.setdefault(_key(v[e]), {"source": k, "expert": e})
                if k.endswith("gate_up_proj"):
                    half = v.shape[1] // 2
                    for lo, hi in ((0, half), (half, v.shape[1])):
                        out.setdefault(_key(v[e, lo:hi]), {"source": k, "expert": e, "rows": [lo, hi]})
    return out


def make(name: str) -> dict:
    import torch
    import transformers

    model = fresh_model(name)
    with tempfile.TemporaryDirectory() as tmp:
        model.save_pretrained(tmp)
        saved = saved_tensors(Path(tmp))
        config = json.loads((Path(tmp) / "config.json").read_text())
    src = sources(name)
    tensors = {}
    for k in sorted(saved):
        v = saved[k]
        where = src.get(_key(v))
        if where is None:
            raise SystemExit(f"{name}: saved tensor {k} {v.shape} equals no state_dict tensor or slice")
        tensors[k] = {"shape": list(v.shape), "dtype": v.dtype.name, **where}
    return {"format": 1, "model": name, "generator": "tests/model/make_save_pretrained_fixture.py",
            "how": "DeepseekV4ForCausalLM(config) + load_state_dict(tiny weights) + save_pretrained",
            "transformers_version": transformers.__version__, "torch_version": torch.__version__,
            "weights_sha256": tm.weights_sha256(tm.build_weights(name)), "config": config, "tensors": tensors}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default=",".join(MODELS))
    args = ap.parse_args()
    FIXTURE_DIR.mkdir(parents=True, exist_ok=True)
    for name in args.models.split(","):
        fx = make(name)
        out = FIXTURE_DIR / f"{name}.json"
        out.write_text(json.dumps(fx, indent=1, sort_keys=False) + "\n")
        print(f"{name}: {len(fx['tensors'])} tensors -> {out} ({out.stat().st_size} bytes)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
