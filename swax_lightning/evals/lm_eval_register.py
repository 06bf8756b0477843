"""Registers the "swax" model with lm-evaluation-harness without importing torch, the model or this package.

lm-eval 0.4.13 looks models up in its registry only (no entry points), and its command line builds the model before
it loads any task file, so the name must be registered before the harness looks it up. Two ways in, both running
this file by its path (never as part of the package, whose import loads torch):
- setup.sh writes `swax_lm_eval.pth` into the environment's site-packages (STARTUP_LINE): Python runs it at every
  start-up, so `lm_eval --model swax` works from any folder;
- lm_eval_plugin/sitecustomize.py, for an environment without that file: put its folder on PYTHONPATH.
At start-up it only installs an import hook (nothing of lm-eval is imported then: starting Python stays as fast): as
soon as lm-eval's model package `lm_eval.models` has been imported, which the harness does before any model lookup,
"swax" is registered as a lazy "module:class" placeholder that the harness imports on first use (and which the
adapter's own @register_model upgrades in place). Without lm-eval installed nothing happens.
"""
from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys

TARGET = "swax_lightning.evals.lm_eval_adapter:SwaxLM"
MODELS = "lm_eval.models"  # lm-eval's package of model names, imported before any model lookup
# The line of swax_lm_eval.pth (setup.sh): this file, found through the installed package without importing it.
STARTUP_LINE = ("import importlib.util as u, os, runpy; s = u.find_spec('swax_lightning'); "
                "p = s and os.path.join(s.submodule_search_locations[0], 'evals', 'lm_eval_register.py'); "
                "p and os.path.isfile(p) and runpy.run_path(p)")


def register() -> bool:
    """Adds "swax" to lm-eval's model registry; False when lm-eval is not installed."""
    try:
        import lm_eval.models  # noqa: F401  the harness's own names first (it imports them only into an empty registry)
        from lm_eval.api.registry import model_registry
    except ImportError:
        return False
    if "swax" not in model_registry:
        model_registry.register("swax", target=TARGET)
    return True


class RegisterAfterModels(importlib.abc.MetaPathFinder):
    """Finds lm_eval.models as Python would, and registers "swax" right after that module has run."""

    def find_spec(self, fullname: str, path=None, target=None):
        if fullname != MODELS:
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is not None and spec.loader is not None:
            run = spec.loader.exec_module

            def exec_module(module) -> None:
                run(module)
                register()

            spec.loader.exec_module = exec_module
        return spec


def write_startup_file() -> str:
    """swax_lm_eval.pth in this environment's site-packages, holding STARTUP_LINE (setup.sh calls this)."""
    import sysconfig
    from pathlib import Path

    path = Path(sysconfig.get_paths()["purelib"]) / "swax_lm_eval.pth"
    path.write_text(STARTUP_LINE + "\n")
    return str(path)


def install() -> None:
    if MODELS in sys.modules:
        register()
    # by name: the start-up file and sitecustomize each run this file afresh, so each has a class of its own
    elif not any(type(finder).__name__ == RegisterAfterModels.__name__ for finder in sys.meta_path):
        sys.meta_path.insert(0, RegisterAfterModels())


install()
