#!/usr/bin/env python3
"""Convert a DeepSeek V4 checkpoint (safetensors) to the ds4 GGUF layout (docs/MODEL.md sections 1-2).

Usage: ds4-convert HF_DIR OUT.gguf [--quant f32|f16|q8_0|q2|q4]

Input: a folder with config.json, *.safetensors (one file or shards) and optionally tokenizer.json
(+ tokenizer_config.json). Every tensor naming in use is accepted:
  * transformers' DeepseekV4ForCausalLM module names (`model.layers.N.self_attn.q_a_proj.weight`,
    `lm_head.weight`, fused `mlp.experts.gate_up_proj` [E, 2I, H] and `mlp.experts.down_proj`
    [E, H, I]), as in its state_dict and as save_pretrained writes a model that was loaded from such
    a checkpoint (`...self_attn.norm.weight` for `kv_norm`);
  * what transformers 5.24's save_pretrained writes for a model built from a config: the official
    leaf names under a `model.` prefix (`model.layers.N.attn.wq_a.weight`,
    `model.layers.N.ffn.experts.X.w1.weight`, `model.layers.N.attn.norm.weight`), with
    `model.embed_tokens.weight`, `model.hc_head.hc_fn` and `head.weight`; its config.json (nested
    `rope_parameters` {main, compress}, every default written) is read as is;
  * the official checkpoint names of docs/MODEL.md 2.4 (`layers.N.attn.wq_a.weight`, `embed.weight`,
    `head.weight`, `hc_head_fn`, per-expert
    `layers.N.ffn.experts.X.w1.weight`, ...). Official FP8 e4m3 weights are dequantized with their
    `.scale` (or `.weight_scale_inv`) companion: one E8M0 (or f32) scale per 128x128 block. FP4 e2m1
    weights (stored as int8/uint8, two values per byte, low nibble first, [N, K/2]) are dequantized
    with one E8M0 scale per 32 inputs ([N, K/32]). This follows the official inference code's layout
    as seen in public copies; it has not been run on the real checkpoint here.
  * `mtp.*` tensors are skipped (the MTP block goes to its own GGUF, docs/MODEL.md 2.3).
  A folder must use one layer naming throughout (else the converter says so).

Output: GGUF v3, architecture `deepseek4`, every key of docs/MODEL.md 1.2 and the tensors of 2.1/2.2 with
ne0 = input features (a PyTorch [out, in] weight is written as is: gguf-py reverses the numpy shape).

Quant mixes (--quant):
  f32   every tensor F32 (ffn_gate_tid2eid I32)
  f16   tensors with 2+ dims F16; 1-D norms, scales, biases, sinks F32; tid2eid I32
  q8_0  the published types of docs/MODEL.md 2.1/2.2, with Q8_0 in place of the routed-expert types
        (a Q8_0 tensor whose ne0 is not a multiple of 32 falls back to F16, with a warning)
  q2    the published q2 layout: routed gate/up IQ2_XXS, down Q2_K, the rest as q8_0
  q4    the published q4 layout: routed experts Q4_K, the rest as q8_0
        q2/q4: gguf-py has no IQ2_XXS/Q2_K/Q4_K quantizer, so the converter writes an f16 GGUF (F32
        where the layout keeps F32) to a temporary file next to OUT (2 bytes per parameter: room is
        needed for it, ~570 GB for Flash) and runs the C++
        requantizer ds4-quantize on it: $DS4_QUANTIZE if set, else build/bin/ds4-quantize of this
        repository, else ds4-quantize on PATH. The temporary file is removed in every case.

Tokenizer: tokenizer.json is embedded as tokenizer.ggml.* (gpt2 BPE, pre "joyai-llm", token types as
llama.cpp's converter assigns them). Without a tokenizer.json the converter synthesizes the tiny
byte-level vocabulary of tiny_tokenizer_json() (the one tests/model/ writes for its tiny models).
"""
from __future__ import annotations

import argparse
import json
import math
import os
import re
import shutil
import struct
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

ARCH = "deepseek4"
QUANTS = ("f32", "f16", "q8_0", "q2", "q4")
TOKEN_NORMAL, TOKEN_CONTROL, TOKEN_USER_DEFINED, TOKEN_UNUSED = 1, 3, 4, 5


class ConvertError(Exception):
    pass


# --------------------------------------------------------------------------------------------
# safetensors reading (numpy only; FP8/E8M0 handled here because numpy has no such dtypes)
# --------------------------------------------------------------------------------------------

_ST_DTYPES = {"F64": np.float64, "F32": np.float32, "F16": np.float16, "I64": np.int64,
              "I32": np.int32, "I16": np.int16, "I8": np.int8, "U8": np.uint8, "BOOL": np.bool_,
              "BF16": np.uint16, "F8_E4M3": np.uint8, "F8_E8M0": np.uint8}


def _e4m3fn_table() -> np.ndarray:
    t = np.zeros(256, np.float32)
    for b in range(256):
        s, e, m = b >> 7, (b >> 3) & 15, b & 7
        if e == 15 and m == 7:
            v = np.nan
        elif e == 0:
            v = m / 8.0 * 2.0 ** -6
        else:
            v = (1 + m / 8.0) * 2.0 ** (e - 7)
        t[b] = -v if s else v
    return t


_E4M3 = _e4m3fn_table()
_E2M1 = np.array([0, .5, 1, 1.5, 2, 3, 4, 6, -0., -.5, -1, -1.5, -2, -3, -4, -6], np.float32)


@dataclass
class _Entry:
    path: Path
    dtype: str
    shape: tuple
    begin: int
    end: int


class SafetensorsDir:
    """All tensors of the *.safetensors files in a folder, read lazily through np.memmap."""

    def __init__(self, folder: Path):
        self.entries: dict[str, _Entry] = {}
        files = sorted(folder.glob("*.safetensors"))
        if not files:
            raise ConvertError(f"no *.safetensors in {folder}")
        for f in files:
            with open(f, "rb") as fh:
                (n,) = struct.unpack("<Q", fh.read(8))
                header = json.loads(fh.read(n))
            base = 8 + n
            for name, info in header.items():
                if name == "__metadata__":
                    continue
                b, e = info["data_offsets"]
                self.entries[name] = _Entry(f, info["dtype"], tuple(info["shape"]), base + b, base + e)

    def names(self):
        return self.entries.keys()

    def raw(self, name: str) -> np.ndarray:
        e = self.entries[name]
        if e.dtype not in _ST_DTYPES:
            raise ConvertError(f"{name}: unsupported safetensors dtype {e.dtype}")
        dt = np.dtype(_ST_DTYPES[e.dtype])
        count = (e.end - e.begin) // dt.itemsize
        arr = np.memmap(e.path, dtype=dt, mode="r", offset=e.begin, shape=(count,))
        return arr.reshape(e.shape) if e.shape else arr.reshape(())

    def dtype(self, name: str) -> str:
        return self.entries[name].dtype

    def plain(self, name: str) -> np.ndarray:
        """A non-quantized tensor as float32 (or its integer type)."""
        a, dt = self.raw(name), self.dtype(name)
        if dt == "BF16":
            return (a.astype(np.uint32) << 16).view(np.float32)
        if dt in ("F32", "F16", "F64"):
            return a.astype(np.float32)
        return np.asarray(a)

    def scale_of(self, weight_name: str) -> str | None:
        stem = weight_name[: -len(".weight")] if weight_name.endswith(".weight") else weight_name
        for cand in (stem + ".scale", stem + ".weight_scale_inv", weight_name + "_scale_inv"):
            if cand in self.entries:
                return cand
        return None

    def _scale_values(self, name: str) -> np.ndarray:
        a, dt = self.raw(name), self.dtype(name)
        if dt == "F8_E8M0":
            v = np.ldexp(np.float32(1.0), a.astype(np.int32) - 127).astype(np.float32)
            v[a == 255] = np.nan
            return v
        return self.plain(name).astype(np.float32)

    def weight(self, name: str) -> np.ndarray:
        """A weight as float32, dequantizing official FP8 (128x128 blocks) and FP4 (1x32 blocks)."""
        dt = self.dtype(name)
        sname = self.scale_of(name)
        if dt == "F8_E4M3":
            if sname is None:
                raise ConvertError(f"{name}: FP8 weight without a .scale companion")
            w = _E4M3[self.raw(name)]
            s = self._scale_values(sname)
            n, k = w.shape
            bn, bk = math.ceil(n / s.shape[0]), math.ceil(k / s.shape[1])
            return w * np.repeat(np.repeat(s, bn, 0), bk, 1)[:n, :k]
        if dt in ("I8", "U8") and sname is not None:  # FP4 e2m1, two per byte, low nibble first
            b = self.raw(name).view(np.uint8)
            n, kh = b.shape
            vals = np.stack([_E2M1[b & 15], _E2M1[b >> 4]], axis=-1).reshape(n, 2 * kh)
            s = self._scale_values(sname)
            blk = (2 * kh) // s.shape[1]
            if blk * s.shape[1] != 2 * kh:
                raise ConvertError(f"{name}: FP4 scale shape {s.shape} does not divide K={2 * kh}")
            return vals * np.repeat(s, blk, 1)
        if dt in ("F32", "F16", "BF16", "F64"):
            return self.plain(name)
        raise ConvertError(f"{name}: cannot read dtype {dt} as a weight")


# --------------------------------------------------------------------------------------------
# hyper-parameters: transformers' DeepseekV4Config, its legacy keys, and the official ModelArgs
# --------------------------------------------------------------------------------------------

_RATIO_OF_TYPE_DEFAULT = {"sliding_attention": 0, "compressed_sparse_attention": 4,
                          "heavily_compressed_attention": 128}


@dataclass
class HParams:
    vocab: int
    hidden: int
    n_layers: int
    n_heads: int
    head_dim: int
    rope_dim: int
    q_lora: int
    o_groups: int
    o_lora: int
    n_experts: int
    n_used: int
    moe_inter: int
    n_shared: int
    n_hash: int
    window: int
    idx_heads: int
    idx_dim: int
    idx_topk: int
    hc: int
    sinkhorn: int
    hc_eps: float
    rms_eps: float
    ratios: list[int]
    swiglu_limit: float
    rope_theta: float
    compress_rope_theta: float
    yarn_factor: float
    yarn_orig_ctx: int
    yarn_beta_fast: float
    yarn_beta_slow: float
    route_scale: float
    norm_topk: bool
    context: int
    name: str = "DeepSeek V4"
    notes: list[str] = field(default_factory=list)


def hparams_from_config(cfg: dict) -> HParams:
    def get(*keys, default=None):
        for k in keys:
            if k in cfg and cfg[k] is not None:
                return cfg[k]
        if default is None:
            raise ConvertError(f"config.json lacks {keys[0]}")
        return default

    n_layers = int(get("num_hidden_layers", "n_layers"))
    head_dim = int(get("head_dim"))
    notes = []
    # per-layer compression ratio
    if cfg.get("layer_types"):
        rates = dict(_RATIO_OF_TYPE_DEFAULT)
        for k, v in (cfg.get("compress_rates") or {}).items():
            rates[k] = int(v)
        if "compress_rate_csa" in cfg:
            rates["compressed_sparse_attention"] = int(cfg["compress_rate_csa"])
        if "compress_rate_hca" in cfg:
            rates["heavily_compressed_attention"] = int(cfg["compress_rate_hca"])
        ratios = [rates[t] for t in cfg["layer_types"][:n_layers]]
    elif cfg.get("compress_ratios") is not None:
        ratios = [int(r) for r in cfg["compress_ratios"]]
        if len(ratios) > n_layers:
            notes.append(f"compress_ratios has {len(ratios)} entries for {n_layers} layers "
                         f"(extra entries are the MTP layer); wrote the first {n_layers}")
        ratios = ratios[:n_layers]
    else:
        raise ConvertError("config.json has neither layer_types nor compress_ratios")
    if len(ratios) != n_layers:
        raise ConvertError(f"{len(ratios)} layer types for {n_layers} layers")
    # the CSA layers (ratio 4, overlapping windows, indexer) are told apart from HCA by the type in
    # transformers and by the value 4 in the official code; the GGUF only has the number.
    if cfg.get("layer_types"):
        for t, r in zip(cfg["layer_types"], ratios):
            if (t == "compressed_sparse_attention") != (r == 4) and r != 0:
                raise ConvertError(f"layer type {t} with ratio {r}: the GGUF (and ds4) identify the "
                                   "overlapping+indexer layers by ratio == 4")
    # hash-routed layers: must be a prefix (the GGUF has only hash_layer_count)
    if cfg.get("mlp_layer_types"):
        kinds = list(cfg["mlp_layer_types"][:n_layers])
        n_hash = sum(1 for k in kinds if k == "hash_moe")
        if kinds != ["hash_moe"] * n_hash + ["moe"] * (n_layers - n_hash):
            raise ConvertError(f"hash_moe layers must be the first layers: {kinds}")
    else:
        n_hash = int(get("num_hash_layers", "n_hash_layers", default=3))
    # rope
    rp = cfg.get("rope_parameters") or {}
    if isinstance(rp.get("compress"), dict):  # transformers' nested form (what save_pretrained writes)
        comp = rp["compress"]
        main = rp.get("main", {})
        compress_theta = float(comp.get("rope_theta", get("compress_rope_theta", default=160000.0)))
    else:
        # A flat dict is the compressed layers' scaling; their base is compress_rope_theta even when
        # the dict also holds a rope_theta (transformers' config ignores it there, C L303-318).
        comp = dict(rp or cfg.get("rope_scaling") or {})
        main = {}
        compress_theta = float(get("compress_rope_theta", default=160000.0))
    rope_theta = float(main.get("rope_theta", get("rope_theta", default=10000.0)))
    rtype = comp.get("rope_type", comp.get("type", "default"))
    if "rope_factor" in cfg:  # official ModelArgs
        rtype = "yarn"
        comp = {"factor": cfg["rope_factor"], "original_max_position_embeddings": cfg["original_seq_len"],
                "beta_fast": cfg.get("beta_fast", 32), "beta_slow": cfg.get("beta_slow", 1)}
    context = int(get("max_position_embeddings", "max_seq_len", default=1048576))
    if rtype == "yarn":
        factor = float(comp.get("factor") or context / comp["original_max_position_embeddings"])
        orig = int(comp.get("original_max_position_embeddings") or context)
        beta_fast = float(comp.get("beta_fast") or 32)
        beta_slow = float(comp.get("beta_slow") or 1)
        af = comp.get("attention_factor", 1.0)
        if af not in (None, 1.0):
            raise ConvertError(f"compress rope attention_factor {af}: ds4 has no YaRN mscale")
        if comp.get("truncate", True) is False:
            raise ConvertError("YaRN truncate=false is not expressible in the GGUF")
    elif rtype == "default":
        factor, orig, beta_fast, beta_slow = 1.0, context, 32.0, 1.0
        notes.append("compressed-layer rope is not YaRN: wrote rope.scaling.factor = 1 (no scaling)")
    else:
        raise ConvertError(f"unsupported compressed-layer rope type {rtype}")
    if "partial_rotary_factor" in cfg and cfg["partial_rotary_factor"] is not None:
        rope_dim = int(head_dim * float(cfg["partial_rotary_factor"]))
    else:
        rope_dim = int(get("qk_rope_head_dim", "rope_head_dim", default=64))
    scoring = cfg.get("scoring_func", cfg.get("score_func", "sqrtsoftplus"))
    if scoring != "sqrtsoftplus":
        raise ConvertError(f"scoring_func {scoring}: ds4 routes with sqrt(softplus)")
    n_shared = int(get("n_shared_experts", default=1))
    swiglu = float(get("swiglu_limit", default=10.0))
    hp = HParams(
        vocab=int(get("vocab_size")), hidden=int(get("hidden_size", "dim")), n_layers=n_layers,
        n_heads=int(get("num_attention_heads", "n_heads")), head_dim=head_dim, rope_dim=rope_dim,
        q_lora=int(get("q_lora_rank")), o_groups=int(get("o_groups")), o_lora=int(get("o_lora_rank")),
        n_experts=int(get("n_routed_experts")),
        n_used=int(get("num_experts_per_tok", "n_activated_experts")),
        moe_inter=int(get("moe_intermediate_size", "moe_inter_dim")), n_shared=n_shared, n_hash=n_hash,
        window=int(get("sliding_window", "window_size")), idx_heads=int(get("index_n_heads")),
        idx_dim=int(get("index_head_dim")), idx_topk=int(get("index_topk")),
        hc=int(get("hc_mult", default=4)), sinkhorn=int(get("hc_sinkhorn_iters", default=20)),
        hc_eps=float(get("hc_eps", default=1e-6)), rms_eps=float(get("rms_norm_eps", "norm_eps", default=1e-6)),
        ratios=ratios, swiglu_limit=swiglu, rope_theta=rope_theta, compress_rope_theta=compress_theta,
        yarn_factor=factor, yarn_orig_ctx=orig, yarn_beta_fast=beta_fast, yarn_beta_slow=beta_slow,
        route_scale=float(get("routed_scaling_factor", "route_scale", default=1.5)),
        norm_topk=bool(cfg.get("norm_topk_prob", True)), context=context, notes=notes)
    if int(get("num_key_value_heads", default=1)) != 1:
        raise ConvertError("num_key_value_heads must be 1 (one shared K=V head)")
    if not hp.norm_topk:
        notes.append("norm_topk_prob=false in config.json, but transformers and the official code always "
                     "normalize the selected weights: wrote expert_weights_norm = true")
    return hp


# --------------------------------------------------------------------------------------------
# names: (source tensor(s), transform) for every GGUF tensor
# --------------------------------------------------------------------------------------------

@dataclass
class Plan:
    gguf: str
    kind: str          # "plain" | "experts" | "tid2eid"
    sources: list      # source names (experts: [per-expert names] or [fused name, part])
    shape: tuple       # numpy shape of the GGUF tensor (reversed ne)
    part: str = ""     # experts from a fused gate_up: "gate" | "up"


_LAYER_NAMING = re.compile(r"^(model\.)?layers\.\d+\.(self_attn|mlp|attn|ffn|input_layernorm|attn_norm)\.")


def _detect_naming(names) -> tuple[str, str]:
    """(naming of the layer tensors, prefix before `layers.N.`). The layers are named either as
    transformers' modules (`self_attn.q_a_proj`, `mlp.experts.gate_up_proj`: "hf") or as the
    official checkpoint (`attn.wq_a`, `ffn.experts.X.w1`: "official"), with or without a `model.`
    prefix: the official checkpoint has none; transformers' state_dict has one, and so has what its
    save_pretrained writes, in either naming (5.24 writes the official leaves under `model.` when
    the model was not loaded from a transformers-named checkpoint, see docs/TRANSFORMERS_NOTES.md
    D13)."""
    kinds, prefixes = set(), set()
    for n in names:
        m = _LAYER_NAMING.match(n)
        if m:
            prefixes.add(m.group(1) or "")
            kinds.add("hf" if m.group(2) in ("self_attn", "mlp", "input_layernorm") else "official")
    if not kinds:
        raise ConvertError("unrecognised tensor names (neither transformers nor official DeepSeek V4): "
                           "no `layers.N.` tensors")
    if len(kinds) > 1 or len(prefixes) > 1:
        raise ConvertError("mixed tensor namings: layers named both as transformers' modules and as the "
                           "official checkpoint, or both with and without the `model.` prefix")
    return kinds.pop(), prefixes.pop()


# The model-level tensors, in every spelling in use: transformers' state_dict, what its
# save_pretrained writes (it reverts only the renamings anchored at the start of a name, so under
# `model.` the embedding and the HC head keep transformers' names while the LM head, outside
# `model.`, becomes `head.weight`), and the official checkpoint.
_TOP_LEVEL = {
    "token_embd.weight": ("model.embed_tokens.weight", "embed.weight", "model.embed.weight", "embed_tokens.weight"),
    "output.weight": ("lm_head.weight", "head.weight", "model.head.weight", "model.lm_head.weight"),
    "output_hc_fn.weight": ("model.hc_head.hc_fn", "hc_head_fn", "model.hc_head_fn", "hc_head.hc_fn"),
    "output_hc_scale.weight": ("model.hc_head.hc_scale", "hc_head_scale", "model.hc_head_scale", "hc_head.hc_scale"),
    "output_hc_base.weight": ("model.hc_head.hc_base", "hc_head_base", "model.hc_head_base", "hc_head.hc_base"),
    "output_norm.weight": ("model.norm.weight", "norm.weight"),
}


def build_plan(st: SafetensorsDir, hp: HParams) -> list[Plan]:
    names = set(st.names())
    naming, prefix = _detect_naming(names)
    H, V, L = hp.hidden, hp.vocab, hp.n_layers
    hc, mix = hp.hc, (2 + hp.hc) * hp.hc
    plans: list[Plan] = []

    def add(gguf_name, src, shape, kind="plain", part=""):
        srcs = src if isinstance(src, list) else [src]
        if kind != "experts":
            for s in srcs:
                if s not in names:
                    raise ConvertError(f"missing tensor {s} (for {gguf_name})")
                got = st.entries[s].shape
                want = tuple(shape)
                if kind == "plain" and st.dtype(s) in ("I8", "U8") and st.scale_of(s):
                    got = (got[0], got[1] * 2)
                if got != want:
                    raise ConvertError(f"{s}: shape {got}, expected {want} (for {gguf_name})")
        plans.append(Plan(gguf_name, kind, srcs, tuple(shape), part))

    hfn = naming == "hf"

    def pick(*cands):
        """transformers' state_dict says `kv_norm`; its save_pretrained writes `norm` (it reverses
        the checkpoint renaming `.norm.` -> `.kv_norm.`). Accept either."""
        for cand in cands:
            if cand in names:
                return cand
        return cands[0]
    def top(gguf_name):
        cands = _TOP_LEVEL[gguf_name]
        for cand in cands:
            if cand in names:
                return cand
        if gguf_name == "output.weight":
            raise ConvertError("missing the LM head (lm_head.weight or head.weight): tied embeddings are not "
                               "supported, ds4 has a separate head")
        raise ConvertError(f"missing tensor {' or '.join(cands)} (for {gguf_name})")
    add("token_embd.weight", top("token_embd.weight"), (V, H))
    add("output_hc_fn.weight", top("output_hc_fn.weight"), (hc, hc * H))
    add("output_hc_scale.weight", top("output_hc_scale.weight"), (1,))
    add("output_hc_base.weight", top("output_hc_base.weight"), (hc,))
    add("output_norm.weight", top("output_norm.weight"), (H,))
    add("output.weight", top("output.weight"), (V, H))

    for i in range(L):
        r = hp.ratios[i]
        coff = 2 if r == 4 else 1
        b = f"blk.{i}."
        p = f"{prefix}layers.{i}."
        if hfn:
            a, c, x, m = p + "self_attn.", p + "self_attn.compressor.", p + "self_attn.compressor.indexer.", p + "mlp."
            N = {"hc_attn_fn": p + "attn_hc.fn", "hc_attn_scale": p + "attn_hc.scale",
                 "hc_attn_base": p + "attn_hc.base", "attn_norm": p + "input_layernorm.weight",
                 "attn_q_a": a + "q_a_proj.weight", "attn_q_a_norm": a + "q_a_norm.weight",
                 "attn_q_b": a + "q_b_proj.weight", "attn_kv": a + "kv_proj.weight",
                 "attn_kv_a_norm": pick(a + "kv_norm.weight", a + "norm.weight"), "attn_sinks": a + "sinks",
                 "attn_output_a": a + "o_a_proj.weight", "attn_output_b": a + "o_b_proj.weight",
                 "attn_compressor_ape": c + "position_bias", "attn_compressor_kv": c + "kv_proj.weight",
                 "attn_compressor_gate": c + "gate_proj.weight",
                 "attn_compressor_norm": pick(c + "kv_norm.weight", c + "norm.weight"),
                 "indexer.attn_q_b": x + "q_b_proj.weight", "indexer.proj": x + "scorer.weights_proj.weight",
                 "indexer_compressor_ape": x + "position_bias", "indexer_compressor_kv": x + "kv_proj.weight",
                 "indexer_compressor_gate": x + "gate_proj.weight",
                 "indexer_compressor_norm": pick(x + "kv_norm.weight", x + "norm.weight"),
                 "hc_ffn_fn": p + "ffn_hc.fn", "hc_ffn_scale": p + "ffn_hc.scale",
                 "hc_ffn_base": p + "ffn_hc.base", "ffn_norm": p + "post_attention_layernorm.weight",
                 "ffn_gate_inp": m + "gate.weight", "exp_probs_b": m + "gate.e_score_correction_bias",
                 "ffn_gate_tid2eid": m + "gate.tid2eid",
                 "ffn_gate_shexp": m + "shared_experts.gate_proj.weight",
                 "ffn_up_shexp": m + "shared_experts.up_proj.weight",
                 "ffn_down_shexp": m + "shared_experts.down_proj.weight"}
        else:
            a, c, x, m = p + "attn.", p + "attn.compressor.", p + "attn.indexer.", p + "ffn."
            N = {"hc_attn_fn": p + "hc_attn_fn", "hc_attn_scale": p + "hc_attn_scale",
                 "hc_attn_base": p + "hc_attn_base", "attn_norm": p + "attn_norm.weight",
                 "attn_q_a": a + "wq_a.weight", "attn_q_a_norm": a + "q_norm.weight",
                 "attn_q_b": a + "wq_b.weight", "attn_kv": a + "wkv.weight",
                 # official: `attn.kv_norm`; save_pretrained writes `attn.norm` (D13)
                 "attn_kv_a_norm": pick(a + "kv_norm.weight", a + "norm.weight"), "attn_sinks": a + "attn_sink",
                 "attn_output_a": a + "wo_a.weight", "attn_output_b": a + "wo_b.weight",
                 "attn_compressor_ape": c + "ape", "attn_compressor_kv": c + "wkv.weight",
                 "attn_compressor_gate": c + "wgate.weight",
                 "attn_compressor_norm": pick(c + "norm.weight", c + "kv_norm.weight"),
                 "indexer.attn_q_b": x + "wq_b.weight", "indexer.proj": x + "weights_proj.weight",
                 "indexer_compressor_ape": x + "compressor.ape",
                 "indexer_compressor_kv": x + "compressor.wkv.weight",
                 "indexer_compressor_gate": x + "compressor.wgate.weight",
                 "indexer_compressor_norm": pick(x + "compressor.norm.weight", x + "compressor.kv_norm.weight"),
                 "hc_ffn_fn": p + "hc_ffn_fn", "hc_ffn_scale": p + "hc_ffn_scale",
                 "hc_ffn_base": p + "hc_ffn_base", "ffn_norm": p + "ffn_norm.weight",
                 "ffn_gate_inp": m + "gate.weight", "exp_probs_b": m + "gate.bias",
                 "ffn_gate_tid2eid": m + "gate.tid2eid",
                 "ffn_gate_shexp": m + "shared_experts.w1.weight",
                 "ffn_up_shexp": m + "shared_experts.w3.weight",
                 "ffn_down_shexp": m + "shared_experts.w2.weight"}
        D, Q, I, E = hp.head_dim, hp.q_lora, hp.moe_inter, hp.n_experts
        add(b + "hc_attn_fn.weight", N["hc_attn_fn"], (mix, hc * H))
        add(b + "hc_attn_scale.weight", N["hc_attn_scale"], (3,))
        add(b + "hc_attn_base.weight", N["hc_attn_base"], (mix,))
        add(b + "attn_norm.weight", N["attn_norm"], (H,))
        add(b + "attn_q_a.weight", N["attn_q_a"], (Q, H))
        add(b + "attn_q_a_norm.weight", N["attn_q_a_norm"], (Q,))
        add(b + "attn_q_b.weight", N["attn_q_b"], (hp.n_heads * D, Q))
        add(b + "attn_kv.weight", N["attn_kv"], (D, H))
        add(b + "attn_kv_a_norm.weight", N["attn_kv_a_norm"], (D,))
        add(b + "attn_sinks.weight", N["attn_sinks"], (hp.n_heads,))
        add(b + "attn_output_a.weight", N["attn_output_a"], (hp.o_groups * hp.o_lora, hp.n_heads * D // hp.o_groups))
        add(b + "attn_output_b.weight", N["attn_output_b"], (H, hp.o_groups * hp.o_lora))
        if r:
            add(b + "attn_compressor_ape.weight", N["attn_compressor_ape"], (r, coff * D))
            add(b + "attn_compressor_kv.weight", N["attn_compressor_kv"], (coff * D, H))
            add(b + "attn_compressor_gate.weight", N["attn_compressor_gate"], (coff * D, H))
            add(b + "attn_compressor_norm.weight", N["attn_compressor_norm"], (D,))
        if r == 4:
            K = hp.idx_dim
            add(b + "indexer.attn_q_b.weight", N["indexer.attn_q_b"], (hp.idx_heads * K, Q))
            add(b + "indexer.proj.weight", N["indexer.proj"], (hp.idx_heads, H))
            add(b + "indexer_compressor_ape.weight", N["indexer_compressor_ape"], (4, 2 * K))
            add(b + "indexer_compressor_kv.weight", N["indexer_compressor_kv"], (2 * K, H))
            add(b + "indexer_compressor_gate.weight", N["indexer_compressor_gate"], (2 * K, H))
            add(b + "indexer_compressor_norm.weight", N["indexer_compressor_norm"], (K,))
        add(b + "hc_ffn_fn.weight", N["hc_ffn_fn"], (mix, hc * H))
        add(b + "hc_ffn_scale.weight", N["hc_ffn_scale"], (3,))
        add(b + "hc_ffn_base.weight", N["hc_ffn_base"], (mix,))
        add(b + "ffn_norm.weight", N["ffn_norm"], (H,))
        add(b + "ffn_gate_inp.weight", N["ffn_gate_inp"], (E, H))
        if i < hp.n_hash:
            if N["ffn_gate_tid2eid"] not in names:
                raise ConvertError(f"hash layer {i} lacks {N['ffn_gate_tid2eid']}")
            add(b + "ffn_gate_tid2eid.weight", N["ffn_gate_tid2eid"], (V, hp.n_used), kind="tid2eid")
            if N["exp_probs_b"] in names:  # docs/MODEL.md 2.2: optional; ds4 ignores it on hash layers
                add(b + "exp_probs_b.bias", N["exp_probs_b"], (E,))
        else:
            if N["ffn_gate_tid2eid"] in names:
                raise ConvertError(f"layer {i} has tid2eid but hash_layer_count is {hp.n_hash}")
            if N["exp_probs_b"] in names:
                add(b + "exp_probs_b.bias", N["exp_probs_b"], (E,))
        if hfn:
            add(b + "ffn_gate_exps.weight", m + "experts.gate_up_proj", (E, I, H), "experts", "gate")
            add(b + "ffn_up_exps.weight", m + "experts.gate_up_proj", (E, I, H), "experts", "up")
            add(b + "ffn_down_exps.weight", m + "experts.down_proj", (E, H, I), "experts", "down")
            for s, want in ((m + "experts.gate_up_proj", (E, 2 * I, H)), (m + "experts.down_proj", (E, H, I))):
                if s not in names or st.entries[s].shape != want:
                    raise ConvertError(f"{s}: expected shape {want}")
        else:
            for w, g, shape in (("w1", "ffn_gate_exps", (E, I, H)), ("w3", "ffn_up_exps", (E, I, H)),
                                ("w2", "ffn_down_exps", (E, H, I))):
                srcs = [f"{m}experts.{e}.{w}.weight" for e in range(E)]
                for s in srcs:
                    if s not in names:
                        raise ConvertError(f"missing tensor {s}")
                add(b + g + ".weight", srcs, shape, "experts")
        add(b + "ffn_gate_shexp.weight", N["ffn_gate_shexp"], (I * hp.n_shared, H))
        add(b + "ffn_up_shexp.weight", N["ffn_up_shexp"], (I * hp.n_shared, H))
        add(b + "ffn_down_shexp.weight", N["ffn_down_shexp"], (H, I * hp.n_shared))

    used = set()
    for pl in plans:
        used.update(pl.sources)
    scales = {st.scale_of(u) for u in used} - {None}
    leftovers = sorted(n for n in names if n not in used and n not in scales and not n.startswith("mtp."))
    if leftovers:
        raise ConvertError("tensors the converter does not expect for this config: "
                           + ", ".join(leftovers[:10]) + (" ..." if len(leftovers) > 10 else ""))
    return plans


# --------------------------------------------------------------------------------------------
# types per quant mix (docs/MODEL.md 2.1/2.2 and 2.5)
# --------------------------------------------------------------------------------------------

F32, F16, Q8_0, I32 = "F32", "F16", "Q8_0", "I32"

_PUBLISHED = [  # (suffix, type) in the q2/q4 files, routed experts excepted
    ("token_embd.weight", F16), ("output.weight", Q8_0), ("output_hc_fn.weight", F16),
    ("output_hc_scale.weight", F32), ("output_hc_base.weight", F32), ("output_norm.weight", F32),
    ("hc_attn_fn.weight", F16), ("hc_ffn_fn.weight", F16), ("hc_attn_scale.weight", F32),
    ("hc_ffn_scale.weight", F32), ("hc_attn_base.weight", F32), ("hc_ffn_base.weight", F32),
    ("attn_norm.weight", F32), ("ffn_norm.weight", F32), ("attn_q_a_norm.weight", F32),
    ("attn_kv_a_norm.weight", F32), ("attn_sinks.weight", F32), ("attn_compressor_norm.weight", F32),
    ("indexer_compressor_norm.weight", F32), ("exp_probs_b.bias", F32),
    ("attn_q_a.weight", Q8_0), ("attn_q_b.weight", Q8_0), ("attn_kv.weight", Q8_0),
    ("attn_output_a.weight", Q8_0), ("attn_output_b.weight", Q8_0),
    ("attn_compressor_ape.weight", F16), ("attn_compressor_kv.weight", F16),
    ("attn_compressor_gate.weight", F16), ("indexer.attn_q_b.weight", F16), ("indexer.proj.weight", F16),
    ("indexer_compressor_ape.weight", F16), ("indexer_compressor_kv.weight", F16),
    ("indexer_compressor_gate.weight", F16), ("ffn_gate_inp.weight", F16),
    ("ffn_gate_shexp.weight", Q8_0), ("ffn_up_shexp.weight", Q8_0), ("ffn_down_shexp.weight", Q8_0),
    ("ffn_gate_exps.weight", Q8_0), ("ffn_up_exps.weight", Q8_0), ("ffn_down_exps.weight", Q8_0),
    ("ffn_gate_tid2eid.weight", I32),
]


def published_type(gguf_name: str) -> str:
    base = re.sub(r"^blk\.\d+\.", "", gguf_name)
    for suffix, t in _PUBLISHED:
        if base == suffix:
            return t
    raise ConvertError(f"no type rule for {gguf_name}")


def tensor_type(pl: Plan, quant: str, warn) -> str:
    if pl.kind == "tid2eid":
        return I32
    if quant == "f32":
        return F32
    if quant == "f16":
        return F16 if len(pl.shape) >= 2 else F32
    t = published_type(pl.gguf)
    if t == Q8_0 and pl.shape[-1] % 32:
        warn(f"{pl.gguf}: ne0 = {pl.shape[-1]} is not a multiple of 32, written F16 instead of Q8_0")
        return F16
    return t


# --------------------------------------------------------------------------------------------
# tokenizer
# --------------------------------------------------------------------------------------------

def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte -> printable character map (docs/MODEL.md section 6)."""
    bs = list(range(33, 127)) + list(range(161, 173)) + list(range(174, 256))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}


TINY_HEAD_SPECIALS = ["<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>"]
TINY_TAIL_SPECIALS = ["<｜User｜>", "<｜Assistant｜>", "<think>", "</think>", "｜DSML｜",
                      "<｜latest_reminder｜>", "<｜fim▁hole｜>", "<｜▁pad▁｜>"]
_TINY_CORPUS = (
    "The quick brown fox jumps over the lazy dog. A tiny model reads the same files as a large one, "
    "and every number in this text is 1234567890. def main(): return 0 # int x = 42; "
    "Write a haiku about the sea, then explain it in one sentence. The sea is calm and the sky is "
    "blue; the wind is in the trees and the birds are in the air. Quel ramo del lago di Como, che "
    "volge a mezzogiorno, tra due catene non interrotte di monti, tutto a seni e a golfi. "
    "for (int i = 0; i < n; i++) { sum += a[i] * b[i]; } print('hello, world') \n\n"
)


def tiny_tokenizer_json(vocab_size: int) -> dict:
    """A deterministic byte-level BPE tokenizer.json with exactly vocab_size ids.

    ids 0, 1: BOS/EOS (the DeepSeek strings); 2..257: the 256 byte symbols in byte order; then BPE
    merges learned greedily on a fixed built-in text (most frequent pair, ties by the pair's text),
    then [UNUSED_i] fillers if the text runs out of pairs; the last 8 ids: the chat specials the
    engine resolves by string (<｜User｜>, <｜Assistant｜>, <think>, </think>, ｜DSML｜, ...).
    """
    n_fixed = len(TINY_HEAD_SPECIALS) + 256 + len(TINY_TAIL_SPECIALS)
    if vocab_size < n_fixed:
        raise ConvertError(f"tiny vocabulary needs at least {n_fixed} ids, got {vocab_size}")
    b2u = bytes_to_unicode()
    vocab = {t: i for i, t in enumerate(TINY_HEAD_SPECIALS)}
    for b in range(256):
        vocab[b2u[b]] = len(vocab)
    words = {}
    for w in re.findall(r" ?[A-Za-z]+| ?[0-9]| ?[^\sA-Za-z0-9]+|\s+", _TINY_CORPUS):
        key = tuple(b2u[b] for b in w.encode("utf-8"))
        words[key] = words.get(key, 0) + 1
    merges = []
    n_merges = vocab_size - n_fixed
    while len(merges) < n_merges:
        counts: dict[tuple, int] = {}
        for w, c in words.items():
            for a, b in zip(w, w[1:]):
                counts[(a, b)] = counts.get((a, b), 0) + c
        if not counts:
            break
        best = max(counts.items(), key=lambda kv: (kv[1], tuple(-ord(ch) for ch in kv[0][0] + "\0" + kv[0][1])))
        (a, b), c = best
        merges.append(f"{a} {b}")
        if a + b not in vocab:
            vocab[a + b] = len(vocab)
        new_words = {}
        for w, cnt in words.items():
            out, i = [], 0
            while i < len(w):
                if i + 1 < len(w) and w[i] == a and w[i + 1] == b:
                    out.append(a + b)
                    i += 2
                else:
                    out.append(w[i])
                    i += 1
            new_words[tuple(out)] = new_words.get(tuple(out), 0) + cnt
        words = new_words
    while len(vocab) < vocab_size - len(TINY_TAIL_SPECIALS):
        vocab[f"[UNUSED_{len(vocab)}]"] = len(vocab)
    added = [{"id": i, "content": t, "single_word": False, "lstrip": False, "rstrip": False,
              "normalized": False, "special": True} for i, t in enumerate(TINY_HEAD_SPECIALS)]
    for t in TINY_TAIL_SPECIALS:
        vocab[t] = len(vocab)
        added.append({"id": vocab[t], "content": t, "single_word": False, "lstrip": False,
                      "rstrip": False, "normalized": False, "special": True})
    assert len(vocab) == vocab_size
    return {"version": "1.0", "truncation": None, "padding": None, "added_tokens": added,
            "normalizer": None,
            "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True,
                              "use_regex": True},
            "post_processor": None,
            "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True,
                        "use_regex": True},
            "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                      "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False,
                      "ignore_merges": False, "vocab": vocab, "merges": merges}}


def _looks_special(t: str) -> bool:
    return (t.startswith("<|") and t.endswith("|>")) or (t.startswith("<｜") and t.endswith("｜>"))


def vocab_from_tokenizer_json(tj: dict, n_vocab: int) -> tuple[list[str], list[int], list[str]]:
    model = tj["model"]
    if model.get("type") != "BPE":
        raise ConvertError(f"tokenizer.json: expected a BPE model, got {model.get('type')}")
    by_id = {i: (t, TOKEN_NORMAL) for t, i in model["vocab"].items()}
    for a in tj.get("added_tokens", []):
        kind = TOKEN_CONTROL if a.get("special") or _looks_special(a["content"]) else TOKEN_USER_DEFINED
        by_id[a["id"]] = (a["content"], kind)
    top = max(by_id) + 1
    if top > n_vocab:
        raise ConvertError(f"tokenizer has ids up to {top - 1} but the embedding has {n_vocab} rows")
    tokens, types = [], []
    for i in range(n_vocab):
        t, k = by_id.get(i, (f"[UNUSED_{i}]", TOKEN_UNUSED))
        tokens.append(t)
        types.append(k)
    merges = [m if isinstance(m, str) else " ".join(m) for m in model["merges"]]
    return tokens, types, merges


# --------------------------------------------------------------------------------------------
# writing
# --------------------------------------------------------------------------------------------

def write_metadata(w, hp: HParams, name: str) -> None:
    k = ARCH + "."
    w.add_name(name)
    # u32 as in the published files (gguf-py's add_context_length); llama.cpp's loader rejects any
    # other type, while ds4 only prints this key (docs/MODEL.md 1.2 notes it reads a u64 there).
    w.add_uint32(k + "context_length", hp.context)
    for key, v in (("block_count", hp.n_layers), ("embedding_length", hp.hidden), ("vocab_size", hp.vocab),
                   ("attention.head_count", hp.n_heads), ("attention.head_count_kv", 1),
                   ("attention.key_length", hp.head_dim), ("attention.value_length", hp.head_dim),
                   ("rope.dimension_count", hp.rope_dim), ("attention.q_lora_rank", hp.q_lora),
                   ("attention.output_lora_rank", hp.o_lora), ("attention.output_group_count", hp.o_groups),
                   ("expert_count", hp.n_experts), ("expert_used_count", hp.n_used),
                   ("expert_feed_forward_length", hp.moe_inter), ("expert_shared_count", hp.n_shared),
                   ("hash_layer_count", hp.n_hash), ("expert_group_count", 0), ("expert_group_used_count", 0),
                   ("attention.sliding_window", hp.window), ("attention.indexer.head_count", hp.idx_heads),
                   ("attention.indexer.key_length", hp.idx_dim), ("attention.indexer.top_k", hp.idx_topk),
                   ("hyper_connection.count", hp.hc), ("hyper_connection.sinkhorn_iterations", hp.sinkhorn),
                   ("rope.scaling.original_context_length", hp.yarn_orig_ctx)):
        w.add_uint32(k + key, int(v))
    from gguf import GGUFValueType
    w.add_key_value(k + "attention.compress_ratios", [int(r) for r in hp.ratios], GGUFValueType.ARRAY,
                    GGUFValueType.UINT32)
    w.add_key_value(k + "swiglu_clamp_exp", [float(hp.swiglu_limit)] * hp.n_layers, GGUFValueType.ARRAY,
                    GGUFValueType.FLOAT32)
    for key, v in (("rope.freq_base", hp.rope_theta), ("rope.scaling.factor", hp.yarn_factor),
                   ("rope.scaling.yarn_beta_fast", hp.yarn_beta_fast),
                   ("rope.scaling.yarn_beta_slow", hp.yarn_beta_slow),
                   ("attention.compress_rope_freq_base", hp.compress_rope_theta),
                   ("expert_weights_scale", hp.route_scale),
                   ("attention.layer_norm_rms_epsilon", hp.rms_eps), ("hyper_connection.epsilon", hp.hc_eps)):
        w.add_float32(k + key, float(v))
    w.add_bool(k + "expert_weights_norm", True)
    # Keys ds4 never reads but llama.cpp's deepseek4 loader needs, with the values the published files
    # carry (docs/LLAMACPP.md): the router score function, sqrt(softplus) =
    # LLAMA_EXPERT_GATING_FUNC_TYPE_SQRT_SOFTPLUS (4; the only value llama.cpp accepts for deepseek4),
    # and the compressed layers' rope scaling, YaRN (without the key llama.cpp assumes "linear").
    w.add_uint32(k + "expert_gating_func", 4)
    w.add_string(k + "rope.scaling.type", "yarn")


def write_tokenizer(w, hf_dir: Path, hp: HParams, warn) -> None:
    tj_path = hf_dir / "tokenizer.json"
    if tj_path.exists():
        tj = json.loads(tj_path.read_text(encoding="utf-8"))
    else:
        warn("no tokenizer.json: synthesizing the tiny byte-level vocabulary")
        tj = tiny_tokenizer_json(hp.vocab)
    tokens, types, merges = vocab_from_tokenizer_json(tj, hp.vocab)
    cfg_path = hf_dir / "tokenizer_config.json"
    tcfg = json.loads(cfg_path.read_text(encoding="utf-8")) if cfg_path.exists() else {}
    ids = {t: i for i, t in enumerate(tokens)}
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("joyai-llm")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)

    def tok_id(key, default):
        v = tcfg.get(key)
        if isinstance(v, dict):
            v = v.get("content")
        return ids.get(v, ids.get(default))

    bos = tok_id("bos_token", "<｜begin▁of▁sentence｜>")
    eos = tok_id("eos_token", "<｜end▁of▁sentence｜>")
    if bos is not None:
        w.add_bos_token_id(bos)
    if eos is not None:
        w.add_eos_token_id(eos)
        pad = tok_id("pad_token", "<｜end▁of▁sentence｜>")
        w.add_pad_token_id(pad if pad is not None else eos)
    w.add_add_bos_token(bool(tcfg.get("add_bos_token", False)))
    w.add_add_eos_token(bool(tcfg.get("add_eos_token", False)))
    if tcfg.get("chat_template"):
        w.add_chat_template(tcfg["chat_template"])


def _expert_slabs(st: SafetensorsDir, pl: Plan):
    """Yields one float32 [N, K] array per expert."""
    if len(pl.sources) == 1:  # transformers' fused 3-D tensors
        full = st.plain(pl.sources[0])
        I = pl.shape[1]
        for e in range(full.shape[0]):
            if pl.part == "gate":
                yield np.asarray(full[e, :I], np.float32)
            elif pl.part == "up":
                yield np.asarray(full[e, I:], np.float32)
            else:
                yield np.asarray(full[e], np.float32)
    else:
        for s in pl.sources:
            yield st.weight(s)


def _encode(arr: np.ndarray, ggml_type: str) -> np.ndarray:
    from gguf import GGMLQuantizationType, quants
    if ggml_type == F32:
        return np.ascontiguousarray(arr, np.float32)
    if ggml_type == F16:
        return np.ascontiguousarray(arr, np.float32).astype(np.float16)
    if ggml_type == Q8_0:
        return quants.quantize(np.ascontiguousarray(arr, np.float32), GGMLQuantizationType.Q8_0)
    raise ConvertError(f"no encoder for {ggml_type}")


def _nbytes(shape: tuple, ggml_type: str) -> int:
    n = int(np.prod(shape))
    return {F32: 4 * n, F16: 2 * n, I32: 4 * n, Q8_0: n // 32 * 34}[ggml_type]


def _write_chunks(w, chunks, nbytes: int) -> None:
    """gguf-py's write_tensor_data for a tensor delivered in several pieces (expert slabs)."""
    fout = w.fout[0]
    ti = w.tensors[0].pop(next(iter(w.tensors[0])))
    assert ti.nbytes == nbytes, (ti.nbytes, nbytes)
    w.write_padding(fout, fout.tell())
    written = 0
    for c in chunks:
        c.tofile(fout)
        written += c.nbytes
    assert written == nbytes, (written, nbytes)
    w.write_padding(fout, nbytes)


REQUANTIZED = ("q2", "q4")  # mixes written by ds4-quantize from an f16 conversion


def find_ds4_quantize() -> Path:
    """The ds4-quantize binary: $DS4_QUANTIZE, else build/bin/ of this repository, else PATH."""
    env = os.environ.get("DS4_QUANTIZE")
    if env:
        if not os.access(env, os.X_OK):
            raise ConvertError(f"DS4_QUANTIZE={env} is not an executable file")
        return Path(env)
    built = Path(__file__).resolve().parents[2] / "build" / "bin" / "ds4-quantize"
    if os.access(built, os.X_OK):
        return built
    on_path = shutil.which("ds4-quantize")
    if on_path:
        return Path(on_path)
    raise ConvertError(f"--quant q2/q4 need the C++ requantizer ds4-quantize, not found at {built} nor on PATH: "
                       "build it (cmake --build build --target ds4-quantize) or set DS4_QUANTIZE to its path")


def convert_requantized(hf_dir: Path, out: Path, quant: str, name: str | None, log) -> dict:
    """q2/q4: an f16 conversion (F32 where the layout keeps F32) into a temporary file next to `out`,
    then ds4-quantize to `out`."""
    import gguf
    quantizer = find_ds4_quantize()  # before the (long) f32 conversion
    fd, tmp_name = tempfile.mkstemp(prefix=f".{out.name}.", suffix=".f32.gguf", dir=out.parent)
    os.close(fd)
    tmp = Path(tmp_name)
    try:
        r = convert(hf_dir, tmp, "f16", name, log)
        # its progress and errors go straight to our stderr (a full model takes hours)
        p = subprocess.run([str(quantizer), str(tmp), str(out), "--quant", quant])
        if p.returncode != 0:
            out.unlink(missing_ok=True)
            raise ConvertError(f"{quantizer} --quant {quant} failed (exit {p.returncode}; its message is above)")
    finally:
        tmp.unlink(missing_ok=True)
    r["types"] = {t.name: t.tensor_type.name for t in gguf.GGUFReader(str(out)).tensors}
    return r


def convert(hf_dir: Path, out: Path, quant: str = "f32", name: str | None = None, log=print) -> dict:
    import gguf
    from gguf import GGMLQuantizationType

    if quant not in QUANTS:
        raise ConvertError(f"--quant must be one of {', '.join(QUANTS)}")
    if quant in REQUANTIZED:
        return convert_requantized(hf_dir, out, quant, name, log)
    cfg_path = hf_dir / "config.json"
    if not cfg_path.exists():
        raise ConvertError(f"{cfg_path} not found")
    cfg = json.loads(cfg_path.read_text())
    hp = hparams_from_config(cfg)
    warnings: list[str] = list(hp.notes)
    warn = warnings.append
    st = SafetensorsDir(hf_dir)
    plans = build_plan(st, hp)
    types = {pl.gguf: tensor_type(pl, quant, warn) for pl in plans}

    w = gguf.GGUFWriter(str(out), ARCH)
    write_metadata(w, hp, name or cfg.get("_name_or_path") or hf_dir.name)
    w.add_file_type({"f32": 0, "f16": 1, "q8_0": 7}[quant])
    w.add_quantization_version(gguf.GGML_QUANT_VERSION)
    write_tokenizer(w, hf_dir, hp, warn)
    for pl in plans:
        t = types[pl.gguf]
        gt = {F32: GGMLQuantizationType.F32, F16: GGMLQuantizationType.F16,
              Q8_0: GGMLQuantizationType.Q8_0, I32: GGMLQuantizationType.I32}[t]
        np_dtype = {F32: np.float32, F16: np.float16, I32: np.int32, Q8_0: np.uint8}[t]
        nb = _nbytes(pl.shape, t)
        if t == Q8_0:
            w.add_tensor_info(pl.gguf, gguf.quant_shape_to_byte_shape(pl.shape, gt), np.dtype(np.uint8),
                              nb, raw_dtype=gt)
        else:
            w.add_tensor_info(pl.gguf, pl.shape, np.dtype(np_dtype), nb, raw_dtype=gt)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    for pl in plans:
        t = types[pl.gguf]
        nb = _nbytes(pl.shape, t)
        if pl.kind == "tid2eid":
            a = np.asarray(st.plain(pl.sources[0]))
            if a.min() < 0 or a.max() >= hp.n_experts:
                raise ConvertError(f"{pl.sources[0]}: expert ids outside [0, {hp.n_experts})")
            _write_chunks(w, [np.ascontiguousarray(a, np.int32)], nb)
        elif pl.kind == "experts":
            _write_chunks(w, (_encode(s, t) for s in _expert_slabs(st, pl)), nb)
        else:
            a = st.weight(pl.sources[0]).reshape(pl.shape)
            _write_chunks(w, [_encode(a, t)], nb)
    w.close()
    for m in warnings:
        log("ds4-convert: warning: " + m)
    return {"tensors": len(plans), "types": types, "warnings": warnings, "hparams": hp}


# The version every tool prints (`ds4 --version` says the same: CMakeLists.txt's project version;
# tests/model/test_convert_cli.py checks they agree) and the exit-code table of docs/CLI.md.
VERSION = "ds4cpp 0.1.0"
EXIT_CODES = ("Exit status: 0 ok, 1 runtime failure (e.g. out of memory, a failed write or check), "
              "2 bad arguments, environment or input file, 130 interrupted (Ctrl-C).")


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # argparse's usage errors: one line, exit 2
        self.exit(2, f"ds4-convert: {message} (--help lists the arguments)\n")


def main(argv=None) -> int:
    ap = _Parser(
        prog="ds4-convert", description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="Tensor names accepted: transformers' module names (state_dict, or save_pretrained of a\n"
               "model loaded from such a checkpoint: model.layers.N.self_attn.*, lm_head.weight); what\n"
               "transformers' save_pretrained writes for a model built from a config (official leaves\n"
               "under model.: model.layers.N.attn.wq_a.weight, model.layers.N.ffn.experts.X.w1.weight,\n"
               "head.weight); the official checkpoint (layers.N.attn.*, embed.weight, head.weight,\n"
               "FP8/FP4 with their scales). mtp.* is skipped.\n\n" + EXIT_CODES)
    ap.add_argument("hf_dir", type=Path, help="folder with config.json and *.safetensors")
    ap.add_argument("out", type=Path, help="output .gguf")
    ap.add_argument("--quant", default="f16", choices=QUANTS)
    ap.add_argument("--name", help="general.name (default: the folder name)")
    ap.add_argument("--version", action="version", version=VERSION)
    args = ap.parse_args(argv)
    # Bad input (the checkpoint, its config, an unreadable or unwritable path) exits 2, a failure
    # of the conversion itself 1, Ctrl-C 130; never a traceback.
    try:
        if not (args.hf_dir / "config.json").is_file():
            raise ConvertError(f"{args.hf_dir} has no config.json (expected a Hugging Face checkpoint folder)")
        if args.out.resolve() == args.hf_dir.resolve() or args.out.is_dir():
            raise ConvertError(f"output {args.out} is a folder, not a .gguf file")
        r = convert(args.hf_dir, args.out, args.quant, args.name)
    except KeyboardInterrupt:
        print("ds4-convert: interrupted", file=sys.stderr)
        return 130
    except (ConvertError, json.JSONDecodeError, struct.error, KeyError, ValueError) as e:
        print(f"ds4-convert: error: {e}", file=sys.stderr)
        return 2
    except OSError as e:
        print(f"ds4-convert: error: {e}", file=sys.stderr)
        return 2 if isinstance(e, (FileNotFoundError, PermissionError, IsADirectoryError)) else 1
    except MemoryError:
        print("ds4-convert: error: out of memory", file=sys.stderr)
        return 1
    except Exception as e:  # a bug: still one line, not a traceback
        print(f"ds4-convert: error: {type(e).__name__}: {e}", file=sys.stderr)
        return 1
    print(f"ds4-convert: wrote {args.out} ({r['tensors']} tensors, {args.out.stat().st_size} bytes)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
