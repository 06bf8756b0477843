"""Compare evaluation runs: one table and one plot (NIAH accuracy against context length, a line per run).

    python -m swax_lightning compare runs/tiny/*/eval/results.json --out runs/tiny/comparison

Each run is named by its folder (runs/<experiment>/<arm>/eval/results.json -> <arm>). Writes comparison.md and
niah_vs_length.png into --out, and prints the table. Every cell is the average over tasks with its 95% interval and
sample count, and the plot draws the intervals as error bars: two runs differ only where their intervals part.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from swax_lightning.evals.reports import lengths_of, show


def run_name(path: Path) -> str:
    return path.parent.parent.name if path.parent.name == "eval" else path.parent.name


def compare(paths: list[Path]) -> tuple[str, dict]:
    runs = {}
    for path in paths:
        if not path.is_file():
            raise FileNotFoundError(f"results file not found: {path}")
        runs[run_name(path)] = json.loads(path.read_text())
    averages = {name: {bench: result.get(bench, {}).get("scores", {}).get("average", {})
                       for bench in ("niah", "babilong")} for name, result in runs.items()}
    columns = [(bench, n) for bench in ("niah", "babilong")
               for n in lengths_of({name: a[bench] for name, a in averages.items()})]
    header = ["run"] + [f"{'NIAH' if bench == 'niah' else 'BABILong'} {n}" for bench, n in columns]
    lines = ["Average over tasks: mean [95% interval] n=samples.\n", "| " + " | ".join(header) + " |",
             "|---" * len(header) + "|"]
    for name, average in averages.items():
        lines.append(f"| {name} | " + " | ".join(show(average[bench].get(n)) or "-" for bench, n in columns) + " |")
    return "\n".join(lines) + "\n", runs


def plot(runs: dict, out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for name, result in runs.items():
        average = result.get("niah", {}).get("scores", {}).get("average", {})
        if average:
            lengths = sorted(average, key=int)
            means = [average[n]["mean"] for n in lengths]
            errors = [[m - average[n]["ci95"][0] for m, n in zip(means, lengths)],
                      [average[n]["ci95"][1] - m for m, n in zip(means, lengths)]]
            ax.errorbar([int(n) for n in lengths], means, yerr=errors, marker="o", capsize=3, label=name)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("context length (tokens)")
    ax.set_ylabel("NIAH accuracy (%, average over tasks)")
    ax.set_title("RULER NIAH by context length (95% intervals)")
    ax.set_ylim(-2, 102)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(out, dpi=100)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("results", nargs="+", type=Path, help="results.json files written by main.py test")
    parser.add_argument("--out", type=Path, default=Path("comparison"))
    args = parser.parse_args(argv)
    table, runs = compare(args.results)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "comparison.md").write_text(table)
    plot(runs, args.out / "niah_vs_length.png")
    print(table)


if __name__ == "__main__":
    main()
