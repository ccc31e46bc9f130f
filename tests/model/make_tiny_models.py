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
        if args.oracle:
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
