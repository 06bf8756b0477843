"""The one reader of the framework's YAML files, run configs (`main.py fit --config`) and experiment configs
(`swax retrofit run`) alike.

Decisions:
- A file may name a file it extends (`extends: base.yaml`, relative to itself); its own settings win. The CLI hands
  the chain to jsonargparse as one `--config` per file, oldest first (`config_chain`), so that LightningCLI merges
  them as it merges any two configs; an experiment config is merged here, section by section (`merged_config`).
- A value that names an existing `.yaml` file beside the config (a section file, `model: base/tiny_model.yaml`) is
  made absolute, so the chain reads the same from any working folder.
- A missing file, a file that is not YAML or not a mapping, and a missing base are ConfigErrors naming the file.
"""
from __future__ import annotations

from pathlib import Path

import yaml

from swax_lightning.core.errors import ConfigError


def read_config_file(path: Path) -> tuple[Path | None, dict]:
    """One config file: (the file its `extends:` names, or None; its other settings, with the section files it
    names made absolute)."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"config file not found: {path}")
    try:
        cfg = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as err:
        raise ConfigError(f"{path}: not valid YAML: {err}") from err
    if not isinstance(cfg, dict):
        raise ConfigError(f"{path}: must be a mapping of settings")
    for key, val in cfg.items():
        if isinstance(val, str) and val.endswith((".yaml", ".yml")) and (path.parent / val).is_file():
            cfg[key] = str((path.parent / val).resolve())
    if "extends" not in cfg:
        return None, cfg
    base = path.parent / cfg.pop("extends")
    if not base.is_file():
        raise ConfigError(f"{path}: extends a missing file {base}")
    return base, cfg


def config_chain(path: Path) -> list[tuple[Path, dict]]:
    """(file, its own settings) of `path` and every file it extends, the base first."""
    chain, seen = [], set()
    current: Path | None = Path(path)
    while current is not None:
        if current.resolve() in seen:
            raise ConfigError(f"{path}: `extends:` runs in a circle through {current}")
        seen.add(current.resolve())
        base, settings = read_config_file(current)
        chain.append((current, settings))
        current = base
    return chain[::-1]


def merged_config(path: Path) -> dict:
    """The settings of `path` with every file it extends, merged section by section (a later file wins)."""
    merged: dict = {}
    for _, settings in config_chain(path):
        merged = deep_merge(merged, settings)
    return merged


def deep_merge(base: dict, over: dict) -> dict:
    out = dict(base)
    for key, value in over.items():
        nested = isinstance(value, dict) and isinstance(out.get(key), dict)
        out[key] = deep_merge(out[key], value) if nested else value
    return out
