"""The window study in one command: train and evaluate every arm x seed of a study folder, then collect the results.

    python -m swax_lightning.study run configs/study            # all arms, seeds 0 and 1, then collect
    python -m swax_lightning.study run configs/study --seeds 0 -- --trainer.max_steps 20   # extra main.py options
    python -m swax_lightning.study collect runs/study           # table + plots from what has finished

An arm is a config file of the folder (every .yaml except those starting with "_", which hold the shared settings
the arms extend). Each (arm, seed) is one run, `runs/<folder name>/<arm file name>-s<seed>/`: `main.py fit` with
`--seed_everything <seed>` (and the run's --experiment/--arm), then `main.py test` of its last.ckpt. The runs go one
after another (a laptop has the cores for one), each in its own process, exactly the commands a user would type.

Decisions:
- Resumable: a run whose eval/results.json exists is skipped; a run whose fit did not finish (no fit.done marker)
  resumes from its last.ckpt when there is one; anything else starts fresh (`--overwrite true`: a run stopped before
  its first checkpoint left only logs). Stopping the command loses at most the
  steps of the run in progress since its last checkpoint.
- The collected results come from each run's own files: eval/results.json (NIAH, answer loss by distance) and the
  TensorBoard scalars val/loss (last validation of fit) and test/loss, so `collect` needs no state of its own.
- Report (in runs/<experiment>/): study.md, a table per arm and seed (validation loss, NIAH accuracy per length with
  intervals, answer-token loss per distance bucket) and the arms' mean over seeds; niah_vs_length.png and
  answer_loss_vs_distance.png, a line per arm (the mean over seeds) and a band from the lowest to the highest seed.
"""
from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
import time
from pathlib import Path

from swax_lightning.runs import run_dir

ROOT = Path(__file__).resolve().parents[1]


def arm_files(folder: Path) -> list[Path]:
    arms = sorted(p for p in folder.glob("*.yaml") if not p.name.startswith("_"))
    if not arms:
        raise FileNotFoundError(f"no arm files (*.yaml not starting with '_') in {folder}")
    return arms


def arm_run_dir(config: Path, seed: int, save_dir: Path) -> Path:
    """runs/<study folder name>/<arm file stem>-s<seed>: the run folder main.py gives --experiment and --arm."""
    return run_dir(save_dir, config.parent.name, f"{config.stem}-s{seed}")


def _main(subcommand: str, config: Path, seed: int, save_dir: Path, extra: list[str], *more: str) -> None:
    cmd = [sys.executable, str(ROOT / "main.py"), subcommand, "--config", str(config), "--seed_everything", str(seed),
           "--experiment", config.parent.name, "--arm", f"{config.stem}-s{seed}",
           "--trainer.logger.init_args.save_dir", str(save_dir), *more, *extra]
    print("$", " ".join(cmd), flush=True)
    subprocess.run(cmd, check=True)


def run_one(config: Path, seed: int, save_dir: Path, extra: list[str]) -> str:
    folder = arm_run_dir(config, seed, save_dir)
    if (folder / "eval/results.json").is_file():
        return "done before"
    ckpt, fitted = folder / "checkpoints/last.ckpt", folder / "fit.done"
    if not fitted.is_file():  # resume from the last checkpoint, or start again over a run stopped before its first
        _main("fit", config, seed, save_dir, extra, *(["--ckpt_path", str(ckpt)] if ckpt.exists() else
                                                      ["--overwrite", "true"]))
        fitted.write_text("main.py fit finished\n")
    _main("test", config, seed, save_dir, extra, "--ckpt_path", str(ckpt))
    return "trained and evaluated"


# ---- collecting -------------------------------------------------------------------------------------------------
def _scalars(folder: Path) -> dict:
    """The last value of val/loss and test/loss in the run's TensorBoard files."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    out = {}
    for events in sorted(folder.glob("events.out.tfevents.*"), key=lambda p: p.stat().st_mtime):
        acc = EventAccumulator(str(events), size_guidance={"scalars": 0})
        acc.Reload()
        for tag in ("val/loss", "test/loss"):
            if tag in acc.Tags()["scalars"]:
                out[tag] = acc.Scalars(tag)[-1].value
    return out


def collect(experiment_dir: Path) -> str:
    runs = {}
    for results in sorted(experiment_dir.glob("*-s*/eval/results.json")):
        folder = results.parent.parent
        arm, seed = folder.name.rsplit("-s", 1)
        runs[(arm, int(seed))] = {"results": json.loads(results.read_text()), **_scalars(folder)}
    if not runs:
        raise FileNotFoundError(f"no finished runs (…-s<seed>/eval/results.json) in {experiment_dir}")
    text = _table(runs)
    (experiment_dir / "study.md").write_text(text)
    _plots(runs, experiment_dir)
    return text


def _niah(run: dict) -> dict:
    return run["results"].get("niah", {}).get("scores", {}).get("average", {})


def _recall(run: dict) -> list[dict]:
    return run["results"].get("recall", {}).get("buckets", [])


def _table(runs: dict) -> str:
    lengths = sorted({int(n) for run in runs.values() for n in _niah(run)})
    buckets = sorted({(b["from"], b["to"]) for run in runs.values() for b in _recall(run)})
    header = (["arm", "seed", "val loss"] + [f"NIAH {n}" for n in lengths]
              + [f"answer loss {lo}-{hi}" for lo, hi in buckets])
    lines = ["# Window study\n", "NIAH: average over tasks, % [95% interval]; answer loss: mean cross-entropy of the "
             "answer's tokens (nats) at that fact-to-question distance (characters); the `mean` rows average the "
             "seeds.\n", "| " + " | ".join(header) + " |", "|---" * len(header) + "|"]
    for arm in sorted({arm for arm, _ in runs}):
        seeds = sorted(seed for a, seed in runs if a == arm)
        values = [_row(runs[(arm, seed)], lengths, buckets) for seed in seeds]
        for seed, row in zip(seeds, values):
            niah = _niah(runs[(arm, seed)])
            cells = [f"{row[0]:.3f}"] + [_pct(niah.get(str(n))) for n in lengths]
            cells += [f"{v:.3f}" for v in row[1 + len(lengths):]]
            lines.append("| " + " | ".join([arm, str(seed), *cells]) + " |")
        if len(values) > 1:
            mean = [sum(column) / len(column) for column in zip(*values)]
            cells = [f"{mean[0]:.3f}"] + [f"{v:.0f}" for v in mean[1:1 + len(lengths)]]
            cells += [f"{v:.3f}" for v in mean[1 + len(lengths):]]
            lines.append("| " + " | ".join([f"**{arm}**", "mean", *cells]) + " |")
    return "\n".join(lines) + "\n"


def _row(run: dict, lengths: list[int], buckets: list[tuple[int, int]]) -> list[float]:
    """[validation loss, NIAH % per length, answer loss per bucket] of one run (NaN where missing)."""
    niah = _niah(run)
    recall = {(b["from"], b["to"]): b["loss"] for b in _recall(run)}
    return ([run.get("val/loss", math.nan)] + [niah[str(n)]["mean"] if str(n) in niah else math.nan for n in lengths]
            + [recall.get(b, math.nan) for b in buckets])


def _pct(c: dict | None) -> str:
    return "" if c is None else f"{c['mean']:.0f} [{c['ci95'][0]:.0f}, {c['ci95'][1]:.0f}]"


def _by_arm(runs: dict, series) -> dict:
    """{arm: {x: [value per seed]}} for series(run) -> {x: value}."""
    out: dict = {}
    for (arm, _), run in runs.items():
        for x, value in series(run).items():
            out.setdefault(arm, {}).setdefault(x, []).append(value)
    return out


def _plots(runs: dict, out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figures = [
        ("niah_vs_length.png", "NIAH accuracy vs context length", "context length (tokens)", "NIAH accuracy (%)",
         lambda run: {int(n): c["mean"] for n, c in _niah(run).items()}),
        ("answer_loss_vs_distance.png", "Answer-token loss vs recall distance", "fact-to-question distance "
         "(characters, bucket geometric middle)", "answer loss (nats)",
         lambda run: {math.sqrt(b["from"] * b["to"]): b["loss"] for b in _recall(run)}),
    ]
    for name, title, xlabel, ylabel, series in figures:
        fig, ax = plt.subplots(figsize=(7, 4.5))
        for arm, points in sorted(_by_arm(runs, series).items()):
            xs = sorted(points)
            mean = [sum(points[x]) / len(points[x]) for x in xs]
            line, = ax.plot(xs, mean, marker="o", label=arm)
            ax.fill_between(xs, [min(points[x]) for x in xs], [max(points[x]) for x in xs], color=line.get_color(),
                            alpha=0.2)
        ax.set_xscale("log")
        ax.set(title=title + " (line: mean over seeds; band: lowest to highest seed)", xlabel=xlabel, ylabel=ylabel)
        ax.title.set_fontsize(9)
        ax.legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(out / name, dpi=100)
        plt.close(fig)


def main(argv: list[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    extra = argv[argv.index("--") + 1:] if "--" in argv else []
    argv = argv[:argv.index("--")] if "--" in argv else argv
    parser = argparse.ArgumentParser(prog="python -m swax_lightning.study", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="train and evaluate every arm x seed (skipping finished runs), then collect")
    run.add_argument("folder", type=Path, help="folder of arm files, e.g. configs/study")
    run.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    run.add_argument("--save_dir", type=Path, default=Path("runs"))
    col = sub.add_parser("collect", help="table and plots of the finished runs")
    col.add_argument("experiment_dir", type=Path, help="e.g. runs/study")
    args = parser.parse_args(argv)
    if args.command == "collect":
        print(collect(args.experiment_dir))
        return
    start = time.monotonic()
    for config in arm_files(args.folder):
        for seed in args.seeds:
            status = run_one(config, seed, args.save_dir, extra)
            folder = arm_run_dir(config, seed, args.save_dir)
            print(f"[{time.monotonic() - start:7.0f} s] {folder}: {status}", flush=True)
    print(collect(arm_run_dir(arm_files(args.folder)[0], args.seeds[0], args.save_dir).parent))


if __name__ == "__main__":
    main()
