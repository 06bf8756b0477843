"""The module names of the flat layout before the move to subpackages (swax-lightning 0.1.0, until December 2026),
answered by their new homes, so that nothing written against the old names breaks silently.

- `import swax_lightning.config` (or a pickle, a YAML `class_path: swax_lightning.window.StochasticWindow`) gets the
  module at its new name, with a DeprecationWarning naming it.
- `python -m swax_lightning.retrofit run ...` (an old command) says in one line that the command is now
  `swax retrofit`, then runs it with the same arguments; an old module that was no command says so, exit code 2.

A meta-path finder, installed by `import swax_lightning`, answers only the names in MOVED; new names never reach it.
"""
from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys
import warnings

MOVED = {
    "atomic": "core.atomic", "environment": "core.environment",
    "config": "model.config", "attention": "model.attention", "mlstm": "model.mlstm", "deltanet": "model.deltanet",
    "building_blocks": "model.building_blocks", "cache": "model.cache", "model": "model.model",
    "inference": "model.inference", "hf_model": "model.hf_model",
    "corpus": "data.corpus", "data": "data.datamodule", "tokenizer": "data.tokenizer",
    "train_tokenizer": "data.train_tokenizer", "shards": "data.shards", "remote": "data.remote",
    "loss_mask": "data.loss_mask", "recall_documents": "data.recall_documents", "mqar": "data.mqar_episodes",
    "module": "training.module", "window": "training.window", "checkpoints": "training.checkpoints",
    "runs": "training.runs", "numerics": "training.numerics", "throughput": "training.throughput",
    "strategy": "training.strategy", "parallel": "training.parallel", "watchdog": "training.watchdog",
    "hf_import": "pretrained.hf_import", "lora": "pretrained.lora", "retrofit": "pretrained.retrofit",
    "retrofit_experiment": "pretrained.experiment", "retrofit_report": "pretrained.report",
    "study": "study.sweep", "cli": "commands.cli", "generate": "commands.generate", "export": "commands.export",
    "memory": "commands.memory",
}
# The old `python -m swax_lightning.<module>` commands and their verbs.
OLD_COMMANDS = {"generate": "generate", "export": "export", "memory": "memory", "retrofit": "retrofit",
                "retrofit_experiment": "retrofit", "study": "study", "hf_import": "import",
                "checkpoints": "consolidate", "train_tokenizer": "tokenizer"}
PACKAGE = "swax_lightning"


def _old_name(fullname: str) -> str | None:
    """The old module's short name when `fullname` is one (a subpackage's own name, e.g. `swax_lightning.model`,
    is the new package, never the old module)."""
    package, _, name = fullname.rpartition(".")
    if package != PACKAGE or name not in MOVED or MOVED[name].split(".")[0] == name:
        return None
    return name


class _ToNewHome(importlib.abc.Loader):
    def __init__(self, name: str):
        self.name, self.new = name, f"{PACKAGE}.{MOVED[name]}"

    def create_module(self, spec):
        return None

    def exec_module(self, module) -> None:
        warnings.warn(f"{PACKAGE}.{self.name} is now {self.new}", DeprecationWarning, stacklevel=2)
        sys.modules[module.__name__] = importlib.import_module(self.new)  # the import system returns this entry

    def get_code(self, fullname: str):
        """What `python -m <old name>` runs."""
        verb = OLD_COMMANDS.get(self.name)
        if verb is None:
            source = (f"import sys\nprint('error: python -m {fullname} is no command (the module is now {self.new});"
                      f" the commands: swax --help', file=sys.stderr)\nraise SystemExit(2)\n")
        else:
            source = (f"import sys\nprint('note: python -m {fullname} is now `swax {verb}` (or python -m {PACKAGE} "
                      f"{verb})', file=sys.stderr)\nfrom {PACKAGE}.commands.swax import main\n"
                      f"main([{verb!r}, *sys.argv[1:]])\n")
        return compile(source, f"<{fullname}, moved>", "exec")


class MovedModules(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname: str, path=None, target=None):
        name = _old_name(fullname)
        if name is None:
            return None
        origin = f"{PACKAGE}.{MOVED[name]}"  # runpy makes it sys.argv[0]: a name, never None
        return importlib.util.spec_from_loader(fullname, _ToNewHome(name), origin=origin)


def install() -> None:
    if not any(isinstance(finder, MovedModules) for finder in sys.meta_path):
        sys.meta_path.append(MovedModules())
