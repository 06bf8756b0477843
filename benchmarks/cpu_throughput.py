"""Training throughput on CPU, tokens/s: SWAX at several windows, this project's full-attention model (pattern A),
and a plain SDPA-causal Transformer of the same size as the yardstick.

    python benchmarks/cpu_throughput.py                          # T 512 / 2048 / 8192, batch 8 (about 15 minutes)
    python benchmarks/cpu_throughput.py --lengths 256 --batch 2  # a quick look

One step = forward + cross-entropy + backward + AdamW, on the tiny architecture (d_model 128, 4 blocks, 4 attention
heads, byte vocabulary). Decisions:
- One process, all models side by side, and the timed steps interleaved round-robin across models: on a shared
  machine background load then hits every column alike, so the ratios stay meaningful when absolute figures drift.
- Each model gets one untimed warm-up step; the figure is the best of --rounds timed steps (the least disturbed).
- The yardstick is deliberately plain (pre-norm, RoPE, SDPA is_causal, SwiGLU), with the same widths as SWAXModel,
  so "SWA never slower than full attention" and "SWAX faster than a Transformer" are checked against the fastest
  causal kernel torch has on this machine.
Under the table: SWAX at W = T/8 over the SDPA Transformer, and the attention alone (forward + backward at the models'
shape, through kernels.sliding_window_attention) at each window against full causal attention at the same T.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from swax_lightning.kernels import sliding_window_attention  # noqa: E402
from swax_lightning.model.building_blocks import GatedFFN, rope_rotate  # noqa: E402
from swax_lightning.model.config import ModelConfig  # noqa: E402
from swax_lightning.model.model import SWAXModel  # noqa: E402

ARCH = dict(vocab_size=257, d_model=128, n_layers=4, n_heads=4, mlstm_heads=2, chunk_size=64)


class PlainAttention(nn.Module):
    def __init__(self, d: int, heads: int):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(d, 3 * d, bias=False)
        self.out = nn.Linear(d, d, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, d = x.shape
        q, k, v = self.qkv(x).view(B, T, 3, self.heads, d // self.heads).unbind(2)
        pos = torch.arange(T)
        q, k = rope_rotate(q, pos, 10000.0), rope_rotate(k, pos, 10000.0)
        out = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True)
        return self.out(out.transpose(1, 2).reshape(B, T, d))


class PlainTransformer(nn.Module):
    """Pre-norm causal Transformer with SDPA attention, the widths of SWAXModel(cfg)."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        d = cfg.d_model
        self.embed = nn.Embedding(cfg.vocab_size, d)
        self.layers = nn.ModuleList(nn.ModuleList([nn.RMSNorm(d), PlainAttention(d, cfg.n_heads), nn.RMSNorm(d),
                                                   GatedFFN(d, cfg.ffn_width)]) for _ in range(cfg.n_layers))
        self.norm = nn.RMSNorm(d)
        self.head = nn.Linear(d, cfg.vocab_size, bias=False)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.embed(idx)
        for norm1, attn, norm2, ffn in self.layers:
            x = x + attn(norm1(x))
            x = x + ffn(norm2(x))
        return self.head(self.norm(x))


def windows(T: int) -> dict[str, int]:
    return {"W=64": 64, "W=T/8": T // 8, "W=2048": 2048}


def models(T: int) -> dict[str, nn.Module]:
    """Column name -> model for sequence length T."""
    out = {f"SWAX {name}": SWAXModel(ModelConfig(**ARCH, pattern="SX", window=W)) for name, W in windows(T).items()}
    out["pattern A"] = SWAXModel(ModelConfig(**ARCH, pattern="A"))
    out["SDPA Transformer"] = PlainTransformer(ModelConfig(**ARCH, pattern="A"))
    return out


def step_seconds(model: nn.Module, opt: torch.optim.Optimizer, batch: torch.Tensor) -> float:
    start = time.perf_counter()
    logits = model(batch[:, :-1])
    loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), batch[:, 1:].reshape(-1))
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    return time.perf_counter() - start


def attention_seconds(fn, q, k, v) -> float:
    leaves = [x.clone().requires_grad_() for x in (q, k, v)]
    start = time.perf_counter()
    torch.autograd.grad(fn(*leaves).sum(), leaves)
    return time.perf_counter() - start


def attention_ratios(T: int, batch: int, rounds: int) -> dict[str, float]:
    """The attention alone (forward + backward, the models' shape): full causal time / SWA time, per window."""
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(batch, T, ARCH["n_heads"], ARCH["d_model"] // ARCH["n_heads"], generator=g)
               for _ in range(3))
    fns = {name: (lambda W: lambda *x: sliding_window_attention(*x, W))(W) for name, W in windows(T).items()}
    fns["full"] = lambda *x: sliding_window_attention(*x, None)
    best = {name: float("inf") for name in fns}
    for _ in range(rounds + 1):
        for name, fn in fns.items():
            best[name] = min(best[name], attention_seconds(fn, q, k, v))
    return {name: best["full"] / s for name, s in best.items() if name != "full"}


def measure(T: int, batch: int, rounds: int) -> dict[str, float]:
    torch.manual_seed(0)
    data = torch.randint(0, ARCH["vocab_size"], (batch, T + 1))
    runs = {name: (m, torch.optim.AdamW(m.parameters(), lr=1e-3)) for name, m in models(T).items()}
    for m, opt in runs.values():
        step_seconds(m, opt, data)  # warm-up
    best = {name: float("inf") for name in runs}
    for _ in range(rounds):
        for name, (m, opt) in runs.items():
            best[name] = min(best[name], step_seconds(m, opt, data))
    return {name: batch * T / s for name, s in best.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lengths", nargs="+", type=int, default=[512, 2048, 8192])
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    rows = []
    for T in args.lengths:
        row = {"T": T, "windows": windows(T), "tokens_per_s": measure(T, args.batch, args.rounds),
               "swa_speedup_over_full_attention": attention_ratios(T, args.batch, args.rounds)}
        rows.append(row)
        print(json.dumps(row), flush=True)
    names = list(rows[0]["tokens_per_s"])
    print("\n| T | " + " | ".join(names) + " |")
    print("|---" * (len(names) + 1) + "|")
    for r in rows:
        print(f"| {r['T']:,} | " + " | ".join(f"{v:,.0f}" for v in r["tokens_per_s"].values()) + " |")
    print()
    for r in rows:
        tps = r["tokens_per_s"]
        print(f"T={r['T']}: SWAX W=T/8 / SDPA Transformer = {tps['SWAX W=T/8'] / tps['SDPA Transformer']:.2f}x; "
              "SWA / full attention (kernel fwd+bwd): "
              + ", ".join(f"{n}: {x:.2f}x" for n, x in r["swa_speedup_over_full_attention"].items()))


if __name__ == "__main__":
    main()
