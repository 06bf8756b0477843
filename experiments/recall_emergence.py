"""When does content-addressed copying emerge at toy scale? The classic induction task, per architecture.

    python -m experiments.recall_emergence                        # arms A, SX W=64, SX W=4, X; 1000 steps each
    python -m experiments.recall_emergence --arms SX:4 X:64 --igate_bias_init 0   # mLSTM input gates open at init
    python -m experiments.recall_emergence --arms SX:4 --length 8 --lr 3e-3 --batch 32   # shorter strings
    python -m experiments.recall_emergence --task facts --arms A:64 --init_std 0.088   # the study's documents

Every sequence is a random lowercase string S (--length, 48 letters), a random gap of 0..--gap (32) letters, S
again, then the rest of the gap: the second S is predictable only by finding the first and copying it (after its
first letter, which names nothing). Printed per arm every --every steps, as JSON lines: `scored_loss`, the loss
on the second S's letters 2..48 (chance: ln 26 = 3.26 nats), and `other_loss`, on every other position (chance).
This is the capability every recall measure of the window study needs (RULER NIAH, answer-token loss by distance):
until a model copies here, with 40% of its tokens copyable at distances of 48..80, it cannot recall a fact in
natural text either.
--mlstm_heads and --mlstm_qk_factor set the mLSTM's memory size (heads x key width), --d_model and --n_layers the
model's. --eval_gaps ends a copy run with the loss at fixed gaps of held-out strings: how far the copying reaches.

--task asks the same question of the window study's recall data (blocks of --seq characters, the loss on the answer
digits of every question, chance ln 10 = 2.30): `facts`, the study's training documents
(data/recall_documents.py, its RecallMix: facts and questions interleaved, so a far question needs its key
matched); `needle`, one fact at a time in prose from the embedded corpus (pydoc's topics), its question `distance`
characters later, then prose, so copying the digits after the last "is: " is enough; `spans`, key-value lists
("kavolu 4819273 ...", --pairs pairs) repeated after a prose gap (the copy task in the study's alphabet; the loss on
the repeated list after its first 4 characters). Distances follow the study's mixture (by default 75% from 8 to 63
characters, the rest to 450). --eval_edges ends a run with the study's own measure: the answer loss of its held-out
recalls (RULER's keys, generated prose between fact and question; `main.py test`'s recall_edges) per distance
bucket. --min_distance and --near_limit set the facts' distance mixture (data.recall's fields): at the study's 8 and
64 most questions ask about the statement just before them, a shortcut by position; with --min_distance 100
--near_limit 200 the position says little (13% one statement back, 46% two, the rest further): the key must be
matched.

Decisions: the study's model shape (d_model 128, 4 blocks, 4 heads, 2 mLSTM heads, byte vocabulary), AdamW lr 1e-3
with 30 warm-up steps, weight decay 0.1, clipping 1.0, batch 16; every arm sees the same sequences (one generator
seeded per step). With W = 4 an SX model can only copy through its mLSTM layers; with W = 64 its attention reaches
the first S whenever the gap is under 17 letters.
"""
from __future__ import annotations

import argparse
import json
import random
import re
import time

import torch
import torch.nn.functional as F

from swax_lightning.data.recall_documents import FACT, QUESTION, RecallMix, number, syllable_key, training_document
from swax_lightning.data.tokenizer import ByteTokenizer
from swax_lightning.evals.recall_loss import recall_losses
from swax_lightning.model.config import ModelConfig
from swax_lightning.model.model import SWAXModel

LETTERS = (97, 123)
ANSWER = re.compile(r"The special magic number for \w+ is: (\d+)")


def batch(step: int, size: int, length: int, max_gap: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(sequences [size, 2 * length + max_gap], where each second S starts)."""
    g = torch.Generator().manual_seed(step)
    s = torch.randint(*LETTERS, (size, length), generator=g)
    gap = torch.randint(*LETTERS, (size, max_gap), generator=g)
    shift = torch.randint(0, max_gap + 1, (size,), generator=g)
    rows = [torch.cat([s[i], gap[i, :shift[i]], s[i], gap[i, shift[i]:]]) for i in range(size)]
    return torch.stack(rows), length + shift


def copy_loss_at_gap(model, gap: int, length: int, size: int = 64) -> float:
    """Loss on letters 2..length of the second S when exactly `gap` random letters lie between the copies, on
    held-out strings (seeded apart from the training steps' 0..--steps): how far the copying reaches."""
    g = torch.Generator().manual_seed(1_000_000 + gap)
    s = torch.randint(*LETTERS, (size, length), generator=g)
    x = torch.cat([s, torch.randint(*LETTERS, (size, gap), generator=g), s], 1)
    with torch.no_grad():
        losses = F.cross_entropy(model(x[:, :-1]).float().transpose(1, 2), x[:, 1:], reduction="none")
    return losses[:, length + gap:2 * length + gap - 1].mean().item()


def copy_batch(step: int, args: argparse.Namespace) -> tuple[torch.Tensor, torch.Tensor]:
    """(sequences, mask of the positions whose next token is a letter 2..length of the second S)."""
    x, second = batch(step, args.batch, args.length, args.gap)
    mask = torch.zeros(x.shape[0], x.shape[1] - 1, dtype=torch.bool)
    for i, start in enumerate(second.tolist()):
        mask[i, start:start + args.length - 1] = True
    return x, mask


def prose() -> str:
    """pydoc's topics as one ASCII line (dropping the few curly quotes), so that characters are bytes."""
    from pydoc_data.topics import topics
    return " ".join(" ".join(text.split()) for _, text in sorted(topics.items())).encode("ascii", "ignore").decode()


def episode(rng: random.Random, task: str, text: str, pairs: int, mix: RecallMix) -> tuple[str, list[tuple[int, int]]]:
    """One needle (a fact, prose, its question and answer) or one spans episode (a list, prose, the list again), with
    the (start, end) character ranges whose characters are scored."""
    gap = text[(at := rng.randrange(len(text) - 1000)):at + mix.distance(rng)]
    tail = text[(at := rng.randrange(len(text) - 1000)):at + rng.randint(0, 60)]
    if task == "needle":
        key, value = syllable_key(rng), number(rng)
        head = FACT.format(key=key, value=value) + gap + "\n" + QUESTION.format(key=key)
        return head + value + ".\n" + tail + "\n", [(len(head), len(head) + len(value))]
    span = " ".join(f"{syllable_key(rng)} {number(rng)}" for _ in range(pairs)) + "\n"
    head = span + gap + "\n"
    return head + span + tail + "\n", [(len(head) + 4, len(head) + len(span) - 1)]


def document(task: str, index: int, text: str, pairs: int, chars: int,
             mix: RecallMix) -> tuple[str, list[tuple[int, int]]]:
    if task == "facts":
        doc = training_document(index, mix)[0]
        return doc, [m.span(1) for m in ANSWER.finditer(doc)]
    rng, doc, scored = random.Random(f"{task}-{index}"), "", []
    while len(doc) < chars:
        part, ranges = episode(rng, task, text, pairs, mix)
        scored += [(len(doc) + a, len(doc) + b) for a, b in ranges]
        doc += part
    return doc, scored


def recall_batch(step: int, args: argparse.Namespace, text: str) -> tuple[torch.Tensor, torch.Tensor]:
    """(blocks of --seq + 1 bytes from the task's documents, mask of the positions whose next byte is scored)."""
    rows, masks, mix = [], [], RecallMix(min_distance=args.min_distance, near_limit=args.near_limit, max_distance=450)
    for i in range(args.batch):
        doc, scored = document(args.task, step * args.batch + i, text, args.pairs, 2 * args.seq, mix)
        start = random.Random(f"start-{step}-{i}").randrange(len(doc) - args.seq)
        rows.append(list(doc[start:start + args.seq + 1].encode("ascii")))
        mask = torch.zeros(args.seq, dtype=torch.bool)
        for a, b in scored:  # the character at index j is predicted at position j - 1
            lo, hi = max(a - start - 1, 0), min(b - start - 1, args.seq)
            if lo < hi:
                mask[lo:hi] = True
        masks.append(mask)
    return torch.tensor(rows), torch.stack(masks)


def train(pattern: str, window: int, args: argparse.Namespace) -> SWAXModel:
    torch.manual_seed(0)
    model = SWAXModel(ModelConfig(vocab_size=257, d_model=args.d_model, n_layers=args.n_layers, pattern=pattern,
                                  n_heads=4, window=window, mlstm_heads=args.mlstm_heads,
                                  mlstm_qk_factor=args.mlstm_qk_factor, chunk_size=64,
                                  igate_bias_init=args.igate_bias_init, init_std=args.init_std))
    model.reset_parameters(seed=0)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.1)
    text = prose() if args.task != "copy" else ""
    start = time.time()
    for step in range(args.steps + 1):
        x, mask = copy_batch(step, args) if args.task == "copy" else recall_batch(step, args, text)
        losses = F.cross_entropy(model(x[:, :-1]).flatten(0, 1).float(), x[:, 1:].flatten(),
                                 reduction="none").view(x.shape[0], -1)
        if step % args.every == 0:  # measured before this step's update: these sequences are unseen
            print(json.dumps({"arm": f"{pattern} W={window}", "step": step,
                              "scored_loss": round(losses[mask].mean().item(), 3),
                              "other_loss": round(losses[~mask].mean().item(), 3),
                              "seconds": round(time.time() - start),
                              **{k: v for k, v in vars(args).items() if k not in ("arms", "every")}}), flush=True)
        for group in opt.param_groups:
            group["lr"] = args.lr * min(1.0, (step + 1) / 30)
        opt.zero_grad()
        losses.mean().backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
    model.eval()
    if args.eval_gaps:
        print(json.dumps({"arm": f"{pattern} W={window}", "copy_loss_at_gap": {
            gap: round(copy_loss_at_gap(model, gap, args.length), 3) for gap in args.eval_gaps}}), flush=True)
    if args.eval_edges:
        buckets = recall_losses(model, ByteTokenizer(), args.eval_edges, samples=24)["buckets"]
        print(json.dumps({"arm": f"{pattern} W={window}", "study_answer_loss": {
            f"{b['from']}-{b['to']}": round(b["loss"], 3) for b in buckets}}), flush=True)
    return model


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
    parser.add_argument("--task", choices=["copy", "facts", "needle", "spans"], default="copy")
    parser.add_argument("--seq", type=int, default=256, help="characters per block (tasks other than copy)")
    parser.add_argument("--pairs", type=int, default=4, help="key-value pairs per list (task spans)")
    parser.add_argument("--min_distance", type=int, default=8, help="shortest recall distance (the study's: 8)")
    parser.add_argument("--near_limit", type=int, default=64,
                        help="75%% of distances are drawn below this, the rest up to 450 (the study's: 64)")
    parser.add_argument("--eval_edges", type=int, nargs="*", default=[],
                        help="after training, the study's answer loss (evals/recall_loss.py) in these distance buckets")
    parser.add_argument("--eval_gaps", type=int, nargs="*", default=[],
                        help="after training on the copy task, its loss with exactly these gaps (held-out strings)")
    parser.add_argument("--d_model", type=int, default=128, help="model width (the study's: 128)")
    parser.add_argument("--n_layers", type=int, default=4, help="blocks (the study's: 4, S X S X)")
    parser.add_argument("--mlstm_heads", type=int, default=2)
    parser.add_argument("--mlstm_qk_factor", type=float, default=ModelConfig.mlstm_qk_factor,
                        help="mLSTM q/k width as a fraction of d_model (128): the key size of its memory")
    args = parser.parse_args()
    for arm in args.arms:
        pattern, window = arm.split(":")
        train(pattern, int(window), args)


if __name__ == "__main__":
    main()
