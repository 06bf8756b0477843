"""SwaxCLI: LightningCLI with the window schedule and run naming that every swax-lightning run shares.

- `window:` (a YAML section) configures the StochasticWindow callback, always installed: a fixed window, the
  paper's stochastic mix, or empty for the model's own window.
- `eval:` configures the EvalSuite callback (swax_lightning/evals/suite.py), always installed: the evaluations that
  `main.py test` runs after its test loop (none when empty).
- `experiment:` and `arm:` name the run: a TensorBoardLogger then writes to runs/<experiment>/<arm>/ (its save_dir,
  then name = experiment, version = arm), so `tensorboard --logdir runs` lines the arms of a study up side by side,
  and a rerun or resume of an arm continues in the same folder.
- `extends: other.yaml` at the top of a config file puts that file's settings first, then this file's on top (deep
  merge, as with several --config): an arm differing from another in one field is a three-line file.
- After `fit`, the run's settings (model, data, window schedule) and its final validation metrics are written as one
  TensorBoard HPARAMS entry (hp/val_loss, hp/val_bpb), so the HPARAMS tab compares arms by their settings. Set the
  logger's default_hp_metric to false to keep Lightning's placeholder hp_metric out of it.
"""
from __future__ import annotations

import sys
from pathlib import Path

import yaml
from lightning.pytorch.cli import LightningCLI

from swax_lightning import strategy  # noqa: F401  (registers --trainer.strategy fsdp2 and hsdp)
from swax_lightning.checkpoints import refuse_unloadable_checkpoint
from swax_lightning.evals.suite import EvalSuite
from swax_lightning.window import StochasticWindow


class SwaxCLI(LightningCLI):
    def parse_arguments(self, parser, args) -> None:
        if args is None:
            self.config = parser.parse_args(expand_extends(sys.argv[1:]))
        else:
            super().parse_arguments(parser, expand_extends(args) if isinstance(args, list) else args)

    def add_arguments_to_parser(self, parser) -> None:
        parser.add_lightning_class_args(StochasticWindow, "window")
        parser.add_lightning_class_args(EvalSuite, "eval")
        parser.add_argument("--experiment", type=str | None, default=None,
                            help="Study name: TensorBoard runs go to <save_dir>/<experiment>/<arm>/")
        parser.add_argument("--arm", type=str | None, default=None,
                            help="Arm of the study (e.g. w128, stochastic_p0.5): the run's folder name")

    def before_instantiate_classes(self) -> None:
        cfg = self.config[self.subcommand] if self.subcommand else self.config
        logger = cfg.trainer.get("logger")
        if cfg.get("experiment") and getattr(logger, "class_path", "").endswith("TensorBoardLogger"):
            logger.init_args.name = cfg.experiment
            logger.init_args.version = cfg.arm or "default"

    def _run_subcommand(self, subcommand: str) -> None:
        refuse_unloadable_checkpoint(self.config_init[subcommand].get("ckpt_path"), self.trainer.strategy)
        super()._run_subcommand(subcommand)

    def after_fit(self) -> None:
        logger = self.trainer.logger
        if logger is None:
            return
        cfg = _without_paths(self.config[self.subcommand].as_dict())
        params = {key: cfg.get(key) for key in ("experiment", "arm", "seed_everything", "model", "data", "window")}
        params["trainer"] = {k: cfg["trainer"].get(k) for k in ("max_steps", "precision", "accumulate_grad_batches")}
        found = self.trainer.callback_metrics
        metrics = {f"hp/{name.replace('val/', 'val_')}": float(found[name]) for name in ("val/loss", "val/bpb")
                   if name in found}
        logger.log_hyperparams(params, metrics=metrics or None)
        logger.finalize("success")  # the Trainer already closed the writer; flush the one this call reopened


def _without_paths(cfg):
    """The config as plain data, without jsonargparse's `__path__` entries (where nested files came from)."""
    if isinstance(cfg, dict):
        return {k: _without_paths(v) for k, v in cfg.items() if k != "__path__"}
    return cfg


def expand_extends(argv: list[str]) -> list[str]:
    """Replace each `--config FILE` whose YAML starts with `extends: BASE` by `--config BASE --config <FILE's
    other settings>`, recursively. Relative file names inside FILE stay relative to FILE's folder."""
    out, i = [], 0
    while i < len(argv):
        arg = argv[i]
        if arg == "--config" and i + 1 < len(argv):
            out += _config_args(argv[i + 1])
            i += 2
            continue
        out += _config_args(arg.split("=", 1)[1]) if arg.startswith("--config=") else [arg]
        i += 1
    return out


def _config_args(value: str) -> list[str]:
    path = Path(value)
    if not path.is_file():
        return ["--config", value]  # a YAML string, or a missing file (jsonargparse reports it)
    cfg = yaml.safe_load(path.read_text()) or {}
    if not isinstance(cfg, dict) or "extends" not in cfg:
        return ["--config", value]
    base = path.parent / cfg.pop("extends")
    if not base.is_file():
        raise FileNotFoundError(f"{path}: extends a missing file {base}")
    for key, val in cfg.items():  # section files named in FILE, made absolute
        if isinstance(val, str) and val.endswith((".yaml", ".yml")) and (path.parent / val).is_file():
            cfg[key] = str((path.parent / val).resolve())
    return _config_args(str(base)) + ["--config", yaml.safe_dump(cfg)]
