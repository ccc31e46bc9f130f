#!/usr/bin/env python3
"""Tiny DeepSeek V4 models, their GGUFs, and transformers' expected logits.

    # expected logits (needs torch + transformers >= 5.8; writes tests/model/fixtures/<model>/)
    python3 tests/model/make_tiny_models.py --oracle [--models flash_mini,odd_shapes]
    # the trained models' weights (torch; ~5 and ~2 min on 2 cores), then their expected logits
    python3 tests/model/make_tiny_models.py --train --oracle --models trained_mini,trained_ratios
    # GGUFs for the C++ parity tests (numpy + gguf + safetensors only, a few seconds)
    python3 tests/model/make_tiny_models.py --gguf-dir build/tiny-models [--quant f32]

The models (configs, weights, prompts) are defined in tiny_models.py and rebuilt bit-identically by
numpy; the oracle is transformers' DeepseekV4ForCausalLM loading that checkpoint in float32 (eager
attention, the only implementation it has). For every prompt the fixture holds the logits at every
position of prompt + 16 greedy tokens (greedy = argmax, computed step by step without a cache), so
the logits of any prefix are rows of the same table.

Fixture files in tests/model/fixtures/<model>/:
  index.json                 what everything is (shapes, sha256, versions, coverage counters)
  <prompt>.logits.f32        float32 little-endian [rows, vocab] (small vocabularies)
  <prompt>.top64.ids.i32 / .top64.logits.f32 / .lse.f32 / .full.f32   (vocab_real: top-64 ids and
                             logits per row, log-sum-exp per row, and full rows at listed positions)
  <prompt>.rows.f32          (long_ctx, a `_long` model: 8192 tokens, ~5 min on 2 cores) float32
                             [stored positions, vocab] at the positions index.json lists: every 64th
                             and every position around 128, 2048, 4096 and the end, less the near-ties
                             of its router / indexer (MIN_RELATIVE_SELECTION_GAP; margins recorded);
                             no greedy continuation; also transformers' cached paths against its
                             uncached forward, and what a window or top-k one smaller does
  model-f32.gguf             the converter's f32 GGUF when it is under 5 MB (else rebuilt by CI)
"""
from __future__ import annotations

import argparse
import contextlib
import json
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import tiny_models as tm  # noqa: E402
from tiny_models import ds4_convert  # noqa: E402

MAX_COMMITTED_GGUF = 5 * 1024 * 1024
TOPK_REAL_VOCAB = 64
# Router / indexer top-k boundaries closer than this would make the expected logits depend on
# rounding (and, for exact ties, on torch.topk's arbitrary tie order): such models are rejected.
MIN_SELECTION_GAP = 1e-4


def build_gguf(name: str, out: Path, quant: str = "f32", hf_dir: Path | None = None) -> Path:
    """numpy-only: rebuild the checkpoint of `name` and convert it to `out`."""
    with tempfile.TemporaryDirectory() as tmp:
        d = tm.write_hf_dir(name, hf_dir or Path(tmp) / name)
        ds4_convert.convert(d, out, quant, name=f"ds4cpp tiny {name}", log=lambda m: None)
    return out


@contextlib.contextmanager
def coverage_probes(counters):
    """Counts, during a forward pass, how often each rarely-exercised branch actually fires."""
    from transformers.models.deepseek_v4 import modeling_deepseek_v4 as M

    saved = (M.DeepseekV4Experts._apply_gate, M.DeepseekV4MLP.forward, M.DeepseekV4TopKRouter.forward,
             M.DeepseekV4Indexer.forward, M.DeepseekV4IndexerScorer.forward)
    orig_gate, orig_mlp, orig_router, orig_indexer, orig_scorer = saved
    stash = {}
    counters.setdefault("router_min_selection_gap", float("inf"))
    counters.setdefault("indexer_min_selection_gap", float("inf"))

    def apply_gate(self, gate_up):
        g, u = gate_up.chunk(2, dim=-1)
        counters["routed_gate_above_limit"] += int((g > self.limit).sum())
        counters["routed_up_outside_limit"] += int((u.abs() > self.limit).sum())
        counters["routed_gate_up_values"] += g.numel()
        return orig_gate(self, gate_up)

    def mlp_forward(self, x):
        g, u = self.gate_proj(x), self.up_proj(x)
        counters["shared_gate_above_limit"] += int((g > self.limit).sum())
        counters["shared_up_outside_limit"] += int((u.abs() > self.limit).sum())
        counters["shared_gate_up_values"] += g.numel()
        return orig_mlp(self, x)

    def router_forward(self, hidden_states):
        import torch
        logits, weights, idx = orig_router(self, hidden_states)
        scores = self.score_fn(logits)
        unbiased = torch.topk(scores, self.top_k, dim=-1).indices
        if self.num_experts > self.top_k:  # gap between the last selected and the first rejected expert
            srt = torch.sort(scores + self.e_score_correction_bias, dim=-1, descending=True).values
            gap = float((srt[:, self.top_k - 1] - srt[:, self.top_k]).min())
            counters["router_min_selection_gap"] = min(counters["router_min_selection_gap"], gap)
        differ = (idx.sort(-1).values != unbiased.sort(-1).values).any(-1)
        counters["router_rows"] += int(differ.numel())
        counters["router_rows_where_bias_changed_selection"] += int(differ.sum())
        return logits, weights, idx

    def scorer_forward(self, q, compressed_kv, hidden_states):
        stash["scores"] = orig_scorer(self, q, compressed_kv, hidden_states)
        return stash["scores"]

    def indexer_forward(self, hidden_states, q_residual, position_ids, cache, layer_idx):
        idx = orig_indexer(self, hidden_states, q_residual, position_ids, cache, layer_idx)
        visible = (position_ids + 1) // self.compress_rate            # [B, S]
        scores = stash["scores"]
        for s in range(scores.shape[1]):  # gap at the top-k boundary, for queries that really select
            v = int(visible[0, s])
            if v > self.index_topk:
                srt = scores[0, s, :v].sort(descending=True).values
                gap = float(srt[self.index_topk - 1] - srt[self.index_topk])
                counters["indexer_min_selection_gap"] = min(counters["indexer_min_selection_gap"], gap)
        chosen = (idx >= 0).sum(-1)                                  # [B, S]
        counters["indexer_queries"] += int(chosen.numel())
        counters["indexer_queries_with_a_real_selection"] += int((chosen < visible).sum())
        return idx

    M.DeepseekV4Experts._apply_gate = apply_gate
    M.DeepseekV4MLP.forward = mlp_forward
    M.DeepseekV4TopKRouter.forward = router_forward
    M.DeepseekV4Indexer.forward = indexer_forward
    M.DeepseekV4IndexerScorer.forward = scorer_forward
    try:
        yield
    finally:
        (M.DeepseekV4Experts._apply_gate, M.DeepseekV4MLP.forward, M.DeepseekV4TopKRouter.forward,
         M.DeepseekV4Indexer.forward, M.DeepseekV4IndexerScorer.forward) = saved


def train(name: str, log=print) -> Path:
    """Trains a `_trained` model from its numpy initialisation on its language (tiny_models.py) and
    writes fixtures/<name>/model.safetensors (state_dict names, float32, or float16 where its
    `_trained` settings say so: the integer tid2eid stays int64)."""
    import torch
    from transformers import DeepseekV4ForCausalLM

    tr = tm.MODELS[name]["_trained"]
    torch.manual_seed(tr["torch_seed"])
    with tempfile.TemporaryDirectory() as tmp:
        hf_dir = tm.write_hf_dir(name, Path(tmp) / "hf", weights=tm.init_weights(name))
        model = DeepseekV4ForCausalLM.from_pretrained(str(hf_dir), dtype=torch.float32)
    rs = np.random.RandomState(tr["data_seed"] + 1)
    opt = torch.optim.AdamW(model.parameters(), lr=tr["lr"])
    model.train()
    t0 = time.time()
    for step in range(tr["steps"]):
        x = torch.tensor(tm.language_batch(name, rs, tr["batch"], tr["seq"]))
        loss = model(x, labels=x, use_cache=False).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step % 50 == 0 or step == tr["steps"] - 1:
            log(f"{name}: step {step} loss {float(loss):.4g} ({time.time() - t0:.0f}s)")
    sd = {k: v.detach().cpu().numpy() for k, v in model.state_dict().items()}
    if tr.get("dtype") == "float16":
        sd = {k: v.astype(np.float16) if v.dtype == np.float32 else v for k, v in sd.items()}
    out = tm.trained_weights_path(name)
    out.parent.mkdir(parents=True, exist_ok=True)
    tm.save_safetensors(sd, out)
    return out


def run_oracle(name: str, log=print) -> dict:
    import torch
    import transformers
    from transformers import DeepseekV4ForCausalLM

    torch.manual_seed(0)
    spec = tm.MODELS[name]
    fdir = tm.fixture_dir(name)
    if fdir.exists():  # a trained model's weights are a fixture too: keep them
        for f in fdir.iterdir():
            if f != tm.trained_weights_path(name):
                f.unlink()
    fdir.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    with tempfile.TemporaryDirectory() as tmp:
        hf_dir = tm.write_hf_dir(name, Path(tmp) / "hf")
        weights_sha = tm.weights_sha256(tm.build_weights(name))
        model, info = DeepseekV4ForCausalLM.from_pretrained(str(hf_dir), dtype=torch.float32,
                                                            output_loading_info=True)
        bad = {k: v for k, v in info.items() if v}
        if bad:
            raise SystemExit(f"{name}: transformers did not load the checkpoint cleanly: {bad}")
        model.eval()
        if model.config._attn_implementation != "eager":
            raise SystemExit(f"{name}: attention implementation {model.config._attn_implementation}")
        # the loaded parameters are exactly the numpy ones
        ref = tm.build_weights(name)
        sd = model.state_dict()
        if set(sd) != set(ref):
            raise SystemExit(f"{name}: state_dict names differ: {sorted(set(sd) ^ set(ref))[:8]}")
        for k, v in ref.items():
            if not np.array_equal(sd[k].numpy(), v):
                raise SystemExit(f"{name}: {k} changed on load")
        # save_pretrained writes the same names (the converter's "transformers" naming)
        model.save_pretrained(str(Path(tmp) / "saved"))
        from safetensors import safe_open
        saved = set()
        for f in (Path(tmp) / "saved").glob("*.safetensors"):
            with safe_open(str(f), "np") as fh:
                saved.update(fh.keys())
        if saved != {tm.saved_name(k) for k in ref}:
            raise SystemExit(f"{name}: save_pretrained names differ: "
                             f"{sorted(saved ^ {tm.saved_name(k) for k in ref})[:8]}")

        gguf_entry = None
        if not spec.get("_real_vocab") and not spec.get("_trained"):  # CI rebuilds trained ones
            g = fdir / "model-f32.gguf"
            ds4_convert.convert(hf_dir, g, "f32", name=f"ds4cpp tiny {name}", log=lambda m: None)
            if g.stat().st_size <= MAX_COMMITTED_GGUF:
                gguf_entry = {"file": g.name, "quant": "f32", "bytes": g.stat().st_size,
                              "sha256": tm.sha256_file(g)}
            else:
                g.unlink()

    cfg = model.config
    prompts_out = []
    counters_total: dict = defaultdict(int)
    for pname, tokens in tm.prompt_tokens(name).items():
        n_prompt = len(tokens)
        ids = list(tokens)
        margins = []
        with torch.no_grad():
            for _ in range(tm.N_GREEDY):  # greedy, full recompute, no cache
                logits = model(torch.tensor([ids]), use_cache=False).logits[0, -1]
                ids.append(int(torch.argmax(logits)))
            generated = ids[n_prompt:]
            counters = defaultdict(int)
            with coverage_probes(counters):
                rows = model(torch.tensor([ids[:-1]]), use_cache=False).logits[0].numpy().astype(np.float32)
            for k, v in counters.items():
                counters_total[k] = min(counters_total.get(k, v), v) if "min_" in k else counters_total[k] + v
            for k in ("router_min_selection_gap", "indexer_min_selection_gap"):
                if counters[k] < MIN_SELECTION_GAP:
                    raise SystemExit(f"{name}/{pname}: {k} = {counters[k]:.3g}: a near-tie in a top-k "
                                     "selection (torch.topk breaks ties arbitrarily, an f32 engine may "
                                     "flip it); change the model's seed or shape")
            # transformers' own decode path: prefill the prompt, then one token at a time with the cache
            out = model(torch.tensor([tokens]), use_cache=True)
            cache = out.cache
            dec = [out.logits[0].numpy()]
            for t in generated[:-1]:
                out = model(torch.tensor([[t]]), cache=cache, use_cache=True)
                cache = out.cache
                dec.append(out.logits[0].numpy())
            dec = np.concatenate(dec, 0)
            # and pure token-by-token decode from position 0
            out = model(torch.tensor([ids[:1]]), use_cache=True)
            cache = out.cache
            tbt = [out.logits[0].numpy()]
            for t in ids[1:-1]:
                out = model(torch.tensor([[t]]), cache=cache, use_cache=True)
                cache = out.cache
                tbt.append(out.logits[0].numpy())
            tbt = np.concatenate(tbt, 0)
        for s in range(tm.N_GREEDY):
            r = rows[n_prompt - 1 + s]
            top2 = np.sort(r)[-2:]
            margins.append(float(top2[1] - top2[0]))
            if int(np.argmax(r)) != generated[s]:
                log(f"{name}/{pname}: greedy step {s} argmax differs between step-wise and batched runs")
        entry = {"name": pname, "tokens": ids[:-1], "n_prompt": n_prompt, "generated": generated,
                 "rows": int(rows.shape[0]), "greedy_top2_margin": margins,
                 "transformers_decode_path_max_abs_diff": {
                     "prefill_then_cached_decode": float(np.abs(dec - rows).max()),
                     "cached_token_by_token": float(np.abs(tbt - rows).max())},
                 "logits_abs_max": float(np.abs(rows).max()), "logits_std": float(rows.std()),
                 "coverage": dict(counters)}
        if spec.get("_real_vocab"):
            top = np.argsort(-rows, axis=1, kind="stable")[:, :TOPK_REAL_VOCAB].astype(np.int32)
            topv = np.take_along_axis(rows, top, 1).astype(np.float32)
            m = rows.max(1, keepdims=True)
            lse = (m[:, 0] + np.log(np.exp(rows - m).sum(1))).astype(np.float32)
            full_pos = [n_prompt - 1, rows.shape[0] - 1]
            files = {"top_ids": f"{pname}.top{TOPK_REAL_VOCAB}.ids.i32",
                     "top_logits": f"{pname}.top{TOPK_REAL_VOCAB}.logits.f32",
                     "logsumexp": f"{pname}.lse.f32", "full_rows": f"{pname}.full.f32"}
            top.astype("<i4").tofile(fdir / files["top_ids"])
            topv.astype("<f4").tofile(fdir / files["top_logits"])
            lse.astype("<f4").tofile(fdir / files["logsumexp"])
            rows[full_pos].astype("<f4").tofile(fdir / files["full_rows"])
            entry.update(files={k: {"file": v, "sha256": tm.sha256_file(fdir / v)} for k, v in files.items()},
                         top_k=TOPK_REAL_VOCAB, full_row_positions=full_pos)
        else:
            f = f"{pname}.logits.f32"
            rows.astype("<f4").tofile(fdir / f)
            entry["files"] = {"logits": {"file": f, "sha256": tm.sha256_file(fdir / f),
                                         "dtype": "float32-le", "shape": [int(rows.shape[0]), int(rows.shape[1])]}}
        prompts_out.append(entry)

    schedule = []
    for i, lt in enumerate(cfg.layer_types):
        r = cfg.compress_rates.get(lt, 0) if lt != tm.S else 0
        schedule.append({"layer": i, "type": lt, "ratio": r, "mlp": cfg.mlp_layer_types[i]})
    index = {
        "format": 1, "model": name,
        "generator": "tests/model/make_tiny_models.py --oracle",
        "oracle": "transformers DeepseekV4ForCausalLM, float32, eager attention, use_cache=False",
        "transformers_version": transformers.__version__, "torch_version": torch.__version__,
        "numpy_version": np.__version__,
        "weights_sha256": weights_sha,
        "config": tm.hf_config(name), "schedule": schedule,
        "vocab_size": cfg.vocab_size, "n_greedy": tm.N_GREEDY,
        "rounding": "none: transformers applies no FP8 KV-row or Hadamard+FP4 indexer simulation",
        "gguf": gguf_entry, "prompts": prompts_out, "coverage_total": dict(counters_total),
        "seconds": round(time.time() - t0, 1),
    }
    (fdir / "index.json").write_text(json.dumps(index, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    return index


# `_long` models: a selection whose two sides (the k-th and the (k+1)-th score) are closer than
# this, relative to the largest |score| of that selection, is a near-tie: an f32 engine whose scores
# differ from transformers' by ~1e-6 relative (the logits do, at the end of the model) may pick the
# other row or expert, and one swapped row of the 512 moves that position's logits by ~1e-3. The
# logits at such a position are not stored (index.json lists it and its gaps); elsewhere a tie
# cannot reach the stored rows, because the model's only selections are in its last layer
# (tiny_models.py, long_ctx).
MIN_RELATIVE_SELECTION_GAP = 1e-5


@contextlib.contextmanager
def selection_margins(out: dict):
    """Records, per query position of one uncached forward pass, the gap at the top-k boundary of
    the non-hash router and of the indexer (absolute, and the largest |score| it is relative to).
    A `_long` model has one layer with each, so one record each."""
    import torch
    from transformers.models.deepseek_v4 import modeling_deepseek_v4 as M

    saved = (M.DeepseekV4TopKRouter.forward, M.DeepseekV4Indexer.forward, M.DeepseekV4IndexerScorer.forward)
    orig_router, orig_indexer, orig_scorer = saved
    stash = {}

    def router_forward(self, hidden_states):
        logits, weights, idx = orig_router(self, hidden_states)
        s = self.score_fn(logits) + self.e_score_correction_bias
        top = torch.topk(s, self.top_k + 1, dim=-1).values
        if "router" in out:
            raise SystemExit("more than one non-hash router layer")
        out["router"] = ((top[:, self.top_k - 1] - top[:, self.top_k]).numpy().astype(np.float64),
                         s.abs().amax(-1).numpy().astype(np.float64))
        return logits, weights, idx

    def scorer_forward(self, q, compressed_kv, hidden_states):
        stash["scores"] = orig_scorer(self, q, compressed_kv, hidden_states)
        return stash["scores"]

    def indexer_forward(self, hidden_states, q_residual, position_ids, cache, layer_idx):
        idx = orig_indexer(self, hidden_states, q_residual, position_ids, cache, layer_idx)
        scores = stash["scores"][0]                                   # [S, T]
        visible = (position_ids[0] + 1) // self.compress_rate         # [S]
        T, k = scores.shape[-1], self.index_topk
        future = torch.arange(T)[None, :] >= visible[:, None]
        gap = np.full(scores.shape[0], np.inf)
        if T > k:
            top = scores.masked_fill(future, float("-inf")).topk(k + 1, dim=-1).values
            g = (top[:, k - 1] - top[:, k]).numpy().astype(np.float64)
            sel = (visible > k).numpy()                               # queries that really choose
            gap[sel] = g[sel]
        mag = scores.masked_fill(future, 0.0).abs().amax(-1).numpy().astype(np.float64)
        if "indexer" in out:
            raise SystemExit("more than one indexer layer")
        out["indexer"] = (gap, mag, visible.numpy())
        return idx

    M.DeepseekV4TopKRouter.forward = router_forward
    M.DeepseekV4Indexer.forward = indexer_forward
    M.DeepseekV4IndexerScorer.forward = scorer_forward
    try:
        yield
    finally:
        M.DeepseekV4TopKRouter.forward, M.DeepseekV4Indexer.forward, M.DeepseekV4IndexerScorer.forward = saved


def run_long_oracle(name: str, log=print) -> dict:
    """Fixtures of a `_long` model: its one prompt evaluated by transformers in one uncached forward;
    the logits at tm.long_positions() as full float32 rows (<prompt>.rows.f32, [positions, vocab],
    little-endian; 192 x 512 x 4 = 393 kB for long_ctx: full rows keep the same max-relative
    comparison as the other fixtures, and f16 would round at 5e-4 relative, 100x coarser than the
    bound), the selection margins at every position, and transformers' own cached paths against
    the uncached one."""
    import torch
    import transformers
    from transformers import DeepseekV4ForCausalLM

    torch.manual_seed(0)
    spec = tm.MODELS[name]
    fdir = tm.fixture_dir(name)
    if fdir.exists():
        for f in fdir.iterdir():
            f.unlink()
    fdir.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    (pname, tokens), = tm.prompt_tokens(name).items()
    positions = tm.long_positions(name, len(tokens))
    ids = torch.tensor([tokens])
    with tempfile.TemporaryDirectory() as tmp:
        hf_dir = tm.write_hf_dir(name, Path(tmp) / "hf")
        weights = tm.build_weights(name)
        model, info = DeepseekV4ForCausalLM.from_pretrained(str(hf_dir), dtype=torch.float32,
                                                            output_loading_info=True)
        bad = {k: v for k, v in info.items() if v}
        if bad:
            raise SystemExit(f"{name}: transformers did not load the checkpoint cleanly: {bad}")
        model.eval()
        sd = model.state_dict()
        for k, v in weights.items():
            if not np.array_equal(sd[k].numpy(), v):
                raise SystemExit(f"{name}: {k} changed on load")
        g = fdir / "model-f32.gguf"
        ds4_convert.convert(hf_dir, g, "f32", name=f"ds4cpp tiny {name}", log=lambda m: None)
        gguf_entry = None
        if g.stat().st_size <= MAX_COMMITTED_GGUF:
            gguf_entry = {"file": g.name, "quant": "f32", "bytes": g.stat().st_size, "sha256": tm.sha256_file(g)}
        else:
            g.unlink()

    def forward_rows(m, **kw):
        with torch.no_grad():
            return m(ids, use_cache=False, **kw).logits[0].numpy()

    margins: dict = {}
    with selection_margins(margins):
        full = forward_rows(model)
    log(f"{name}: uncached forward of {len(tokens)} tokens in {time.time() - t0:.0f}s")
    # selection margins; positions whose selection is a near-tie are not stored (listed instead)
    r_gap, r_mag = margins["router"]
    i_gap, i_mag, visible = margins["indexer"]
    r_rel, i_rel = r_gap / r_mag, i_gap / np.maximum(i_mag, 1e-30)
    near_tie = (r_rel < MIN_RELATIVE_SELECTION_GAP) | (i_rel < MIN_RELATIVE_SELECTION_GAP)
    left_out = [{"position": int(p), "router": float(r_rel[p]), "indexer": float(i_rel[p])}
                for p in positions if near_tie[p]]
    positions = [p for p in positions if not near_tie[p]]
    if left_out:
        log(f"{name}: near-ties at {left_out}: not stored")
    rows = full[positions].astype(np.float32)
    ref_max = float(np.abs(rows).max())
    pos = np.array(positions)
    choosing = pos[visible[pos] > spec["index_topk"]]

    # transformers against itself: prefill in chunks with the cache, and prefill then decode
    def cached(chunks):
        out, cache, at = {}, None, 0
        with torch.no_grad():
            for n in chunks:
                o = model(ids[:, at:at + n], cache=cache, use_cache=True)
                cache = o.cache
                lg = o.logits[0].numpy()
                for j in range(n):
                    out[at + j] = lg[j]
                at += n
        return out

    def diff(got: dict):
        common = [p for p in positions if p in got]
        return float(max(np.abs(got[p] - full[p]).max() for p in common)) / ref_max, len(common)

    self_checks = {}
    chunked = [1000] * (len(tokens) // 1000) + ([len(tokens) % 1000] if len(tokens) % 1000 else [])
    self_checks["prefill_in_chunks_of_1000_with_cache"] = diff(cached(chunked))
    for lo, hi in spec["_long"]["around"][2:4]:  # decode token by token across 2048 and 4096
        self_checks[f"prefill_{lo}_then_decode_to_{hi}"] = diff(cached([lo] + [1] * (hi - lo)))
    log(f"{name}: cached paths {self_checks} ({time.time() - t0:.0f}s)")

    # what one boundary off would do (each, to the logits at the stored positions after it)
    sensitivity = {}
    for key, val, after in (("sliding_window", spec["sliding_window"] - 1, spec["sliding_window"] - 1),
                            ("index_topk", spec["index_topk"] - 1, 4 * spec["index_topk"])):
        cfg = model.config.to_dict()
        cfg[key] = val
        other = DeepseekV4ForCausalLM(type(model.config).from_dict(cfg)).eval()
        other.load_state_dict(model.state_dict())
        o = forward_rows(other)
        later = [p for p in positions if p >= after]
        sensitivity[f"{key}={val}"] = {"from_position": after, "max_relative_deviation":
                                       float(np.abs(o[later] - full[later]).max()) / ref_max}
    log(f"{name}: sensitivity {sensitivity} ({time.time() - t0:.0f}s)")

    f = f"{pname}.rows.f32"
    rows.astype("<f4").tofile(fdir / f)
    entry = {"name": pname, "tokens": list(map(int, tokens)), "n_prompt": len(tokens), "generated": [],
             "rows": len(positions), "full_row_positions": positions,
             "files": {"full_rows": {"file": f, "sha256": tm.sha256_file(fdir / f), "dtype": "float32-le",
                                     "shape": [len(positions), int(rows.shape[1])]}},
             "logits_abs_max": ref_max, "logits_std": float(rows.std()),
             "transformers_self_consistency_max_relative_deviation": {k: v[0] for k, v in self_checks.items()},
             "selection_margins": {
                 "definition": "gap between the k-th and (k+1)-th score of a top-k selection, divided by the "
                               "largest |score| of that selection; router: last layer, k = experts per token; "
                               "indexer: layer with ratio 4, k = index_topk, only queries that see more than "
                               "k compressed rows",
                 "indexer_queries_choosing": int((visible > spec["index_topk"]).sum()),
                 "stored_positions_where_the_indexer_chooses": len(choosing),
                 "router_min_at_stored_positions": float(r_rel[pos].min()),
                 "indexer_min_at_stored_positions": float(i_rel[choosing].min()) if len(choosing) else None,
                 "router_min_anywhere": float(r_rel.min()), "indexer_min_anywhere": float(i_rel.min()),
                 "router_positions_below_threshold": int((r_rel < MIN_RELATIVE_SELECTION_GAP).sum()),
                 "indexer_positions_below_threshold": int((i_rel < MIN_RELATIVE_SELECTION_GAP).sum()),
                 "threshold": MIN_RELATIVE_SELECTION_GAP,
                 "near_ties_left_out": left_out,
                 "router_at_stored_positions": [float(x) for x in r_rel[pos]],
                 "indexer_at_stored_positions": [None if not np.isfinite(x) else float(x) for x in i_rel[pos]]},
             "boundary_sensitivity": sensitivity}
    schedule = [{"layer": i, "type": lt, "ratio": model.config.compress_rates.get(lt, 0) if lt != tm.S else 0,
                 "mlp": model.config.mlp_layer_types[i]} for i, lt in enumerate(model.config.layer_types)]
    index = {
        "format": 1, "model": name, "generator": "tests/model/make_tiny_models.py --oracle",
        "oracle": "transformers DeepseekV4ForCausalLM, float32, eager attention, use_cache=False, one forward "
                  "over the whole prompt",
        "transformers_version": transformers.__version__, "torch_version": torch.__version__,
        "numpy_version": np.__version__, "weights_sha256": tm.weights_sha256(weights),
        "config": tm.hf_config(name), "schedule": schedule, "vocab_size": int(rows.shape[1]), "n_greedy": 0,
        "rounding": "none: transformers applies no FP8 KV-row or Hadamard+FP4 indexer simulation",
        "gguf": gguf_entry, "prompts": [entry], "seconds": round(time.time() - t0, 1),
    }
    (fdir / "index.json").write_text(json.dumps(index, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    return index


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default=",".join(tm.MODELS), help="comma-separated subset")
    ap.add_argument("--oracle", action="store_true", help="regenerate fixtures with transformers")
    ap.add_argument("--train", action="store_true",
                    help="retrain the trained models (torch) before anything else")
    ap.add_argument("--gguf-dir", type=Path, help="write <model>-<quant>.gguf here (no torch needed)")
    ap.add_argument("--quant", default="f32", choices=ds4_convert.QUANTS)
    args = ap.parse_args()
    names = [n for n in args.models.split(",") if n]
    for n in names:
        if n not in tm.MODELS:
            ap.error(f"unknown model {n}; known: {', '.join(tm.MODELS)}")
    if not args.oracle and not args.gguf_dir and not args.train:
        ap.error("nothing to do: pass --train, --oracle and/or --gguf-dir")
    for n in names:
        t0 = time.time()
        if args.train and tm.MODELS[n].get("_trained"):
            print(f"{n}: trained weights in {train(n)}")
        if args.oracle and tm.MODELS[n].get("_long"):
            idx = run_long_oracle(n)
            p = idx["prompts"][0]
            print(f"{n}: fixtures in {time.time() - t0:.1f}s; {p['rows']} rows; margins "
                  f"{ {k: v for k, v in p['selection_margins'].items() if not isinstance(v, (list, str))} }")
        elif args.oracle:
            idx = run_oracle(n)
            cov = idx["coverage_total"]
            print(f"{n}: fixtures in {time.time() - t0:.1f}s; coverage {json.dumps(cov)}")
            for p in idx["prompts"]:
                print(f"  {p['name']}: {p['rows']} rows, greedy {p['generated']}, "
                      f"min margin {min(p['greedy_top2_margin']):.3g}, decode-path diff "
                      f"{p['transformers_decode_path_max_abs_diff']}")
        if args.gguf_dir:
            args.gguf_dir.mkdir(parents=True, exist_ok=True)
            out = build_gguf(n, args.gguf_dir / f"{n}-{args.quant}.gguf", args.quant)
            print(f"{n}: {out} ({out.stat().st_size} bytes) in {time.time() - t0:.1f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
