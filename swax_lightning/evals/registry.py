"""The evaluations `main.py test` can run, one class per evaluation in its own file, and the table the suite loops
over: a new evaluation is one file with one `@register`ed class (docs/extending.md).

What an evaluation says of itself (the Evaluation interface):
- `order`: where it runs among the others (the long generative ones first, the harness last);
- `name`: its key everywhere: the YAML field under `eval:` (`eval.niah.tasks`), its section of results.json, its
  TensorBoard scalars (`eval/<name>/...`);
- `Settings`: a dataclass of its fields, each documented in its docstring (LightningCLI shows and checks them);
- `check(arch, data)`: refuse, before any work, what cannot run (a length too short for its prompt), naming the field;
- `workload()`: (prompts, prompt tokens, generated tokens at most) for the cost estimate printed before the suite;
- `run(model, data, samples)`: its results section (appending one record per sample to `samples`);
- `report(section)`, `scalars(section)`, `figures(section)`: its part of results.md, its TensorBoard scalars, and
  the figures written beside the reports and to TensorBoard. They read the section alone, so reports can be
  rebuilt from a results.json.

Decisions:
- `load_all` imports, once, every module of this package that registers an evaluation (its source holds
  `@register`), so the table is complete without a list of files to keep in step, and modules that only serve one
  (the lm-eval adapter, which imports the harness) load when that evaluation runs.
- An evaluation runs when its section is given (`eval.niah: {...}`), not when a list inside it is non-empty.
- Settings given as a mapping (a retrofit config, a test) are built into the dataclass here, with an unknown field
  a ConfigError naming `eval.<name>.<field>`.
"""
from __future__ import annotations

import importlib
import pkgutil
from dataclasses import asdict, fields
from pathlib import Path
from typing import ClassVar

from swax_lightning.core.errors import ConfigError


class Evaluation:
    """One evaluation; `context` is the suite (seed, chunk_len, essay, and `generate` for generated answers)."""

    name: ClassVar[str]
    title: ClassVar[str]
    order: ClassVar[int]
    Settings: ClassVar[type]
    # (key of the section's rows or None for a list section, tag format such as "eval/x/{gap}", {scalar: row key})
    scalar_rows: ClassVar[tuple[str | None, str, dict[str, str]] | None] = None

    def __init__(self, settings, context):
        self.settings, self.context = settings, context

    def check(self, arch, data) -> None:
        """Refuses settings that cannot run with this model config and data module (ConfigError naming the field)."""

    def workload(self) -> tuple[int, int, int] | None:
        """(prompts, prompt tokens, generated tokens at most); None: not estimated."""
        return None

    def run(self, model, data, samples: list) -> dict:
        raise NotImplementedError

    def record(self) -> dict:
        """Its settings as results.json records them."""
        return asdict(self.settings)

    @classmethod
    def report(cls, section: dict) -> list[str]:
        return []

    @classmethod
    def scalars(cls, section: dict) -> dict[str, float]:
        """TensorBoard scalars: by default {tag.format_map(row)/name: row[key]} for every row and every (name, key)
        of `scalar_rows`'s metrics; none where it is None."""
        if cls.scalar_rows is None:
            return {}
        rows_key, tag, metrics = cls.scalar_rows
        rows = section if rows_key is None else section[rows_key]
        return {f"{tag.format_map(row)}/{name}": row[key] for row in rows for name, key in metrics.items()}

    @classmethod
    def figures(cls, section: dict) -> dict:
        """{name: matplotlib figure}: written as <name>.png beside the reports, and to TensorBoard as eval/<name>."""
        return {}


EVALUATIONS: dict[str, type[Evaluation]] = {}


def register(cls: type[Evaluation]) -> type[Evaluation]:
    EVALUATIONS[cls.name] = cls
    return cls


def load_all() -> dict[str, type[Evaluation]]:
    """Imports every evaluation module of this package once; returns the table."""
    folder = Path(__file__).parent
    for info in pkgutil.iter_modules([str(folder)]):
        if not info.ispkg and "\n@register\n" in (folder / f"{info.name}.py").read_text():
            importlib.import_module(f"{__package__}.{info.name}")
    ordered = sorted(EVALUATIONS.items(), key=lambda item: item[1].order)
    EVALUATIONS.clear()
    EVALUATIONS.update(ordered)
    return EVALUATIONS


def build_settings(name: str, value):
    """The Settings of evaluation `name` from a dataclass, a mapping or None (not run)."""
    cls = EVALUATIONS[name].Settings
    if value is None or isinstance(value, cls):
        return value
    if not isinstance(value, dict):
        raise ConfigError(f"eval.{name} must be a mapping of its fields (got {value!r})")
    known = {f.name for f in fields(cls)}
    unknown = sorted(set(value) - known)
    if unknown:
        raise ConfigError(f"eval.{name}.{unknown[0]}: unknown field (known: {', '.join(sorted(known))})")
    return cls(**value)
