"""Metric hook for the task YAML files beside this file (lm-eval resolves `!function utils.<name>` here)."""
from swax_lightning.evals.code_exec import pass_at_1  # noqa: F401
