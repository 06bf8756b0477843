"""Evaluation reports: per-cell summaries with sample counts and 95% intervals, and results.json, results.md, the
figures and the TensorBoard scalars, each evaluation's part written by the evaluation itself (registry.py).

Decisions:
- A cell (task x length, or depth x length) reports its mean score, its sample count n and a 95% Wilson score
  interval on the mean share. Wilson is exact in its coverage idea for 0/100 scores (BABILong, single-needle NIAH)
  and stays inside [0, 100] with one sample (a 0 from one sample is "0 [0, 79]", not "0"); for NIAH tasks with
  partial scores (multivalue, multiquery) it is an approximation, said so in the report.
- The "average" row pools every sample of a length across tasks (each task has the same count per length).
- results.json is plain, deterministic JSON: no timings, no absolute paths in "samples", keys in a fixed order, so
  two runs of the same model and settings give the same file.
- Every file is written to a temporary name, then renamed: a crash never leaves half a report.
"""
from __future__ import annotations

import json
import math
from collections import defaultdict
from pathlib import Path

from swax_lightning.core import atomic
from swax_lightning.evals.registry import load_all

Z95 = 1.959963984540054


def wilson_interval(mean_percent: float, n: int) -> list[float]:
    """95% Wilson score interval, in percent, of a share observed as `mean_percent` over n samples."""
    if n == 0:
        return [0.0, 100.0]
    p = mean_percent / 100
    centre = (p + Z95 ** 2 / (2 * n)) / (1 + Z95 ** 2 / n)
    half = Z95 * math.sqrt(p * (1 - p) / n + Z95 ** 2 / (4 * n * n)) / (1 + Z95 ** 2 / n)
    return [round(100 * max(0.0, centre - half), 2), round(100 * min(1.0, centre + half), 2)]


def mean_interval(values: list[float]) -> tuple[float, list[float]]:
    """The mean of `values` and its 95% normal interval (mean +- 1.96 standard errors; [mean, mean] for one value)."""
    n = len(values)
    mean = sum(values) / n
    sd = math.sqrt(sum((x - mean) ** 2 for x in values) / (n - 1)) if n > 1 else 0.0
    half = Z95 * sd / math.sqrt(n)
    return mean, [mean - half, mean + half]


def cell(values: list[float]) -> dict:
    mean = sum(values) / len(values)
    return {"mean": mean, "n": len(values), "ci95": wilson_interval(mean, len(values))}


def _grid(values_by_depth: dict) -> dict:
    """{depth: {length: [score, ...]}} -> {depth: {length: cell}}, depths in increasing order."""
    return {d: {n: cell(v) for n, v in values_by_depth[d].items()} for d in sorted(values_by_depth, key=float)}


def summarize(scores: dict) -> dict:
    """scores: {(task, length, depth or None): [score, ...]} -> {"scores": {task: {length: cell}}, with an "average"
    row pooling the tasks, and (when depths are given) "depth_x_length": {depth: {length: cell}} pooling the tasks
    and "depth_x_length_by_task": {task: {depth: {length: cell}}}}."""
    by_task, by_depth, by_length = (defaultdict(lambda: defaultdict(list)) for _ in range(3))
    by_task_depth = defaultdict(lambda: defaultdict(lambda: defaultdict(list)))
    for (task, length, depth), values in scores.items():
        by_task[task][str(length)] += values
        by_length["average"][str(length)] += values
        if depth is not None:
            by_depth[f"{depth:g}"][str(length)] += values
            by_task_depth[task][f"{depth:g}"][str(length)] += values
    table = {task: {n: cell(v) for n, v in rows.items()} for task, rows in by_task.items()}
    table["average"] = {n: cell(v) for n, v in by_length["average"].items()}
    out = {"scores": table}
    if by_depth:
        out["depth_x_length"] = _grid(by_depth)
        out["depth_x_length_by_task"] = {task: _grid(grid) for task, grid in by_task_depth.items()}
    return out


def lengths_of(table: dict) -> list[str]:
    """The length columns of a score table, in increasing order (numbers of tokens, or split names like 4k)."""
    def order(n: str):
        return (float(n[:-1]) * (1 << 20 if n[-1] == "M" else 1024)) if n[-1] in "kM" else float(n)
    return sorted({n for row in table.values() for n in row}, key=order)


def show(c: dict | None) -> str:
    return "" if c is None else f"{c['mean']:.1f} [{c['ci95'][0]:.0f}, {c['ci95'][1]:.0f}] n={c['n']}"


def score_table(title: str, section: dict, note: str = "") -> list[str]:
    """A task x length table of cells (a NIAH or BABILong section), headed by `title` (and `note`)."""
    table = section["scores"]
    lengths = lengths_of(table)
    lines = [f"## {title}\n", *([note] if note else []), "| task | " + " | ".join(lengths) + " |",
             "|---" * (len(lengths) + 1) + "|"]
    lines += [f"| {task} | " + " | ".join(show(row.get(n)) for n in lengths) + " |" for task, row in table.items()]
    return [*lines, ""]


def section_table(title: str, note: str, columns: list[str], rows: list[list]) -> list[str]:
    """A results.md section: its heading, a note, and a table of `rows` under `columns`."""
    head = [f"## {title}\n", *([note + "\n"] if note else []), "| " + " | ".join(columns) + " |",
            "|---" * len(columns) + "|"]
    return [*head, *("| " + " | ".join(map(str, row)) + " |" for row in rows), ""]


def table_scalars(name: str, section: dict) -> dict[str, float]:
    """eval/<name>/<task>/<length>: the mean of every cell of a task x length table."""
    return {f"eval/{name}/{task}/{length}": c["mean"] for task, row in section["scores"].items()
            for length, c in row.items()}


def with_interval(row: dict, key: str, digits: int, interval_digits: int) -> str:
    """row[key] and its interval row[key_ci95] as "value [low, high]"."""
    low, high = row[f"{key}_ci95"]
    return f"{row[key]:.{digits}f} [{low:.{interval_digits}f}, {high:.{interval_digits}f}]"


def _sections(results: dict):
    """(evaluation class, its section) for every evaluation the results hold, in the table's order."""
    evaluations = load_all()
    return [(cls, results[name]) for name, cls in evaluations.items() if name in results]


def flat_metrics(results: dict) -> dict:
    """TensorBoard scalars of every evaluation in `results` (each evaluation's `scalars`: eval/<name>/...)."""
    metrics = {}
    for cls, section in _sections(results):
        metrics |= cls.scalars(section)
    return metrics


def figures(results: dict) -> dict:
    """{name: figure} of every evaluation in `results` (e.g. the NIAH heatmaps)."""
    out = {}
    for cls, section in _sections(results):
        out |= cls.figures(section)
    return out


def markdown(results: dict, with_settings: bool = True) -> str:
    """results.md: the tables of every evaluation (and the settings line, unless printed to a terminal)."""
    settings = f"\n\nSettings: `{json.dumps(results['settings'])}`" if with_settings else ""
    lines = [f"# Evaluation results{settings}\n", "Cells: mean score [95% Wilson interval] n=samples.\n"]
    for cls, section in _sections(results):
        lines += cls.report(section)
    return "\n".join(lines) + "\n"


def write_reports(results: dict, out_dir: Path) -> None:
    """results.json, results.md and every evaluation's figures (<name>.png, e.g. niah_heatmap.png) in out_dir."""
    import matplotlib.pyplot as plt

    out_dir.mkdir(parents=True, exist_ok=True)
    atomic.write_text(out_dir / "results.json", json.dumps(results, indent=2))
    atomic.write_text(out_dir / "results.md", markdown(results))
    for name, fig in figures(results).items():
        with atomic.written_atomically(out_dir / f"{name}.png") as tmp:
            fig.savefig(tmp, dpi=100, format="png")
        plt.close(fig)
