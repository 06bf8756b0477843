"""Reading a torch file as data, never as code: every checkpoint, progress file and distributed checkpoint's meta.pt
of the framework goes through `load_as_data`.

A pickle can name any callable, and torch.load(weights_only=False) calls it while reading: a checkpoint downloaded
from elsewhere would run its code before any check. weights_only=True unpickles tensors, containers and plain values
only, which is all the framework writes (its checkpoints hold state dicts, hyper-parameters as dicts and the loops'
and callbacks' states); anything else is refused in one line naming the file, before it runs.
"""
from __future__ import annotations

import pickle
from pathlib import Path

import torch

from swax_lightning.core.errors import InputError


def load_as_data(path: str | Path, map_location="cpu", mmap: bool = False):
    """torch.load(path) with weights_only=True; a file that asks for more than data is an InputError naming it."""
    try:
        return torch.load(path, map_location=map_location, weights_only=True, mmap=mmap)
    except pickle.UnpicklingError as err:
        reason = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise InputError(f"{path} holds more than data (it names code to run when read; refused, nothing ran): "
                         f"{reason}") from None
