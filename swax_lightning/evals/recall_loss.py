"""Answer-token loss by recall distance: memory measured without exact generation.

Each held-out sample (swax_lightning/data/recall_documents.py) states a fact, then `distance` characters of unseen
prose, then asks for the fact's value; the model reads it teacher-forced and we take its cross-entropy on the answer's
tokens (mean over the value's tokens, in nats) and whether every answer token is its top prediction. A model that
remembers has a low loss at every distance; one that only sees W tokens back is at chance (ln 10 = 2.30 per digit
with the byte tokenizer) once the value is more than W tokens behind its answer.

That offset, a sample's `reach`, is not its distance: the fact's tail and the whole question lie between value and
answer, so with RULER's wording reach = distance + 97 to 121 characters (the key's length counts twice). A window
below about 100 characters never sees a value from its answer, whatever the bucket; each bucket reports its reach.

Decisions:
- Distances are drawn log-uniformly inside each bucket [edge_i, edge_i+1) of `edges`, so buckets can be set relative
  to the windows and the training length (e.g. up to the training length, beyond it), and every bucket gets the
  same number of samples. Buckets are by distance, the prose the memory must hold the fact across, and report
  their reach [least, most], which says which windows can see the value.
- The prompt and the answer are tokenized separately and concatenated, so the answer's tokens are exactly the
  value's own tokenization whatever the tokenizer.
- Per bucket: mean loss with a 95% normal interval over samples, exact-recall share with a Wilson interval.
"""
from __future__ import annotations

import math
import random
from dataclasses import dataclass, field

import torch
from tqdm import tqdm

from swax_lightning.core.errors import ConfigError, require
from swax_lightning.data.recall_documents import eval_sample
from swax_lightning.evals.essay import generated_essay, prose_sentences
from swax_lightning.evals.registry import Evaluation, register
from swax_lightning.evals.reports import mean_interval, section_table, wilson_interval, with_interval
from swax_lightning.evals.ruler import load_words
from swax_lightning.evals.scoring import token_scores


def bucket_distances(edges: list[int], samples: int, seed: int) -> list[tuple[int, int, int]]:
    """(bucket start, bucket end, distance) for `samples` log-uniform distances in each bucket."""
    if len(edges) < 2 or any(b <= a for a, b in zip(edges, edges[1:])) or edges[0] < 1:
        raise ConfigError(f"eval.recall.edges must be increasing distances >= 1, at least two (got {edges})")
    out = []
    for lo, hi in zip(edges, edges[1:]):
        rng = random.Random(f"recall-distance-{seed}-{lo}-{hi}")
        out += [(lo, hi, min(hi - 1, int(math.exp(rng.uniform(math.log(lo), math.log(hi)))))) for _ in range(samples)]
    return out


def answer_loss(model, tokenizer, prompt: str, answer: str, chunk_len: int = 4096) -> tuple[float, bool]:
    """Mean cross-entropy of the answer's tokens after the prompt, and whether all of them are top-1."""
    context, target = tokenizer.encode(prompt), tokenizer.encode(answer)
    device = next(model.parameters()).device
    ids = torch.tensor([context + target], device=device)
    n = ids.shape[1] - 1
    answer = torch.arange(n, device=device)[None] >= n - len(target)
    logprob, greedy = token_scores(model, ids[:, :n], torch.arange(n, device=device)[None], ids[:, 1:], chunk_len,
                                   answer)
    return float(-logprob[answer].mean()), bool(greedy[answer].all())


def recall_losses(model, tokenizer, edges: list[int], samples: int, seed: int = 0, progress=None) -> dict:
    """{"buckets": [{from, to, reach, loss, loss_ci95, exact, exact_ci95, n}], "samples": [...]} over the buckets;
    `reach` is the [least, most] characters from a bucket's fact values to their answers (RecallSample.reach)."""
    adjectives, nouns = load_words()
    keys = [f"{a}-{n}" for a in adjectives for n in nouns]
    filler = prose_sentences(generated_essay(seed=seed + 1))
    jobs = bucket_distances(edges, samples, seed)
    rows = []
    for i, (lo, hi, distance) in enumerate(progress(jobs) if progress else jobs):
        sample = eval_sample(distance, i, filler, keys, seed)
        loss, exact = answer_loss(model, tokenizer, sample.prompt, sample.value)
        rows.append({"eval": "recall", "from": lo, "to": hi, "distance": distance, "reach": sample.reach, "index": i,
                     "key": sample.key, "value": sample.value, "loss": loss, "exact": exact})
    return {"buckets": [_bucket(lo, hi, [r for r in rows if r["from"] == lo]) for lo, hi in zip(edges, edges[1:])],
            "samples": rows}


def _bucket(lo: int, hi: int, rows: list[dict]) -> dict:
    n = len(rows)
    mean, ci95 = mean_interval([r["loss"] for r in rows])
    exact = 100.0 * sum(r["exact"] for r in rows) / n
    return {"from": lo, "to": hi, "reach": [min(r["reach"] for r in rows), max(r["reach"] for r in rows)],
            "loss": mean, "loss_ci95": ci95, "exact": exact, "exact_ci95": wilson_interval(exact, n), "n": n}


@dataclass
class RecallSettings:
    """Answer-token loss by recall distance.

    Args:
        edges: Distance buckets (characters between a fact and its question), e.g. [1, 16, 256, 1024, 8192].
        samples: Samples per bucket.
    """

    edges: list[int] = field(default_factory=lambda: [1, 16, 256, 1024, 8192])
    samples: int = 16

    def __post_init__(self) -> None:
        require(self.samples >= 1, "eval.recall.samples", "must be >= 1", self.samples)
        bucket_distances(self.edges, 1, 0)  # the edges checked now, not after the test loop


@register
class RecallLoss(Evaluation):
    name, title, order, Settings = "recall", "answer loss by distance", 40, RecallSettings
    scalar_rows = ("buckets", "eval/recall/{from}-{to}", {"answer_loss": "loss", "exact": "exact"})

    def workload(self) -> tuple[int, int, int]:
        buckets = len(self.settings.edges) - 1
        return buckets * self.settings.samples, self.settings.samples * sum(self.settings.edges[1:]), 0

    def run(self, model, data, samples: list) -> dict:
        recall = recall_losses(model, data.tokenizer, self.settings.edges, self.settings.samples, self.context.seed,
                               progress=lambda jobs: tqdm(jobs, desc="recall by distance"))
        samples += recall["samples"]
        return {"buckets": recall["buckets"]}

    @classmethod
    def report(cls, section: dict) -> list[str]:
        note = ("Distance: characters between the fact and its question; reach: characters from the fact's value to "
                "the answer (a layer must see that far back to copy it); loss: mean cross-entropy of the answer's "
                "tokens (nats) [95% interval]; exact: all answer tokens top-1, % [95% Wilson interval].")
        rows = [[f"{r['from']}-{r['to']}", _reach(r), with_interval(r, "loss", 3, 3), with_interval(r, "exact", 1, 0),
                 r["n"]] for r in section["buckets"]]
        return section_table("Answer-token loss by recall distance", note, ["distance", "reach", "loss", "exact", "n"],
                             rows)


def _reach(bucket: dict) -> str:
    """A bucket's reach as "least-most" ("-" in results written before buckets recorded it)."""
    return "-" if "reach" not in bucket else f"{bucket['reach'][0]}-{bucket['reach'][1]}"
