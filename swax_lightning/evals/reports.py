"""Evaluation reports: per-cell summaries with sample counts and 95% intervals, results.json, results.md, the NIAH
heatmap and the TensorBoard scalars.

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

from swax_lightning import atomic

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


def flat_metrics(results: dict) -> dict:
    """TensorBoard scalars: eval/<benchmark>/<task>/<length> (mean), perplexity by position, MQAR as
    eval/mqar/gap_<gap>/accuracy and .../value_loss, lm-eval metrics as eval/lm_eval/<task>/<metric>/<filter>."""
    metrics = {}
    for name in ("niah", "babilong"):
        for task, row in results.get(name, {}).get("scores", {}).items():
            for length, c in row.items():
                metrics[f"eval/{name}/{task}/{length}"] = c["mean"]
    for row in results.get("perplexity", []):
        metrics[f"eval/ppl_by_position/{row['from']}-{row['to']}/loss"] = row["loss"]
        metrics[f"eval/ppl_by_position/{row['from']}-{row['to']}/bpb"] = row["bpb"]
    for row in results.get("recall", {}).get("buckets", []):
        metrics[f"eval/recall/{row['from']}-{row['to']}/answer_loss"] = row["loss"]
        metrics[f"eval/recall/{row['from']}-{row['to']}/exact"] = row["exact"]
    for row in results.get("mqar", {}).get("gaps", []):
        metrics[f"eval/mqar/gap_{row['gap']}/accuracy"] = row["accuracy"]
        metrics[f"eval/mqar/gap_{row['gap']}/value_loss"] = row["loss"]
    for task, cells in results.get("lm_eval", {}).items():
        for metric, c in cells.items():
            metrics[f"eval/lm_eval/{task}/{metric.replace(',', '/')}"] = c["value"]
    return metrics


def heatmap_figure(niah: dict, task: str | None = None):
    """NIAH mean score by needle depth (rows) x context length in tokens (columns), of one task or (task None) of
    all tasks pooled; cells without samples blank."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    grid = niah["depth_x_length"] if task is None else niah["depth_x_length_by_task"][task]
    depths, lengths = list(grid), lengths_of(grid)
    values = np.ma.masked_invalid([[grid[d][n]["mean"] if n in grid[d] else np.nan for n in lengths]
                                   for d in depths])
    counts = {grid[d][n]["n"] for d in depths for n in lengths if n in grid[d]}
    fig, ax = plt.subplots(figsize=(1.2 * len(lengths) + 3, 0.22 * len(depths) + 2))
    cmap = plt.get_cmap("RdYlGn").with_extremes(bad="white")
    image = ax.imshow(values, vmin=0, vmax=100, cmap=cmap, aspect="auto")
    ax.set_xticks(range(len(lengths)), [f"{int(n) // 1024}k" if int(n) >= 1024 else n for n in lengths])
    ax.set_yticks(range(len(depths)), [f"{float(d):.0%}" for d in depths], fontsize=7 if len(depths) > 12 else 9)
    ax.set_xlabel("context length (tokens)")
    ax.set_ylabel("needle depth (share of the haystack)")
    n_text = "/".join(str(n) for n in sorted(counts))
    pooled = f"mean over {len(niah['depth_x_length_by_task'])} tasks" if task is None else task
    ax.set_title(f"RULER NIAH accuracy (%) by needle depth and context length\n({pooled}, n = {n_text} samples "
                 "per cell)", fontsize=10)
    if len(depths) <= 20:  # numbers in the cells while they stay legible
        empty = np.ma.getmaskarray(values)
        for i, j in zip(*np.nonzero(~empty)):
            ax.text(j, i, f"{values[i, j]:.0f}", ha="center", va="center", fontsize=8)
    fig.colorbar(image, ax=ax, label="accuracy (%)")
    fig.tight_layout()
    return fig


def _reach(bucket: dict) -> str:
    """A recall bucket's reach as "least-most" ("-" in results written before buckets recorded it)."""
    return "-" if "reach" not in bucket else f"{bucket['reach'][0]}-{bucket['reach'][1]}"


def _with_interval(row: dict, key: str, digits: int, interval_digits: int) -> str:
    """row[key] and its interval row[key_ci95] as "value [low, high]"."""
    low, high = row[f"{key}_ci95"]
    return f"{row[key]:.{digits}f} [{low:.{interval_digits}f}, {high:.{interval_digits}f}]"


def _interval(c: dict) -> str:
    return "-" if c["ci95"] is None else f"[{c['ci95'][0]:.4f}, {c['ci95'][1]:.4f}] ({c['interval']})"


def markdown(results: dict, with_settings: bool = True) -> str:
    """results.md: the tables of every evaluation (and the settings line, unless printed to a terminal)."""
    settings = f"\n\nSettings: `{json.dumps(results['settings'])}`" if with_settings else ""
    lines = [f"# Evaluation results{settings}\n", "Cells: mean score [95% Wilson interval] n=samples.\n"]
    titles = {"niah": "RULER NIAH (string_match_all, %; columns: context length in model tokens)",
              "babilong": "BABILong (official rule, %)"}
    for name, title in titles.items():
        if name not in results:
            continue
        table = results[name]["scores"]
        lengths = lengths_of(table)
        lines.append(f"## {title}\n")
        if name == "babilong":
            lines.append(f"Data: {results[name]['source']}; columns: {results[name]['length_unit']}.\n")
        lines += ["| task | " + " | ".join(lengths) + " |", "|---" * (len(lengths) + 1) + "|"]
        lines += [f"| {task} | " + " | ".join(show(row.get(n)) for n in lengths) + " |" for task, row in table.items()]
        lines.append("")
    if "perplexity" in results:
        lines += ["## Loss by position\n", "| positions | loss | ppl | bits/byte |", "|---|---|---|---|"]
        lines += [f"| {r['from']}-{r['to']} | {r['loss']:.4f} | {r['ppl']:.3f} | {r['bpb']:.4f} |"
                  for r in results["perplexity"]]
        lines.append("")
    if "recall" in results:
        lines += ["## Answer-token loss by recall distance\n",
                  "Distance: characters between the fact and its question; reach: characters from the fact's value "
                  "to the answer (a layer must see that far back to copy it); loss: mean cross-entropy of the "
                  "answer's tokens (nats) [95% interval]; exact: all answer tokens top-1, % [95% Wilson interval].\n",
                  "| distance | reach | loss | exact | n |", "|---|---|---|---|---|"]
        lines += [f"| {r['from']}-{r['to']} | {_reach(r)} | {_with_interval(r, 'loss', 3, 3)} | "
                  f"{_with_interval(r, 'exact', 1, 0)} | {r['n']} |" for r in results["recall"]["buckets"]]
        lines.append("")
    if "mqar" in results:
        lines += ["## Associative recall (MQAR) by gap\n",
                  f"{results['mqar']['episode']}. Gap: filler characters between the pairs and their queries; reach: "
                  "tokens from a stated value to the query that asks for it (a window W sees the pair when W >= "
                  "reach); accuracy: queries whose value is the top prediction, % [95% Wilson interval], n queries; "
                  "value loss: mean cross-entropy of the values (nats) [95% interval over episodes]. Chance: "
                  f"{results['mqar']['chance']}.\n",
                  "| gap | reach | accuracy | value loss | n |", "|---|---|---|---|---|"]
        lines += [f"| {r['gap']} | {r['reach'][0]}-{r['reach'][1]} | {_with_interval(r, 'accuracy', 1, 0)} | "
                  f"{_with_interval(r, 'loss', 3, 3)} | {r['n']} |" for r in results["mqar"]["gaps"]]
        lines.append("")
    if "lm_eval" in results:
        lines += ["## lm-evaluation-harness\n",
                  "Interval: Wilson for shares of 0/1 scores, else value +- 1.96 x the harness's standard error.\n",
                  "| task | metric,filter | value | 95% interval | n |", "|---|---|---|---|---|"]
        lines += [f"| {task} | {metric} | {c['value']:.4f} | {_interval(c)} | {c['n']} |"
                  for task, cells in results["lm_eval"].items() for metric, c in cells.items()]
    return "\n".join(lines) + "\n"


def write_reports(results: dict, out_dir: Path) -> None:
    """results.json, results.md and (NIAH) niah_heatmap.png (all tasks) and niah_heatmap_<task>.png in out_dir."""
    out_dir.mkdir(parents=True, exist_ok=True)
    atomic.write_text(out_dir / "results.json", json.dumps(results, indent=2))
    atomic.write_text(out_dir / "results.md", markdown(results))
    if "niah" in results:
        import matplotlib.pyplot as plt

        for task in (None, *results["niah"]["depth_x_length_by_task"]):
            fig = heatmap_figure(results["niah"], task)
            with atomic.written_atomically(out_dir / f"niah_heatmap{'_' + task if task else ''}.png") as tmp:
                fig.savefig(tmp, dpi=100, format="png")
            plt.close(fig)
