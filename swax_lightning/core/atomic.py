"""Atomic writes: nothing half-written ever replaces good data.

A file or folder is built under a temporary sibling name (a dot, the name, the writer's pid) and renamed into place
only once complete, so a reader sees the old version or the new one, never a mix, and a crash leaves the old one.
A file is replaced in one rename; a folder, which cannot be renamed over a non-empty one, goes through a short-lived
`.old` sibling that is removed once the new folder is in place.
- `read_json` reads such a file back and names it when it is not JSON (a file edited or damaged by hand): the
  caller's one-line InputError, never a bare JSONDecodeError.
"""
from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from swax_lightning.core.errors import InputError


def temporary_sibling(path: Path, tag: str | None = None) -> Path:
    """The temporary name `path` is built under: .<name>.tmp-<tag> (tag: the pid unless given, e.g. one name that
    every rank of a distributed save agrees on)."""
    return path.with_name(f".{path.name}.tmp-{os.getpid() if tag is None else tag}")


def remove(path: Path) -> None:
    """Remove a file or a folder, if there."""
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    elif path.exists() or path.is_symlink():
        path.unlink()


def replace(new: Path, final: Path) -> None:
    """Put the finished file or folder `new` at `final`, replacing what is there."""
    final.parent.mkdir(parents=True, exist_ok=True)
    if new.is_file() and not final.is_dir():
        os.replace(new, final)
        return
    old = final.with_name(f".{final.name}.old-{os.getpid()}")
    remove(old)
    if final.exists():
        os.replace(final, old)
    os.replace(new, final)
    remove(old)


@contextmanager
def written_atomically(path: str | Path) -> Iterator[Path]:
    """`with written_atomically(p) as tmp:` write the file or folder `tmp`; on success it replaces `p`, on an error
    (Ctrl-C included) it is removed and `p` is untouched."""
    path = Path(path)
    tmp = temporary_sibling(path)
    remove(tmp)
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        yield tmp
        replace(tmp, path)
    finally:
        remove(tmp)


def write_text(path: str | Path, text: str) -> None:
    """Replace the file `path` by `text`, atomically."""
    with written_atomically(path) as tmp:
        tmp.write_text(text)


def write_json(path: str | Path, content: dict) -> None:
    """`content` as indented JSON, written atomically."""
    write_text(path, json.dumps(content, indent=2) + "\n")


def read_json(path: str | Path, remedy: str = "remove it to measure it again") -> dict:
    """The JSON in `path`; InputError naming the file and the remedy when it is unreadable or not JSON."""
    try:
        return json.loads(Path(path).read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise InputError(f"{path} is corrupt ({err}): {remedy}") from err
