"""Registers the "swax" model with lm-evaluation-harness without importing torch, the model or this package.

lm-eval 0.4.13 looks models up in its registry only (no entry points), and its command line builds the model before
it loads any task file, so the name must be registered when Python starts: lm_eval_plugin/sitecustomize.py runs
this file when that folder is on PYTHONPATH. It imports nothing of swax_lightning, whose package imports torch. The
registration is a lazy "module:class" placeholder, which the harness imports on first use (and which the adapter's
own @register_model upgrades in place).
"""
from __future__ import annotations

TARGET = "swax_lightning.evals.lm_eval_adapter:SwaxLM"


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


register()
