"""docs/MODEL.md section 4, read literally, in numpy: a token-by-token decoder over our GGUF.

This is not an oracle (it was written here, from the spec); it is the executable form of the spec
that the tests run against transformers' fixtures. When it agrees with transformers on every tiny
model, the spec, the converter's tensor layout and docs/TRANSFORMERS_NOTES.md agree with the oracle;
when it does not, one of them is wrong. It also gives the C++ engine a step-by-step reference whose
intermediate values can be printed.

Rounding: `fp8=True` applies docs/MODEL.md's FP8-E4M3 simulation to raw and compressed KV rows and
`fp4=True` the Hadamard+FP4 indexer simulation (transformers does neither; both default off).
"""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np


def _meta(reader, key, default=None):
    f = reader.fields.get(key)
    if f is None:
        return default
    v = f.contents()
    return v


class Gguf:
    def __init__(self, path: Path):
        from gguf import GGUFReader
        from gguf.quants import dequantize

        self.r = GGUFReader(str(path))
        self.t = {}
        self.types = {}
        for t in self.r.tensors:
            self.types[t.name] = t.tensor_type.name
            if t.tensor_type.name == "I32":
                a = np.asarray(t.data).astype(np.int64)
            else:
                a = dequantize(t.data, t.tensor_type).astype(np.float32)
            self.t[t.name] = a.reshape([int(x) for x in reversed(t.shape)])

    def m(self, key, default=None):
        return _meta(self.r, "deepseek4." + key, default)


def rmsnorm(x, w, eps):
    x = x.astype(np.float64)
    y = x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps)
    return (y * w if w is not None else y).astype(np.float32)


def rope_freqs(rd, base, factor=1.0, orig=0, beta_fast=32.0, beta_slow=1.0):
    k = np.arange(rd // 2, dtype=np.float64)
    f = base ** (-2.0 * k / rd)
    if factor != 1.0:
        corr = lambda beta: rd * math.log(orig / (2 * math.pi * beta)) / (2 * math.log(base))  # noqa: E731
        lo = max(0, math.floor(corr(beta_fast)))
        hi = min(rd - 1, math.ceil(corr(beta_slow)))
        ramp = 1.0 - np.clip((k - lo) / max(0.001, hi - lo), 0.0, 1.0)
        f = f / factor * (1.0 - ramp) + f * ramp
    return f.astype(np.float32)


def rope(x, p, freqs, inverse=False):
    """Rotates the last 2*len(freqs) dims of x (any leading shape) at position p, adjacent pairs."""
    rd = 2 * len(freqs)
    th = (np.float32(p) * freqs).astype(np.float64)
    c, s = np.cos(th), np.sin(th)
    if inverse:
        s = -s
    y = x.copy()
    a, b = x[..., -rd::2].astype(np.float64), x[..., -rd + 1::2].astype(np.float64)
    y[..., -rd::2] = a * c - b * s
    y[..., -rd + 1::2] = a * s + b * c
    return y.astype(np.float32)


def _round_grid(x, grid):
    """Nearest value of a sorted non-negative grid, ties toward the even index."""
    ax = np.abs(x)
    i = np.clip(np.searchsorted(grid, ax), 1, len(grid) - 1)
    lo, hi = grid[i - 1], grid[i]
    pick_hi = (ax - lo > hi - ax) | ((ax - lo == hi - ax) & (i % 2 == 0))
    return np.sign(x) * np.where(pick_hi, hi, lo)


_E4M3 = np.array(sorted({(m / 8.0) * 2.0 ** -6 if e == 0 else (1 + m / 8.0) * 2.0 ** (e - 7)
                         for e in range(16) for m in range(8) if not (e == 15 and m == 7)}))
_E2M1 = np.array([0, .5, 1, 1.5, 2, 3, 4, 6])


def fp8sim(v, n_nope):
    v = v.copy()
    for b in range(0, n_nope, 64):
        blk = v[b:b + 64].astype(np.float64)
        amax = max(np.abs(blk).max(), 1e-4)
        s = 2.0 ** math.ceil(math.log2(amax / 448.0))
        v[b:b + 64] = _round_grid(np.clip(blk / s, -448, 448), _E4M3) * s
    return v


def hadamard(v):
    v = v.astype(np.float64).copy()
    n, h = len(v), 1
    while h < n:
        for i in range(0, n, 2 * h):
            a, b = v[i:i + h].copy(), v[i + h:i + 2 * h].copy()
            v[i:i + h], v[i + h:i + 2 * h] = a + b, a - b
        h *= 2
    return v / math.sqrt(n)


def iqat(v):
    v = hadamard(v)
    for b in range(0, len(v), 32):
        blk = v[b:b + 32]
        amax = max(np.abs(blk).max(), 7.052966104933725e-38)
        s = 2.0 ** math.ceil(math.log2(amax / 6.0))
        v[b:b + 32] = _round_grid(np.clip(blk / s, -6, 6), _E2M1) * s
    return v.astype(np.float32)


class Compressor:
    """docs/MODEL.md 4.4 rolling state for one (layer, attention|indexer) compressor."""

    def __init__(self, ratio, d, ape, wkv, wgate, norm, eps):
        self.r, self.d = ratio, d
        self.coff = 2 if ratio == 4 else 1
        self.ape, self.wkv, self.wgate, self.norm, self.eps = ape, wkv, wgate, norm, eps
        self.kv = np.zeros((self.coff * ratio, self.coff * d), np.float32)
        self.sc = np.full((self.coff * ratio, self.coff * d), -np.inf, np.float32)

    def step(self, xn, p):
        """Returns the pooled+normed row (before RoPE) when position p completes a window."""
        r = self.r
        row = (4 + p % 4) if r == 4 else p % r
        self.kv[row] = self.wkv @ xn
        self.sc[row] = self.wgate @ xn + self.ape[p % r]
        if (p + 1) % r:
            return None
        if r == 4:
            d = self.d
            kv = np.concatenate([self.kv[:4, :d], self.kv[4:, d:]], 0)    # [8, d]
            sc = np.concatenate([self.sc[:4, :d], self.sc[4:, d:]], 0)
            self.kv[:4], self.sc[:4] = self.kv[4:].copy(), self.sc[4:].copy()
        else:
            kv, sc = self.kv, self.sc
        m = sc.max(0, keepdims=True)
        w = np.exp((sc - m).astype(np.float64))
        pooled = ((w * kv).sum(0) / w.sum(0)).astype(np.float32)
        return rmsnorm(pooled, self.norm, self.eps)


class RefModel:
    def __init__(self, path: Path, fp8: bool = False, fp4: bool = False):
        g = self.g = Gguf(path)
        self.fp8, self.fp4 = fp8, fp4
        self.L = int(g.m("block_count"))
        self.H = int(g.m("embedding_length"))
        self.nh = int(g.m("attention.head_count"))
        self.D = int(g.m("attention.key_length"))
        self.rd = int(g.m("rope.dimension_count"))
        self.groups = int(g.m("attention.output_group_count"))
        self.n_used = int(g.m("expert_used_count"))
        self.window = int(g.m("attention.sliding_window"))
        self.topk = int(g.m("attention.indexer.top_k"))
        self.ih = int(g.m("attention.indexer.head_count"))
        self.idim = int(g.m("attention.indexer.key_length"))
        self.hc = int(g.m("hyper_connection.count"))
        self.sinkhorn = int(g.m("hyper_connection.sinkhorn_iterations"))
        self.hc_eps = float(g.m("hyper_connection.epsilon"))
        self.eps = float(g.m("attention.layer_norm_rms_epsilon"))
        self.ratios = [int(x) for x in g.m("attention.compress_ratios")]
        self.clamp = [float(x) for x in g.m("swiglu_clamp_exp")]
        self.route_scale = float(g.m("expert_weights_scale"))
        self.f_main = rope_freqs(self.rd, float(g.m("rope.freq_base")))
        self.f_comp = rope_freqs(self.rd, float(g.m("attention.compress_rope_freq_base")),
                                 float(g.m("rope.scaling.factor")), int(g.m("rope.scaling.original_context_length")),
                                 float(g.m("rope.scaling.yarn_beta_fast")), float(g.m("rope.scaling.yarn_beta_slow")))
        self.reset()

    def reset(self):
        g, t = self.g, self.g.t
        self.margins = []   # (kind, layer, position, gap between the last selected and the first rejected)
        self.pos = 0
        self.raw = [[] for _ in range(self.L)]
        self.comp = [[] for _ in range(self.L)]
        self.icomp = [[] for _ in range(self.L)]
        self.cstate, self.istate = [None] * self.L, [None] * self.L
        for i, r in enumerate(self.ratios):
            b = f"blk.{i}."
            if r:
                self.cstate[i] = Compressor(r, self.D, t[b + "attn_compressor_ape.weight"],
                                            t[b + "attn_compressor_kv.weight"], t[b + "attn_compressor_gate.weight"],
                                            t[b + "attn_compressor_norm.weight"], self.eps)
            if r == 4:
                self.istate[i] = Compressor(4, self.idim, t[b + "indexer_compressor_ape.weight"],
                                            t[b + "indexer_compressor_kv.weight"],
                                            t[b + "indexer_compressor_gate.weight"],
                                            t[b + "indexer_compressor_norm.weight"], self.eps)
        _ = g

    # docs/MODEL.md 4.2
    def hc_pre(self, X, fn, scale, base):
        n = self.hc
        flat = rmsnorm(X.reshape(-1), None, self.eps)
        m = (fn.astype(np.float64) @ flat).astype(np.float32)
        pre = 1 / (1 + np.exp(-(m[:n] * scale[0] + base[:n]))) + self.hc_eps
        post = 2 / (1 + np.exp(-(m[n:2 * n] * scale[1] + base[n:2 * n])))
        Lg = (m[2 * n:] * scale[2] + base[2 * n:]).reshape(n, n)
        C = np.exp(Lg - Lg.max(1, keepdims=True))
        C = C / C.sum(1, keepdims=True) + self.hc_eps
        C = C / (C.sum(0, keepdims=True) + self.hc_eps)
        for _ in range(self.sinkhorn - 1):
            C = C / (C.sum(1, keepdims=True) + self.hc_eps)
            C = C / (C.sum(0, keepdims=True) + self.hc_eps)
        x_in = (pre[:, None] * X).sum(0).astype(np.float32)
        return x_in, post.astype(np.float32), C.astype(np.float32)

    @staticmethod
    def hc_post(y, X, post, C):
        return (post[:, None] * y[None, :] + C.T @ X).astype(np.float32)

    def attention(self, il, X, p):
        t, b, r = self.g.t, f"blk.{il}.", self.ratios[il]
        fr = self.f_main if r == 0 else self.f_comp
        x_in, post, C = self.hc_pre(X, t[b + "hc_attn_fn.weight"], t[b + "hc_attn_scale.weight"],
                                    t[b + "hc_attn_base.weight"])
        xn = rmsnorm(x_in, t[b + "attn_norm.weight"], self.eps)
        qr = rmsnorm(t[b + "attn_q_a.weight"] @ xn, t[b + "attn_q_a_norm.weight"], self.eps)
        q = (t[b + "attn_q_b.weight"] @ qr).reshape(self.nh, self.D)
        q = rope(rmsnorm(q, None, self.eps), p, fr)
        kv = rope(rmsnorm(t[b + "attn_kv.weight"] @ xn, t[b + "attn_kv_a_norm.weight"], self.eps), p, fr)
        if self.fp8:
            kv = fp8sim(kv, self.D - self.rd)
        self.raw[il].append(kv)
        self.raw[il] = self.raw[il][-self.window:]
        rows = list(self.raw[il])
        if r:
            c = self.cstate[il].step(xn, p)
            if c is not None:
                c = rope(c, p + 1 - r, fr)
                self.comp[il].append(fp8sim(c, self.D - self.rd) if self.fp8 else c)
            sel = list(range(len(self.comp[il])))
            if r == 4:
                ci = self.istate[il].step(xn, p)
                if ci is not None:
                    ci = rope(ci, p + 1 - r, fr)
                    self.icomp[il].append(iqat(ci) if self.fp4 else ci)
                if len(self.comp[il]) > self.topk:
                    sel = self.indexer_topk(il, qr, xn, p)
            rows += [self.comp[il][j] for j in sel]
        K = np.stack(rows).astype(np.float64)                       # [n, D]
        s = (q.astype(np.float64) @ K.T) / math.sqrt(self.D)         # [nh, n]
        sink = t[b + "attn_sinks.weight"].astype(np.float64)
        M = np.maximum(sink, s.max(1))
        e = np.exp(s - M[:, None])
        o = (e @ K) / (np.exp(sink - M) + e.sum(1))[:, None]
        o = rope(o.astype(np.float32), p, fr, inverse=True)
        wa = t[b + "attn_output_a.weight"]                          # [g*ol, nh*D/g]
        ol = wa.shape[0] // self.groups
        og = o.reshape(self.groups, -1)
        low = np.concatenate([wa[g * ol:(g + 1) * ol] @ og[g] for g in range(self.groups)])
        y = t[b + "attn_output_b.weight"] @ low
        return self.hc_post(y, X, post, C)

    def indexer_topk(self, il, qr, xn, p):
        t, b = self.g.t, f"blk.{il}."
        qi = (t[b + "indexer.attn_q_b.weight"] @ qr).reshape(self.ih, self.idim)
        qi = rope(qi, p, self.f_comp)
        if self.fp4:
            qi = np.stack([iqat(h) for h in qi])
        w = (t[b + "indexer.proj.weight"] @ xn) / math.sqrt(self.idim * self.ih)
        Kc = np.stack(self.icomp[il]).astype(np.float64)             # [n, idim]
        score = (np.maximum(0, qi.astype(np.float64) @ Kc.T) * w[:, None]).sum(0)
        order = np.argsort(-score, kind="stable")                   # ties -> lower row
        self.margins.append(("indexer", il, p, float(score[order[self.topk - 1]] - score[order[self.topk]])))
        return sorted(order[: self.topk].tolist())

    def ffn(self, il, X, token):
        t, b = self.g.t, f"blk.{il}."
        x_in, post, C = self.hc_pre(X, t[b + "hc_ffn_fn.weight"], t[b + "hc_ffn_scale.weight"],
                                    t[b + "hc_ffn_base.weight"])
        xn = rmsnorm(x_in, t[b + "ffn_norm.weight"], self.eps)
        logit = (t[b + "ffn_gate_inp.weight"].astype(np.float64) @ xn)
        prob = np.sqrt(np.where(logit > 20, logit, np.log1p(np.exp(np.minimum(logit, 20)))))
        if b + "ffn_gate_tid2eid.weight" in t:
            sel = t[b + "ffn_gate_tid2eid.weight"][token].tolist()
        else:
            bias = t.get(b + "exp_probs_b.bias", np.zeros_like(prob))
            biased = prob + bias
            order = np.argsort(-biased, kind="stable")
            sel = order[: self.n_used].tolist()
            if len(order) > self.n_used:
                self.margins.append(("router", il, self.pos, float(biased[order[self.n_used - 1]]
                                                                   - biased[order[self.n_used]])))
        w = prob[sel]
        w = w / max(w.sum(), 6.103515625e-5) * self.route_scale
        lim = self.clamp[il]

        def swiglu(g, u):
            if lim > 1e-6:
                g, u = np.minimum(g, lim), np.clip(u, -lim, lim)
            return g / (1 + np.exp(-g)) * u

        y = np.zeros(self.H, np.float64)
        G, U, Dn = t[b + "ffn_gate_exps.weight"], t[b + "ffn_up_exps.weight"], t[b + "ffn_down_exps.weight"]
        for e, we in zip(sel, w):
            y += Dn[e] @ (swiglu(G[e] @ xn, U[e] @ xn) * we)
        y += t[b + "ffn_down_shexp.weight"] @ swiglu(t[b + "ffn_gate_shexp.weight"] @ xn,
                                                     t[b + "ffn_up_shexp.weight"] @ xn)
        return self.hc_post(y.astype(np.float32), X, post, C)

    def step(self, token: int, p: int) -> np.ndarray:
        t = self.g.t
        self.pos = p
        X = np.repeat(t["token_embd.weight"][token][None, :], self.hc, 0).astype(np.float32)
        for il in range(self.L):
            X = self.attention(il, X, p)
            X = self.ffn(il, X, token)
        flat = rmsnorm(X.reshape(-1), None, self.eps)
        mo = t["output_hc_fn.weight"] @ flat
        w = 1 / (1 + np.exp(-(mo * t["output_hc_scale.weight"][0] + t["output_hc_base.weight"]))) + self.hc_eps
        e = (w[:, None] * X).sum(0)
        n = rmsnorm(e, t["output_norm.weight"], self.eps)
        return (t["output.weight"] @ n).astype(np.float32)

    def logits(self, tokens) -> np.ndarray:
        self.reset()
        return np.stack([self.step(tok, p) for p, tok in enumerate(tokens)])
