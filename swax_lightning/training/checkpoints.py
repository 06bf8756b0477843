"""Checkpoints: saving (`last.ckpt` is always the newest good state), loading (the one loader every tool uses), and
consolidation (a distributed checkpoint becomes one file that every 1-process tool loads).

LatestCheckpoint (a callback, listed in the trainer configs) writes <checkpoint dir>/last.ckpt
- every `every_n_train_steps` optimizer steps, after every validation during fit, and when training ends, so
  `--ckpt_path last` never goes back in time (Lightning's ModelCheckpoint(save_last=True) with a monitor writes only at
  validations: a run that ended between two of them left last.ckpt behind);
- at a step whose validation is due, only once that validation has finished: Lightning, resuming from a checkpoint
  written before a due validation, skips it for good. A crash during validation therefore resumes from the save before,
  and the validation runs again;
- never with non-finite weights (all ranks check their shards and agree; the old last.ckpt stays and a warning names
  the step);
- atomically (atomic.py): written beside the old one and renamed over it, for files and distributed folders; a save
  that fails (a full disk) removes its temporary file and ends the run in one line;
- after ModelCheckpoint's save of the same validation (Lightning calls checkpoint callbacks last, so LatestCheckpoint
  has them save first): the best path last.ckpt records exists and is the best, and a resume tracks (and so cleans
  up) every top-k file.

Loading: `read_checkpoint` reads a single-file checkpoint or says in one line why it cannot (a distributed folder,
with the consolidation command; a missing or unreadable file); `load_model` rebuilds the model with the architecture
the checkpoint records and the tokenizer it was trained with, checked by content: the tokenizer file at the recorded
path must still have the recorded fingerprint (a different tokenizer of the same size would score silently wrong).
`generate`, `export`, the lm-eval adapter and the CLI's start-up checks all load through here.

Consolidation (a command):

    python -m swax_lightning consolidate runs/<experiment>/<arm>/checkpoints/last.ckpt [--out last-full.ckpt]

turns a distributed checkpoint (a folder: one .distcp shard file per rank and meta.pt) into one Lightning checkpoint
file: full weights, and the AdamW state keyed by parameter index as a 1-process optimizer expects, so that
`swax_lightning.commands.generate`, `main.py test` and a 1-process `main.py fit --ckpt_path` load it.
"""
from __future__ import annotations

import argparse
import warnings
from pathlib import Path

import lightning
import torch
from lightning.pytorch.callbacks import Callback

from swax_lightning.core import atomic
from swax_lightning.core.errors import ConfigError, InputError, first_line
from swax_lightning.core.safe_load import load_as_data
from swax_lightning.data.tokenizer import load_tokenizer
from swax_lightning.training.runs import run_folder

LAST = "last.ckpt"


class LatestCheckpoint(Callback):
    """Keeps <checkpoint dir>/last.ckpt at the newest finite state (see the module docstring).

    Args:
        every_n_train_steps: Also save every this many optimizer steps (0 = only after validations and at the end).
        dirpath: Folder of last.ckpt (default: the ModelCheckpoint's folder, else <run folder>/checkpoints).
    """

    def __init__(self, every_n_train_steps: int = 0, dirpath: str | None = None):
        if every_n_train_steps < 0:
            raise ValueError(f"LatestCheckpoint.every_n_train_steps must be >= 0 (got {every_n_train_steps})")
        self.every_n_train_steps, self.dirpath = every_n_train_steps, dirpath
        self._saved_step = -1
        self.written: Path | None = None  # last.ckpt once this run has written it

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        step = trainer.global_step
        n = self.every_n_train_steps
        if n and step % n == 0 and step != self._saved_step and not _validation_due(trainer):
            self.save(trainer, pl_module)

    def on_validation_end(self, trainer, pl_module) -> None:
        if trainer.state.fn == "fit" and not trainer.sanity_checking:
            for callback in trainer.checkpoint_callbacks:  # Lightning runs them after us: their save goes first, so
                try:                                            # last.ckpt records it (their own call then skips)
                    callback.on_validation_end(trainer, pl_module)
                except OSError as err:  # Lightning writes through an fsspec transaction: nothing half-written stays
                    raise _save_failed(trainer.global_step, f"a checkpoint in {callback.dirpath}", err) from err
            self.save(trainer, pl_module)

    def on_train_end(self, trainer, pl_module) -> None:
        if trainer.global_step != self._saved_step:
            self.save(trainer, pl_module)

    def save(self, trainer, pl_module) -> None:
        step = trainer.global_step
        self._saved_step = step
        if not _all_finite(trainer, pl_module):
            warnings.warn(f"step {step}: the weights are not finite; {LAST} keeps the previous state", stacklevel=2)
            return
        folder = Path(trainer.strategy.broadcast(str(self.folder(trainer))))
        final = folder / LAST
        tmp = atomic.temporary_sibling(final, tag="save")  # one name for every rank's shard
        if trainer.is_global_zero:
            folder.mkdir(parents=True, exist_ok=True)
            atomic.remove(tmp)
        trainer.strategy.barrier("LatestCheckpoint.clean")
        try:
            trainer.save_checkpoint(tmp)  # every rank writes its shard; ends with a barrier
        except OSError as err:  # a full disk, a lost mount: no half-written file stays beside the good one
            atomic.remove(tmp)
            raise _save_failed(step, str(final), err) from err
        if trainer.is_global_zero:
            atomic.replace(tmp, final)
        trainer.strategy.barrier("LatestCheckpoint.replace")
        self.written = final

    def folder(self, trainer) -> Path:
        """Where last.ckpt goes."""
        if self.dirpath:
            return Path(self.dirpath)
        if trainer.checkpoint_callback is not None and trainer.checkpoint_callback.dirpath:
            return Path(trainer.checkpoint_callback.dirpath)
        return run_folder(trainer) / "checkpoints"


def _save_failed(step: int, what: str, err: OSError) -> InputError:
    return InputError(f"step {step}: saving {what} failed ({err.strerror or err}); {LAST} keeps the state before, "
                      f"and no half-written file is left")


def _validation_due(trainer) -> bool:
    """Whether Lightning validates right after this training batch (its own rule, evaluated at on_train_batch_end)."""
    loop = trainer.fit_loop
    return loop.epoch_loop._should_check_val_fx(loop._data_fetcher)


def _all_finite(trainer, pl_module) -> bool:
    local = all(bool(torch.isfinite(_local(p)).all()) for p in pl_module.parameters())
    return trainer.strategy.reduce_boolean_decision(local, all=True)


def _local(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.to_local() if hasattr(tensor, "to_local") else tensor  # a DTensor shard: this rank's part


# ---- loading ------------------------------------------------------------------------------------------------------
def is_distributed_checkpoint(path: str | Path) -> bool:
    path = Path(path)
    return path.is_dir() and (path / "meta.pt").is_file()


def read_checkpoint(path: str | Path, map_location: str = "cpu") -> dict:
    """A single-file checkpoint (memory-mapped: no copy of the weights until used), or one clear error."""
    path = Path(path)
    if is_distributed_checkpoint(path):
        raise ConfigError(f"{path} is a distributed checkpoint (one shard per rank): make one file of it first with "
                          f"python -m swax_lightning consolidate {path}")
    if not path.is_file():
        raise FileNotFoundError(f"checkpoint not found: {path}")
    try:
        return load_as_data(path, map_location, mmap=True)
    except InputError:
        raise
    except Exception as err:  # noqa: BLE001 - truncated, or not a torch file: reported as such
        raise ConfigError(f"cannot read checkpoint {path}: {err}") from err


def checkpoint_tokenizer(checkpoint: dict, source: str | Path):
    """The tokenizer a checkpoint was trained with (its data section), refused if the file at the recorded path no
    longer has the recorded content fingerprint."""
    data = checkpoint.get("datamodule_hyper_parameters", {})
    spec, recorded = data.get("tokenizer", "byte"), data.get("tokenizer_fingerprint")
    tokenizer = load_tokenizer(spec)
    if recorded is not None and recorded != tokenizer.fingerprint:
        raise ConfigError(f"{source} was trained with the tokenizer {spec} of fingerprint {recorded}, but that file "
                          f"now holds another tokenizer ({tokenizer.fingerprint}): restore the original file")
    return tokenizer


def check_tokenizer(checkpoint: dict, configured: str, source: str) -> None:
    """A run given a checkpoint must tokenize as the checkpoint was trained: the configured tokenizer's content
    fingerprint must be the one the checkpoint records (checkpoints written before fingerprints were recorded pass)."""
    recorded = checkpoint.get("datamodule_hyper_parameters", {}).get("tokenizer_fingerprint")
    fingerprint = load_tokenizer(configured).fingerprint
    if recorded is not None and recorded != fingerprint:
        raise ConfigError(f"data.tokenizer {configured} ({fingerprint}) is not the tokenizer {source} was trained "
                          f"with ({recorded}): set data.tokenizer to that file")


def model_from_checkpoint(checkpoint: dict, source: str | Path):
    """(model in eval mode, tokenizer) from a checkpoint dict, with the architecture it records."""
    from swax_lightning.training.module import LanguageModule  # the module builds models; it does not load files

    module = LanguageModule(**checkpoint.get("hyper_parameters", {}))
    module.on_load_checkpoint(checkpoint)
    module.load_state_dict(checkpoint["state_dict"])
    return module.model.eval(), checkpoint_tokenizer(checkpoint, source)


def model_checkpoint(state: dict, cfg, data: dict, **extra) -> dict:
    """The checkpoint of a model made outside `main.py fit` (an import, a retrofit), as fit writes it, so that
    load_model, `main.py test`, generate and export read it: the weights `state` (SWAXModel's names) under `model.`,
    LanguageModule's hyper-parameters for the ModelConfig `cfg`, `data` as TextDataModule records its
    hyper-parameters (the tokenizer file and its fingerprint at least), and any `extra` entries (provenance)."""
    from swax_lightning.training.module import LanguageModule  # the module builds models; it does not write files

    return {"state_dict": {f"model.{name}": tensor for name, tensor in state.items()},
            "hyper_parameters": dict(LanguageModule(arch=cfg).hparams), "datamodule_hyper_parameters": data,
            "pytorch-lightning_version": lightning.__version__, "epoch": 0, "global_step": 0, **extra}


def load_model(ckpt_path: str | Path, device: str = "cpu"):
    """(model in eval mode, tokenizer) from a checkpoint file written by main.py fit (or swax import)."""
    return model_from_checkpoint(read_checkpoint(ckpt_path, device), ckpt_path)


def refuse_nothing_to_resume(ckpt_path, trainer) -> None:
    """`--ckpt_path last` where no LatestCheckpoint has written last.ckpt: Lightning warns and trains from scratch
    into the old run's folder; here it is one line."""
    places = [c.folder(trainer) / LAST for c in trainer.callbacks if isinstance(c, LatestCheckpoint)]
    if ckpt_path == "last" and places and not any(place.exists() for place in places):
        raise ConfigError(f"--ckpt_path last: there is no {', '.join(map(str, places))} to resume from: leave "
                          f"--ckpt_path out to start this run")


# ---- consolidation ------------------------------------------------------------------------------------------------

def refuse_unloadable_checkpoint(ckpt_path, strategy) -> None:
    """A distributed checkpoint loads only under a sharding strategy (any number of processes): say so, with the
    consolidation command, instead of failing inside torch.load."""
    from lightning.pytorch.strategies import ModelParallelStrategy

    if ckpt_path and is_distributed_checkpoint(ckpt_path) and not isinstance(strategy, ModelParallelStrategy):
        raise ValueError(f"ckpt_path {ckpt_path} is a distributed checkpoint (one shard per rank): load it with "
                         "--trainer.strategy fsdp2 (any number of devices), or make one file of it first: "
                         f"python -m swax_lightning consolidate {ckpt_path}")


def consolidate(folder: str | Path, out: str | Path) -> Path:
    """Write the single-file equivalent of the distributed checkpoint `folder` to `out` (atomically)."""
    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint.api import CheckpointException
    from torch.distributed.checkpoint.format_utils import _EmptyStateDictLoadPlanner
    from torch.distributed.checkpoint.state_dict_loader import _load_state_dict

    folder, out = Path(folder), Path(out)
    if not is_distributed_checkpoint(folder):
        raise FileNotFoundError(f"not a distributed checkpoint (a folder with meta.pt and .distcp shards): {folder}")
    checkpoint = load_as_data(folder / "meta.pt")
    shards: dict = {}
    try:  # read every shard into full tensors, without a process group
        _load_state_dict(shards, storage_reader=FileSystemReader(folder), planner=_EmptyStateDictLoadPlanner(),
                         no_dist=True)
    except (Exception, CheckpointException) as err:  # a damaged shard raises the latter, a BaseException
        raise InputError(f"cannot read the shards of distributed checkpoint {folder}: {first_line(err)}") from err
    checkpoint["state_dict"] = shards.pop("state_dict")
    optimizers = sorted((k for k in shards if k.startswith("optimizer_")), key=lambda k: int(k.split("_")[1]))
    checkpoint["optimizer_states"] = [_keyed_by_index(shards[k]) for k in optimizers]
    with atomic.written_atomically(out) as tmp:
        torch.save(checkpoint, tmp)
    return out


def _keyed_by_index(state: dict) -> dict:
    """An optimizer state keyed by parameter name (distributed checkpoints) -> keyed by index (torch.optim): indices
    count the parameters group by group, in order, as Optimizer.state_dict numbers them."""
    index = {name: i for i, name in enumerate(n for group in state["param_groups"] for n in group["params"])}
    groups = [dict(group, params=[index[n] for n in group["params"]]) for group in state["param_groups"]]
    return {"state": {index[name]: value for name, value in state["state"].items()}, "param_groups": groups}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m swax_lightning consolidate",
                                     description="Turn a distributed checkpoint folder into one checkpoint file.")
    parser.add_argument("folder", help="distributed checkpoint (e.g. runs/<experiment>/<arm>/checkpoints/last.ckpt)")
    parser.add_argument("--out", help="output file (default: <folder without .ckpt>-full.ckpt beside it)")
    args = parser.parse_args(argv)
    folder = Path(args.folder)
    out = Path(args.out) if args.out else folder.with_name(f"{folder.name.removesuffix('.ckpt')}-full.ckpt")
    try:
        print(f"wrote {consolidate(folder, out)}")
    except (FileNotFoundError, ValueError) as err:
        parser.exit(2, f"error: {err}\n")


if __name__ == "__main__":
    main()
