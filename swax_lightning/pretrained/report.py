"""The comparison's report (experiment.py): tables, ratios and plots, from the files each step left.

    python -m swax_lightning retrofit report runs/retrofit/smollm2

Reads <out>/variants/*/{results.json, variant.json}, <out>/students/*/{transfer.json, lora.json}, timings.json and
experiment.yaml, and writes <out>/report.md, <out>/summary.json and the plots <out>/niah_by_length.png,
babilong_by_length.png, loss_by_position.png, choice_and_decode.png and convergence.png. Needs no state of its own,
so it can be written again at any time, from what has finished.

Decisions:
- Cells are mean [95% Wilson interval] n, as in every report of the framework; "all" pools every sample of a variant
  over the lengths (and tasks), and the multiple-choice "mean" pools every item of every task.
- The ratio of the paper's claim: for each window, SWA(w, s) with the largest sink count over the best retrofit (the
  one with the highest pooled score), on NIAH and on BABILong; no ratio (said why) when the best retrofit scored 0.
  Its 95% interval is a paired bootstrap (BOOTSTRAP_DRAWS resamples of the prompts, the same draw for both variants:
  they answered the same prompts); a draw where the retrofit scores 0 has an unbounded ratio, so an upper end that
  falls on such draws is written "unbounded".
- Convergence is read off the held-out curves the stages measure at 0, 1, 2, 4, ... steps: a stage has converged
  when the last doubling of its tokens improved its held-out measure (the layers' mean relative MSE; the LoRA loss)
  by less than 2% (FLAT); otherwise the report says it did not, and by how much the last doubling still improved it.
- Memory and speed are read at the longest NIAH prompt (the largest context every variant ran): one sequence's
  inference-state bytes, and the tokens per second each sequence got after the prefill, in batches of the size
  the table names (every variant the same).
"""
from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import yaml

from swax_lightning.core import atomic
from swax_lightning.evals.reports import cell, lengths_of, show

STYLE = {"full": ("black", "-"), "swa+sinks": (None, "-"), "swa": (None, "--"), "retrofit": (None, ":")}
BOOTSTRAP_DRAWS = 4000  # resamples of the paired bootstrap of each ratio (seeded: the report repeats exactly)
FLAT = 0.02  # converged: the last doubling of a stage's tokens improved its held-out measure by less than this


def load_variants(folder: Path) -> dict[str, dict]:
    """name -> {"results", "variant"} of every finished variant, in the order the experiment runs them."""
    out = {}
    for done in (folder / "variants").glob("*/variant.json"):
        info = atomic.read_json(done)
        out[done.parent.name] = {"variant": info, "results": atomic.read_json(done.parent / "results.json")}
    order = {"full": 0, "swa+sinks": 1, "swa": 2, "retrofit": 3}
    return dict(sorted(out.items(), key=lambda kv: (order[kv[1]["variant"]["family"]],
                                                    kv[1]["variant"]["variant"].get("window") or 0, kv[0])))


def pooled(results: dict, evaluation: str) -> dict | None:
    scores = [s["score"] for s in results["samples"] if s["eval"] == evaluation]
    return cell(scores) if scores else None


def niah_by_depth(results: dict) -> dict:
    """depth -> NIAH cell pooling every task and length: at depth 1 the needle ends the haystack, inside any window
    that reaches back over the question; at 0 and 0.5 it is beyond the windows at every length but the shortest."""
    scores: dict = {}
    for s in results["samples"]:
        if s["eval"] == "niah":
            scores.setdefault(f"{s['depth']:g}", []).append(s["score"])
    return {depth: cell(scores[depth]) for depth in sorted(scores, key=float)}


def by_length(results: dict, evaluation: str) -> dict:
    return results.get(evaluation, {}).get("scores", {}).get("average", {})


def choice_cells(results: dict) -> dict:
    """task -> accuracy cell (percent) of the multiple-choice tasks, and "mean" pooling their items."""
    out, pooled_items = {}, []
    for task, metrics in sorted(results.get("lm_eval", {}).items()):
        acc = metrics.get("acc,none")
        if acc:
            correct = round(acc["value"] * acc["n"])
            scores = [100.0] * correct + [0.0] * (acc["n"] - correct)
            out[task], pooled_items = cell(scores), pooled_items + scores
    if pooled_items:
        out["mean"] = cell(pooled_items)
    return out


def longest_niah(variant_info: dict) -> dict | None:
    """The decode row of the longest NIAH prompts of a variant."""
    rows = {int(key.split("/")[1]): row for key, row in variant_info["decode"].items() if key.startswith("niah/")}
    return rows[max(rows)] | {"length": max(rows)} if rows else None


def ratios(variants: dict, sinks: int) -> list[dict]:
    """Per window: SWA(w, sinks) pooled score over the best retrofit's, on NIAH and BABILong."""
    retrofits = {name: v for name, v in variants.items() if v["variant"]["family"] == "retrofit"}
    rows = []
    for name, v in variants.items():
        spec = v["variant"]["variant"]
        if spec.get("window") is None or spec.get("n_sink") != sinks:
            continue
        row = {"window": spec["window"], "sinks": sinks, "variant": name}
        for evaluation in ("niah", "babilong"):
            swa = pooled(v["results"], evaluation)
            best = max(((pooled(r["results"], evaluation) or {"mean": math.nan})["mean"], key)
                       for key, r in retrofits.items()) if retrofits else (math.nan, None)
            if swa is None or math.isnan(best[0]):
                continue
            ratio = swa["mean"] / best[0] if best[0] > 0 else None  # no ratio to a retrofit that scored 0
            paired = paired_scores(v["results"], retrofits[best[1]]["results"], evaluation)
            interval = ratio_interval(*paired) if ratio is not None and paired else None
            row[evaluation] = {"swa": swa["mean"], "best_retrofit": best[0],
                               "best_retrofit_variant": retrofits[best[1]]["variant"]["variant"]["name"],
                               "ratio": ratio, "ci95": interval}
        rows.append(row)
    return rows


def paired_scores(a: dict, b: dict, evaluation: str) -> tuple[np.ndarray, np.ndarray] | None:
    """Two variants' scores on the same prompts of `evaluation`, matched by task, length, depth and index; None when
    they did not answer the same prompts (another grid)."""
    def keyed(results: dict) -> dict:
        return {(s.get("task"), s.get("length"), s.get("depth"), s.get("index")): s["score"]
                for s in results["samples"] if s["eval"] == evaluation}
    ka, kb = keyed(a), keyed(b)
    if not ka or ka.keys() != kb.keys():
        return None
    keys = list(ka)
    return np.array([ka[k] for k in keys]), np.array([kb[k] for k in keys])


def ratio_interval(swa: np.ndarray, retrofit: np.ndarray, draws: int = BOOTSTRAP_DRAWS) -> list:
    """95% paired-bootstrap interval [low, high] of mean(swa) / mean(retrofit); high is None (unbounded) when more
    than 2.5% of the draws have a retrofit mean of 0."""
    picks = np.random.default_rng(0).integers(0, len(swa), size=(draws, len(swa)))
    numerator, denominator = swa[picks].mean(axis=1), retrofit[picks].mean(axis=1)
    ratio = np.full(draws, np.inf)
    np.divide(numerator, denominator, out=ratio, where=denominator > 0)
    low, high = np.quantile(ratio, [0.025, 0.975], method="inverted_cdf")
    return [float(low), float(high) if np.isfinite(high) else None]


def _ratio_text(entry: dict | None) -> str:
    if not entry:
        return ""
    if entry["ratio"] is not None:
        ratio = f"{entry['ratio']:.2f}"
        if entry.get("ci95"):
            low, high = entry["ci95"]
            ratio += f" [{low:.2f}, {'unbounded' if high is None else f'{high:.2f}'}]"
    else:
        ratio = "none: both 0" if entry["swa"] == 0 else "none: every retrofit 0"
    return f"{ratio} ({entry['swa']:.1f} / {entry['best_retrofit']:.1f}, {entry['best_retrofit_variant']})"


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    return ["| " + " | ".join(header) + " |", "|---" * len(header) + "|"] + ["| " + " | ".join(r) + " |" for r in rows]


def students(folder: Path) -> dict[str, dict]:
    """name -> {"transfer": transfer.json, "lora": lora.json or {}} of every student that finished stage 1."""
    out = {}
    for path in sorted((folder / "students").glob("*/transfer.json")):
        lora = path.parent / "lora.json"
        out[path.parent.name] = {"transfer": atomic.read_json(path),
                                 "lora": atomic.read_json(lora) if lora.is_file() else {}}
    return out


def budgets_table(folder: Path) -> list[str]:
    rows = []
    for name, stages in students(folder).items():
        transfer, lora = stages["transfer"], stages["lora"]
        losses = lora.get("train_loss") or []
        rows.append([name, transfer["pattern"], f"{transfer['tokens']:,} ({transfer['steps']})",
                     transfer["train"], f"{transfer['held_out_relative_mse_before']:.3f} -> "
                     f"{transfer['held_out_relative_mse_after']:.3f}",
                     f"{lora.get('tokens', 0):,} ({lora.get('steps', 0)}), rank {lora.get('rank', '-')}",
                     f"{losses[0]:.3f} -> {losses[-1]:.3f}" if losses else "-"])
    if not rows:
        return []
    return ["## Retrofit budgets\n",
            "Tokens (optimizer steps) of each stage; held-out relative MSE: |student - teacher|^2 / |teacher|^2 of "
            "the layers' outputs on the held-out sequences, mean over layers, before and after attention transfer; "
            "LoRA loss: next-token loss (nats) of the first and last step.\n",
            *_table(["student", "pattern", "transfer tokens (steps)", "trained", "held-out relative MSE",
                     "LoRA tokens (steps)", "LoRA loss"], rows), ""]


def per_doubling(curve: list[dict], key: str) -> float | None:
    """The relative improvement of a held-out curve's `key` per doubling of tokens, over its last two points after
    the start (16 -> 32 steps for a 32-step stage); None with fewer than two such points."""
    points = [row for row in curve if row["step"] > 0]
    if len(points) < 2:
        return None
    a, b = points[-2], points[-1]
    return (1 - b[key] / a[key]) / math.log2(b["step"] / a["step"])


def verdict(rate: float | None) -> str:
    if rate is None:
        return "too few points"
    if rate < FLAT:
        return f"flat ({100 * rate:+.1f}% per doubling)"
    return f"not converged: {100 * rate:.1f}% per doubling"


def convergence_table(folder: Path) -> list[str]:
    rows = []
    for name, stages in students(folder).items():
        transfer = stages["transfer"].get("held_out_curve") or []
        lora = stages["lora"].get("held_out_loss_curve") or []
        teacher = stages["lora"].get("teacher_held_out_loss")
        rows.append([name, f"{transfer[0]['mean']:.3f} -> {transfer[-1]['mean']:.3f}" if transfer else "-",
                     verdict(per_doubling(transfer, "mean")),
                     f"{lora[0]['loss']:.3f} -> {lora[-1]['loss']:.3f}" if lora else "-",
                     f"{teacher:.3f}" if teacher is not None else "-", verdict(per_doubling(lora, "loss"))])
    if not rows:
        return []
    return ["## Convergence\n",
            f"Held-out curves (convergence.png), measured after 0, 1, 2, 4, ... steps on the same validation "
            f"sequences: the layers' relative MSE (mean over the converted layers) in attention transfer, the "
            f"next-token loss (nats) in LoRA. A stage is flat when its last doubling of tokens improved it by less "
            f"than {100 * FLAT:.0f}%.\n",
            *_table(["student", "transfer: held-out relative MSE", "transfer", "LoRA: held-out loss",
                     "teacher's loss", "LoRA"], rows), ""]


def long_context_table(variants: dict) -> list[str]:
    niah_lengths = lengths_of({n: by_length(v["results"], "niah") for n, v in variants.items()})
    babi_lengths = lengths_of({n: by_length(v["results"], "babilong") for n, v in variants.items()})
    header = ["variant", *[f"NIAH {n}" for n in niah_lengths], "NIAH all",
              *[f"BABILong {n}" for n in babi_lengths], "BABILong all"]
    rows = []
    for name, v in variants.items():
        r = v["results"]
        rows.append([name, *[show(by_length(r, "niah").get(n)) for n in niah_lengths], show(pooled(r, "niah")),
                     *[show(by_length(r, "babilong").get(n)) for n in babi_lengths], show(pooled(r, "babilong"))])
    return ["## Long context\n", "RULER NIAH (string_match_all, %) and BABILong (official rule, %) by context length "
            "in the model's tokens, tasks pooled; cells: mean [95% Wilson interval] n=samples.\n",
            *_table(header, rows), ""]


def depth_table(variants: dict) -> list[str]:
    cells = {name: niah_by_depth(v["results"]) for name, v in variants.items()}
    depths = sorted({d for by_depth in cells.values() for d in by_depth}, key=float)
    if len(depths) < 2:
        return []
    rows = [[name, *[show(by_depth.get(d)) for d in depths]] for name, by_depth in cells.items()]
    return ["## NIAH by needle depth\n", "The NIAH samples of every task and length by the queried needle's depth in "
            "the haystack (0 = its start, 1 = its end, just before the question), %.\n",
            *_table(["variant", *[f"depth {d}" for d in depths]], rows), ""]


def short_context_table(variants: dict) -> list[str]:
    tasks = sorted({t for v in variants.values() for t in choice_cells(v["results"]) if t != "mean"})
    header = ["variant", *tasks, "mean", "state at the longest NIAH prompt", "decode tokens/s there",
              "prefill tokens/s there"]
    rows = []
    for name, v in variants.items():
        cells, decode = choice_cells(v["results"]), longest_niah(v["variant"])
        cost = ["-"] * 3 if decode is None else [
            f"{decode['cache_bytes'] / 2**20:.1f} MiB ({decode['prompt_tokens']:,} tokens)",
            "-" if decode["decode_tokens_per_s"] is None
            else f"{decode['decode_tokens_per_s']:.1f} (batch {decode.get('batch', 1)})",
            f"{decode['prefill_tokens_per_s']:.0f}"]
        rows.append([name, *[show(cells.get(t)) for t in tasks], show(cells.get("mean")), *cost])
    return ["## Short context, memory and speed\n", "Generated multiple choice (evals/choice.py; 4 choices, chance "
            "25%): accuracy % by log-likelihood through the lm-eval adapter. State: the bytes of one sequence's "
            "inference caches after the longest NIAH prompt and its answer; speeds: this machine's, during the "
            "evaluation, per sequence of a batch decoded together.\n",
            *_table(header, rows), ""]


def loss_table(variants: dict) -> list[str]:
    buckets = next((v["results"]["perplexity"] for v in variants.values() if "perplexity" in v["results"]), None)
    if not buckets:
        return []
    header = ["variant", *[f"{b['from']}-{b['to']}" for b in buckets]]
    rows = [[name, *[f"{b['loss']:.3f}" for b in v["results"].get("perplexity", [])]] for name, v in variants.items()]
    return ["## Held-out loss by position\n", "Mean next-token loss (nats) of the held-out split by token position.\n",
            *_table(header, rows), ""]


def ratio_lines(rows: list[dict]) -> list[str]:
    if not rows:
        return []
    return ["## SWA with sinks over the best retrofit\n",
            "Pooled score of SWA(w, s) divided by the best retrofit's (the paper claims 2-10x on NIAH and BABILong), "
            "with its 95% paired-bootstrap interval; in parentheses the two scores and the retrofit.\n",
            *_table(["window", "sinks", "NIAH", "BABILong"],
                    [[str(r["window"]), str(r["sinks"]), _ratio_text(r.get("niah")), _ratio_text(r.get("babilong"))]
                     for r in rows]), ""]


def header_lines(folder: Path) -> list[str]:
    cfg = yaml.safe_load((folder / "experiment.yaml").read_text()) if (folder / "experiment.yaml").is_file() else {}
    times = atomic.read_json(folder / "timings.json") if (folder / "timings.json").is_file() else {}
    wall, cpu = (sum(t[key] for t in times.values()) for key in ("wall", "cpu"))
    threads = max((t["threads"] for t in times.values()), default=1)
    steps = ", ".join(f"{step} {t['wall'] / 60:.1f}" for step, t in times.items())
    evaluate = cfg.get("evaluate", {})
    students = ", ".join(f"{name} ({spec['pattern']})" for name, spec in cfg.get("students", {}).items())
    training = cfg.get("training_precision", cfg.get("precision"))
    return ["# Pretrained model: training-free SWA with sinks against linear-attention retrofits\n",
            f"Model: {cfg.get('source', '?')}; students: {students}; SWA windows "
            f"{evaluate.get('windows')} with sinks {evaluate.get('sinks')} (window_includes_sinks "
            f"{evaluate.get('window_includes_sinks')}).\n",
            f"Precision: training {training}, evaluation {evaluate.get('precision')}; device "
            f"{cfg.get('device')}. Time: {wall / 60:.1f} min in all "
            f"(minutes per step: {steps}); CPU time {cpu / 60:.1f} min on {threads} threads.\n"]


def write_report(folder: str | Path) -> str:
    folder = Path(folder)
    variants = load_variants(folder)
    if not variants:
        raise FileNotFoundError(f"no finished variant (variants/*/variant.json) in {folder}")
    cfg = yaml.safe_load((folder / "experiment.yaml").read_text()) if (folder / "experiment.yaml").is_file() else {}
    sinks = max(cfg.get("evaluate", {}).get("sinks") or [0])
    rows = ratios(variants, sinks)
    text = "\n".join([*header_lines(folder), *budgets_table(folder), *convergence_table(folder),
                      *long_context_table(variants),
                      *depth_table(variants), *ratio_lines(rows), *short_context_table(variants),
                      *loss_table(variants)]) + "\n"
    atomic.write_text(folder / "report.md", text)
    atomic.write_json(folder / "summary.json", summary(variants, rows))
    plots(variants, folder)
    convergence_plot(students(folder), folder)
    return text


def summary(variants: dict, rows: list[dict]) -> dict:
    out = {"ratios": rows, "variants": {}}
    for name, v in variants.items():
        r = v["results"]
        out["variants"][name] = {"family": v["variant"]["family"], "niah_all": pooled(r, "niah"),
                                 "babilong_all": pooled(r, "babilong"), "niah": by_length(r, "niah"),
                                 "niah_by_depth": niah_by_depth(r),
                                 "babilong": by_length(r, "babilong"), "choice": choice_cells(r),
                                 "loss_by_position": r.get("perplexity"), "longest_niah": longest_niah(v["variant"]),
                                 "seconds": v["variant"]["seconds"]}
    return json.loads(json.dumps(out, allow_nan=True))


# ---- plots -------------------------------------------------------------------------------------------------------
def _style(variant: dict, index: int) -> dict:
    color, line = STYLE[variant["family"]]
    return {"color": color or f"C{index}", "linestyle": line, "marker": "o", "label": variant["variant"]["name"]}


def _lines(ax, variants: dict, series) -> None:
    for i, v in enumerate(variants.values()):
        points = series(v)
        if points:
            xs = sorted(points)
            ax.plot(xs, [points[x] for x in xs], **_style(v["variant"], i))


def plots(variants: dict, folder: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figures = [
        ("niah_by_length.png", "RULER NIAH by context length", "context length (tokens)", "accuracy (%)",
         lambda v: {int(n): c["mean"] for n, c in by_length(v["results"], "niah").items()}, "log"),
        ("babilong_by_length.png", "BABILong qa by context length (0 = the facts alone)", "context length (tokens)",
         "accuracy (%)", lambda v: {int(n): c["mean"] for n, c in by_length(v["results"], "babilong").items()},
         "symlog"),
        ("loss_by_position.png", "Held-out loss by token position", "position (bucket geometric middle)",
         "loss (nats)", lambda v: {math.sqrt(max(b["from"], 1) * b["to"]): b["loss"]
                                   for b in v["results"].get("perplexity", [])}, "log"),
    ]
    for name, title, xlabel, ylabel, series, scale in figures:
        fig, ax = plt.subplots(figsize=(8, 5))
        _lines(ax, variants, series)
        ax.set_xscale(scale, **({"linthresh": 512} if scale == "symlog" else {}))
        ax.set(title=title, xlabel=xlabel, ylabel=ylabel)
        ax.legend(fontsize=7, ncol=2)
        fig.tight_layout()
        _save(fig, folder / name)
    _bars(variants, folder, plt)


def convergence_plot(trained: dict[str, dict], folder: Path) -> None:
    """Attention transfer's held-out relative MSE per layer (thin) and mean (thick), and LoRA's held-out loss with
    the teacher's, against tokens on log axes (the start at 0 on the linear part of a symlog axis)."""
    if not trained:
        return
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(13, 5))
    one_step = {left: 1, right: 1}  # the tokens of one step: where each axis turns logarithmic
    for i, (name, stages) in enumerate(trained.items()):
        color = f"C{i}"
        curve, lora = stages["transfer"].get("held_out_curve") or [], stages["lora"].get("held_out_loss_curve") or []
        tokens = [row["tokens"] for row in curve]
        for layer in range(len(curve[0]["by_layer"]) if curve else 0):
            left.plot(tokens, [row["by_layer"][layer] for row in curve], color=color, alpha=0.2, linewidth=0.7)
        left.plot(tokens, [row["mean"] for row in curve], color=color, marker="o", linewidth=2, label=name)
        right.plot([row["tokens"] for row in lora], [row["loss"] for row in lora], color=color, marker="o", label=name)
        if stages["lora"].get("teacher_held_out_loss") is not None:
            right.axhline(stages["lora"]["teacher_held_out_loss"], color="black", linestyle="--", linewidth=1)
        for ax, rows in ((left, curve), (right, lora)):
            one_step[ax] = next((row["tokens"] for row in rows if row["tokens"]), one_step[ax])
    for ax, title, ylabel in ((left, "Attention transfer: held-out error per layer (mean thick)",
                               "relative MSE of the layer output"),
                              (right, "LoRA: held-out next-token loss (dashed: the teacher)", "loss (nats)")):
        ax.set_xscale("symlog", linthresh=one_step[ax])
        ax.autoscale_view()  # the teacher's axhline left the x margins of a linear axis (down to -5% of the tokens)
        ax.set(title=title, xlabel="training tokens of the stage", ylabel=ylabel)
        ax.legend(fontsize=8)
    left.set_yscale("log")
    fig.tight_layout()
    _save(fig, folder / "convergence.png")


def _bars(variants: dict, folder: Path, plt) -> None:
    names = list(variants)
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.5))
    means = [choice_cells(v["results"]).get("mean") for v in variants.values()]
    axes[0].bar(names, [m["mean"] if m else 0 for m in means],
                yerr=[[m["mean"] - m["ci95"][0] if m else 0 for m in means],
                      [m["ci95"][1] - m["mean"] if m else 0 for m in means]], color="C0")
    axes[0].axhline(25, color="grey", linestyle=":", label="chance")
    axes[0].set(title="Multiple choice, mean over tasks (95% interval)", ylabel="accuracy (%)")
    decode = [longest_niah(v["variant"]) or {} for v in variants.values()]
    axes[1].bar(names, [d.get("cache_bytes", 0) / 2**20 for d in decode], color="C1")
    axes[1].set(title="Inference state at the longest NIAH prompt", ylabel="MiB")
    axes[2].bar(names, [d.get("decode_tokens_per_s") or 0 for d in decode], color="C2")
    axes[2].set(title="Decode speed there, per sequence of a batch (this machine)", ylabel="tokens/s")
    for ax in axes:
        ax.tick_params(axis="x", rotation=60, labelsize=7)
    fig.tight_layout()
    _save(fig, folder / "choice_and_decode.png")


def _save(fig, path: Path) -> None:
    import matplotlib.pyplot as plt

    with atomic.written_atomically(path) as tmp:
        fig.savefig(tmp, dpi=100, format="png")
    plt.close(fig)
