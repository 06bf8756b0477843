"""EvalSuite: the evaluations `main.py test` runs after the test loop, and the reports they leave.

Configured from the YAML section `eval:` (the CLI always installs this callback; with nothing configured it does
nothing): one sub-section per evaluation to run, named as the evaluation's file registers it (registry.py), e.g.

    eval:
      niah: {tasks: [niah_single_1], lengths: [4096, 8192], samples: 40}   # ruler.py
      babilong: {tasks: [qa1, qa2], lengths: [0, 4096], samples: 20}       # babilong.py
      perplexity: {length: 8192, samples: 8}                              # perplexity.py
      recall: {edges: [1, 64, 512, 4096], samples: 16}                     # recall_loss.py
      mqar: {gaps: [0, 64, 512], samples: 64}                              # mqar.py
      lm_eval: {tasks: [arc_easy, hellaswag], include_path: ...}           # harness.py
      chunk_len: 4096                                                      # and the settings every one shares
      batch_size: 8

After Lightning's test loop (held-out loss, perplexity, bits per byte), rank 0 runs them in that order (on an
unsharded copy of a model trained with FSDP2, gathered from all ranks; see parallel.py), all through the streaming
inference, so 131k-token contexts run in bounded memory.

Under a sharded strategy the other ranks take part in the gather of the copy and then leave: every rank runs the same
test batches (data/datamodule.py), and the suite on rank 0 is not limited by the strategy's collective_timeout
(watchdog.py).

Reports (reports.py), written beside the checkpoint's run (runs/<experiment>/<arm>/eval/, or `output_dir`):
- results.json: the settings, the test loop's figures (test_split: test/loss, test/bpb, ... at the same window),
  every cell's mean, sample count and 95% interval, and every sample (its question,
  references or target, prediction, score, length in tokens, and the arguments that regenerate its prompt with
  `python -m swax_lightning regenerate`, whose options are in settings["regenerate"]);
- results.md: the tables; each evaluation's figures as PNG (niah_heatmap.png: NIAH accuracy by needle depth x
  context length, all tasks pooled, and niah_heatmap_<task>.png for each task);
- TensorBoard: eval/... scalars of every evaluation, and its figures as images (eval/niah_heatmap, ...).
Compare runs with `python -m swax_lightning compare`.

Decision: the field list of EvalSuite is the table of evaluations: its signature (what LightningCLI parses, shows
with --print_config and documents with --help) is built from the registry, one optional section per evaluation, so
an evaluation added in its own file needs no line here.
"""
from __future__ import annotations

import inspect
from collections.abc import Callable, Iterable
from itertools import islice
from pathlib import Path

from lightning.pytorch.callbacks import Callback
from tqdm import tqdm

from swax_lightning.core.errors import ConfigError
from swax_lightning.evals.babilong import ANSWER_CHARS
from swax_lightning.evals.cost import estimate
from swax_lightning.evals.registry import build_settings, load_all
from swax_lightning.evals.reports import figures, flat_metrics, markdown, write_reports
from swax_lightning.model.inference import continue_texts, override_attention
from swax_lightning.model.model import check_window
from swax_lightning.training.parallel import evaluation_model
from swax_lightning.training.runs import checkpoint_identity, run_folder

WINDOW_CONVENTIONS = {False: "window = recent keys (current token included); the sinks come on top",
                      True: "window = every key a query sees, the sinks among them"}
EVALUATIONS = load_all()


class EvalSuite(Callback):
    """Evaluations run by `main.py test`: each registered evaluation's section (its fields: that evaluation's
    Settings, e.g. ruler.NIAHSettings for `niah`), and the settings they share.

    Args:
        window: Evaluation window override for the sliding-window layers (empty = the window callback's), in the
            convention window_includes_sinks says.
        n_sink: Sink-token override for the sliding-window layers.
        convert_full_attention: Run the full-attention layers as SWA(window, n_sink) (training-free conversion); the
            model's own sliding layers then keep their trained window and sinks (results.json records every
            layer's as attention_windows).
        window_includes_sinks: `window` counts every key a query sees, the n_sink sinks among them; false (the
            framework's convention): `window` recent keys, current token included, plus the sinks. Recorded in
            results.json with the recent-key window it gives.
        chunk_len: Prefill tokens per model call: a batch of B prompts is prefilled chunk_len // B tokens of each
            at a time, so a call's activations do not grow with the batch.
        batch_size: Prompts of one evaluation and length generated together, left-padded to the longest (each
            continuation equals its own alone): a decode step reads the weights once for all of them, and a
            full-attention cache holds batch_size contexts at once.
        essay_file: Text file for the essay haystack and the BABILong filler (empty = generated prose, essay.py).
        output_dir: Where the reports go (empty = <run>/eval/).
        seed: Seed of every generated sample.
    """

    def __init__(self, window: int | None = None, n_sink: int | None = None, convert_full_attention: bool = False,
                 window_includes_sinks: bool = False, chunk_len: int = 2048, batch_size: int = 1,
                 essay_file: str | None = None, output_dir: str | None = None, seed: int = 0, **sections):
        unknown = sorted(set(sections) - set(EVALUATIONS))
        if unknown:
            raise ConfigError(f"eval.{unknown[0]}: no such evaluation (known: {', '.join(EVALUATIONS)})")
        if essay_file is not None and not Path(essay_file).is_file():
            raise FileNotFoundError(f"EvalSuite.essay_file not found: {essay_file}")
        if window_includes_sinks and window is None:
            raise ConfigError("EvalSuite.window_includes_sinks needs EvalSuite.window")
        if batch_size < 1:
            raise ConfigError(f"EvalSuite.batch_size must be >= 1 (got {batch_size})")
        self.window, self.n_sink, self.convert_full_attention = window, n_sink, convert_full_attention
        self.window_includes_sinks, self.chunk_len, self.seed = window_includes_sinks, chunk_len, seed
        self.batch_size = batch_size
        self.essay_file, self.output_dir = essay_file, output_dir
        self.essay = Path(essay_file).read_text() if essay_file else None
        self.evaluations = [EVALUATIONS[name](settings, self) for name in EVALUATIONS
                            if (settings := build_settings(name, sections.get(name))) is not None]
        self._on_generation = None

    @property
    def enabled(self) -> bool:
        return bool(self.evaluations)

    def evaluation(self, name: str):
        """The configured evaluation `name`, or None."""
        return next((e for e in self.evaluations if e.name == name), None)

    def check_model(self, arch) -> None:
        """The window override must fit the model's positions (ModelConfig.max_positions of a pretrained model); the
        CLI calls this at start-up, setup again for a Trainer run without it."""
        if self.window is not None:
            check_window(arch, self.window)

    def setup(self, trainer, pl_module, stage: str) -> None:
        """Before fit or test does any work: `check_settings` on the model's config and the data module."""
        self.check_settings(pl_module.arch, trainer.datamodule)

    def check_settings(self, arch, data) -> None:
        """The window override must fit the positions of a model of config `arch`, and every evaluation's `check`
        passes with data's tokenizer and recall documents (otherwise a study arm failed only in its test, after
        training, or BABILong after NIAH had run)."""
        self.check_model(arch)
        for evaluation in self.evaluations:
            evaluation.check(arch, data)

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
        results["test_split"] = {name: float(value) for name, value in trainer.callback_metrics.items()
                                 if name.startswith("test/")}  # the test loop's, at the suite's window
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
        on_generation(eval, length, stats): called after every batch of generated answers with generate's stats (the
        batch's size, its prefill and decode seconds, the bytes its caches held); timings stay out of the results,
        which are deterministic."""
        model.eval()
        override_attention(model, self.window, self.n_sink, self.convert_full_attention, self.window_includes_sinks)
        if announce:
            print(estimate(self, model), flush=True)
        self._on_generation = on_generation
        results = {"settings": self._settings(model, data.tokenizer) | {"checkpoint": checkpoint}, "samples": []}
        for evaluation in self.evaluations:
            results[evaluation.name] = evaluation.run(model, data, results["samples"])
        return results

    def _settings(self, model, tokenizer) -> dict:
        niah, babilong = self.evaluation("niah"), self.evaluation("babilong")
        regenerate = (f"python -m swax_lightning regenerate --tokenizer {tokenizer.name} --seed {self.seed} "
                      f"--niah_max_new_tokens {niah.settings.max_new_tokens if niah else 128} "
                      f"--babilong_answer_chars {babilong.settings.answer_chars if babilong else ANSWER_CHARS}"
                      + (f" --essay_file {self.essay_file}" if self.essay_file else "") + " <sample's regenerate>")
        return {"window": model.window, "attention_windows": model.attention_windows(), "pattern": model.cfg.pattern,
                "seed": self.seed,
                **{evaluation.name: evaluation.record() for evaluation in self.evaluations},
                "convert_full_attention": self.convert_full_attention, "n_sink": self.n_sink,
                "window_override": self.window, "window_includes_sinks": self.window_includes_sinks,
                "window_convention": WINDOW_CONVENTIONS[self.window_includes_sinks], "sinks": model.n_sink,
                "haystack": "essay_file" if self.essay_file else "generated prose (swax_lightning/evals/essay.py)",
                "regenerate": regenerate}

    def generate(self, model, tokenizer, texts: Iterable[str], max_new_tokens: int, evaluation: str, length,
                 done: Callable[[str], bool] | None = None, desc: str | None = None,
                 total: int | None = None) -> list[str]:
        """The greedy continuations of `texts` (streaming, chunked prefill), batch_size at a time (texts are read
        lazily, a batch at a time: 131k-token prompts are not all held at once), each batch reported to
        on_generation; done(text so far), if given, ends a continuation early (e.g. once the answer is complete).
        desc and total: the progress bar's label and length (no bar without desc)."""
        should_stop = (lambda b, tokens: done(tokenizer.decode(tokens))) if done else None
        predictions, texts = [], iter(texts)
        with tqdm(total=total, desc=desc, leave=False, disable=desc is None) as progress:
            while batch := list(islice(texts, self.batch_size)):
                stats = {} if self._on_generation else None
                predictions += continue_texts(model, tokenizer, batch, max_new_tokens,
                                              chunk_len=max(1, self.chunk_len // len(batch)), stats=stats,
                                              should_stop=should_stop)
                if self._on_generation:
                    self._on_generation(evaluation, length, stats)
                progress.update(len(batch))
        return predictions

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
            if hasattr(experiment, "add_figure"):
                for name, fig in figures(results).items():
                    experiment.add_figure(f"eval/{name.replace('_heatmap_', '_heatmap/')}", fig, trainer.global_step)
                experiment.flush()


def _signature() -> inspect.Signature:
    """EvalSuite's own parameters, then one keyword per registered evaluation, typed by its Settings (empty = not
    run): what LightningCLI reads to parse, document and check the `eval:` section."""
    own = [p for p in inspect.signature(EvalSuite.__init__).parameters.values() if p.kind != p.VAR_KEYWORD]
    sections = [inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=None,
                                  annotation=cls.Settings | None) for name, cls in EVALUATIONS.items()]
    return inspect.Signature([*own, *sections])


EvalSuite.__init__.__signature__ = _signature()
