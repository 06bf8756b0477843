"""Runs and their folders: where a run's settings, checkpoints, logs and evaluations go, decided in one place.

A named run (the config's `experiment:` and `arm:`) lives in <save_dir>/<experiment>/<arm>/:
    config.yaml                the fit's settings (validate, test and predict write <subcommand>-config.yaml)
    checkpoints/last.ckpt      the newest finite state (checkpoints.py)
    events.out.tfevents.*      TensorBoard (a CSVLogger writes metrics.csv; W&B keeps its files in <save_dir>/wandb)
    eval/                      what `main.py test` wrote: results.json names the checkpoint it evaluated
    wandb-id                   the W&B run id of this run, so that a resumed fit continues the same W&B run

Decisions:
- One fit per folder: `main.py fit` into a folder that already holds a run is refused, in one line, unless it resumes
  that run (`--ckpt_path last`, or a checkpoint inside the folder) or `--overwrite true` is given, in which case the
  old folder is deleted before anything is written. A run is therefore never mixed with another in its checkpoints,
  TensorBoard files or config.yaml.
- An evaluation names its checkpoint by path, optimizer step and sha256 of the file (or of a distributed
  checkpoint's files), so a report or model card can never be attributed to another checkpoint.
- Runs without `experiment:` are named by the logger (Lightning's version_N folders), which never reuses a folder.
- A run folder never leaves its save_dir: `experiment` and `arm` are plain names (letters, digits, `.`, `_`, `+`,
  `-`; not `.` or `..`), refused in one line naming the field otherwise, and the joined folder must resolve inside
  save_dir (no link out). `--overwrite true` deletes only a folder that holds a run of this framework (its
  config.yaml beside checkpoints/ or logger files); anything else in the way is refused, not deleted.
"""
from __future__ import annotations

import hashlib
import re
import shutil
import uuid
from pathlib import Path

from lightning.pytorch.loggers import CSVLogger, TensorBoardLogger

from swax_lightning.core.errors import ConfigError
from swax_lightning.core.safe_load import load_as_data

WANDB_ID_FILE = "wandb-id"
CKPT_KEYWORDS = ("last", "best", "hpc")  # --ckpt_path values that Lightning resolves itself
PLAIN_NAME = re.compile(r"[A-Za-z0-9_+\-.]+")
RUN_MARKS = ("checkpoints", "metrics.csv")  # beside config.yaml, what a run folder of this framework holds


def run_dir(save_dir: str | Path | None, experiment: str, arm: str | None) -> Path:
    """<save_dir>/<experiment>/<arm> (arm "default" when not set), refused unless both are plain names and the folder
    resolves inside save_dir."""
    for field, name in (("experiment", experiment), ("arm", arm or "default")):
        if not isinstance(name, str) or not PLAIN_NAME.fullmatch(name) or name in (".", ".."):
            raise ConfigError(f"{field} {name!r} must be a plain folder name (letters, digits, '.', '_', '+', '-'; "
                              f"not '.' or '..'): a run folder stays inside its save_dir")
    base = Path(save_dir or ".")
    folder = base / experiment / (arm or "default")
    if not folder.resolve().is_relative_to(base.resolve()):
        raise ConfigError(f"run folder {folder} resolves to {folder.resolve()}, outside save_dir {base.resolve()} "
                          f"(a link?): choose another experiment or arm")
    return folder


def holds_a_run(folder: Path) -> bool:
    """Whether `folder` holds a run of this framework: its config.yaml beside checkpoints/, or logger files."""
    return (folder / "config.yaml").is_file() and (any((folder / mark).exists() for mark in RUN_MARKS)
                                                   or any(folder.glob("events.out.tfevents.*")))


def run_folder(trainer) -> Path:
    """The folder of a running Trainer's run: the first logger's <save_dir>/<name>/<version> (for TensorBoard and CSV,
    their log_dir; for W&B <save_dir>/<project>/<run name>, its version being the run's unique id), the Trainer's
    default_root_dir without a logger."""
    if not trainer.loggers:
        return Path(trainer.default_root_dir)
    logger = trainer.loggers[0]
    if isinstance(logger, (TensorBoardLogger, CSVLogger)):
        return Path(logger.log_dir)
    run_name = getattr(logger, "_name", None)  # WandbLogger keeps the run name (the arm) there: its name is the project
    version = run_name or (logger.version if isinstance(logger.version, str) else f"version_{logger.version}")
    return Path(logger.save_dir or trainer.default_root_dir) / str(logger.name) / version


def config_file_name(subcommand: str) -> str:
    """config.yaml for fit; <subcommand>-config.yaml for the others, so an evaluation never replaces the fit's."""
    return "config.yaml" if subcommand == "fit" else f"{subcommand}-config.yaml"


def resumes(folder: Path, ckpt_path: str | None) -> bool:
    """Whether a fit given `ckpt_path` continues the run in `folder`."""
    if ckpt_path is None:
        return False
    if ckpt_path in CKPT_KEYWORDS:
        return True
    return folder.resolve() in Path(ckpt_path).resolve().parents


def claim_for_fit(folder: Path, ckpt_path: str | None, overwrite: bool) -> None:
    """Before a fit writes anything into `folder` (global rank 0): refuse a folder holding another run, or delete it
    when asked to (see the module docstring)."""
    if not folder.is_dir() or not any(folder.iterdir()) or resumes(folder, ckpt_path):
        return
    if not holds_a_run(folder):
        raise ConfigError(f"{folder} holds files that are no run of this framework (no config.yaml beside "
                          f"checkpoints/ or logs): nothing was deleted; name this run otherwise (--arm, --experiment)")
    if not overwrite:
        raise ConfigError(f"{folder} already holds a run: resume it with --ckpt_path last, name this run otherwise "
                          f"(--arm, --experiment), or replace it with --overwrite true")
    shutil.rmtree(folder)


def wandb_run_id(folder: Path, resuming: bool) -> str:
    """This run's W&B id: the one recorded in `folder` when the fit resumes it, else a new one (recorded)."""
    recorded = folder / WANDB_ID_FILE
    if resuming and recorded.is_file():
        return recorded.read_text().strip()
    run_id = f"{folder.name}-{uuid.uuid4().hex[:8]}"
    folder.mkdir(parents=True, exist_ok=True)
    recorded.write_text(run_id + "\n")
    return run_id


def checkpoint_identity(ckpt_path: str | Path | None) -> dict | None:
    """What an evaluation records of the checkpoint it evaluated: its path, the optimizer step it holds (read from it:
    a Trainer running `test` does not restore its global_step) and its content hash."""
    if ckpt_path is None or not Path(ckpt_path).exists():
        return None
    path = Path(ckpt_path)
    saved = load_as_data(path / "meta.pt" if path.is_dir() else path, mmap=True)
    return {"path": str(path), "step": saved.get("global_step"), "sha256": content_hash(path)}


def content_hash(path: Path) -> str:
    """sha256 of a file, or of a folder's files (names and contents, in sorted order)."""
    digest = hashlib.sha256()
    files = sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]
    for file in files:
        if path.is_dir():
            digest.update(file.relative_to(path).as_posix().encode() + b"\0")
        with open(file, "rb") as f:
            while block := f.read(1 << 24):
                digest.update(block)
    return "sha256:" + digest.hexdigest()


def same_checkpoint(identity: dict | None, ckpt_path: str | Path) -> bool:
    """Whether an evaluation's recorded checkpoint is the file at ckpt_path (by content)."""
    return bool(identity) and identity.get("sha256") == content_hash(Path(ckpt_path))
