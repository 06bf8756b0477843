"""Prompts for generation and prediction: given on the command line or config, then one per non-empty line of a
file. Data, not model: `main.py predict` (the data module) and `swax generate` both read them here."""
from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path


def read_prompts(prompts: Sequence[str] | None = None, prompts_file: str | Path | None = None) -> list[str]:
    """The given prompts, then the non-empty lines of prompts_file."""
    texts = list(prompts or [])
    if prompts_file:
        path = Path(prompts_file)
        if not path.is_file():
            raise FileNotFoundError(f"prompts file not found: {path}")
        texts += [line for line in path.read_text().splitlines() if line.strip()]
    return texts
