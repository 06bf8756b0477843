"""The short-context tasks through lm-evaluation-harness (`eval.lm_eval`): ARC, HellaSwag, MBPP or any harness task,
run on the model through the adapter (lm_eval_adapter.py, which imports lm_eval and so is loaded only when this
evaluation runs: the harness is an optional group, `bash setup.sh eval`).

Decisions:
- The cost estimate lists the tasks without a time: their size is the harness's business.
- Results keep the harness's "metric,filter" keys with a document count and a 95% interval per metric
  (lm_eval_adapter.metric_cell); TensorBoard gets eval/lm_eval/<task>/<metric>/<filter>.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from swax_lightning.core.errors import require
from swax_lightning.evals.registry import Evaluation, register
from swax_lightning.evals.reports import section_table


@dataclass
class HarnessSettings:
    """lm-evaluation-harness tasks.

    Args:
        tasks: Task names (arc_easy, arc_challenge, hellaswag, mbpp_swax, or your own in include_path).
        include_path: Folder of extra task YAML files (e.g. local, offline task definitions).
        limit: Examples per task (empty = all).
    """

    tasks: list[str] = field(default_factory=lambda: ["arc_easy", "arc_challenge", "hellaswag"])
    include_path: str | None = None
    limit: int | None = None

    def __post_init__(self) -> None:
        require(bool(self.tasks), "eval.lm_eval.tasks", "must name at least one task", self.tasks)
        require(self.limit is None or self.limit >= 1, "eval.lm_eval.limit", "must be >= 1 or empty", self.limit)


@register
class Harness(Evaluation):
    name, title, order, Settings = "lm_eval", "lm-eval tasks", 60, HarnessSettings

    def run(self, model, data, samples: list) -> dict:
        from swax_lightning.evals.lm_eval_adapter import run_lm_eval

        s = self.settings
        return run_lm_eval(model, data.tokenizer, s.tasks, s.include_path, s.limit, self.context.chunk_len)

    @classmethod
    def report(cls, section: dict) -> list[str]:
        note = "Interval: Wilson for shares of 0/1 scores, else value +- 1.96 x the harness's standard error."
        rows = [[task, metric, f"{c['value']:.4f}", _interval(c), c["n"]] for task, cells in section.items()
                for metric, c in cells.items()]
        return section_table("lm-evaluation-harness", note, ["task", "metric,filter", "value", "95% interval", "n"],
                             rows)

    @classmethod
    def scalars(cls, section: dict) -> dict[str, float]:
        return {f"eval/lm_eval/{task}/{metric.replace(',', '/')}": c["value"]
                for task, cells in section.items() for metric, c in cells.items()}


def _interval(c: dict) -> str:
    return "-" if c["ci95"] is None else f"[{c['ci95'][0]:.4f}, {c['ci95'][1]:.4f}] ({c['interval']})"
