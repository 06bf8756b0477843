"""EvalSuite: the evaluations `main.py test` runs after the test loop, and the reports they leave.

Configured from the YAML section `eval:` (the CLI always installs this callback; with nothing configured it does
nothing). After Lightning's test loop (held-out loss, perplexity, bits per byte), rank 0 runs, as configured (on an
unsharded copy of a model trained with FSDP2, gathered from all ranks; see parallel.py):
RULER NIAH (ruler.py), BABILong (babilong.py), perplexity by position (perplexity.py) and lm-evaluation-harness tasks
(lm_eval_adapter.py), all through the streaming inference, so 131k-token contexts run in bounded memory.

Reports, written beside the checkpoint's run (runs/<experiment>/<arm>/eval/, or `output_dir`):
- results.json: every score, the settings, and every sample's prediction;
- results.md: the tables; niah_heatmap.png: NIAH accuracy by needle depth x context length;
- TensorBoard: eval/... scalars per task and length, and the heatmap as an image.
Compare runs with `python -m swax_lightning.evals.compare`.
"""
from __future__ import annotations

import json
import os
from collections import defaultdict
from pathlib import Path

from lightning.pytorch.callbacks import Callback
from tqdm import tqdm

from swax_lightning.evals import babilong, ruler
from swax_lightning.inference import continue_texts, override_attention
from swax_lightning.parallel import evaluation_model


class EvalSuite(Callback):
    """Evaluations run by `main.py test`.

    Args:
        niah_tasks: RULER NIAH tasks (niah_single_1/2/3, niah_multikey_1/2/3, niah_multivalue, niah_multiquery).
        niah_lengths: Context lengths in the model's tokens.
        niah_samples: Samples per task and length (needle depths rotate through niah_depths across samples,
            tasks and lengths).
        niah_depths: Needle depths (0 = start of the haystack, 1 = end).
        babilong_tasks: BABILong tasks (qa1 .. qa5).
        babilong_lengths: Context lengths in tokens (0 = the facts alone).
        babilong_samples: Samples per task and length.
        babilong_data_dir: Official BABILong files ({dir}/{length}/{task}.jsonl) instead of generated samples; the
            lengths are then folder names like 0k, 4k (from babilong_lengths / 1024).
        perplexity_len: Sequence length for perplexity by position on the held-out shards (empty = skip).
        perplexity_samples: Sequences for it.
        lm_eval_tasks: lm-evaluation-harness task names (arc_easy, arc_challenge, hellaswag, mbpp, or your own).
        lm_eval_include_path: Folder of extra task YAML files (e.g. local, offline task definitions).
        lm_eval_limit: Examples per lm-eval task (empty = all).
        window: Evaluation window override for the sliding-window layers (empty = the window callback's).
        n_sink: Sink-token override for the sliding-window layers.
        convert_full_attention: Also run full-attention layers as SWA(window, n_sink) (training-free conversion).
        max_new_tokens: Generation budget of NIAH (RULER: 128); BABILong uses 32.
        chunk_len: Prefill chunk length.
        essay_file: Text file for the essay haystack and the BABILong filler (empty = the language reference).
        output_dir: Where the reports go (empty = <run>/eval/).
        seed: Seed of every generated sample.
    """

    def __init__(self, niah_tasks: list[str] | None = None,
                 niah_lengths: list[int] = (4096, 8192, 16384, 32768, 65536, 131072), niah_samples: int = 5,
                 niah_depths: list[float] = (0.0, 0.25, 0.5, 0.75, 1.0), babilong_tasks: list[str] | None = None,
                 babilong_lengths: list[int] = (0, 4096, 16384, 65536, 131072), babilong_samples: int = 5,
                 babilong_data_dir: str | None = None, perplexity_len: int | None = None, perplexity_samples: int = 8,
                 lm_eval_tasks: list[str] | None = None, lm_eval_include_path: str | None = None,
                 lm_eval_limit: int | None = None, window: int | None = None, n_sink: int | None = None,
                 convert_full_attention: bool = False, max_new_tokens: int = 128, chunk_len: int = 2048,
                 essay_file: str | None = None, output_dir: str | None = None, seed: int = 0):
        self.niah_tasks, self.babilong_tasks = list(niah_tasks or []), list(babilong_tasks or [])
        self.lm_eval_tasks = list(lm_eval_tasks or [])
        for task in self.niah_tasks:
            if task not in ruler.TASKS:
                raise ValueError(f"EvalSuite.niah_tasks: unknown task {task!r}; known: {', '.join(ruler.TASKS)}")
        for task in self.babilong_tasks:
            if task not in babilong.TASKS:
                raise ValueError(f"EvalSuite.babilong_tasks: unknown task {task!r}; known: {', '.join(babilong.TASKS)}")
        if essay_file is not None and not Path(essay_file).is_file():
            raise FileNotFoundError(f"EvalSuite.essay_file not found: {essay_file}")
        if babilong_data_dir is not None and not Path(babilong_data_dir).is_dir():
            raise FileNotFoundError(f"EvalSuite.babilong_data_dir not found: {babilong_data_dir}")
        if any(d < 0 or d > 1 for d in niah_depths):
            raise ValueError(f"EvalSuite.niah_depths must be in [0, 1] (got {list(niah_depths)})")
        self.niah_lengths, self.niah_samples, self.niah_depths = list(niah_lengths), niah_samples, list(niah_depths)
        self.babilong_lengths, self.babilong_samples = list(babilong_lengths), babilong_samples
        self.babilong_data_dir = babilong_data_dir
        self.perplexity_len, self.perplexity_samples = perplexity_len, perplexity_samples
        self.lm_eval_include_path, self.lm_eval_limit = lm_eval_include_path, lm_eval_limit
        self.window, self.n_sink, self.convert_full_attention = window, n_sink, convert_full_attention
        self.max_new_tokens, self.chunk_len, self.seed = max_new_tokens, chunk_len, seed
        self.essay = Path(essay_file).read_text() if essay_file else None
        self.output_dir = output_dir

    @property
    def enabled(self) -> bool:
        return bool(self.niah_tasks or self.babilong_tasks or self.lm_eval_tasks or self.perplexity_len)

    def on_test_end(self, trainer, pl_module) -> None:
        if not self.enabled:
            return
        model, data = evaluation_model(trainer, pl_module), trainer.datamodule  # every rank: a gather under FSDP2
        if model is None:  # not rank 0
            return
        was_training, window = model.training, model.window
        model.eval()
        override_attention(model, self.window, self.n_sink, self.convert_full_attention)
        results = {"settings": self._settings(model), "samples": []}
        if self.niah_tasks:
            results["niah"] = self._run_niah(model, data.tokenizer, results["samples"])
        if self.babilong_tasks:
            results["babilong"] = self._run_babilong(model, data.tokenizer, results["samples"])
        if self.perplexity_len:
            from swax_lightning.evals.perplexity import position_losses

            results["perplexity"] = position_losses(model, data.data_dir / "val", self.perplexity_len,
                                                    self.perplexity_samples, self.chunk_len,
                                                    data.meta.get("bytes_per_token", 1.0))
        if self.lm_eval_tasks:
            from swax_lightning.evals.lm_eval_adapter import run_lm_eval

            results["lm_eval"] = run_lm_eval(model, data.tokenizer, self.lm_eval_tasks, self.lm_eval_include_path,
                                             self.lm_eval_limit, self.chunk_len)
        out_dir = self._output_dir(trainer)
        write_reports(results, out_dir)
        self._log(trainer, results, out_dir)
        if window is not None:
            model.set_window(window)
        model.train(was_training)

    def _settings(self, model) -> dict:
        return {"window": model.window, "pattern": model.cfg.pattern, "niah_lengths": self.niah_lengths,
                "niah_samples": self.niah_samples, "niah_depths": self.niah_depths,
                "babilong_lengths": self.babilong_lengths, "babilong_samples": self.babilong_samples,
                "max_new_tokens": self.max_new_tokens, "seed": self.seed,
                "convert_full_attention": self.convert_full_attention, "n_sink": self.n_sink}

    def _generate(self, model, tokenizer, text: str, max_new_tokens: int) -> str:
        return continue_texts(model, tokenizer, [text], max_new_tokens, chunk_len=self.chunk_len)[0]

    def _run_niah(self, model, tokenizer, samples: list) -> dict:
        generator = ruler.NIAHGenerator(tokenizer, self.max_new_tokens, self.essay, self.seed)
        scores = defaultdict(list)
        jobs = [(t, n, i) for t in self.niah_tasks for n in self.niah_lengths for i in range(self.niah_samples)]
        for task, length, i in tqdm(jobs, desc="RULER NIAH"):
            # depths rotate with the sample, the task and the length, so even one sample each fills the heatmap
            turn = i + self.niah_tasks.index(task) + self.niah_lengths.index(length)
            depth = self.niah_depths[turn % len(self.niah_depths)]
            sample = generator.sample(task, length, depth, i)
            prediction = self._generate(model, tokenizer, sample.input_text, self.max_new_tokens)
            score = ruler.string_match_all(prediction, sample.references)
            scores[(task, length, depth)].append(score)
            samples.append({"eval": "niah", "task": task, "length": length, "depth": depth, "score": score,
                            "prediction": prediction, "references": sample.references, "tokens": sample.n_tokens})
        return summarize(scores)

    def _run_babilong(self, model, tokenizer, samples: list) -> dict:
        generator = babilong.BabiLongGenerator(tokenizer, 32, self.essay, self.seed)
        scores = defaultdict(list)
        for task in self.babilong_tasks:
            for length in self.babilong_lengths:
                if self.babilong_data_dir:
                    items = babilong.load_official(self.babilong_data_dir, task, f"{length // 1024}k")
                    items = items[:self.babilong_samples]
                else:
                    items = [generator.sample(task, length, i) for i in range(self.babilong_samples)]
                for item in tqdm(items, desc=f"BABILong {task} {length}", leave=False):
                    prediction = self._generate(model, tokenizer, item.input_text, 32)
                    score = 100.0 * babilong.babilong_score(prediction, item.target, item.question, task)
                    scores[(task, length, None)].append(score)
                    samples.append({"eval": "babilong", "task": task, "length": length, "score": score,
                                    "prediction": prediction, "target": item.target})
        return summarize(scores)

    def _output_dir(self, trainer) -> Path:
        if self.output_dir:
            return Path(self.output_dir)
        if trainer.ckpt_path and Path(trainer.ckpt_path).parent.name == "checkpoints":
            return Path(trainer.ckpt_path).parent.parent / "eval"
        return Path(trainer.log_dir or ".") / "eval"

    def _log(self, trainer, results: dict, out_dir: Path) -> None:
        metrics = flat_metrics(results)
        for logger in trainer.loggers:
            logger.log_metrics(metrics, step=trainer.global_step)
            experiment = getattr(logger, "experiment", None)
            if hasattr(experiment, "add_figure") and "niah" in results:
                experiment.add_figure("eval/niah_heatmap", heatmap_figure(results["niah"]), trainer.global_step)
                experiment.flush()


def summarize(scores: dict) -> dict:
    """Mean scores by task and length, their average over tasks, and (NIAH) a depth x length grid."""
    by_task, by_depth = defaultdict(lambda: defaultdict(list)), defaultdict(lambda: defaultdict(list))
    for (task, length, depth), values in scores.items():
        by_task[task][length] += values
        if depth is not None:
            by_depth[depth][length] += values
    mean = lambda v: sum(v) / len(v)  # noqa: E731
    table = {task: {str(n): mean(v) for n, v in lengths.items()} for task, lengths in by_task.items()}
    lengths = sorted({n for lengths in by_task.values() for n in lengths})
    table["average"] = {str(n): mean([mean(by_task[t][n]) for t in by_task if n in by_task[t]]) for n in lengths}
    out = {"scores": table}
    if by_depth:
        out["depth_x_length"] = {str(d): {str(n): mean(v) for n, v in row.items()}
                                 for d, row in sorted(by_depth.items())}
    return out


def flat_metrics(results: dict) -> dict:
    metrics = {}
    for name in ("niah", "babilong"):
        for task, row in results.get(name, {}).get("scores", {}).items():
            for length, score in row.items():
                metrics[f"eval/{name}/{task}/{length}"] = score
    for row in results.get("perplexity", []):
        metrics[f"eval/ppl_by_position/{row['from']}-{row['to']}/loss"] = row["loss"]
        metrics[f"eval/ppl_by_position/{row['from']}-{row['to']}/bpb"] = row["bpb"]
    for task, values in results.get("lm_eval", {}).items():
        for metric, value in values.items():
            if isinstance(value, (int, float)):
                metrics[f"eval/lm_eval/{task}/{metric}"] = value
    return metrics


def heatmap_figure(niah: dict):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    grid = niah["depth_x_length"]
    depths = list(grid)
    lengths = sorted({n for row in grid.values() for n in row}, key=int)
    values = [[grid[d].get(n, float("nan")) for n in lengths] for d in depths]
    fig, ax = plt.subplots(figsize=(1.2 * len(lengths) + 2, 0.6 * len(depths) + 1.5))
    image = ax.imshow(values, vmin=0, vmax=100, cmap="RdYlGn", aspect="auto")
    ax.set_xticks(range(len(lengths)), [f"{int(n) // 1024}k" if int(n) >= 1024 else n for n in lengths])
    ax.set_yticks(range(len(depths)), [f"{float(d):.0%}" for d in depths])
    ax.set_xlabel("context length (tokens)")
    ax.set_ylabel("needle depth")
    for i, row in enumerate(values):
        for j, v in enumerate(row):
            ax.text(j, i, f"{v:.0f}", ha="center", va="center", fontsize=8)
    fig.colorbar(image, ax=ax, label="NIAH accuracy (%)")
    fig.tight_layout()
    return fig


def markdown(results: dict) -> str:
    lines = [f"# Evaluation results\n\nSettings: `{json.dumps(results['settings'])}`\n"]
    for name, title in (("niah", "RULER NIAH (string_match_all, %)"), ("babilong", "BABILong (accuracy, %)")):
        if name not in results:
            continue
        table = results[name]["scores"]
        lengths = sorted({n for row in table.values() for n in row}, key=int)
        lines += [f"## {title}\n", "| task | " + " | ".join(lengths) + " |", "|---" * (len(lengths) + 1) + "|"]
        lines += [f"| {task} | " + " | ".join(f"{row.get(n, float('nan')):.1f}" for n in lengths) + " |"
                  for task, row in table.items()]
        lines.append("")
    if "perplexity" in results:
        lines += ["## Loss by position\n", "| positions | loss | ppl | bits/byte |", "|---|---|---|---|"]
        lines += [f"| {r['from']}-{r['to']} | {r['loss']:.4f} | {r['ppl']:.3f} | {r['bpb']:.4f} |"
                  for r in results["perplexity"]]
        lines.append("")
    if "lm_eval" in results:
        lines += ["## lm-evaluation-harness\n", "| task | metric | value |", "|---|---|---|"]
        lines += [f"| {task} | {metric} | {value:.4f} |" for task, values in results["lm_eval"].items()
                  for metric, value in values.items() if isinstance(value, (int, float))]
    return "\n".join(lines) + "\n"


def write_reports(results: dict, out_dir: Path) -> None:
    """results.json, results.md and (NIAH) niah_heatmap.png, each written to a temporary file then renamed."""
    out_dir.mkdir(parents=True, exist_ok=True)
    for name, text in (("results.json", json.dumps(results, indent=2)), ("results.md", markdown(results))):
        tmp = out_dir / f".{name}.tmp"
        tmp.write_text(text)
        os.replace(tmp, out_dir / name)
    if "niah" in results:
        fig = heatmap_figure(results["niah"])
        fig.savefig(out_dir / ".niah_heatmap.tmp.png", dpi=100)
        os.replace(out_dir / ".niah_heatmap.tmp.png", out_dir / "niah_heatmap.png")
