"""The companion paper's comparison (arXiv 2608.28444) on a real pretrained model, in one command: the model with full
attention, masked to sliding-window attention with and without sinks (no training), and converted to linear
attention by the LoLCATs-style retrofit (retrofit.py), evaluated on the same prompts.

    python -m swax_lightning retrofit run configs/retrofit/smollm2.yaml          # everything, resumable
    python -m swax_lightning retrofit run configs/retrofit/smollm2_large.yaml    # the larger budget (a GPU)
    python -m swax_lightning retrofit report runs/retrofit/smollm2               # table and plots of what finished

Steps, each skipped when its outputs exist (an interrupted run, started again, goes on where it stopped; a variant
evaluated under other `evaluate` settings is evaluated again):
1. import (swax import) of `source` into <out>/import, unless `import_dir` names an existing import;
2. the data module's shards of `data` tokenized with the model's own tokenizer (<out>/data unless data.data_dir);
3. attention transfer of every student at once, then LoRA for each: <out>/students/<name>/checkpoints/last.ckpt;
4. every variant through the evaluation suite (evals/suite.py, the same settings and seed for all, so the same
   prompts): full attention; SWA(w, s) for every window w and sink count s (training-free, the full-attention layers
   converted with the window convention `window_includes_sinks`); each retrofit. Per variant, in
   <out>/variants/<name>/: the suite's reports (results.json with every sample, results.md, NIAH heatmaps) and
   variant.json (time taken, and from every batch of generated answers its prefill and decode speed and the bytes
   its inference state held); TensorBoard scalars in <out>/tensorboard/<variant> (and the training curves in
   <out>/tensorboard/<student>);
5. the report: <out>/report.md (the tables, the budgets, the ratios of SWA with sinks to the best retrofit), plots
   (NIAH and BABILong by length, loss by position, multiple choice, decode memory and speed) and summary.json.

Decisions:
- The evaluations are the suite's own: RULER NIAH on its depth grid, BABILong with the official prompts and rule,
  loss by position on the held-out split, and the generated multiple-choice tasks (evals/choice.py) through the
  lm-eval adapter; every cell with n and a 95% interval. NIAH and BABILong "all lengths" cells pool every sample of
  a variant, which is what the ratios compare.
- Decode memory and speed come from the evaluation's own generations (generate's stats, batches of the suite's
  batch_size): the bytes of one sequence's inference state after the prompt and the answer, and the tokens per
  second each sequence gets after the prefill, at each prompt length; the table gives them at the longest NIAH
  length with the batch they were measured at (a step of a batch reads the weights once for all its sequences).
  Timings are this machine's at the time (kept out of the suite's deterministic results.json).
- A config file may `extends:` another (a larger budget overrides a few fields, `students.<name>: null` drops a
  student); an unknown field or a value out of range is one line naming it (exit code 2).
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import math
import time
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

import torch
import yaml

from swax_lightning.core import atomic
from swax_lightning.core.config_files import merged_config
from swax_lightning.core.environment import cpu_has_native_bf16
from swax_lightning.core.errors import ConfigError, require, usage_errors_reported
from swax_lightning.core.safe_load import load_as_data
from swax_lightning.evals import choice
from swax_lightning.evals.reports import flat_metrics, write_reports
from swax_lightning.evals.suite import EvalSuite
from swax_lightning.model.config import ModelConfig
from swax_lightning.pretrained import retrofit
from swax_lightning.pretrained.hf_import import import_pretrained, run_config
from swax_lightning.training.checkpoints import LAST, load_model, model_checkpoint, read_checkpoint
from swax_lightning.training.runs import checkpoint_identity

DONE = "variant.json"  # written last in a variant's folder: the variant is finished
PRECISIONS = ("bf16", "fp32")
TRAINING_PRECISIONS = (*PRECISIONS, "auto")  # auto: bf16 where this machine computes bf16 natively
SUITE_FIXED = ("window", "n_sink", "convert_full_attention", "window_includes_sinks", "lm_eval",
               "output_dir")  # set per variant, not in evaluate.suite


@dataclass
class StudentSpec:
    """One retrofit: pattern = the layer kinds of the converted model (D = Gated DeltaNet, X = mLSTM, L = LoLCATs,
    A and S = keep the teacher's full or sliding attention layer there; tiled over the depth: SSSSSL converts Gemma 3
    270M's global layers), arch = other ModelConfig fields of the students."""

    pattern: str
    arch: dict = field(default_factory=dict)


@dataclass
class EvaluationConfig:
    """What every variant is evaluated on.

    Args:
        windows: Windows w of the SWA variants.
        sinks: Sink counts s of the SWA variants (each with every window).
        window_includes_sinks: The window's convention (false: w recent keys plus the s sinks; true: w keys in all).
        choice_items: Items per generated multiple-choice task (evals/choice.py); 0 = none.
        precision: The weights of every evaluated variant (the same for all): fp32, or bf16 (faster on GPUs). On 2
            AVX-512 BF16 cores bf16 prefilled about a fifth faster, but the attention models' decode steps ran 2-8x
            slower than in fp32 (the recurrent students' about 1.5x faster), and 7 of the 9 variants are attention.
        suite: EvalSuite arguments, as under `eval:` in a run config (niah, babilong, perplexity, ... sections,
            chunk_len, seed, essay_file); the window settings and the multiple-choice tasks are set per variant.
    """

    windows: list = field(default_factory=lambda: [64, 256, 512])
    sinks: list = field(default_factory=lambda: [4, 0])
    window_includes_sinks: bool = False
    choice_items: int = 20
    precision: str = "fp32"
    suite: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        require(bool(self.windows) and all(isinstance(w, int) and w >= 1 for w in self.windows),
                "evaluate.windows", "must be whole numbers >= 1", self.windows)
        require(all(isinstance(s, int) and s >= 0 for s in self.sinks), "evaluate.sinks",
                "must be whole numbers >= 0", self.sinks)
        require(self.choice_items >= 0, "evaluate.choice_items", "must be >= 0", self.choice_items)
        require(self.precision in PRECISIONS, "evaluate.precision", f"must be one of {PRECISIONS}", self.precision)
        fixed = sorted(set(self.suite) & set(SUITE_FIXED))
        require(not fixed, "evaluate.suite", f"must not set {fixed} (set per variant)", self.suite)
        self.make_suite()  # the suite's own checks, now

    def make_suite(self, **per_variant) -> EvalSuite:
        try:
            return EvalSuite(**self.suite, **per_variant)
        except TypeError as err:
            raise ConfigError(f"evaluate.suite: {err}") from None
        except (ValueError, FileNotFoundError) as err:
            raise ConfigError(f"evaluate.suite: {err}") from None


@dataclass
class ExperimentConfig:
    """The whole comparison.

    Args:
        source: What swax import reads: a Hugging Face folder, a .gguf file, smollm2 or gemma3 (the packaged GGUFs).
        out: The experiment's folder.
        import_dir: An existing import to use instead (its checkpoints/last.ckpt); empty = <out>/import.
        device: cpu or cuda.
        precision: Of the retrofit's training: bf16 (forwards under bf16 autocast, fp32 weights and optimizer: faster
            on GPUs and on CPUs with AVX-512 BF16 or AMX), fp32, or auto: bf16 on a GPU or such a CPU, else fp32 (on
            a CPU without them bf16 is emulated: a transfer step ran 7x slower than in fp32). The evaluation's is
            evaluate.precision.
        seed: Seed of the students' new weights, the data order and the adapters.
        held_out_sequences: Validation sequences (of data.seq_len tokens) the convergence curves are measured on:
            each layer's transfer error and the LoRA loss, the same sequences at every point.
        data: TextDataModule arguments for the training text (source, seq_len, batch_size, recall, data_dir...); the
            tokenizer is always the model's own.
        students: name -> StudentSpec of each retrofit; `name: null` drops a student the extended file names.
        transfer: Stage 1 (retrofit.TransferConfig).
        lora: Stage 2 (retrofit.LoRAConfig).
        evaluate: EvaluationConfig.
    """

    source: str = "smollm2"
    out: str = "runs/retrofit/smollm2"
    import_dir: str | None = None
    device: str = "cpu"
    precision: str = "auto"
    seed: int = 0
    held_out_sequences: int = 4
    data: dict = field(default_factory=lambda: {"source": "embedded", "seq_len": 1024, "batch_size": 1})
    students: dict = field(default_factory=lambda: {"gdn": StudentSpec("D"), "mlstm": StudentSpec("X")})
    transfer: retrofit.TransferConfig = field(default_factory=retrofit.TransferConfig)
    lora: retrofit.LoRAConfig = field(default_factory=retrofit.LoRAConfig)
    evaluate: EvaluationConfig = field(default_factory=EvaluationConfig)

    def __post_init__(self) -> None:
        require(self.device in ("cpu", "cuda"), "device", "must be cpu or cuda", self.device)
        require(self.precision in TRAINING_PRECISIONS, "precision", f"must be one of {TRAINING_PRECISIONS}",
                self.precision)
        require(bool(self.students), "students", "must name at least one retrofit", self.students)
        require(self.held_out_sequences >= 1, "held_out_sequences", "must be >= 1", self.held_out_sequences)
        require("tokenizer" not in self.data, "data.tokenizer", "is the model's own: leave it out",
                self.data.get("tokenizer"))
        for name in self.students:
            require(name.replace("_", "").isalnum(), "students", "names must be letters, digits or _", name)

    @property
    def bf16(self) -> bool:
        """Whether the retrofit's training forwards run under bf16 autocast (precision, with auto resolved)."""
        if self.precision == "auto":
            return self.device == "cuda" or cpu_has_native_bf16()
        return self.precision == "bf16"

    @property
    def folder(self) -> Path:
        return Path(self.out)

    @property
    def seq_len(self) -> int:
        return int(self.data.get("seq_len", 512))

    @property
    def batch_size(self) -> int:
        return int(self.data.get("batch_size", 16))


# ---- reading the config ----------------------------------------------------------------------------------------------
def read_config(path: str | Path) -> ExperimentConfig:
    """The experiment config file (with the files it extends), checked: one ConfigError naming a bad field."""
    if not Path(path).is_file():
        raise ConfigError(f"experiment config not found: {path}")
    return build(ExperimentConfig, merged_config(Path(path)), "")


NESTED = {"transfer": retrofit.TransferConfig, "lora": retrofit.LoRAConfig, "evaluate": EvaluationConfig}


def build(cls, settings: dict, where: str):
    """cls(**settings) with nested sections built too; an unknown field is a ConfigError naming it."""
    known = {f.name for f in fields(cls)}
    unknown = sorted(set(settings) - known)
    if unknown:
        raise ConfigError(f"{where}{unknown[0]}: unknown field (known: {', '.join(sorted(known))})")
    values = dict(settings)
    for name, nested in NESTED.items():
        if name in values and name in known:
            values[name] = build(nested, values[name] or {}, f"{where}{name}.")
    if cls is ExperimentConfig and "students" in values:
        values["students"] = {name: build(StudentSpec, spec, f"students.{name}.")
                              for name, spec in (values["students"] or {}).items() if spec is not None}
    try:
        return cls(**values)
    except TypeError as err:
        raise ConfigError(f"{where.rstrip('.') or 'config'}: {err}") from None


# ---- variants --------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Variant:
    """One evaluated model: the teacher with full attention (window None, student None), masked to SWA(window,
    n_sink), or a retrofit (student)."""

    name: str
    window: int | None = None
    n_sink: int | None = None
    student: str | None = None

    @property
    def family(self) -> str:
        if self.student:
            return "retrofit"
        return "full" if self.window is None else ("swa+sinks" if self.n_sink else "swa")


def variants(cfg: ExperimentConfig) -> list[Variant]:
    out = [Variant("full")]
    out += [Variant(f"swa{w}-sink{s}", w, s) for s in cfg.evaluate.sinks for w in cfg.evaluate.windows]
    return out + [Variant(f"retrofit-{name}", student=name) for name in cfg.students]


# ---- the steps -------------------------------------------------------------------------------------------------------
class Clock:
    """Wall-clock and CPU seconds per step, kept in <out>/timings.json across interrupted runs (a step done before
    keeps its time). CPU seconds over the cores used say what the step would take on an idle machine."""

    def __init__(self, path: Path):
        self.path = path
        self.times = atomic.read_json(path) if path.is_file() else {}

    @staticmethod
    def now() -> tuple[float, float]:
        return time.perf_counter(), time.process_time()

    def record(self, step: str, start: tuple[float, float]) -> None:
        wall, cpu = self.now()
        self.times[step] = {"wall": round(wall - start[0], 1), "cpu": round(cpu - start[1], 1),
                            "threads": torch.get_num_threads()}
        atomic.write_json(self.path, self.times)


def teacher_checkpoint(cfg: ExperimentConfig, clock: Clock) -> Path:
    if cfg.import_dir:
        ckpt = Path(cfg.import_dir) / "checkpoints" / LAST
        if not ckpt.is_file():
            raise ConfigError(f"import_dir {cfg.import_dir}: no checkpoints/{LAST} there (run swax import first)")
        return ckpt
    ckpt = cfg.folder / "import" / "checkpoints" / LAST
    if not ckpt.is_file():
        start = Clock.now()
        print(f"importing {cfg.source} into {ckpt.parent.parent}", flush=True)
        import_pretrained(cfg.source, ckpt.parent.parent, overwrite=True)
        clock.record("import", start)
    return ckpt


def data_module(cfg: ExperimentConfig, tokenizer_file: str):
    from swax_lightning.data.datamodule import TextDataModule

    settings = {"data_dir": str(cfg.folder / "data"), **cfg.data, "tokenizer": tokenizer_file}
    try:
        data = TextDataModule(**settings)
        data.prepare_data()
        data.setup("test")
    except (TypeError, ValueError) as err:  # the data module's own checks name the field or the folder
        raise ConfigError(f"data: {err}") from None
    return data


def student_folder(cfg: ExperimentConfig, name: str) -> Path:
    return cfg.folder / "students" / name


def train_students(cfg: ExperimentConfig, teacher_ckpt: Path, data, clock: Clock) -> dict[str, Path]:
    """Both stages for every student not finished before; returns name -> converted checkpoint."""
    teacher, _ = load_model(teacher_ckpt, cfg.device)
    pending = {name: spec for name, spec in cfg.students.items()
               if not (student_folder(cfg, name) / "transfer.pt").is_file()}
    if pending:
        start = Clock.now()
        run_transfer(cfg, teacher, data, pending)
        clock.record(f"attention transfer ({', '.join(pending)})", start)  # a student added later: its own entry
    lora_pending = {name: spec for name, spec in cfg.students.items()
                    if not (student_folder(cfg, name) / "checkpoints" / LAST).is_file()}
    if lora_pending:
        inputs, targets = _held_out(cfg, data)
        with torch.no_grad():  # once for all students: their held-out curves end against it
            teacher_loss = float(teacher(inputs, targets=targets))
    for name, spec in lora_pending.items():
        start = Clock.now()
        run_lora(cfg, teacher, teacher_ckpt, data, name, spec, teacher_loss)
        clock.record(f"lora {name}", start)
    return {name: student_folder(cfg, name) / "checkpoints" / LAST for name in cfg.students}


def _writer(cfg: ExperimentConfig, name: str):
    from torch.utils.tensorboard import SummaryWriter

    return SummaryWriter(str(cfg.folder / "tensorboard" / name))


def _held_out(cfg: ExperimentConfig, data) -> retrofit.Batch:
    """The validation sequences (inputs, targets) every point of the convergence curves is measured on."""
    blocks = data.blocks("val", cfg.seq_len + 1)
    return next(retrofit.token_batches(blocks, min(cfg.held_out_sequences, len(blocks)), cfg.seed, cfg.device))


class Curve:
    """A stage's held-out points {steps done: value}, written to `path` as they come: a resumed stage keeps the
    points measured before it stopped (one measured again after a resume from an earlier save is the same)."""

    def __init__(self, path: Path, tokens_per_step: int):
        self.path, self.tokens_per_step = path, tokens_per_step
        self.points = {int(k): v for k, v in atomic.read_json(path).items()} if path.is_file() else {}

    def add(self, step: int, value) -> None:
        self.points[step] = value
        self.path.parent.mkdir(parents=True, exist_ok=True)
        atomic.write_json(self.path, {str(k): v for k, v in self.points.items()})

    def rows(self, key: str) -> list[dict]:
        """[{"step", "tokens", key: value}] in step order."""
        return [{"step": k, "tokens": k * self.tokens_per_step, key: self.points[k]} for k in sorted(self.points)]


def run_transfer(cfg: ExperimentConfig, teacher, data, specs: dict) -> None:
    students = {name: retrofit.converted_model(teacher, spec.pattern, cfg.seed, **spec.arch)
                for name, spec in specs.items()}
    held_out = retrofit.mixer_io(teacher, _held_out(cfg, data)[0])
    curves = {name: Curve(student_folder(cfg, name) / "transfer-curve.json", cfg.batch_size * cfg.seq_len)
              for name in students}
    measure = {name: lambda step, model, name=name: curves[name].add(step, retrofit.transfer_errors(model, *held_out))
               for name in students}
    steps = retrofit.steps_for(cfg.transfer.tokens, cfg.batch_size, cfg.seq_len)
    print(f"attention transfer of {', '.join(students)}: {steps} steps of {cfg.batch_size} x {cfg.seq_len} tokens"
          f" ({'bf16 autocast' if cfg.bf16 else 'fp32'})", flush=True)
    writers = {name: _writer(cfg, name) for name in students}
    started, latest = time.perf_counter(), {}

    def log(name: str, step: int, loss: float) -> None:
        writers[name].add_scalar("transfer/relative_mse", loss, step)
        latest[name] = loss
        if name == list(students)[-1] and (step + 1) % max(1, steps // 10) == 0:
            print(f"  transfer step {step + 1}/{steps}: relative MSE "
                  f"{', '.join(f'{n} {v:.3f}' for n, v in latest.items())} ({retrofit.seconds_since(started):.0f} s)",
                  flush=True)

    batches = retrofit.token_batches(data.blocks("train", cfg.seq_len + 1), cfg.batch_size, cfg.seed, cfg.device)
    progress = cfg.folder / "students" / "transfer-progress.pt"
    losses = retrofit.attention_transfer(teacher, students, batches, steps, cfg.transfer, progress, log, cfg.bf16,
                                         measure)
    for name, model in students.items():
        folder, curve = student_folder(cfg, name), curves[name].rows("by_layer")
        before, after = curve[0]["by_layer"], curve[-1]["by_layer"]
        summary = {"pattern": specs[name].pattern, "steps": steps, "tokens": steps * cfg.batch_size * cfg.seq_len,
                   "budget_tokens": cfg.transfer.tokens, "train": cfg.transfer.train, "lr": cfg.transfer.lr,
                   "held_out_sequences": len(held_out[0][0]),
                   "held_out_relative_mse_before": _mean(before), "held_out_relative_mse_after": _mean(after),
                   "held_out_relative_mse_by_layer": {"before": before, "after": after},
                   "held_out_curve": [row | {"mean": _mean(row["by_layer"])} for row in curve],
                   "train_relative_mse": losses[name]}
        for row in summary["held_out_curve"]:
            writers[name].add_scalar("transfer/held_out_relative_mse", row["mean"], row["tokens"])
        writers[name].close()
        atomic.write_json(folder / "transfer.json", summary)
        with atomic.written_atomically(folder / "transfer.pt") as tmp:
            torch.save(retrofit.student_state(model), tmp)
        atomic.remove(curves[name].path)
        print(f"  {name}: held-out relative MSE {summary['held_out_relative_mse_before']:.3f} -> "
              f"{summary['held_out_relative_mse_after']:.3f} (mean over layers)", flush=True)


def run_lora(cfg: ExperimentConfig, teacher, teacher_ckpt: Path, data, name: str, spec: StudentSpec,
             teacher_loss: float) -> None:
    """Stage 2 for one student; teacher_loss: the teacher's loss on the held-out sequences (_held_out)."""
    folder = student_folder(cfg, name)
    model = retrofit.converted_model(teacher, spec.pattern, cfg.seed, **spec.arch)
    model.load_state_dict(load_as_data(folder / "transfer.pt", cfg.device), strict=False)
    steps = retrofit.steps_for(cfg.lora.tokens, cfg.batch_size, cfg.seq_len)
    print(f"LoRA of {name}: {steps} steps of {cfg.batch_size} x {cfg.seq_len} tokens, rank {cfg.lora.rank}",
          flush=True)
    writer, started = _writer(cfg, name), time.perf_counter()

    def log(step: int, loss: float) -> None:
        writer.add_scalar("lora/loss", loss, step)
        if (step + 1) % max(1, steps // 5) == 0:
            print(f"  LoRA step {step + 1}/{steps}: loss {loss:.3f} ({retrofit.seconds_since(started):.0f} s)",
                  flush=True)

    inputs, targets = _held_out(cfg, data)
    curve = Curve(folder / "lora-curve.json", cfg.batch_size * cfg.seq_len)

    def measure(step: int, model) -> None:
        curve.add(step, float(model(inputs, targets=targets)))

    batches = retrofit.token_batches(data.blocks("train", cfg.seq_len + 1), cfg.batch_size, cfg.seed + 1, cfg.device)
    if steps:
        losses = retrofit.lora_finetune(model, batches, steps, cfg.lora, folder / "lora-progress.pt", log, cfg.seed,
                                        cfg.bf16, measure)
    else:
        losses = []
        with torch.no_grad():
            measure(0, model.eval())
    for row in curve.rows("loss"):
        writer.add_scalar("lora/held_out_loss", row["loss"], row["tokens"])
    writer.close()
    summary = {"steps": steps, "tokens": steps * cfg.batch_size * cfg.seq_len, "budget_tokens": cfg.lora.tokens,
               "rank": cfg.lora.rank, "alpha": cfg.lora.alpha, "lr": cfg.lora.lr,
               "held_out_loss_curve": curve.rows("loss"), "teacher_held_out_loss": teacher_loss, "train_loss": losses}
    write_converted(model, teacher_ckpt, folder, {"transfer": atomic.read_json(folder / "transfer.json"),
                                                  "lora": summary})
    atomic.write_json(folder / "lora.json", summary)
    atomic.remove(curve.path)


def write_converted(model, teacher_ckpt: Path, folder: Path, budgets: dict) -> Path:
    """The converted model as a framework checkpoint with the teacher's tokenizer, and its `main.py test` config."""
    teacher = read_checkpoint(teacher_ckpt)
    data = teacher["datamodule_hyper_parameters"]
    checkpoint = model_checkpoint(model.state_dict(), model.cfg, data,
                                  retrofit_of={"teacher": str(teacher_ckpt), **{k: {key: v for key, v in b.items()
                                               if not key.startswith("train_")} for k, b in budgets.items()}})
    ckpt = folder / "checkpoints" / LAST
    with atomic.written_atomically(ckpt) as tmp:
        torch.save(checkpoint, tmp)
    atomic.write_text(folder / "config.yaml", run_config(model.cfg, data, folder.resolve(),
                                                                  str(teacher_ckpt), made_by="the retrofit"))
    return ckpt


# ---- evaluation ------------------------------------------------------------------------------------------------------
def evaluate_variant(cfg: ExperimentConfig, variant: Variant, ckpt: Path, data, choice_dir: Path | None) -> str:
    folder, settings = cfg.folder / "variants" / variant.name, evaluation_settings(cfg)
    again = ""
    if (folder / DONE).is_file():
        if atomic.read_json(folder / DONE).get("settings") == settings:
            return "done before"
        (folder / DONE).unlink()  # evaluated under other settings: its results would not be this config's
        again = " again (evaluate's settings changed)"
    start = time.perf_counter()
    model, _ = load_model(ckpt, cfg.device)
    if cfg.evaluate.precision == "bf16":
        model.to(torch.bfloat16)
    suite = variant_suite(cfg, variant, choice_dir)
    generations: list[dict] = []
    results = suite.evaluate(model, data, checkpoint_identity(ckpt),
                             on_generation=lambda ev, n, stats: generations.append({"eval": ev, "length": n, **stats}))
    write_reports(results, folder)
    decode = decode_summary(generations)
    writer = _writer(cfg, variant.name)
    for tag, value in {**flat_metrics(results), **decode_metrics(decode)}.items():
        writer.add_scalar(tag, value, 0)
    writer.close()
    atomic.write_json(folder / DONE, {"variant": asdict(variant), "family": variant.family, "checkpoint": str(ckpt),
                                        "settings": settings, "seconds": retrofit.seconds_since(start),
                                        "decode": decode, "generations": generations})
    return f"evaluated{again} in {retrofit.seconds_since(start):.0f} s"


def evaluation_settings(cfg: ExperimentConfig) -> dict:
    """What a variant's results depend on besides its window and checkpoint, as its variant.json stores it: a finished
    variant is skipped only when these are the config's."""
    settings = {key: value for key, value in asdict(cfg.evaluate).items() if key not in ("windows", "sinks")}
    return json.loads(json.dumps(settings))


def variant_suite(cfg: ExperimentConfig, variant: Variant, choice_dir: Path | None) -> EvalSuite:
    """The evaluation suite of one variant: the config's settings, the variant's window and sinks, the generated
    multiple-choice tasks in choice_dir (None: none), the reports in the variant's folder."""
    swa = variant.window is not None
    return cfg.evaluate.make_suite(
        window=variant.window, n_sink=variant.n_sink, convert_full_attention=swa,
        window_includes_sinks=cfg.evaluate.window_includes_sinks and swa,
        output_dir=str(cfg.folder / "variants" / variant.name),
        lm_eval={"tasks": list(choice.TASKS), "include_path": str(choice_dir)} if choice_dir else None)


def check_variants(cfg: ExperimentConfig, teacher_ckpt: Path, data) -> None:
    """Every variant's evaluation settings against the teacher and the tokenizer, before any long work: a window
    beyond the model's positions, or a NIAH or BABILong length too short for its task, is one line naming the field."""
    arch = ModelConfig(**read_checkpoint(teacher_ckpt)["hyper_parameters"]["arch"])
    for variant in variants(cfg):
        try:
            variant_suite(cfg, variant, None).check_settings(arch, data)
        except ValueError as err:  # ConfigError included: the suite names its field
            raise ConfigError(f"evaluate ({variant.name}): {err}") from None


def decode_summary(generations: list[dict]) -> dict:
    """Per (evaluation, prompt length), from generate's stats of each batch: prompts, the largest batch, prefill
    tokens/s (the padded prompts of a batch over its prefill's seconds), decode tokens/s of one sequence (decode steps
    over their seconds: each step gives every sequence of the batch a token) and the largest inference-state bytes
    per sequence."""
    groups: dict = {}
    for g in generations:
        groups.setdefault(f"{g['eval']}/{g['length']}", []).append(g)
    out = {}
    for key, rows in groups.items():
        steps, seconds = sum(r["decode_steps"] for r in rows), sum(r["decode_seconds"] for r in rows)
        out[key] = {"prompts": sum(r["batch"] for r in rows), "batch": max(r["batch"] for r in rows),
                    "prompt_tokens": max(r["prompt_tokens"] for r in rows),
                    "prefill_tokens_per_s": sum(r["batch"] * r["prompt_tokens"] for r in rows)
                    / max(sum(r["prefill_seconds"] for r in rows), 1e-9),
                    "decode_tokens_per_s": steps / seconds if seconds else None,
                    "cache_bytes": max(r["cache_bytes"] / r["batch"] for r in rows)}
    return out


def decode_metrics(decode: dict) -> dict:
    metrics = {}
    for key, row in decode.items():
        metrics[f"decode/{key}/cache_mib"] = row["cache_bytes"] / 2**20
        metrics[f"decode/{key}/prefill_tokens_per_s"] = row["prefill_tokens_per_s"]
        if row["decode_tokens_per_s"] is not None:
            metrics[f"decode/{key}/decode_tokens_per_s"] = row["decode_tokens_per_s"]
    return metrics


# ---- the command -----------------------------------------------------------------------------------------------------
def check_packages(cfg: ExperimentConfig) -> None:
    """What the evaluation will import, checked before anything runs: the multiple-choice tasks go through lm-eval."""
    if cfg.evaluate.choice_items and importlib.util.find_spec("lm_eval") is None:
        raise ConfigError("evaluate.choice_items: the multiple-choice tasks run through lm-eval, which is not "
                          "installed: bash setup.sh eval pretrained, or evaluate.choice_items: 0")


def run(cfg: ExperimentConfig) -> str:
    check_packages(cfg)
    cfg.folder.mkdir(parents=True, exist_ok=True)
    settings = asdict(cfg) | {"training_precision": "bf16" if cfg.bf16 else "fp32"}  # `auto` as this machine reads it
    atomic.write_text(cfg.folder / "experiment.yaml", yaml.safe_dump(settings, sort_keys=False))
    clock, started = Clock(cfg.folder / "timings.json"), time.perf_counter()
    teacher_ckpt = teacher_checkpoint(cfg, clock)
    tokenizer_file = read_checkpoint(teacher_ckpt)["datamodule_hyper_parameters"]["tokenizer"]
    start = Clock.now()
    data = data_module(cfg, tokenizer_file)
    if "data" not in clock.times:
        clock.record("data", start)
    check_variants(cfg, teacher_ckpt, data)
    student_ckpts = train_students(cfg, teacher_ckpt, data, clock)
    choice_dir = None
    if cfg.evaluate.choice_items:
        choice_dir = choice.write_tasks(cfg.folder / "choice_tasks", cfg.evaluate.choice_items,
                                        cfg.evaluate.suite.get("seed", 0))
    for variant in variants(cfg):
        start = Clock.now()
        ckpt = student_ckpts[variant.student] if variant.student else teacher_ckpt
        status = evaluate_variant(cfg, variant, ckpt, data, choice_dir)
        if status != "done before":
            clock.record(f"evaluate {variant.name}", start)
        print(f"[{retrofit.seconds_since(started):7.0f} s] {variant.name}: {status}", flush=True)
    from swax_lightning.pretrained.report import write_report

    return write_report(cfg.folder)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m swax_lightning retrofit", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    run_parser = sub.add_parser("run", help="import, retrofit, evaluate every variant (skipping what finished), "
                                            "then write the report")
    run_parser.add_argument("config", type=Path, help="e.g. configs/retrofit/smollm2.yaml")
    report_parser = sub.add_parser("report", help="the table and plots of the variants finished so far")
    report_parser.add_argument("folder", type=Path, help="the experiment's out folder, e.g. runs/retrofit/smollm2")
    args = parser.parse_args(argv)
    with usage_errors_reported(FileNotFoundError):
        if args.command == "report":
            from swax_lightning.pretrained.report import write_report

            print(write_report(args.folder))
        else:
            print(run(read_config(args.config)))


def _mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else math.nan

