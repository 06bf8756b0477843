"""When does content-addressed copying emerge at toy scale? The classic induction task, per architecture.

    python benchmarks/recall_emergence.py                        # arms A, SX W=64, SX W=4, X; 1000 steps each
    python benchmarks/recall_emergence.py --arms SX:4 X:64 --igate_bias_init 0   # mLSTM input gates open at init
    python benchmarks/recall_emergence.py --arms SX:4 --length 8 --lr 3e-3 --batch 32   # shorter strings

Every sequence is a random lowercase string S (--length, 48 letters), a random gap of 0..--gap (32) letters, S
again, then the rest of the gap: the second S is predictable only by finding the first and copying it (after its
first letter, which names nothing). Printed per arm every --every steps, as JSON lines: the loss on the second S's
letters 2..48 (chance: ln 26 = 3.26 nats) and the loss on the gap (always chance). This is the capability every
recall measure of the window study needs (RULER NIAH, answer-token loss by distance): until a model copies here,
with 40% of its tokens copyable at distances of 48..80, it cannot recall a fact in natural text either.
--mlstm_heads and --mlstm_qk_factor set the mLSTM's memory size (heads x key width).

Decisions: the study's model shape (d_model 128, 4 blocks, 4 heads, 2 mLSTM heads, byte vocabulary), AdamW lr 1e-3
with 30 warm-up steps, weight decay 0.1, clipping 1.0, batch 16; every arm sees the same sequences (one generator
seeded per step). With W = 4 an SX model can only copy through its mLSTM layers; with W = 64 its attention reaches
the first S whenever the gap is under 17 letters.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from swax_lightning.config import ModelConfig  # noqa: E402
from swax_lightning.model import SWAXModel  # noqa: E402

LETTERS = (97, 123)


def batch(step: int, size: int, length: int, max_gap: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(sequences [size, 2 * length + max_gap], where each second S starts)."""
    g = torch.Generator().manual_seed(step)
    s = torch.randint(*LETTERS, (size, length), generator=g)
    gap = torch.randint(*LETTERS, (size, max_gap), generator=g)
    shift = torch.randint(0, max_gap + 1, (size,), generator=g)
    rows = [torch.cat([s[i], gap[i, :shift[i]], s[i], gap[i, shift[i]:]]) for i in range(size)]
    return torch.stack(rows), length + shift


def train(pattern: str, window: int, args: argparse.Namespace) -> None:
    torch.manual_seed(0)
    model = SWAXModel(ModelConfig(vocab_size=257, d_model=128, n_layers=4, pattern=pattern, n_heads=4,
                                  window=window, mlstm_heads=args.mlstm_heads, mlstm_qk_factor=args.mlstm_qk_factor,
                                  chunk_size=64, igate_bias_init=args.igate_bias_init, init_std=args.init_std))
    model.reset_parameters(seed=0)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.1)
    length, size = args.length, args.batch
    start = time.time()
    for step in range(args.steps + 1):
        x, second = batch(step, size, length, args.gap)
        losses = F.cross_entropy(model(x[:, :-1]).flatten(0, 1).float(), x[:, 1:].flatten(),
                                 reduction="none").view(size, -1)
        copy = torch.stack([losses[i, second[i]:second[i] + length - 1].mean() for i in range(size)]).mean()
        gap = torch.stack([losses[i, length:second[i] - 1].mean() for i in range(size) if second[i] > length + 1])
        if step % args.every == 0:
            print(json.dumps({"arm": f"{pattern} W={window}", "step": step, "copy_loss": round(copy.item(), 3),
                              "gap_loss": round(gap.mean().item(), 3), "seconds": round(time.time() - start),
                              **{k: v for k, v in vars(args).items() if k not in ("arms", "every")}}), flush=True)
        for group in opt.param_groups:
            group["lr"] = args.lr * min(1.0, (step + 1) / 30)
        opt.zero_grad()
        losses.mean().backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--arms", nargs="+", default=["A:64", "SX:64", "SX:4", "X:64"],
                        help="PATTERN:WINDOW per arm (the window is unused without S layers)")
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--every", type=int, default=100)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--igate_bias_init", type=float, default=ModelConfig.igate_bias_init,
                        help="initial mLSTM input-gate bias (default: the model's, xLSTM-7B's -10)")
    parser.add_argument("--init_std", type=float, default=ModelConfig.init_std,
                        help="std of the weights at init (default: the model's 0.02)")
    parser.add_argument("--length", type=int, default=48, help="letters in the string that is repeated")
    parser.add_argument("--gap", type=int, default=32, help="the largest gap between its two copies")
    parser.add_argument("--mlstm_heads", type=int, default=2)
    parser.add_argument("--mlstm_qk_factor", type=float, default=ModelConfig.mlstm_qk_factor,
                        help="mLSTM q/k width as a fraction of d_model (128): the key size of its memory")
    args = parser.parse_args()
    for arm in args.arms:
        pattern, window = arm.split(":")
        train(pattern, int(window), args)


if __name__ == "__main__":
    main()
