"""Associative recall by gap: MQAR accuracy and value loss, the evaluation `main.py test` runs for `eval.mqar`.

For each gap, `samples` held-out episodes (swax_lightning/data/mqar_episodes.py: pairs, `gap` characters of filler,
every key asked again) are read through the streaming inference (chunked prefill with each block's cache, at the model's
current window, as every evaluation of the suite), teacher-forced; at each query the model's top prediction for the
value, over the whole vocabulary, and its cross-entropy on the value are taken.

Per gap: accuracy (%) with a 95% Wilson interval over the n queries, the mean value loss (nats) with a 95% normal
interval over the episodes, and the reach [least, most] of its queries (tokens from a stated value to the value asked
for: a window W sees the pair when W >= reach). References: a model that reads the pairs scores 100; one that knows
only that a capital letter comes scores 1/26 = 3.8% (loss ln 26 = 3.26 at best); a guess among the episode's stated
values (what remembering the values but not their keys allows), 1/pairs + (1 - 1/pairs)/26 (values are drawn with
replacement, so another pair may hold the same one): 15.9% for 8 pairs.

Decisions:
- n counts queries, as the accuracy is a share of them; the queries of one episode share its model state, so the
  interval is somewhat narrower than one over independent queries. The loss interval is over episodes (the mean
  value loss of each), the unit that is independent.
- Episodes are tokenized piece by piece (Episode.pieces) and left-padded into batches; only the logits at the
  queries are kept, chunk by chunk, so memory grows with the batch, not with the context.
- Every episode is a sample of results.json: its values, the model's predictions, its score, its loss and the
  arguments that regenerate its text (`python -m swax_lightning regenerate mqar ...`).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from tqdm import tqdm

from swax_lightning.core.errors import require
from swax_lightning.data.mqar_episodes import VALUES, Episode, check_shape, episode_chars, eval_episode
from swax_lightning.data.recall_documents import RecallMix
from swax_lightning.evals.registry import Evaluation, register
from swax_lightning.evals.reports import mean_interval, section_table, wilson_interval, with_interval
from swax_lightning.model.inference import left_pad, prefill

BATCH = 32  # episodes per prefill call


def encode_episode(tokenizer, ep: Episode) -> tuple[list[int], list[list[int]]]:
    """(token ids, for each query the positions of its value's tokens), each piece tokenized alone."""
    ids, value_positions = [], []
    for piece, is_value in ep.pieces():
        tokens = tokenizer.encode(piece)
        if is_value:
            value_positions.append(list(range(len(ids), len(ids) + len(tokens))))
        ids += tokens
    return ids, value_positions


@torch.no_grad()
def score_batch(model, tokenizer, episodes: list[Episode], chunk_len: int) -> list[dict]:
    """Per episode: the model's predictions, the number right and the mean value loss."""
    encoded = [encode_episode(tokenizer, ep) for ep in episodes]
    device = next(model.parameters()).device
    idx, positions = left_pad([ids for ids, _ in encoded], device)
    pads = [idx.shape[1] - len(ids) for ids, _ in encoded]
    wanted = sorted({pad + p - 1 for pad, (_, values) in zip(pads, encoded) for v in values for p in v})
    caches = model.new_caches(len(episodes), dtype=next(model.parameters()).dtype)
    kept = {}
    for start in range(0, idx.shape[1], chunk_len):
        end = min(start + chunk_len, idx.shape[1])
        logits = prefill(model, idx[:, start:end], positions[:, start:end], caches, chunk_len, return_all=True)
        here = [t for t in wanted if start <= t < end]
        kept |= dict(zip(here, logits[:, [t - start for t in here]].float().clone().unbind(1)))
    out = []
    for b, (pad, (ids, values)) in enumerate(zip(pads, encoded)):
        predictions, losses, right = [], [], 0
        for positions_of_value in values:
            logits = torch.stack([kept[pad + p - 1][b] for p in positions_of_value])
            target = torch.tensor([ids[p] for p in positions_of_value], device=device)
            top = logits.argmax(-1)
            predictions.append(tokenizer.decode(top.tolist()))
            losses.append(float(F.cross_entropy(logits, target)))
            right += bool((top == target).all())
        out.append({"predictions": predictions, "correct": right, "loss": sum(losses) / len(losses)})
    return out


def mqar_by_gap(model, tokenizer, gaps: list[int], samples: int, pairs: int, key_length: int, seed: int = 0,
                chunk_len: int = 2048, progress=None) -> dict:
    """{"gaps": [{gap, reach, accuracy, accuracy_ci95, loss, loss_ci95, n, episodes}], "episode" and "chance" (what
    the report says of them), "samples": [one per episode]}."""
    jobs = [(gap, start) for gap in gaps for start in range(0, samples, BATCH)]
    rows = []
    for gap, start in progress(jobs) if progress else jobs:
        episodes = [eval_episode(gap, i, pairs, key_length, seed) for i in range(start, min(start + BATCH, samples))]
        for i, ep, scored in zip(range(start, samples), episodes, score_batch(model, tokenizer, episodes, chunk_len)):
            rows.append({"eval": "mqar", "gap": gap, "index": i, "reach": [min(ep.reaches), max(ep.reaches)],
                         "references": "".join(ep.values), "prediction": "".join(scored["predictions"]),
                         "score": 100.0 * scored["correct"] / len(ep.values), "queries": len(ep.values),
                         "loss": scored["loss"], "regenerate": f"mqar {pairs}x{key_length} {gap} {i}"})
    return {"gaps": [_cell(gap, [r for r in rows if r["gap"] == gap]) for gap in gaps],
            "episode": f"{samples} held-out episodes per gap, each {pairs} pairs of {key_length}-letter keys and "
                       f"one-letter values (swax_lightning/data/mqar_episodes.py)",
            "chance": f"{100 / len(VALUES):.1f}% knowing only the values' alphabet, "
                      f"{100 * stated_value_chance(pairs):.1f}% guessing one of the episode's stated values (which a "
                      f"memory of the values alone, not of their keys, allows)", "samples": rows}


def stated_value_chance(pairs: int) -> float:
    """The share a guess of a random stated pair's value gets right: the queried pair's own value (1 / pairs), or
    another pair's, equal to it with probability 1 / |VALUES| since values are drawn with replacement."""
    return 1 / pairs + (1 - 1 / pairs) / len(VALUES)


def query_cell(rows: list[dict]) -> dict:
    """The statistics of a cell of episodes scored query by query: accuracy over the queries with a Wilson interval,
    the mean loss with an interval over the episodes, n queries (the span-copying evaluation's cells too)."""
    queries = sum(r["queries"] for r in rows)
    accuracy = sum(r["score"] * r["queries"] for r in rows) / queries
    loss, loss_ci95 = mean_interval([r["loss"] for r in rows])
    return {"accuracy": accuracy, "accuracy_ci95": wilson_interval(accuracy, queries), "loss": loss,
            "loss_ci95": loss_ci95, "n": queries, "episodes": len(rows)}


def _cell(gap: int, rows: list[dict]) -> dict:
    return {"gap": gap, "reach": [min(r["reach"][0] for r in rows), max(r["reach"][1] for r in rows)],
            **query_cell(rows)}


@dataclass
class MQARSettings:
    """Associative recall (MQAR) by gap.

    Args:
        gaps: Gaps (filler characters between the pairs and their queries), e.g. [0, 16, 64, 256, 1024].
        samples: Episodes per gap.
        pairs: Key-value pairs per episode; empty = data.recall's when its kind is mqar, else RecallMix's default.
        key_length: Letters per key; empty = data.recall's when its kind is mqar, else RecallMix's default.
    """

    gaps: list[int] = field(default_factory=lambda: [0, 16, 64, 256, 1024])
    samples: int = 64
    pairs: int | None = None
    key_length: int | None = None

    def __post_init__(self) -> None:
        require(bool(self.gaps) and all(gap >= 0 for gap in self.gaps), "eval.mqar.gaps", "must be gaps >= 0",
                self.gaps)
        require(self.samples >= 1, "eval.mqar.samples", "must be >= 1", self.samples)


@register
class MQAR(Evaluation):
    name, title, order, Settings = "mqar", "MQAR by gap", 50, MQARSettings
    scalar_rows = ("gaps", "eval/mqar/gap_{gap}", {"accuracy": "accuracy", "value_loss": "loss"})

    def settle_shape(self, recall) -> None:
        """Pairs and key length from the training data's MQAR documents where not given, then checked."""
        trained = recall if getattr(recall, "kind", None) == "mqar" else RecallMix(kind="mqar")  # else the defaults
        s = self.settings
        s.pairs = trained.pairs if s.pairs is None else s.pairs
        s.key_length = trained.key_length if s.key_length is None else s.key_length
        check_shape(s.pairs, s.key_length, max(s.gaps), "eval.mqar")

    def check(self, arch, data) -> None:
        self.settle_shape(getattr(data, "recall", None))

    def workload(self) -> tuple[int, int, int]:
        s = self.settings
        chars = sum(episode_chars(s.pairs, s.key_length, gap) for gap in s.gaps) if s.pairs else 0
        return len(s.gaps) * s.samples, s.samples * chars, 0

    def run(self, model, data, samples: list) -> dict:
        self.settle_shape(getattr(data, "recall", None))
        s = self.settings
        mqar = mqar_by_gap(model, data.tokenizer, s.gaps, s.samples, s.pairs, s.key_length, self.context.seed,
                           self.context.chunk_len, progress=lambda jobs: tqdm(jobs, desc="MQAR by gap"))
        samples += mqar.pop("samples")
        return mqar

    @classmethod
    def report(cls, section: dict) -> list[str]:
        note = (f"{section['episode']}. Gap: filler characters between the pairs and their queries; reach: tokens "
                "from a stated value to the query that asks for it (a window W sees the pair when W >= reach); "
                "accuracy: queries whose value is the top prediction, % [95% Wilson interval], n queries; value "
                "loss: mean cross-entropy of the values (nats) [95% interval over episodes]. Chance: "
                f"{section['chance']}.")
        rows = [[r["gap"], f"{r['reach'][0]}-{r['reach'][1]}", with_interval(r, "accuracy", 1, 0),
                 with_interval(r, "loss", 3, 3), r["n"]] for r in section["gaps"]]
        return section_table("Associative recall (MQAR) by gap", note, ["gap", "reach", "accuracy", "value loss", "n"],
                             rows)
