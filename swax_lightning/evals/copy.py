"""Span copying by length: the short-context task of the window study, the evaluation `main.py test` runs for
`eval.copy`.

For each span length, `samples` held-out copy episodes (swax_lightning/data/mqar_episodes.py: `length` random
capitals, "=", the same span again) are read teacher-forced through the streaming inference, as MQAR's are
(mqar.score_batch); every copied character is a query: right when it is the model's top prediction over the whole
vocabulary. A copied character lies length + 1 tokens after its original, so a window W > length can copy the span
exactly and a shorter one cannot; past the window, only a memory that holds the span in order copies it.

Per length: accuracy (%) with a 95% Wilson interval over the copied characters, and the mean loss (nats) with a 95%
interval over the episodes. References: an exact copier scores 100 (loss 0); a model that knows only that a capital
comes scores 1/26 = 3.8% (loss ln 26 = 3.26 at best).

Decisions:
- The same scoring code as MQAR (a copy episode is an Episode whose queries are the copied characters), so the two
  tasks of the study are read the same way; the episodes come from their own random stream (seed, length, index).
- Every episode is a sample of results.json with the arguments that regenerate it
  (`python -m swax_lightning regenerate copy span <length> <index>`).
"""
from __future__ import annotations

from dataclasses import dataclass, field

from tqdm import tqdm

from swax_lightning.core.errors import require
from swax_lightning.data.mqar_episodes import VALUES, eval_copy_episode
from swax_lightning.evals.mqar import BATCH, query_cell, score_batch
from swax_lightning.evals.registry import Evaluation, register
from swax_lightning.evals.reports import section_table, with_interval


def copy_by_length(model, tokenizer, lengths: list[int], samples: int, seed: int = 0, chunk_len: int = 2048,
                   progress=None) -> dict:
    """{"lengths": [{length, reach, accuracy, accuracy_ci95, loss, loss_ci95, n, episodes}], "episode", "chance",
    "samples": [one per episode]}."""
    jobs = [(length, start) for length in lengths for start in range(0, samples, BATCH)]
    rows = []
    for length, start in progress(jobs) if progress else jobs:
        indices = range(start, min(start + BATCH, samples))
        episodes = [eval_copy_episode(length, i, seed) for i in indices]
        for i, ep, scored in zip(indices, episodes, score_batch(model, tokenizer, episodes, chunk_len)):
            rows.append({"eval": "copy", "length": length, "index": i, "references": "".join(ep.values),
                         "prediction": "".join(scored["predictions"]),
                         "score": 100.0 * scored["correct"] / len(ep.values), "queries": len(ep.values),
                         "loss": scored["loss"], "regenerate": f"copy span {length} {i}"})
    cells = [{"length": n, "reach": n + 1, **query_cell([r for r in rows if r["length"] == n])} for n in lengths]
    return {"lengths": cells,
            "episode": f"{samples} held-out episodes per length, each a span of random capitals, '=', the span again",
            "chance": f"{100 / len(VALUES):.1f}% knowing only the alphabet", "samples": rows}


@dataclass
class CopySettings:
    """Span copying by length.

    Args:
        lengths: Span lengths (characters), e.g. [8, 32, 48, 96]: a window W copies the spans shorter than W.
        samples: Episodes per length.
    """

    lengths: list[int] = field(default_factory=lambda: [8, 32, 48, 96])
    samples: int = 32

    def __post_init__(self) -> None:
        require(bool(self.lengths) and all(n >= 1 for n in self.lengths), "eval.copy.lengths", "must be lengths >= 1",
                self.lengths)
        require(self.samples >= 1, "eval.copy.samples", "must be >= 1", self.samples)


@register
class Copy(Evaluation):
    name, title, order, Settings = "copy", "Span copying by length", 55, CopySettings
    scalar_rows = ("lengths", "eval/copy/length_{length}", {"accuracy": "accuracy", "loss": "loss"})

    def workload(self) -> tuple[int, int, int]:
        s = self.settings
        return len(s.lengths) * s.samples, s.samples * sum(2 * n + 2 for n in s.lengths), 0

    def run(self, model, data, samples: list) -> dict:
        s = self.settings
        out = copy_by_length(model, data.tokenizer, s.lengths, s.samples, self.context.seed, self.context.chunk_len,
                             progress=lambda jobs: tqdm(jobs, desc="copy by length"))
        samples += out.pop("samples")
        return out

    @classmethod
    def report(cls, section: dict) -> list[str]:
        note = (f"{section['episode']}. Reach: tokens from a character to its copy (a window W copies it when "
                "W >= reach); accuracy: copied characters that are the top prediction, % [95% Wilson interval], "
                f"n characters; loss: mean cross-entropy (nats) [95% interval over episodes]. Chance: "
                f"{section['chance']}.")
        rows = [[r["length"], r["reach"], with_interval(r, "accuracy", 1, 0), with_interval(r, "loss", 3, 3), r["n"]]
                for r in section["lengths"]]
        return section_table(cls.title, note, ["length", "reach", "accuracy", "loss", "n"], rows)
