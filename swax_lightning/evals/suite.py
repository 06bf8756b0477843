"""EvalSuite: the evaluations `main.py test` runs after the test loop, and the reports they leave.

Configured from the YAML section `eval:` (the CLI always installs this callback; with nothing configured it does
nothing). After Lightning's test loop (held-out loss, perplexity, bits per byte), rank 0 runs, as configured (on an
unsharded copy of a model trained with FSDP2, gathered from all ranks; see parallel.py):
RULER NIAH (ruler.py), BABILong (babilong.py), perplexity by position (perplexity.py), associative recall by gap
(mqar.py) and lm-evaluation-harness tasks (lm_eval_adapter.py), all through the streaming inference, so 131k-token
contexts run in bounded memory.

Under a sharded strategy the other ranks take part in the gather of the copy and then leave: every rank runs the same
test batches (data.py), and the suite on rank 0 is not limited by the strategy's collective_timeout (watchdog.py).

Reports (reports.py), written beside the checkpoint's run (runs/<experiment>/<arm>/eval/, or `output_dir`):
- results.json: the settings, every cell's mean, sample count and 95% interval, and every sample (its question,
  references or target, prediction, score, length in tokens, and the arguments that regenerate its prompt with
  `python -m swax_lightning.evals.regenerate`, whose options are in settings["regenerate"]);
- results.md: the tables; niah_heatmap.png: NIAH accuracy by needle depth x context length, all tasks pooled, and
  niah_heatmap_<task>.png: the same for each task;
- TensorBoard: eval/... scalars per task and length, and the heatmaps as images (eval/niah_heatmap, and
  eval/niah_heatmap/<task>).
Compare runs with `python -m swax_lightning.evals.compare`.

Decision: NIAH needle depths follow RULER's grid (40 evenly spaced depths by default) and are dealt so that every
(length, depth) cell gets the same number of samples and each task spreads over the whole depth range: sample i of
task t at a length takes depth number (i * n_tasks + t) mod n_depths, which needs n_tasks * niah_samples to be a
multiple of the number of depths.
"""
from __future__ import annotations

from collections import defaultdict
from pathlib import Path

from lightning.pytorch.callbacks import Callback
from tqdm import tqdm

from swax_lightning.config import ConfigError
from swax_lightning.evals import babilong, ruler
from swax_lightning.evals.cost import estimate
from swax_lightning.evals.reports import flat_metrics, heatmap_figure, markdown, summarize, write_reports
from swax_lightning.inference import continue_texts, override_attention
from swax_lightning.model import check_window
from swax_lightning.parallel import evaluation_model
from swax_lightning.runs import checkpoint_identity, run_folder

BABILONG_NEW_TOKENS = babilong.MAX_NEW_TOKENS
WINDOW_CONVENTIONS = {False: "window = recent keys (current token included); the sinks come on top",
                      True: "window = every key a query sees, the sinks among them"}
INTERVAL_NOTE = ("95% Wilson score intervals on the mean share; exact in spirit for 0/100 scores, an approximation "
                 "for the partial scores of niah_multivalue and niah_multiquery")


def _first_sample_fits(field_name: str, make_sample) -> None:
    """Builds one sample, so that a length too short for it is refused now, naming the field."""
    try:
        make_sample()
    except ValueError as err:
        raise ConfigError(f"EvalSuite.{field_name}: {err}") from None


class EvalSuite(Callback):
    """Evaluations run by `main.py test`.

    Args:
        niah_tasks: RULER NIAH tasks (niah_single_1/2/3, niah_multikey_1/2/3, niah_multivalue, niah_multiquery).
        niah_lengths: Context lengths in the model's tokens.
        niah_samples: Samples per task and length; a multiple of the number of depths (each depth gets
            niah_samples / n_depths of them, for every task and length).
        niah_depths: Needle depths (0 = start of the haystack, 1 = end), or their number for an evenly spaced grid
            (RULER: 40).
        babilong_tasks: BABILong tasks (qa1 .. qa5).
        babilong_lengths: Context lengths in tokens (0 = the facts alone).
        babilong_samples: Samples per task and length.
        babilong_data_dir: Official BABILong files as downloaded ({dir}/{task}/{split}.json) instead of generated
            samples; babilong_lengths are then read in the official unit (GPT-2 tokens) and name the splits
            (1000 or 1024 -> 1k, 4096 -> 4k, 1048576 -> 1M; a length that names no split is refused).
        perplexity_len: Sequence length for perplexity by position on the held-out shards (empty = skip).
        perplexity_samples: Sequences for it.
        recall_edges: Distance buckets (characters between a fact and its question) of the answer-token loss by
            recall distance (evals/recall_loss.py), e.g. [1, 16, 256, 1024, 8192]; empty = skip.
        recall_samples: Samples per bucket.
        mqar_gaps: Gaps (filler characters) of the associative-recall evaluation (evals/mqar.py: accuracy and value
            loss by gap), e.g. [0, 16, 64, 256, 1024]; empty = skip.
        mqar_samples: Episodes per gap.
        mqar_pairs: Key-value pairs per episode; empty = data.recall's when its kind is mqar, else RecallMix's
            default (8).
        mqar_key_length: Letters per key; empty = data.recall's when its kind is mqar, else RecallMix's default (1).
        lm_eval_tasks: lm-evaluation-harness task names (arc_easy, arc_challenge, hellaswag, mbpp, or your own).
        lm_eval_include_path: Folder of extra task YAML files (e.g. local, offline task definitions).
        lm_eval_limit: Examples per lm-eval task (empty = all).
        window: Evaluation window override for the sliding-window layers (empty = the window callback's), in the
            convention window_includes_sinks says.
        n_sink: Sink-token override for the sliding-window layers.
        convert_full_attention: Also run full-attention layers as SWA(window, n_sink) (training-free conversion).
        window_includes_sinks: `window` counts every key a query sees, the n_sink sinks among them; false (the
            framework's convention): `window` recent keys, current token included, plus the sinks. Recorded in
            results.json with the recent-key window it gives.
        max_new_tokens: Generation budget of NIAH (RULER: 128); BABILong uses 20, as its own scripts.
        chunk_len: Prefill chunk length.
        essay_file: Text file for the essay haystack and the BABILong filler (empty = generated prose, essay.py).
        output_dir: Where the reports go (empty = <run>/eval/).
        seed: Seed of every generated sample.
    """

    def __init__(self, niah_tasks: list[str] | None = None,
                 niah_lengths: list[int] = (4096, 8192, 16384, 32768, 65536, 131072), niah_samples: int = 40,
                 niah_depths: int | list[float] = ruler.N_DEPTHS, babilong_tasks: list[str] | None = None,
                 babilong_lengths: list[int] = (0, 4096, 16384, 65536, 131072), babilong_samples: int = 5,
                 babilong_data_dir: str | None = None, perplexity_len: int | None = None, perplexity_samples: int = 8,
                 recall_edges: list[int] | None = None, recall_samples: int = 16,
                 mqar_gaps: list[int] | None = None, mqar_samples: int = 64, mqar_pairs: int | None = None,
                 mqar_key_length: int | None = None,
                 lm_eval_tasks: list[str] | None = None, lm_eval_include_path: str | None = None,
                 lm_eval_limit: int | None = None, window: int | None = None, n_sink: int | None = None,
                 convert_full_attention: bool = False, window_includes_sinks: bool = False,
                 max_new_tokens: int = 128, chunk_len: int = 2048,
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
        for length in babilong_lengths if babilong_data_dir else ():
            try:
                babilong.split_name(length)
            except ValueError as err:
                raise ValueError(f"EvalSuite.babilong_lengths: {err}") from None
        niah_depths = ruler.depth_grid(niah_depths) if isinstance(niah_depths, int) else list(niah_depths)
        if not niah_depths or any(d < 0 or d > 1 for d in niah_depths):
            raise ValueError(f"EvalSuite.niah_depths must be depths in [0, 1] or their number (got {niah_depths})")
        if self.niah_tasks and (niah_samples < 1 or niah_samples % len(niah_depths)):
            raise ValueError(f"EvalSuite.niah_samples: {niah_samples} samples per task and length cannot cover the "
                             f"{len(niah_depths)} depths (niah_depths) equally; use a multiple of {len(niah_depths)}")
        self.niah_lengths, self.niah_samples, self.niah_depths = list(niah_lengths), niah_samples, niah_depths
        self.babilong_lengths, self.babilong_samples = list(babilong_lengths), babilong_samples
        self.babilong_data_dir = babilong_data_dir
        self.perplexity_len, self.perplexity_samples = perplexity_len, perplexity_samples
        self.recall_edges, self.recall_samples = list(recall_edges or []), recall_samples
        if self.recall_edges:
            from swax_lightning.evals.recall_loss import bucket_distances

            bucket_distances(self.recall_edges, 1, seed)  # checks the edges now, not after the test loop
        self.mqar_gaps, self.mqar_samples = list(mqar_gaps or []), mqar_samples
        self.mqar_pairs, self.mqar_key_length = mqar_pairs, mqar_key_length
        if any(gap < 0 for gap in self.mqar_gaps) or (self.mqar_gaps and mqar_samples < 1):
            raise ValueError(f"EvalSuite.mqar_gaps must be >= 0 and mqar_samples >= 1 (got {self.mqar_gaps}, "
                             f"{mqar_samples})")
        self.lm_eval_include_path, self.lm_eval_limit = lm_eval_include_path, lm_eval_limit
        self.window, self.n_sink, self.convert_full_attention = window, n_sink, convert_full_attention
        self.window_includes_sinks = window_includes_sinks
        if window_includes_sinks and window is None:
            raise ValueError("EvalSuite.window_includes_sinks needs EvalSuite.window")
        self.max_new_tokens, self.chunk_len, self.seed = max_new_tokens, chunk_len, seed
        self.essay_file = essay_file
        self.essay = Path(essay_file).read_text() if essay_file else None
        self.output_dir = output_dir
        self._on_generation = None

    @property
    def enabled(self) -> bool:
        return bool(self.niah_tasks or self.babilong_tasks or self.lm_eval_tasks or self.perplexity_len
                    or self.recall_edges or self.mqar_gaps)

    def check_model(self, arch) -> None:
        """The window override must fit the model's positions (ModelConfig.max_positions of a pretrained model); the
        CLI calls this at start-up, setup again for a Trainer run without it."""
        if self.window is not None:
            check_window(arch, self.window)

    def setup(self, trainer, pl_module, stage: str) -> None:
        """Before fit or test does any work: `check_settings` on the model's config and the data module."""
        self.check_settings(pl_module.arch, trainer.datamodule)

    def check_settings(self, arch, data) -> None:
        """The window override must fit the positions of a model of config `arch`, the MQAR episodes' shape is
        settled (from data.recall where not given) and checked, and every NIAH and generated BABILong length must hold
        its task's story, needles and question with data's tokenizer (otherwise a study arm failed only in its test,
        after training, or BABILong after NIAH had run)."""
        self.check_model(arch)
        if self.mqar_gaps:
            self._settle_mqar_shape(getattr(data, "recall", None))
        if data is None:
            return
        tokenizer = data.tokenizer
        niah = ruler.NIAHGenerator(tokenizer, self.max_new_tokens, self.essay, self.seed)
        shortest = min(self.niah_lengths, default=0)
        for task in self.niah_tasks:
            _first_sample_fits("niah_lengths", lambda task=task: niah.sample(task, shortest, self.niah_depths[0], 0))
        if self.babilong_data_dir:
            return  # the official files: split names are checked at construction
        stories = babilong.BabiLongGenerator(tokenizer, BABILONG_NEW_TOKENS, self.essay, self.seed)
        for task in self.babilong_tasks:
            for length in (n for n in self.babilong_lengths if n):  # 0: the facts alone, always fits
                _first_sample_fits("babilong_lengths", lambda task=task, length=length: stories.sample(task, length, 0))

    def _settle_mqar_shape(self, recall) -> None:
        from swax_lightning.mqar import check_shape
        from swax_lightning.recall_documents import RecallMix

        trained = recall if getattr(recall, "kind", None) == "mqar" else RecallMix(kind="mqar")  # else the defaults
        if self.mqar_pairs is None:
            self.mqar_pairs = trained.pairs
        if self.mqar_key_length is None:
            self.mqar_key_length = trained.key_length
        check_shape(self.mqar_pairs, self.mqar_key_length, max(self.mqar_gaps), "EvalSuite.mqar")

    def on_test_end(self, trainer, pl_module) -> None:
        if not self.enabled:
            return
        model, data = evaluation_model(trainer, pl_module), trainer.datamodule  # every rank: a gather under FSDP2
        if model is None:  # not rank 0: nothing from here needs it
            return
        watchdog = getattr(trainer.strategy, "watchdog", None)
        if watchdog is not None:  # rank 0 alone from here, with no collective: the suite may take hours
            watchdog.rest("suite")
        was_training, window = model.training, model.window
        results = self.evaluate(model, data, checkpoint_identity(trainer.ckpt_path),
                                announce=True)
        out_dir = self._output_dir(trainer)
        write_reports(results, out_dir)
        print(f"{markdown(results, with_settings=False)}\nevaluation reports: {out_dir}/ (results.json with every "
              f"sample, results.md, plots)", flush=True)
        self._log(trainer, results, out_dir)
        if window is not None:
            model.set_window(window)
        model.train(was_training)

    def evaluate(self, model, data, checkpoint: dict | None = None, announce: bool = False,
                 on_generation=None) -> dict:
        """Every configured evaluation of `model` (put in eval mode, with this suite's window and sink overrides
        applied to it) on `data` (a TextDataModule: its tokenizer, its validation shards for the loss by position):
        the results dict the reports are written from. announce: print the cost estimate first.
        on_generation(eval, length, stats): called after every generated answer with generate's stats (its prefill
        and decode seconds, the bytes its caches held); timings stay out of the results, which are deterministic."""
        model.eval()
        override_attention(model, self.window, self.n_sink, self.convert_full_attention, self.window_includes_sinks)
        if announce:
            print(estimate(self, model), flush=True)
        self._on_generation = on_generation
        results = {"settings": self._settings(model, data.tokenizer) | {"checkpoint": checkpoint}, "samples": []}
        if self.niah_tasks:
            results["niah"] = self._run_niah(model, data.tokenizer, results["samples"])
        if self.babilong_tasks:
            results["babilong"] = self._run_babilong(model, data.tokenizer, results["samples"])
        if self.perplexity_len:
            from swax_lightning.evals.perplexity import position_losses

            block = self.perplexity_len + 1
            results["perplexity"] = position_losses(model, data.blocks("val", block), data.block_count("val", block),
                                                    self.perplexity_len, self.perplexity_samples, self.chunk_len,
                                                    data.meta.get("bytes_per_token", 1.0))
        if self.recall_edges:
            from swax_lightning.evals.recall_loss import recall_losses

            recall = recall_losses(model, data.tokenizer, self.recall_edges, self.recall_samples, self.seed,
                                   progress=lambda jobs: tqdm(jobs, desc="recall by distance"))
            results["recall"] = {"buckets": recall["buckets"]}
            results["samples"] += recall["samples"]
        if self.mqar_gaps:
            from swax_lightning.evals.mqar import mqar_by_gap

            mqar = mqar_by_gap(model, data.tokenizer, self.mqar_gaps, self.mqar_samples, self.mqar_pairs,
                               self.mqar_key_length, self.seed, self.chunk_len,
                               progress=lambda jobs: tqdm(jobs, desc="MQAR by gap"))
            results["samples"] += mqar.pop("samples")
            results["mqar"] = mqar
        if self.lm_eval_tasks:
            from swax_lightning.evals.lm_eval_adapter import run_lm_eval

            results["lm_eval"] = run_lm_eval(model, data.tokenizer, self.lm_eval_tasks, self.lm_eval_include_path,
                                             self.lm_eval_limit, self.chunk_len)
        return results

    def _settings(self, model, tokenizer) -> dict:
        regenerate = (f"python -m swax_lightning.evals.regenerate --tokenizer {tokenizer.name} --seed {self.seed} "
                      f"--niah_max_new_tokens {self.max_new_tokens} --babilong_max_new_tokens {BABILONG_NEW_TOKENS}"
                      + (f" --essay_file {self.essay_file}" if self.essay_file else "") + " <sample's regenerate>")
        return {"window": model.window, "pattern": model.cfg.pattern, "niah_lengths": self.niah_lengths,
                "niah_samples": self.niah_samples, "niah_depths": self.niah_depths,
                "babilong_lengths": self.babilong_lengths, "babilong_samples": self.babilong_samples,
                "recall_edges": self.recall_edges, "recall_samples": self.recall_samples,
                "mqar_gaps": self.mqar_gaps, "mqar_samples": self.mqar_samples, "mqar_pairs": self.mqar_pairs,
                "mqar_key_length": self.mqar_key_length,
                "max_new_tokens": self.max_new_tokens, "seed": self.seed,
                "convert_full_attention": self.convert_full_attention, "n_sink": self.n_sink,
                "window_override": self.window, "window_includes_sinks": self.window_includes_sinks,
                "window_convention": WINDOW_CONVENTIONS[self.window_includes_sinks], "sinks": model.n_sink,
                "haystack": "essay_file" if self.essay_file else "generated prose (swax_lightning/evals/essay.py)",
                "regenerate": regenerate}

    def _generate(self, model, tokenizer, text: str, max_new_tokens: int, evaluation: str, length) -> str:
        stats = {} if self._on_generation else None
        prediction = continue_texts(model, tokenizer, [text], max_new_tokens, chunk_len=self.chunk_len, stats=stats)[0]
        if self._on_generation:
            self._on_generation(evaluation, length, stats)
        return prediction

    def _niah_jobs(self) -> list[tuple[str, int, int, float]]:
        """(task, length, index, depth) of every NIAH sample: each task, at each length, takes every depth
        niah_samples / n_depths times."""
        depths = self.niah_depths
        return [(task, length, i, depths[i % len(depths)]) for length in self.niah_lengths
                for task in self.niah_tasks for i in range(self.niah_samples)]

    def _run_niah(self, model, tokenizer, samples: list) -> dict:
        generator = ruler.NIAHGenerator(tokenizer, self.max_new_tokens, self.essay, self.seed)
        scores = defaultdict(list)
        for task, length, i, depth in tqdm(self._niah_jobs(), desc="RULER NIAH"):
            sample = generator.sample(task, length, depth, i)
            prediction = self._generate(model, tokenizer, sample.input_text, self.max_new_tokens, "niah", length)
            score = ruler.string_match_all(prediction, sample.references)
            scores[(task, length, depth)].append(score)
            samples.append({"eval": "niah", "task": task, "length": length, "depth": depth, "index": i,
                            "tokens": sample.n_tokens, "question": sample.question,
                            "references": sample.references, "prediction": prediction, "score": score,
                            "regenerate": f"niah {task} {length} {depth} {i}"})
        return {**summarize(scores), "interval": INTERVAL_NOTE}

    def _babilong_items(self, generator, task: str, length: int) -> tuple[str, list]:
        """(column name, samples) of one task and length: generated, or the official split's first rows."""
        if self.babilong_data_dir:
            split = babilong.split_name(length)
            items = babilong.load_official(self.babilong_data_dir, task, split, generator.tokenizer)
            return split, items[:self.babilong_samples]
        return str(length), [generator.sample(task, length, i) for i in range(self.babilong_samples)]

    def _run_babilong(self, model, tokenizer, samples: list) -> dict:
        generator = babilong.BabiLongGenerator(tokenizer, BABILONG_NEW_TOKENS, self.essay, self.seed)
        scores = defaultdict(list)
        for task in self.babilong_tasks:
            for length in self.babilong_lengths:
                column, items = self._babilong_items(generator, task, length)
                for item in tqdm(items, desc=f"BABILong {task} {column}", leave=False):
                    prediction = self._generate(model, tokenizer, item.input_text, BABILONG_NEW_TOKENS, "babilong",
                                                column)
                    score = 100.0 * babilong.babilong_score(prediction, item.target, item.question, task)
                    scores[(task, column, None)].append(score)
                    record = {"eval": "babilong", "task": task, "length": column, "index": item.index,
                              "tokens": item.n_tokens, "gpt2_tokens_estimate": item.gpt2_tokens_estimate,
                              "question": item.question, "target": item.target, "prediction": prediction,
                              "score": score}
                    if self.babilong_data_dir:
                        record["source"] = f"{task}/{column}.json row {item.index}"
                    else:
                        record["regenerate"] = f"babilong {task} {length} {item.index}"
                    samples.append(record)
        out = summarize(scores)
        if self.babilong_data_dir:
            out["source"] = f"official BABILong files in {self.babilong_data_dir}"
            out["length_unit"] = "official splits (GPT-2 tokens)"
        else:
            out["source"] = (f"generated (swax_lightning/evals/babilong.py, seed {self.seed}, filler: "
                             f"{'essay_file' if self.essay_file else 'generated prose'})")
            out["length_unit"] = "model tokens (each sample also records an estimate of its GPT-2 tokens)"
        return out

    def _output_dir(self, trainer) -> Path:
        if self.output_dir:
            return Path(self.output_dir)
        if trainer.ckpt_path and Path(trainer.ckpt_path).parent.name == "checkpoints":
            return Path(trainer.ckpt_path).parent.parent / "eval"
        return run_folder(trainer) / "eval"

    def _log(self, trainer, results: dict, out_dir: Path) -> None:
        metrics = flat_metrics(results)
        for logger in trainer.loggers:
            logger.log_metrics(metrics, step=trainer.global_step)
            experiment = getattr(logger, "experiment", None)
            if hasattr(experiment, "add_figure") and "niah" in results:
                for task in (None, *results["niah"]["depth_x_length_by_task"]):
                    tag = "eval/niah_heatmap" + (f"/{task}" if task else "")
                    experiment.add_figure(tag, heatmap_figure(results["niah"], task), trainer.global_step)
                experiment.flush()
