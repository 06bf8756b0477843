"""The window effect on multi-query associative recall (MQAR): does training with a short window make the mLSTM
remember, where a long window lets attention do the work and fail beyond it?

    python -m experiments.window_mqar                              # arms short (W 2), long (W 64), stochastic p 0.5
    python -m experiments.window_mqar --arms long --steps 500 --seed 1   # one arm, fewer steps, another seed
    python -m experiments.window_mqar --arms short --key_tokens 3 --short_window 4   # keys of 3 tokens, W 4 holds one
    python -m experiments.window_mqar --arms attention --d_model 64 --lr 1e-3      # full attention's lookup alone
    python -m experiments.window_mqar --d_model 128 --lr 1e-3 --repeats 2 --attention_conv 4 --steps 2000
        # S X S X with short convolutions: the three arms separate as the paper says (what_was_tried.md item 18)

Every sequence: P key-value pairs (single tokens: keys from one range of ids, values from another), a gap of filler
tokens (a third range), then the P keys again in a new order, each followed by its value. The loss and accuracy are
on the values after the queries. A value's key is the token before it, so an SWA layer with W = 2 hands each value its
key; whether the lookup at a query is done by attention (it sees the pair when it is inside the window) or by the
mLSTM (its state holds every pair) is what the window decides. Training gaps are 0..--train_gap tokens (default 16,
so every pair is inside the long window, 64, during training; --short_gap_steps N draws them in 0..16 for the first N
steps, a curriculum); the evaluation gaps go to 512, beyond it.
--key_tokens K spells the keys in K tokens of a small alphabet, so that only the whole key names a value;
--short_window sets the short window; --attention_conv K puts short convolutions on every attention layer's q, k, v
(a key then carries the token before it: one layer can look a value up, and four attention blocks form the lookup
by step 500 where without them they form none in 2,000: docs/study/what_was_tried.md item 18).

Arms (an S X model, one SWA block then one mLSTM block, --repeats times, 4 heads, 2 mLSTM heads): `short` trains
and evaluates at W = 2, `long` at W = 64, `stochastic` trains at 2 with probability 0.5, else 64, the last 10% at 64
(swax_lightning/training/window.py's schedule), and evaluates at 64; `attention` is the full-attention control (A A,
--repeats times: no window, no mLSTM; two blocks are the fewest that can look a key up). Printed as JSON lines:
training loss and accuracy every --every steps, then accuracy per evaluation gap.

Decisions: width --d_model (default 128), weights at std 1/sqrt(d_model) (at the model's default 0.02, meant for
widths in the thousands, the short arm stayed at chance for 2,000 steps) and mLSTM input gates open (bias 0 instead
of xLSTM-7B's -10, --igate_bias; docs/study/what_was_tried.md items 5-6); AdamW, 30 warm-up steps, no weight
decay, batch 64, lr 3e-3 by default (the memory's pilots; full attention's lookup forms at 1e-3 and not at 3e-3: item
17); every arm sees the same sequences (a generator seeded per step; evaluation seeds are disjoint from training's).
"""
from __future__ import annotations

import argparse
import json
import math
import time

import torch
import torch.nn.functional as F

from swax_lightning.model.config import ModelConfig
from swax_lightning.model.model import SWAXModel
from swax_lightning.training.window import StochasticWindow

KEYS, VALUES, FILLER = (0, 64), (64, 128), (128, 192)
EVAL_SEED = 1 << 20
SHORT_GAP = 16


def batch(seed: int, size: int, pairs: int, gap: tuple[int, int],
          key_tokens: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    """(sequences [size, 2 * (key_tokens + 1) * pairs + max gap], mask of the positions whose next token is a queried
    value). Keys are distinct; a key of several tokens is spelled in an alphabet of the fewest key tokens that has
    `pairs` words (2 letters for 8 three-token keys), so that its last tokens alone do not name it."""
    g = torch.Generator().manual_seed(seed)
    if key_tokens == 1:
        keys = torch.stack([torch.randperm(KEYS[1] - KEYS[0], generator=g)[:pairs] for _ in range(size)])[..., None]
    else:
        letters = math.ceil(pairs ** (1 / key_tokens) - 1e-9)
        words = torch.stack([torch.randperm(letters ** key_tokens, generator=g)[:pairs] for _ in range(size)])
        spelled = torch.stack([words // letters ** i % letters for i in reversed(range(key_tokens))], -1)
        alphabet = torch.stack([torch.randperm(KEYS[1] - KEYS[0], generator=g)[:letters] for _ in range(size)])
        keys = torch.gather(alphabet, 1, spelled.flatten(1)).view(size, pairs, key_tokens)
    keys = keys + KEYS[0]
    values = torch.randint(*VALUES, (size, pairs), generator=g)
    order = torch.stack([torch.randperm(pairs, generator=g) for _ in range(size)])
    gaps = torch.randint(gap[0], gap[1] + 1, (size,), generator=g)
    filler = torch.randint(*FILLER, (size, gap[1]), generator=g)
    rows, masks = [], []
    for i in range(size):
        queries = torch.cat([keys[i, order[i]], values[i, order[i], None]], 1).flatten()
        tail = filler[i, gaps[i]:]  # pads every row to the same length, after the queries
        stated = torch.cat([keys[i], values[i, :, None]], 1).flatten()
        rows.append(torch.cat([stated, filler[i, :gaps[i]], queries, tail]))
        mask = torch.zeros(len(rows[-1]) - 1, dtype=torch.bool)
        span = key_tokens + 1
        start = span * pairs + gaps[i] + key_tokens - 1
        mask[start:start + span * pairs:span] = True  # at each query key's last token: its value comes next
        masks.append(mask)
    return torch.stack(rows), torch.stack(masks)


def recall(model: SWAXModel, x: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    logits = model(x[:, :-1]).float()
    target = x[:, 1:]
    loss = F.cross_entropy(logits[mask], target[mask])
    return loss, (logits[mask].argmax(-1) == target[mask]).float().mean()


def arm_model(name: str, args: argparse.Namespace) -> SWAXModel:
    """The arm's model: S X (or A A for `attention`) --repeats times, at width --d_model, seeded by --seed."""
    pattern = "AA" if name == "attention" else "SX"
    init_std = args.init_std if args.init_std is not None else args.d_model ** -0.5
    model = SWAXModel(ModelConfig(vocab_size=257, d_model=args.d_model, n_layers=2 * args.repeats, pattern=pattern,
                                  n_heads=4, window=64, mlstm_heads=2, chunk_size=16, igate_bias_init=args.igate_bias,
                                  init_std=init_std, attention_conv=args.attention_conv))
    model.reset_parameters(seed=args.seed)
    return model


def training_gaps(step: int, args: argparse.Namespace) -> tuple[int, int]:
    """The range the gaps of training step `step` are drawn from: 0..SHORT_GAP during the first --short_gap_steps
    (the curriculum), then 0..--train_gap."""
    return (0, SHORT_GAP if step < args.short_gap_steps else args.train_gap)


def run(name: str, args: argparse.Namespace) -> None:
    short = args.short_window
    windows = {"short": StochasticWindow([short], anneal_fraction=0.0),
               "long": StochasticWindow([64], anneal_fraction=0.0),
               "attention": StochasticWindow([64], anneal_fraction=0.0),  # no sliding layer: the window is unused
               "stochastic": StochasticWindow([short, 64], [0.5, 0.5], anneal_fraction=0.1, seed=args.seed)}[name]
    eval_window = short if name == "short" else 64
    torch.manual_seed(args.seed)
    model = arm_model(name, args)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.0)
    start = time.time()
    for step in range(args.steps):
        model.set_window(windows.window_at(step, args.steps))
        loss, acc = recall(model, *batch(args.seed * 1_000_003 + step, args.batch, args.pairs,
                                         training_gaps(step, args), args.key_tokens))
        for group in opt.param_groups:
            group["lr"] = args.lr * min(1.0, (step + 1) / 30)
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if step % args.every == 0 or step == args.steps - 1:
            print(json.dumps({"arm": name, "seed": args.seed, "step": step, "loss": round(loss.item(), 3),
                              "acc": round(acc.item(), 3), "seconds": round(time.time() - start)}), flush=True)
    model.set_window(eval_window)
    model.eval()
    with torch.no_grad():
        for gap in args.eval_gaps:
            loss, acc = recall(model, *batch(EVAL_SEED + gap, 256, args.pairs, (gap, gap), args.key_tokens))
            print(json.dumps({"arm": name, "seed": args.seed, "eval_window": eval_window, "gap": gap,
                              "eval_loss": round(loss.item(), 3), "eval_acc": round(acc.item(), 3)}), flush=True)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--arms", nargs="+", default=["short", "long", "stochastic"],
                        choices=["short", "long", "stochastic", "attention"])
    parser.add_argument("--steps", type=int, default=1500)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--pairs", type=int, default=8)
    parser.add_argument("--key_tokens", type=int, default=1, help="tokens per key (the value follows the last)")
    parser.add_argument("--short_window", type=int, default=2, help="the short arm's window (and the stochastic's)")
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--d_model", type=int, default=128, help="model width")
    parser.add_argument("--train_gap", type=int, default=SHORT_GAP, help="training gaps are drawn in 0..train_gap")
    parser.add_argument("--short_gap_steps", type=int, default=0,
                        help=f"the first steps whose gaps are drawn in 0..{SHORT_GAP} whatever --train_gap")
    parser.add_argument("--repeats", type=int, default=1, help="the arm's two blocks, repeated (2: S X S X)")
    parser.add_argument("--init_std", type=float, default=None,
                        help="std of the weights at init (default 1/sqrt(d_model), 0.0884 at 128; the runs before "
                             "2026-12-05 used 0.088; at the model's 0.02 no recall is learned)")
    parser.add_argument("--igate_bias", type=float, default=0.0,
                        help="the mLSTM input-gate bias at init (xLSTM-7B: -10; 0 opens the gates: item 5)")
    parser.add_argument("--attention_conv", type=int, default=0,
                        help="short convolutions of this width on q, k, v of every attention layer (0: none)")
    parser.add_argument("--every", type=int, default=200)
    parser.add_argument("--eval_gaps", type=int, nargs="+", default=[0, 16, 64, 128, 256, 512])
    return parser.parse_args(argv)


def main() -> None:
    args = parse_args()
    for arm in args.arms:
        run(arm, args)


if __name__ == "__main__":
    main()
