"""Compare evaluation runs: one table and one plot (NIAH accuracy against context length, a line per run).

    python -m swax_lightning.evals.compare runs/tiny/*/eval/results.json --out runs/tiny/comparison

Each run is named by its folder (runs/<experiment>/<arm>/eval/results.json -> <arm>). Writes comparison.md and
niah_vs_length.png into --out, and prints the table.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path


def run_name(path: Path) -> str:
    return path.parent.parent.name if path.parent.name == "eval" else path.parent.name


def compare(paths: list[Path]) -> tuple[str, dict]:
    runs = {}
    for path in paths:
        if not path.is_file():
            raise FileNotFoundError(f"results file not found: {path}")
        runs[run_name(path)] = json.loads(path.read_text())
    lines = []
    niah_lengths = sorted({n for r in runs.values() for n in r.get("niah", {}).get("scores", {}).get("average", {})},
                          key=int)
    bab_lengths = sorted({n for r in runs.values() for n in r.get("babilong", {}).get("scores", {}).get("average",
                                                                                                         {})}, key=int)
    header = ["run"] + [f"NIAH {n}" for n in niah_lengths] + [f"BABILong {n}" for n in bab_lengths]
    lines += ["| " + " | ".join(header) + " |", "|---" * len(header) + "|"]
    for name, result in runs.items():
        niah = result.get("niah", {}).get("scores", {}).get("average", {})
        bab = result.get("babilong", {}).get("scores", {}).get("average", {})
        cells = [f"{niah[n]:.1f}" if n in niah else "-" for n in niah_lengths]
        cells += [f"{bab[n]:.1f}" if n in bab else "-" for n in bab_lengths]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
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
            ax.plot([int(n) for n in lengths], [average[n] for n in lengths], marker="o", label=name)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("context length (tokens)")
    ax.set_ylabel("NIAH accuracy (%, average over tasks)")
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
