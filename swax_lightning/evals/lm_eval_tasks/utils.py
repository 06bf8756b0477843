"""Hooks for the task YAML files beside this file (lm-eval resolves `!function utils.<name>` here): pass@1 through
the contained executor (code_exec.py), and MBPP's fixed few-shot examples.

The harness's own mbpp task prompts with MBPP task ids 2, 3 and 4 (rows of MBPP's prompt split, Austin et al. 2021,
CC BY 4.0), not with the first rows of the prompt split; mbpp_fewshot.json holds those three rows as the dataset
has them, since the harness's module that lists them loads the hub's code_eval metric on import.
"""
import json
from pathlib import Path

from swax_lightning.evals.code_exec import pass_at_1  # noqa: F401


def fewshot_samples() -> list[dict]:
    return json.loads((Path(__file__).parent / "mbpp_fewshot.json").read_text())
