"""The window study in one command: train and evaluate every arm x seed of a study folder, then collect the results.

    python -m swax_lightning study run configs/study --seeds 0 1 2 3 4 --jobs 2   # all arms, 5 seeds, 2 at a time
    python -m swax_lightning study run configs/study --seeds 0 -- --trainer.max_steps 20   # extra main.py options
    python -m swax_lightning study collect runs/study           # table + plots from what has finished
    python -m swax_lightning study compare runs/study other/study   # two sweeps side by side, where they differ
    python -m swax_lightning study run configs/study --seeds 1 --records docs/study/records   # a study kept in git

An arm is a config file of the folder (every .yaml except those starting with "_", which hold the shared settings
the arms extend). Each (arm, seed) is one run, `runs/<folder name>/<arm file name>-s<seed>/`: `main.py fit` with
`--seed_everything <seed>` (and the run's --experiment/--arm), then `main.py test` of its last.ckpt, each in its own
process, exactly the commands a user would type; `--jobs N` runs N of them side by side. A windowed arm (one with a
`window.windows` schedule) is also tested at each other window the study's arms train at (`--window.eval_window W`,
reports in eval_w<W>/): a long-window arm at the short window shows what its memory recalls alone.

Decisions:
- Resumable: a run whose eval/results.json exists is skipped; a run whose fit did not finish (no fit.done marker)
  resumes from its last.ckpt when there is one; anything else starts fresh (`--overwrite true`: a run stopped before
  its first checkpoint left only logs). Stopping the command loses at most the
  steps of the run in progress since its last checkpoint.
- The same figures on any machine of the same CPU kind: every run gets `--threads` intra-op threads (default 1,
  through OMP_NUM_THREADS), whatever the cores, since the thread count changes the order of floating-point sums and
  so the trained weights; `--jobs` then uses the cores by running whole runs side by side, which on small models is
  also faster than threads. Each fit records what it ran on in its run folder (environment.json), and the report
  lists it.
- The collected results come from each run's own files: eval/results.json and eval_w<W>/results.json (MQAR,
  span copying, NIAH, answer loss by distance, the test split's loss and bits per byte), the TensorBoard scalar
  val/loss (last validation of fit), and environment.json, so `collect` needs no state of its own. The arm's own
  window is tested last, so that its test figures are also the last in TensorBoard.
- A study longer than one machine's life (five seeds at two hours each) keeps its finished runs as records:
  `--records DIR` writes one JSON per run as soon as it finishes, `<arm>-s<seed>.json` (what `collect` reads from
  its folder: results.json at every window, the TensorBoard scalars, environment.json); a run kept there is not
  trained again, and the report joins the records, so one study can train in several checkouts. A record and a
  run folder of the same arm and seed that disagree stop the command with both named (one of them is not the run
  the other says it is).
- Report (in runs/<experiment>/): study.md, the arms' MQAR accuracy and value loss per gap and span-copy accuracy
  per length (mean over seeds, lowest to highest seed), each windowed arm at its own and the other windows, the
  paper's claims read seed by seed (claims.py: k of n seeds, paired bootstrap intervals, a verdict each), the
  secondary measures (validation and test loss, test bits per byte, NIAH, answer loss), a row per arm and seed with
  95% intervals, and what the runs ran on; mqar_accuracy_vs_gap.png, mqar_loss_vs_gap.png (the windows marked),
  copy_accuracy_vs_length.png, short_context_per_arm.png (test bits per byte and in-window copying, a dot per
  seed), and where measured niah_vs_length.png and answer_loss_vs_distance.png: a line per arm (the mean over
  seeds) and a band from the lowest to the highest seed.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import re
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from swax_lightning.core.atomic import read_json, write_json
from swax_lightning.core.config_files import merged_config
from swax_lightning.core.environment import ENVIRONMENT_FILE
from swax_lightning.core.errors import InputError, usage_errors_reported
from swax_lightning.study.claims import claims, copy_inside, mqar_beyond
from swax_lightning.training.runs import run_dir

ROOT = Path(__file__).resolve().parents[2]


def arm_files(folder: Path) -> list[Path]:
    arms = sorted(p for p in folder.glob("*.yaml") if not p.name.startswith("_"))
    if not arms:
        raise FileNotFoundError(f"no arm files (*.yaml not starting with '_') in {folder}")
    return arms


def arm_run_dir(config: Path, seed: int, save_dir: Path) -> Path:
    """runs/<study folder name>/<arm file stem>-s<seed>: the run folder main.py gives --experiment and --arm."""
    return run_dir(save_dir, config.parent.name, f"{config.stem}-s{seed}")


def _main(subcommand: str, config: Path, seed: int, save_dir: Path, extra: list[str], threads: int,
          *more: str) -> None:
    cmd = [sys.executable, str(ROOT / "main.py"), subcommand, "--config", str(config), "--seed_everything", str(seed),
           "--experiment", config.parent.name, "--arm", f"{config.stem}-s{seed}",
           "--trainer.logger.init_args.save_dir", str(save_dir), *more, *extra]
    print(f"$ OMP_NUM_THREADS={threads}", " ".join(cmd), flush=True)
    subprocess.run(cmd, check=True, env=os.environ | {"OMP_NUM_THREADS": str(threads)})


def study_windows(folder: Path) -> list[int]:
    """Every window an arm of the study trains at (its `window.windows`)."""
    return sorted({int(w) for config in arm_files(folder)
                   for w in (merged_config(config).get("window") or {}).get("windows") or []})


def other_windows(config: Path, windows: list[int]) -> list[int]:
    """The study's windows an arm is also evaluated at: all but its own evaluation window; none for an arm without
    a window schedule (attention-only, xLSTM-only)."""
    merged = merged_config(config)
    schedule = merged.get("window") or {}
    own = schedule.get("eval_window", (merged.get("model") or {}).get("arch", {}).get("window"))  # the callback's
    return [w for w in windows if w != own] if schedule.get("windows") else []


def run_one(config: Path, seed: int, save_dir: Path, extra: list[str], threads: int = 1,
            windows: list[int] = (), records: Path | None = None) -> str:
    """Fit (resuming), then `main.py test` at each of `windows` (into eval_w<W>/) and last at the arm's own
    evaluation window (eval/, whose results.json marks the run done; last, so that its test figures are the last
    ones in TensorBoard). With `records`: a run kept there is not trained again, and a run that finishes is kept
    there at once (a study stopped later, or failing in another run, loses no finished run)."""
    folder = arm_run_dir(config, seed, save_dir)
    record = _record_path(records, folder) if records else None
    if (folder / "eval/results.json").is_file():
        return "done before"
    if record and record.is_file():
        return f"kept in {record}"
    ckpt, fitted = folder / "checkpoints/last.ckpt", folder / "fit.done"
    if not fitted.is_file():  # resume from the last checkpoint, or start again over a run stopped before its first
        _main("fit", config, seed, save_dir, extra, threads, *(["--ckpt_path", str(ckpt)] if ckpt.exists() else
                                                               ["--overwrite", "true"]))
        fitted.write_text("main.py fit finished\n")
    for window in windows:
        if not (folder / f"eval_w{window}/results.json").is_file():
            _main("test", config, seed, save_dir, extra, threads, "--ckpt_path", str(ckpt), "--window.eval_window",
                  str(window), "--eval.output_dir", str(folder / f"eval_w{window}"))
    _main("test", config, seed, save_dir, extra, threads, "--ckpt_path", str(ckpt))
    if record:
        keep(_finished_run(folder), record, folder)
    return "trained and evaluated"


def run_all(folder: Path, seeds: list[int], save_dir: Path, extra: list[str], threads: int, jobs: int,
            records: Path | None = None) -> Path:
    """Every arm x seed, `jobs` at a time (those kept in `records` not again); returns the experiment folder."""
    start = time.monotonic()
    runs = [(config, seed) for config in arm_files(folder) for seed in seeds]
    windows = study_windows(folder)

    def one(run: tuple[Path, int]) -> None:
        status = run_one(*run, save_dir, extra, threads, other_windows(run[0], windows), records)
        print(f"[{time.monotonic() - start:7.0f} s] {arm_run_dir(*run, save_dir)}: {status}", flush=True)

    with ThreadPoolExecutor(max_workers=jobs) as pool:
        for finished in [pool.submit(one, run) for run in runs]:
            finished.result()  # a failed run stops the study with its error
    return arm_run_dir(*runs[0], save_dir).parent


# ---- collecting -------------------------------------------------------------------------------------------------
SCALARS = ("val/loss", "test/loss", "test/bpb")


def _scalars(folder: Path) -> dict:
    """The last value of val/loss, test/loss and test/bpb in the run's TensorBoard files."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    out = {}
    for events in sorted(folder.glob("events.out.tfevents.*"), key=lambda p: p.stat().st_mtime):
        acc = EventAccumulator(str(events), size_guidance={"scalars": 0})
        acc.Reload()
        for tag in SCALARS:
            if tag in acc.Tags()["scalars"]:
                out[tag] = acc.Scalars(tag)[-1].value
    return out


def load_runs(experiment_dir: Path, records: Path | None = None) -> dict:
    """(arm, seed) -> {"results", "val/loss", "test/loss", "test/bpb", "at_other_windows" ({window: results}),
    "environment"} of every finished run of a sweep (the test figures from results.json where it has them, else
    from TensorBoard), and of every record in `records`, where the sweep's runs are then also recorded."""
    finished = sorted(path.parent.parent for path in experiment_dir.glob("*-s*/eval/results.json"))
    runs = {_arm_and_seed(folder): _finished_run(folder) for folder in finished}
    if records is not None:
        for folder in finished:
            keep(runs[_arm_and_seed(folder)], _record_path(records, folder), folder)
        runs = load_records(records) | runs
    if not runs:
        raise FileNotFoundError(f"no finished runs (…-s<seed>/eval/results.json) in {experiment_dir}"
                                + (f" and no records (<arm>-s<seed>.json) in {records}" if records else ""))
    return runs


def keep(run: dict, record: Path, folder: Path) -> None:
    """Write the run's record, unless one is there: then it must hold the same results (nothing is rewritten)."""
    if not record.is_file():
        write_json(record, run)
    elif _canonical(run) != _canonical(read_json(record, "restore it (git checkout) or remove it and run that arm "
                                                          "and seed again")):
        raise InputError(f"{folder} and {record} hold different results for the same arm and seed: remove the one "
                         "that is wrong")


def _record_path(records: Path, folder: Path) -> Path:
    """Where a run folder (<arm>-s<seed>) is kept in a records folder."""
    return records / f"{folder.name}.json"


def load_records(records: Path) -> dict:
    """The runs kept in a records folder, as load_runs gives them (JSON's string keys of at_other_windows made
    windows again)."""
    runs = {}
    for path in sorted(records.glob("*-s*.json")):
        arm, seed = path.stem.rsplit("-s", 1)
        run = read_json(path, "restore it (git checkout) or remove it and run that arm and seed again")
        run["at_other_windows"] = {int(window): results for window, results in run["at_other_windows"].items()}
        runs[(arm, int(seed))] = run
    return runs


def _canonical(run: dict) -> str:
    return json.dumps(run, sort_keys=True)  # windows as strings, as in a record


def _arm_and_seed(folder: Path) -> tuple[str, int]:
    arm, seed = folder.name.rsplit("-s", 1)
    return arm, int(seed)


def _finished_run(folder: Path) -> dict:
    """What `collect` reads of one finished run folder (its record)."""
    results = json.loads((folder / "eval/results.json").read_text())
    others = {int(match[1]): json.loads(other.read_text()) for other in sorted(folder.glob("eval_w*/results.json"))
              if (match := re.fullmatch(r"eval_w(\d+)", other.parent.name))}
    environment = folder / ENVIRONMENT_FILE
    return {"results": results, **_scalars(folder), **results.get("test_split", {}), "at_other_windows": others,
            "environment": json.loads(environment.read_text()) if environment.is_file() else {}}


def collect(experiment_dir: Path, records: Path | None = None) -> str:
    runs = load_runs(experiment_dir, records)
    experiment_dir.mkdir(parents=True, exist_ok=True)
    text = report(runs)
    (experiment_dir / "study.md").write_text(text)
    _plots(runs, experiment_dir)
    return text


def _niah(run: dict) -> dict:
    return run["results"].get("niah", {}).get("scores", {}).get("average", {})


def _recall(run: dict) -> list[dict]:
    return run["results"].get("recall", {}).get("buckets", [])


def _mqar(run: dict) -> list[dict]:
    return run["results"].get("mqar", {}).get("gaps", [])


def _copy(run: dict) -> list[dict]:
    return run["results"].get("copy", {}).get("lengths", [])


def _columns(runs: dict) -> dict[str, list]:
    """The measures' columns over all runs: MQAR gaps, copied span lengths, NIAH lengths, answer-loss buckets."""
    return {"gaps": sorted({g["gap"] for run in runs.values() for g in _mqar(run)}),
            "spans": sorted({c["length"] for run in runs.values() for c in _copy(run)}),
            "lengths": sorted({int(n) for run in runs.values() for n in _niah(run)}),
            "buckets": sorted({(b["from"], b["to"]) for run in runs.values() for b in _recall(run)})}


def _values(run: dict, columns: dict) -> dict[str, list[float]]:
    """One run's measures in the order of `columns` (NaN where missing)."""
    mqar, niah = {g["gap"]: g for g in _mqar(run)}, _niah(run)
    recall = {(b["from"], b["to"]): b["loss"] for b in _recall(run)}
    copy = {c["length"]: c["accuracy"] for c in _copy(run)}
    return {"accuracy": [mqar[g]["accuracy"] if g in mqar else math.nan for g in columns["gaps"]],
            "copy": [copy.get(n, math.nan) for n in columns["spans"]],
            "value loss": [mqar[g]["loss"] if g in mqar else math.nan for g in columns["gaps"]],
            "val loss": [run.get("val/loss", math.nan)],
            "test loss": [run.get("test/loss", math.nan)],
            "test bpb": [run.get("test/bpb", math.nan)],
            "niah": [niah[str(n)]["mean"] if str(n) in niah else math.nan for n in columns["lengths"]],
            "answer loss": [recall.get(b, math.nan) for b in columns["buckets"]]}


def _spread(values: list[float], digits: int) -> str:
    """mean (lowest-highest) over seeds; the value alone for one seed; nan where a seed lacks it."""
    if any(math.isnan(v) for v in values):
        return "nan"
    if len(values) == 1:
        return f"{values[0]:.{digits}f}"
    return f"{sum(values) / len(values):.{digits}f} ({min(values):.{digits}f}-{max(values):.{digits}f})"


def _arm_table(runs: dict, columns: dict, header: list[str], measures: list[tuple[str, int]]) -> list[str]:
    """A row per arm: each column of `measures` ((measure, digits) in _values' order) as its mean over seeds
    (lowest-highest seed)."""
    lines = ["| arm | seeds | " + " | ".join(header) + " |", "|---" * (len(header) + 2) + "|"]
    for arm in sorted({arm for arm, _ in runs}):
        seeds = sorted(seed for a, seed in runs if a == arm)
        per_seed = [_values(runs[(arm, seed)], columns) for seed in seeds]
        cells = [_spread(list(column), digits) for measure, digits in measures
                 for column in zip(*(values[measure] for values in per_seed))]
        lines.append(f"| {arm} | {len(seeds)} | " + " | ".join(cells) + " |")
    return lines + [""]


def report(runs: dict) -> str:
    columns = _columns(runs)
    gaps = [f"gap {g}" for g in columns["gaps"]]
    lines = ["# Window study\n", "Each cell: the mean over seeds (lowest-highest seed).\n"]
    if gaps:
        mqar = next(run["results"]["mqar"] for run in runs.values() if "mqar" in run["results"])
        lines += [f"## Associative recall (MQAR): accuracy (%) by gap\n\n{mqar['episode']}; gap: filler characters "
                  f"between the pairs and their queries. Chance: {mqar['chance']}.\n",
                  *_arm_table(runs, columns, gaps, [("accuracy", 1)]),
                  "## MQAR value loss (nats) by gap\n", *_arm_table(runs, columns, gaps, [("value loss", 3)])]
    if columns["spans"]:
        copy = next(run["results"]["copy"] for run in runs.values() if "copy" in run["results"])
        lines += [f"## Span copying (the short-context task): accuracy (%) by span length\n\n{copy['episode']}; "
                  f"a window W copies a span shorter than W. Chance: {copy['chance']}.\n",
                  *_arm_table(runs, columns, [f"span {n}" for n in columns["spans"]], [("copy", 1)])]
    long_window = _long_window(runs)
    lines += _other_window_table(runs, long_window)
    lines += claims(runs, lambda run: run.get("test/bpb", math.nan), long_window)
    secondary = (["val loss", "test loss", "test bpb"] + [f"NIAH {n}" for n in columns["lengths"]]
                 + [f"answer loss {lo}-{hi}" for lo, hi in columns["buckets"]])
    lines += ["## Secondary measures\n", "Validation loss (text, nats per token, the last validation of fit); test "
              "loss and bits per byte (the test split, main.py test); NIAH: average over tasks (%); answer loss: "
              "mean cross-entropy of the answer's tokens (nats) at that fact-to-question distance (characters).\n"]
    lines += _arm_table(runs, columns, secondary, [("val loss", 3), ("test loss", 3), ("test bpb", 3), ("niah", 0),
                                                   ("answer loss", 3)])
    lines += ["## Every run\n", "MQAR accuracy (%) and NIAH (%) with 95% Wilson intervals.\n",
              *_run_rows(runs, columns), "## What the runs ran on\n", *_environments(runs)]
    return "\n".join(lines) + "\n"


def _other_window_table(runs: dict, long_window: int | None) -> list[str]:
    """Each windowed arm at its own evaluation window and at the study's other windows (eval_w<W>/): MQAR beyond the
    long window (what the memory gives), copying inside it, test bits per byte; mean (lowest-highest seed)."""
    windowed = sorted({arm for (arm, _), run in runs.items() if run.get("at_other_windows")})
    if not windowed or long_window is None:
        return []

    def measures(results: dict) -> list[float]:
        return [mqar_beyond(results, long_window), copy_inside(results, long_window),
                results.get("test_split", {}).get("test/bpb", math.nan)]

    lines = ["## Each windowed arm at its own window and at the others\n",
             f"MQAR accuracy beyond W = {long_window} (%, the gaps whose every pair lies beyond it: at a short window "
             f"what the memory recalls alone), span-copy accuracy inside it (%), and test bits per byte; mean "
             f"(lowest-highest seed).\n", "| arm | evaluated at | MQAR beyond | copy inside | test bpb |",
             "|---|---|---|---|---|"]
    for arm in windowed:
        seeds = [run for (a, _), run in sorted(runs.items()) if a == arm]
        own = seeds[0]["results"]["settings"]["window"]
        for window in [own, *sorted(seeds[0].get("at_other_windows", {}))]:
            per_seed = [measures(run["results"] if window == own else run.get("at_other_windows", {}).get(window, {}))
                        for run in seeds]
            cells = [_spread(list(column), digits) for column, digits in zip(zip(*per_seed), (1, 1, 3))]
            lines.append(f"| {arm} | {window}{' (own)' if window == own else ''} | " + " | ".join(cells) + " |")
    return lines + [""]


def compare(first: dict, second: dict) -> str:
    """Two sweeps of one study (two machines, or two CPU kernel sets) side by side: per arm and gap, each sweep's MQAR
    accuracy as mean (lowest-highest seed), and whether they agree within the seed spread: each sweep's mean inside
    the other's range of seeds."""
    columns = _columns({(i, *key): run for i, runs in enumerate((first, second)) for key, run in runs.items()})
    arms = sorted({arm for arm, _ in first} & {arm for arm, _ in second})
    header = ["arm", *[f"gap {g}" for g in columns["gaps"]]]
    lines = ["| " + " | ".join(header) + " |", "|---" * len(header) + "|"]
    agree = total = 0
    for arm in arms:
        per_sweep = [[_values(runs[key], columns)["accuracy"] for key in sorted(runs) if key[0] == arm]
                     for runs in (first, second)]  # [sweep][seed][gap]
        cells = []
        for j in range(len(columns["gaps"])):
            a, b = ([seed[j] for seed in seeds] for seeds in per_sweep)
            within = _inside(a, b) and _inside(b, a)
            agree, total = agree + within, total + 1
            cells.append(f"{_spread(a, 1)} / {_spread(b, 1)}{'' if within else ' **differ**'}")
        lines.append(f"| {arm} | " + " | ".join(cells) + " |")
    return "\n".join(["MQAR accuracy (%) by gap: first sweep / second sweep, each the mean (lowest-highest seed); "
                      "**differ**: a sweep's mean outside the other's seed range.\n", *lines, "",
                      f"{agree} of {total} cells agree within the seed spread.", "",
                      "First sweep:", *_environments(first), "Second sweep:", *_environments(second)]) + "\n"


def _inside(values: list[float], others: list[float]) -> bool:
    """The mean of `others` lies within the range of `values`."""
    return min(values) <= sum(others) / len(others) <= max(values)


def _run_rows(runs: dict, columns: dict) -> list[str]:
    header = (["arm", "seed", "val loss"] + [f"MQAR gap {g}" for g in columns["gaps"]]
              + [f"NIAH {n}" for n in columns["lengths"]])
    lines = ["| " + " | ".join(header) + " |", "|---" * len(header) + "|"]
    for (arm, seed), run in sorted(runs.items()):
        mqar, niah = {g["gap"]: g for g in _mqar(run)}, _niah(run)
        cells = [f"{run.get('val/loss', math.nan):.3f}"]
        cells += [_pct(mqar.get(g), "accuracy", "accuracy_ci95") for g in columns["gaps"]]
        cells += [_pct(niah.get(str(n)), "mean", "ci95") for n in columns["lengths"]]
        lines.append("| " + " | ".join([arm, str(seed), *cells]) + " |")
    return lines + [""]


def _pct(c: dict | None, mean: str, interval: str) -> str:
    return "" if c is None else f"{c[mean]:.0f} [{c[interval][0]:.0f}, {c[interval][1]:.0f}]"


def _environments(runs: dict) -> list[str]:
    """Each distinct environment and the runs that had it."""
    seen: dict[str, list[str]] = {}
    for (arm, seed), run in sorted(runs.items()):
        seen.setdefault(json.dumps(run["environment"], sort_keys=True), []).append(f"{arm}-s{seed}")
    lines = []
    for environment, names in seen.items():
        env = json.loads(environment)
        if not env:
            lines.append(f"- {', '.join(names)}: not recorded")
            continue
        packages = ", ".join(f"{k} {v}" for k, v in env.get("packages", {}).items() if v)
        lines.append(f"- {len(names)} run(s): {env['cpu']} ({env['cpu_capability']}), {env['threads']} thread(s), "
                     f"GPU {env['gpu'] or 'none'}, Python {env['python']}, {env['platform']}; {packages}")
    return lines


def _by_arm(runs: dict, series) -> dict:
    """{arm: {x: [value per seed]}} for series(run) -> {x: value}."""
    out: dict = {}
    for (arm, _), run in runs.items():
        for x, value in series(run).items():
            out.setdefault(arm, {}).setdefault(x, []).append(value)
    return out


def _windows(runs: dict) -> list[int]:
    """The evaluation windows of the SWA arms (results.json settings)."""
    return sorted({run["results"]["settings"]["window"] for run in runs.values()
                   if run["results"].get("settings", {}).get("window")})


def _long_window(runs: dict) -> int | None:
    """The largest evaluation window of the SWA arms: the long window the claims and tables read against."""
    windows = _windows(runs)
    return max(windows) if windows else None


def _plots(runs: dict, out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    gap_axis = "gap (filler characters between the pairs and their queries)"
    figures = [
        ("mqar_accuracy_vs_gap.png", "MQAR accuracy vs gap", gap_axis, "accuracy (%)",
         lambda run: {g["gap"]: g["accuracy"] for g in _mqar(run)}),
        ("mqar_loss_vs_gap.png", "MQAR value loss vs gap", gap_axis, "value loss (nats)",
         lambda run: {g["gap"]: g["loss"] for g in _mqar(run)}),
        ("copy_accuracy_vs_length.png", "Span-copy accuracy vs span length", "span length (characters)",
         "accuracy (%)", lambda run: {c["length"]: c["accuracy"] for c in _copy(run)}),
        ("niah_vs_length.png", "NIAH accuracy vs context length", "context length (tokens)", "NIAH accuracy (%)",
         lambda run: {int(n): c["mean"] for n, c in _niah(run).items()}),
        ("answer_loss_vs_distance.png", "Answer-token loss vs recall distance", "fact-to-question distance "
         "(characters, bucket geometric middle)", "answer loss (nats)",
         lambda run: {math.sqrt(b["from"] * b["to"]): b["loss"] for b in _recall(run)}),
    ]
    for name, title, xlabel, ylabel, series in figures:
        points_by_arm = _by_arm(runs, series)
        if not points_by_arm:
            continue
        fig, ax = plt.subplots(figsize=(7, 4.5))
        for arm, points in sorted(points_by_arm.items()):
            xs = sorted(points)
            mean = [sum(points[x]) / len(points[x]) for x in xs]
            line, = ax.plot(xs, mean, marker="o", label=arm)
            ax.fill_between(xs, [min(points[x]) for x in xs], [max(points[x]) for x in xs], color=line.get_color(),
                            alpha=0.2)
        if name.startswith("mqar"):
            _mark_windows(ax, runs)
            ax.set_xscale("symlog", linthresh=16)
            ax.set_xlim(left=0)
        if name == "mqar_accuracy_vs_gap.png":
            _mark_chance(ax, runs)
        else:
            ax.set_xscale("log")
        ax.set(title=title + " (line: mean over seeds; band: lowest to highest seed)", xlabel=xlabel, ylabel=ylabel)
        ax.title.set_fontsize(9)
        ax.legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(out / name, dpi=100)
        plt.close(fig)
    _short_context_plot(runs, out, plt)


def _short_context_plot(runs: dict, out: Path, plt) -> None:
    """short_context_per_arm.png: per arm, test bits per byte and span-copy accuracy inside the long window, a dot
    per seed and a bar at the mean."""
    long_window = _long_window(runs)
    panels = [("test bits per byte (lower is better)", lambda run: run.get("test/bpb", math.nan)),
              (f"span-copy accuracy inside W = {long_window} (%)",
               lambda run: copy_inside(run["results"], long_window))]
    arms = sorted({arm for arm, _ in runs})
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for ax, (label, measure) in zip(axes, panels):
        for i, arm in enumerate(arms):
            values = [v for (a, _), run in sorted(runs.items()) if a == arm if not math.isnan(v := measure(run))]
            if values:
                ax.bar(i, sum(values) / len(values), color="lightgrey")
                ax.plot([i] * len(values), values, "o", color="black", markersize=3)
        ax.set_xticks(range(len(arms)), arms, rotation=30, ha="right", fontsize=8)
        ax.set_ylabel(label, fontsize=8)
    fig.suptitle("The short-context side per arm (bar: mean over seeds; dots: seeds)", fontsize=9)
    fig.tight_layout()
    fig.savefig(out / "short_context_per_arm.png", dpi=100)
    plt.close(fig)


def _mark_windows(ax, runs: dict) -> None:
    """A dashed line per evaluation window W at the gap from which every pair lies beyond it (reach > W)."""
    cell = next(g for run in runs.values() for g in _mqar(run))
    nearest = cell["reach"][0] - cell["gap"]  # the shortest reach at gap 0
    for window in _windows(runs):
        ax.axvline(max(0, window - nearest + 1), color="grey", linestyle="--", linewidth=1)
        ax.annotate(f"W = {window}: every pair beyond it", (max(0, window - nearest + 1), 0.98),
                    xycoords=("data", "axes fraction"), rotation=90, va="top", ha="right", fontsize=7,
                    color="grey")


def _mqar_pairs(settings: dict) -> int:
    """The MQAR episodes' pairs a run was evaluated with (results.json written before the evaluation registry: the
    flat `mqar_pairs`)."""
    return settings["mqar"]["pairs"] if "mqar" in settings else settings["mqar_pairs"]


def _mark_chance(ax, runs: dict) -> None:
    """Dotted lines at the accuracy of a model that knows only the values' alphabet, and of one that remembers the
    stated values but not their keys (evals/mqar.py's stated_value_chance)."""
    from swax_lightning.data.mqar_episodes import VALUES
    from swax_lightning.evals.mqar import stated_value_chance

    pairs = next(_mqar_pairs(run["results"]["settings"]) for run in runs.values() if _mqar(run))
    for level, label in ((100 / len(VALUES), "the values' alphabet only"),
                         (100 * stated_value_chance(pairs), "the stated values only")):
        ax.axhline(level, color="grey", linestyle=":", linewidth=1)
        ax.annotate(label, (0.02, level), xycoords=("axes fraction", "data"), ha="left", va="bottom", fontsize=7,
                    color="grey")


def main(argv: list[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    extra = argv[argv.index("--") + 1:] if "--" in argv else []
    argv = argv[:argv.index("--")] if "--" in argv else argv
    parser = argparse.ArgumentParser(prog="python -m swax_lightning study", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="train and evaluate every arm x seed (skipping finished runs), then collect")
    run.add_argument("folder", type=Path, help="folder of arm files, e.g. configs/study")
    run.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4],
                     help="the runs' seeds (weights, data order, episodes, window schedule); the design asks for 5")
    run.add_argument("--save_dir", type=Path, default=Path("runs"))
    run.add_argument("--threads", type=int, default=1, help="intra-op threads of every run (the same on any machine)")
    run.add_argument("--jobs", type=int, default=1, help="runs side by side (e.g. the number of cores / threads)")
    col = sub.add_parser("collect", help="table and plots of the finished runs")
    col.add_argument("experiment_dir", type=Path, help="e.g. runs/study")
    for command in (run, col):
        command.add_argument("--records", type=Path, help="a folder that keeps every finished run as a JSON record "
                             "(e.g. docs/study/records, in git); its records join the report")
    cmp = sub.add_parser("compare", help="two sweeps' MQAR accuracy side by side, and where they differ")
    cmp.add_argument("first", type=Path, help="e.g. runs/study")
    cmp.add_argument("second", type=Path, help="e.g. the same study's sweep on another machine")
    args = parser.parse_args(argv)
    with usage_errors_reported():  # a missing folder, a damaged or contradicted record: one line
        _run_command(args, extra, parser)


def _run_command(args: argparse.Namespace, extra: list[str], parser: argparse.ArgumentParser) -> None:
    if args.command == "compare":
        print(compare(load_runs(args.first), load_runs(args.second)))
        return
    if args.command == "collect":
        print(collect(args.experiment_dir, args.records))
        return
    if args.threads < 1 or args.jobs < 1:
        parser.error(f"--threads and --jobs must be >= 1 (got {args.threads}, {args.jobs})")
    print(collect(run_all(args.folder, args.seeds, args.save_dir, extra, args.threads, args.jobs, args.records),
                  args.records))


if __name__ == "__main__":
    main()
