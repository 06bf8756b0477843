"""SwaxCLI: LightningCLI with the window schedule, run naming, start-up checks and one-line configuration errors that
every swax-lightning run shares.

- `window:` configures the StochasticWindow callback and `eval:` the EvalSuite callback (evals/suite.py: what
  `main.py test` runs after its test loop); both are always installed, empty meaning the model's own window and no
  evaluations.
- `experiment:` and `arm:` name the run folder <save_dir>/<experiment>/<arm>/ (runs.py): logs, checkpoints and the
  config file of each command go there whatever the logger (TensorBoard, CSV, W&B), so the arms of a study never
  overwrite each other and `tensorboard --logdir runs` lines them up. `--print_config` prints that folder first.
- `extends: other.yaml` at the top of a config file puts that file's settings first, then this file's on top (deep
  merge): an arm differing from another in one field is a three-line file.
- The configuration is the truth: where LightningCLI would parse a checkpoint's hyperparameters over it, a
  checkpoint trained with another architecture is refused before anything runs, the differing fields named
  (evaluate at another window with `window.eval_window` or `eval.window`). `validate`, `test` and `predict` without
  `--ckpt_path` are refused unless `--allow_random_weights true`. LightningCLI's `--optimizer` / `--lr_scheduler`
  groups are off: the optimizer is `model.optim`, which they would bypass.
- Configuration errors (a rejected value, a config dataclass's ConfigError, a constructor's ValueError or missing
  file, Lightning's MisconfigurationException, a launch whose ranks would never all come, an unreadable config or
  checkpoint) are one line, `error: <message>`, on stderr with exit code 2 and no traceback (SWAX_DEBUG=1 shows it).
  Any other exception is a bug and keeps its traceback.
- One seed per run: `seed_everything` (the initial weights) also sets `data.seed` (the training stream's order and
  the recall documents) and `window.seed` (the window schedule), so two seeds differ in all three and one seed
  repeats a run exactly; the two fields cannot be set apart. A `seed_everything: true` (a random seed) leaves them 0.
- After `fit`: environment.json (what the fit ran on, environment.py), and the run's settings as every logger's
  hyperparameters; TensorBoard gets one HPARAMS entry with the final validation metrics (hp/val_loss, hp/val_bpb).
"""
from __future__ import annotations

import json
import logging
import re
import sys
import warnings
from pathlib import Path

import yaml
from lightning.pytorch.cli import LightningCLI, SaveConfigCallback
from lightning.pytorch.loggers import TensorBoardLogger
from lightning.pytorch.utilities import rank_zero_only, rank_zero_warn

from swax_lightning import __version__
from swax_lightning.core.atomic import write_text
from swax_lightning.core.config_files import config_chain
from swax_lightning.core.environment import ENVIRONMENT_FILE, describe
from swax_lightning.core.errors import ConfigError, usage_errors, usage_errors_reported
from swax_lightning.data.datamodule import TextDataModule
from swax_lightning.evals.suite import EvalSuite
from swax_lightning.model.config import ModelConfig
from swax_lightning.training.checkpoints import (
    LAST,
    LatestCheckpoint,
    check_tokenizer,
    read_checkpoint,
    refuse_nothing_to_resume,
    refuse_unloadable_checkpoint,
)
from swax_lightning.training.module import LanguageModule, check_architecture
from swax_lightning.training.runs import (
    CKPT_KEYWORDS,
    claim_for_fit,
    config_file_name,
    resumes,
    run_dir,
    run_folder,
    wandb_run_id,
)
from swax_lightning.training.strategy import (  # also registers --trainer.strategy fsdp2, hsdp
    check_launch,
    refuse_replica_mesh,
)
from swax_lightning.training.window import StochasticWindow

# Logger class: (init arg set to the experiment, init args set to the arm). Each puts its checkpoints (and, but for
# W&B, its logs) in <save_dir>/<experiment>/<arm>/.
RUN_NAMING = {"TensorBoardLogger": ("name", ("version",)), "CSVLogger": ("name", ("version",)),
              "WandbLogger": ("project", ("name",))}  # its id (version) is the run's own: start_run
PRINT_CONFIG = "--print_config"
CONFIG_FLAGS = ("--config", "-c")
ORIGIN_MARK = "# settings of "  # first line of the YAML string an extending file becomes: errors can name the file
# Classes whose validation errors name their fields as `Class.field`, and the config section each one is.
SECTION_OF = {"ModelConfig": "model.arch", "OptimConfig": "model.optim", "GenerationConfig": "model.generation",
              "TextDataModule": "data", "StochasticWindow": "window", "EvalSuite": "eval"}
KEY_IN_MESSAGE = re.compile(r'Parser key "([\w.]+)"|option \'([\w.]+)\'|\b(' + "|".join(SECTION_OF) + r')\.(\w+)')
PRINT_CONFIG_FLAGS = {"skip_default": "skip_default", "skip_unset": "skip_unset", "skip_null": "skip_unset",
                      "comments": "with_comments"}  # jsonargparse's flags: the dump() argument each one sets


class SwaxCLI(LightningCLI):
    """LightningCLI with the additions and checks of the module docstring; takes LightningCLI's arguments."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("auto_configure_optimizers", False)
        kwargs["parser_kwargs"] = _raising_parsers(kwargs.get("parser_kwargs") or {}, self.subcommands())
        self._argv: list[str] = []
        with usage_errors_reported():
            try:
                super().__init__(*args, **kwargs)
            except usage_errors() as err:
                raise ConfigError(with_source(str(err), self._argv)) from err

    def parse_arguments(self, parser, args) -> None:
        if args is not None and not isinstance(args, list):  # a dict or Namespace: no files to expand
            super().parse_arguments(parser, args)
            return
        self._argv, print_flags = _without_print_config(expand_extends(sys.argv[1:] if args is None else args))
        self.config = parser.parse_args(self._argv)
        cfg = self.config[self.config.subcommand] if self.config.get("subcommand") else self.config
        folder = name_run(cfg)
        if print_flags is not None:
            self._print_config(parser, folder, print_flags)
        if folder is not None and self.config.get("subcommand") == "fit":
            start_run(cfg, folder)

    def _print_config(self, parser, folder: Path | None, flags: str) -> None:
        """jsonargparse's --print_config, after the run naming and validation, headed by the run folder."""
        subcommand = self.config.get("subcommand")
        subparser = self._subcommand_parsers[subcommand] if subcommand else parser
        unknown = [flag for flag in flags.split(",") if flag and flag not in PRINT_CONFIG_FLAGS]
        if unknown:
            raise ConfigError(f"{PRINT_CONFIG}: unknown flag {unknown[0]!r} (known: {', '.join(PRINT_CONFIG_FLAGS)})")
        kwargs = {"skip_unset": False} | {PRINT_CONFIG_FLAGS[flag]: True for flag in flags.split(",") if flag}
        dump = subparser.dump(self.config[subcommand] if subcommand else self.config, **kwargs)
        where = f"# run folder: {folder}" if folder else "# run folder: chosen by the logger (no experiment: set)"
        sys.stdout.write(f"{where}\n{dump}")
        raise SystemExit(0)

    def add_arguments_to_parser(self, parser) -> None:
        parser.add_lightning_class_args(StochasticWindow, "window")
        parser.add_lightning_class_args(EvalSuite, "eval")
        for target in ("data.seed", "window.seed"):
            parser.link_arguments("seed_everything", target, compute_fn=run_seed)
        parser.add_argument("--experiment", type=str | None, default=None,
                            help="Study name: the run goes to <save_dir>/<experiment>/<arm>/")
        parser.add_argument("--arm", type=str | None, default=None,
                            help="Arm of the study (e.g. w128, stochastic_p0.5): the run's folder name")
        parser.add_argument("--allow_random_weights", type=bool, default=False,
                            help="Let validate, test and predict run without --ckpt_path (random initial weights)")
        parser.add_argument("--overwrite", type=bool, default=False,
                            help="fit: replace the run already in <save_dir>/<experiment>/<arm>/ (deleted first)")

    def _parse_ckpt_path(self) -> None:
        """Replaces LightningCLI's merge of the checkpoint's hyperparameters into the configuration (see the module
        docstring) by the start-up checks of the checkpoint."""
        subcommand = self.config.get("subcommand")
        if subcommand:
            check_checkpoint(self.config[subcommand], subcommand)
            self.config[subcommand]["weights_only"] = True  # Lightning's own load of ckpt_path reads data only too

    def instantiate_classes(self) -> None:
        """The constructors validate their arguments: what they reject is a configuration error; so are a
        distributed checkpoint given to a strategy that cannot load it, a model-parallel mesh that is not
        data-parallel over every rank, a launch whose ranks would never all come (strategy.check_launch), a kernel
        backend the trainer's device or precision cannot run (ModelConfig.check_run), a vocabulary smaller than the
        tokenizer's (check_vocabulary), `--ckpt_path last` with no last.ckpt, and an evaluation window beyond a
        pretrained model's positions."""
        try:
            super().instantiate_classes()
            if self.subcommand:
                refuse_unloadable_checkpoint(self.config[self.subcommand].get("ckpt_path"), self.trainer.strategy)
                refuse_nothing_to_resume(self.config[self.subcommand].get("ckpt_path"), self.trainer)
                refuse_replica_mesh(self.trainer.strategy)
                check_launch(self.trainer.strategy)
            self.model.arch.check_run(self.trainer.strategy.root_device.type, self.trainer.precision,
                                      training=self.subcommand == "fit")
            check_vocabulary(self.model.arch, self.datamodule)
            check_schedule(self.trainer, self.datamodule)
            if self.subcommand:
                for suite in (c for c in self.trainer.callbacks if isinstance(c, EvalSuite)):
                    suite.check_model(self.model.arch)
        except (ValueError, FileNotFoundError) as err:
            if isinstance(err, ConfigError):
                raise
            raise ConfigError(str(err)) from err

    def after_fit(self) -> None:
        cfg = without_paths(self.config[self.subcommand].as_dict())
        params = {key: cfg.get(key) for key in ("experiment", "arm", "seed_everything", "model", "data", "window")}
        params["trainer"] = {k: cfg["trainer"].get(k) for k in ("max_steps", "precision", "accumulate_grad_batches")}
        found = self.trainer.callback_metrics
        metrics = {f"hp/{name.replace('val/', 'val_')}": float(found[name]) for name in ("val/loss", "val/bpb")
                   if name in found}
        for logger in self.trainer.loggers:
            if isinstance(logger, TensorBoardLogger):  # the only one taking metrics beside its hyperparameters
                logger.log_hyperparams(params, metrics=metrics or None)
            else:
                logger.log_hyperparams(params)
            logger.finalize("success")  # the Trainer already closed the loggers; flush what this call reopened
        if self.trainer.is_global_zero:
            write_text(run_folder(self.trainer) / ENVIRONMENT_FILE, json.dumps(describe(), indent=2) + "\n")
        rank_zero_only(print)(fit_summary(self.trainer, metrics))


def run_seed(seed_everything) -> int:
    """The seed the data and the window schedule take from `seed_everything`: the integer itself; 0 for true/false
    (LightningCLI draws a true's seed only after parsing)."""
    if isinstance(seed_everything, bool) or seed_everything is None:
        return 0
    if not 0 <= int(seed_everything) < 2 ** 32:  # numpy's range, which every seeded generator here takes
        raise ConfigError(f"seed_everything must be in [0, 2**32) (got {seed_everything})")
    return int(seed_everything)


def fit_summary(trainer, metrics: dict) -> str:
    """What a finished fit left and where: the run folder, the last checkpoint, the final validation figures, and
    the commands that look at them."""
    folder = run_folder(trainer)
    latest = next((c for c in trainer.callbacks if isinstance(c, LatestCheckpoint)), None)
    last = latest.folder(trainer) / LAST if latest else None
    lines = [f"run folder: {folder} (config.yaml, checkpoints/, logs)"]
    if last is not None and last.exists():
        lines.append(f"last checkpoint: {last} (step {trainer.global_step})")
    if metrics:
        lines.append("final validation: " + ", ".join(f"{k.removeprefix('hp/')} {v:.4f}" for k, v in metrics.items()))
    lines.append(f"curves: tensorboard --logdir {folder.parent}")
    if last is not None and last.exists():
        lines.append(f"evaluate: python main.py test --config {folder / 'config.yaml'} --ckpt_path {last}")
    return "\n".join(lines)


def check_schedule(trainer, data: TextDataModule) -> None:
    """Values each class accepts alone but not together with the others: a training window longer than the training
    sequences (it would be full attention under another name), and a validation interval of 0."""
    for callback in (c for c in trainer.callbacks if isinstance(c, StochasticWindow)):
        longer = [w for w in callback.windows if w > data.seq_len]
        if longer:
            raise ConfigError(f"window.windows {longer} are longer than data.seq_len = {data.seq_len}: a training "
                              f"window must be <= the training length (a window >= it is full attention)")
    if trainer.val_check_interval == 0:
        raise ConfigError("trainer.val_check_interval must be > 0 (a number of batches, or a share of an epoch in "
                          "(0, 1])")


def check_vocabulary(arch: ModelConfig, data: TextDataModule) -> None:
    """The model's embedding must cover every id the data's tokenizer produces: checked here, where both are built,
    before any long work (neither the model nor the data module reads the other's settings)."""
    if arch.vocab_size < data.tokenizer.vocab_size:
        raise ConfigError(f"model.arch.vocab_size = {arch.vocab_size} is smaller than the {data.tokenizer.vocab_size} "
                          f"ids of data.tokenizer {data.tokenizer_spec!r}: set model.arch.vocab_size >= "
                          f"{data.tokenizer.vocab_size}")


def _raising_parsers(parser_kwargs: dict, subcommands) -> dict:
    """parser_kwargs with exit_on_error off for the main parser and each subcommand's: a rejected value then raises
    ArgumentError (reported in one line) instead of printing the subcommand's 60-line usage."""
    out = {**parser_kwargs, "exit_on_error": False, "version": f"swax-lightning {__version__}"}
    for name in subcommands:
        out[name] = {**parser_kwargs.get(name, {}), "exit_on_error": False}
    return out


def _without_print_config(argv: list[str]) -> tuple[list[str], str | None]:
    """argv without `--print_config[=flags]`, and the flags ("" for none; None when not asked)."""
    flags = None
    rest = []
    for arg in argv:
        if arg == PRINT_CONFIG or arg.startswith(PRINT_CONFIG + "="):
            flags = arg.partition("=")[2]
        else:
            rest.append(arg)
    return rest, flags


def name_run(cfg) -> Path | None:
    """Sets each configured logger's run naming from `experiment` and `arm` (RUN_NAMING) and returns the run folder,
    <save_dir>/<experiment>/<arm>; None without an experiment or a logger that names its runs."""
    if not cfg.get("experiment"):
        return None
    loggers = cfg.trainer.get("logger")
    run_dirs = []
    for logger in loggers if isinstance(loggers, list) else [loggers]:
        class_name = getattr(logger, "class_path", "").rpartition(".")[2]
        if class_name not in RUN_NAMING:
            if class_name:
                rank_zero_warn(f"experiment/arm do not name the runs of {class_name}: it chooses its own folder")
            continue
        experiment_arg, arm_args = RUN_NAMING[class_name]
        setattr(logger.init_args, experiment_arg, cfg.experiment)
        for arg in arm_args:
            setattr(logger.init_args, arg, cfg.arm or "default")
        run_dirs.append(run_dir(logger.init_args.get("save_dir"), cfg.experiment, cfg.arm))
    if run_dirs:
        _checkpoints_into(cfg.trainer.get("callbacks"), run_dirs[0] / "checkpoints")
    return run_dirs[0] if run_dirs else None


def _checkpoints_into(callbacks, folder: Path) -> None:
    """A ModelCheckpoint without a dirpath writes into the run folder's checkpoints/ whatever the logger (Lightning
    derives it from the logger's version, which for W&B is the run's unique id, not the arm)."""
    for callback in callbacks or []:
        if getattr(callback, "class_path", "").endswith("ModelCheckpoint") and not callback.init_args.get("dirpath"):
            callback.init_args.dirpath = str(folder)


def start_run(cfg, folder: Path) -> None:
    """A fit's run folder, on global rank 0 before anything is written: refused if it holds another run (or deleted
    with --overwrite true, runs.claim_for_fit); a W&B logger gets this run's own id."""
    if rank_zero_only.rank != 0:
        return
    claim_for_fit(folder, cfg.get("ckpt_path"), cfg.get("overwrite"))
    loggers = cfg.trainer.get("logger")
    for logger in loggers if isinstance(loggers, list) else [loggers]:
        if getattr(logger, "class_path", "").endswith("WandbLogger"):
            logger.init_args.version = wandb_run_id(folder, resuming=resumes(folder, cfg.get("ckpt_path")))


class RunFolderConfig(SaveConfigCallback):
    """Writes the run's settings into its run folder (`run_folder`) for every logger, on rank 0 only: config.yaml for
    fit, <subcommand>-config.yaml for the others (runs.config_file_name)."""

    def save_config(self, trainer, pl_module, stage) -> None:
        folder = run_folder(trainer)
        folder.mkdir(parents=True, exist_ok=True)
        self.parser.save(self.config, str(folder / config_file_name(trainer.state.fn.value)), skip_none=False,
                         overwrite=self.overwrite, multifile=self.multifile)


def check_checkpoint(cfg, subcommand: str) -> None:
    """Start-up checks of --ckpt_path: it exists, and a checkpoint file's architecture is the configured one; an
    evaluation without a checkpoint needs --allow_random_weights."""
    ckpt = cfg.get("ckpt_path")
    if ckpt is None:
        if subcommand != "fit" and not cfg.get("allow_random_weights"):
            raise ConfigError(f"{subcommand} without --ckpt_path would evaluate random initial weights: give "
                              f"--ckpt_path <checkpoint> (or --allow_random_weights true)")
        return
    path = Path(ckpt)
    if path.is_file():
        checkpoint = read_checkpoint(path)
        saved = checkpoint.get("hyper_parameters", {}).get("arch")
        if saved is not None:
            check_architecture(saved, ModelConfig(**without_paths(cfg.model.arch.as_dict())), source=str(path))
        check_tokenizer(checkpoint, cfg.data.tokenizer, source=str(path))
    elif not path.exists() and ckpt not in CKPT_KEYWORDS and not ckpt.startswith("registry"):
        raise ConfigError(f"--ckpt_path: no such checkpoint file or folder: {ckpt}")


def without_paths(cfg):
    """The config as plain data, without jsonargparse's `__path__` entries (where nested files came from)."""
    if isinstance(cfg, dict):
        return {k: without_paths(v) for k, v in cfg.items() if k != "__path__"}
    return cfg


def expand_extends(argv: list[str]) -> list[str]:
    """Replace each `--config FILE` (or `-c FILE`, `--config=FILE`) whose YAML starts with `extends: BASE` by
    `--config BASE --config <FILE's other settings>`, recursively. Relative file names inside FILE stay relative to
    FILE's folder."""
    out, i = [], 0
    while i < len(argv):
        arg = argv[i]
        if arg in CONFIG_FLAGS and i + 1 < len(argv):
            out += _config_args(argv[i + 1])
            i += 2
            continue
        out += _config_args(arg.split("=", 1)[1]) if arg.startswith("--config=") else [arg]
        i += 1
    return out


def _config_args(value: str) -> list[str]:
    path = Path(value)
    if not path.is_file():
        if value.endswith((".yaml", ".yml", ".json")) and ": " not in value and "\n" not in value:
            raise ConfigError(f"config file not found: {value}")
        return ["--config", value]  # a YAML string
    (base, _), *extending = config_chain(path)
    return ["--config", str(base)] + [arg for file, settings in extending
                                      for arg in ("--config", f"{ORIGIN_MARK}{file}\n{yaml.safe_dump(settings)}")]


def with_source(message: str, argv: list[str]) -> str:
    """The message of a configuration error, followed by where the field it names was set: the config file
    (through `extends:` and section files) or the command line that set it last."""
    found = KEY_IN_MESSAGE.search(message)
    if not found:
        return message
    key = found[1] or found[2] or f"{SECTION_OF[found[3]]}.{found[4]}"
    source = None
    for i, arg in enumerate(argv):
        if arg in CONFIG_FLAGS and i + 1 < len(argv):
            source = _file_setting(argv[i + 1], key.split(".")) or source
        elif arg == f"--{key}" or arg.startswith(f"--{key}="):
            source = "on the command line"
    return f"{message} [{key} set {source}]" if source else message


def _file_setting(value: str, keys: list[str]) -> str | None:
    """Where a --config value (a file, an extending file's YAML string, or a YAML string) sets the dotted key,
    following section files (`model: base/model.yaml`); None when it does not set it."""
    if value.startswith(ORIGIN_MARK):
        origin, text = Path(value[len(ORIGIN_MARK):].partition("\n")[0]), value
    elif Path(value).is_file():
        origin, text = Path(value), Path(value).read_text()
    else:
        origin, text = None, value
    tree = yaml.safe_load(text)
    for key in keys:
        if isinstance(tree, str) and tree.endswith((".yaml", ".yml")):  # a section file: the rest of the key is in it
            origin = (origin.parent if origin else Path()) / tree
            if not origin.is_file():
                return None
            tree = yaml.safe_load(origin.read_text())
        if not isinstance(tree, dict) or key not in tree:
            return None
        tree = tree[key]
    return f"in {origin}" if origin else "in a --config string"


# Lightning's messages that say nothing a swax-lightning user can act on: (logger message start | warning text).
QUIET_LOGS = ("💡 Tip:", "TPU available:", "HPU available:", "`weights_only` was not set")
QUIET_WARNINGS = (r".*isinstance\(treespec, LeafSpec\)` is deprecated",  # inside Lightning, fixed by Lightning
                  r".*Your `IterableDataset` has `__len__` defined")       # litdata sizes each rank and worker itself


class _Quiet(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith(QUIET_LOGS)


def quiet_lightning() -> None:
    """Drops Lightning's messages listed in QUIET_LOGS and QUIET_WARNINGS; everything else is shown."""
    for name in ("lightning.pytorch", "lightning.fabric"):
        logging.getLogger(name).addFilter(_Quiet())
        for handler in logging.getLogger(name).handlers:
            handler.addFilter(_Quiet())
    for pattern in QUIET_WARNINGS:
        warnings.filterwarnings("ignore", message=pattern)


class _ParseOnly(SwaxCLI):
    """The settings only: nothing is seeded or built, no file is read but the configs."""

    def _set_seed(self) -> None:
        pass

    def instantiate_classes(self) -> None:
        pass


def read_run_config(path: str | Path) -> dict:
    """A run config file's settings exactly as `main.py` reads them (extends:, section files, every default), as
    plain data, without building the model, data or trainer: for tools such as the memory estimate."""
    return without_paths(_ParseOnly(LanguageModule, TextDataModule, run=False, args=["--config", str(path)],
                                    seed_everything_default=0).config.as_dict())


def main(args: list[str] | None = None) -> None:
    """`python main.py ...` and `swax fit|validate|test|predict ...`: runs the command line `args` (default:
    sys.argv[1:])."""
    quiet_lightning()
    SwaxCLI(LanguageModule, TextDataModule, seed_everything_default=0, save_config_callback=RunFolderConfig,
            save_config_kwargs={"overwrite": True, "save_to_log_dir": False},
            args=args)
