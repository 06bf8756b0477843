"""The checkout's top-level `kernels/` folder never takes the import name `kernels` from an installed package.

kernels/ sits at the top of the repository (the layout the project keeps) and is imported as swax_lightning.kernels
(the link swax_lightning/kernels -> ../kernels in a checkout, the install's package-dir otherwise). Whenever the
checkout's root is on sys.path (`python main.py`, `python -m swax_lightning` from the root, pytest's pythonpath), the
folder is also importable under the top-level name `kernels`, which is the import name of Hugging Face's kernels
package; transformers >= 5.25 depends on it (`from kernels import CUDAProperties`) and found this folder instead.

A meta-path finder, installed first by `import swax_lightning`, answers the top-level name `kernels` only: it looks
on sys.path without the checkout's root, so an installed `kernels` package wins; with none installed it steps aside
and nothing changes (nothing here imports the folder under that name). Every other name resolves as Python does it.
"""
from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
from pathlib import Path

NAME = "kernels"
# swax_lightning.kernels as it resolves: a checkout's top-level kernels/ (the link's target), or an installed package's
# own copy under swax_lightning/, which no sys.path entry holds as a top-level `kernels` (the finder then steps aside)
FOLDER = (Path(__file__).resolve().parents[1] / NAME).resolve()


def _is_checkout_root(entry: str) -> bool:
    try:
        return (Path(entry or ".") / NAME).resolve() == FOLDER
    except OSError:
        return False


class InstalledKernelsFirst(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname: str, path=None, target=None):
        if fullname != NAME or path is not None:
            return None
        elsewhere = [entry for entry in sys.path if not _is_checkout_root(entry)]
        return importlib.machinery.PathFinder.find_spec(NAME, elsewhere)


def install() -> None:
    if not any(isinstance(finder, InstalledKernelsFirst) for finder in sys.meta_path):
        sys.meta_path.insert(0, InstalledKernelsFirst())
