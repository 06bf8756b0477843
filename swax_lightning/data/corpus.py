"""Text sources: the embedded default corpus (present on every machine, no download) and a user's own folder.

The embedded corpus (docs/design.md section 10) is the Python standard library itself: its non-test `.py`
sources (~12 MB of code and docstrings) plus the English prose of the language reference in `pydoc_data.topics`
(~465k characters). A user's source is a folder (or one file) of .txt, .md, .py files (one document each) and .jsonl
files (one document per line, from the field "text").

Decisions:
- Documents are referenced by small picklable strings so that litdata's `optimize` workers can read them.
- The train/val/test split is by document, from a stable hash of the document's name, which is its path relative to
  the source's root (the standard library's folder for the embedded corpus): the split is the same on every machine
  and wherever the folder is moved, adding files never moves an existing document to another split, and the
  held-out text is never trained on. Validation takes the lowest hash bucket, test the next one, so raising
  test_fraction never moves a validation document.
- Files that are not valid UTF-8 are skipped, but never silently: the caller passes a list that collects them and
  reports the count with examples (the few stdlib files that are not UTF-8 are tests, left out of the corpus).
"""
from __future__ import annotations

import hashlib
import json
import sysconfig
from collections.abc import Iterator
from pathlib import Path

from swax_lightning.core.errors import InputError

EMBEDDED = "embedded"
TEXT_SUFFIXES = (".txt", ".md", ".py", ".jsonl")
_TOPIC_PREFIX = "pydoc_data.topics:"


def _stdlib_root() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def _stdlib_sources() -> list[str]:
    root = _stdlib_root()
    skip = {"test", "tests", "idle_test", "site-packages", "dist-packages", "__pycache__"}
    files = [p for p in root.rglob("*.py") if not skip & set(p.relative_to(root).parts[:-1])
             and not p.name.startswith("test_")]
    return sorted(str(p) for p in files)


def document_refs(source: str) -> list[str]:
    """Every readable input of a source: file paths, plus pydoc topic keys for the embedded corpus."""
    if source == EMBEDDED:
        from pydoc_data.topics import topics

        return _stdlib_sources() + [_TOPIC_PREFIX + key for key in sorted(topics)]
    path = Path(source)
    if not path.exists():
        raise FileNotFoundError(f"data source not found: {path} (use 'embedded' or a folder of "
                                f"{', '.join(TEXT_SUFFIXES)} files)")
    files = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.suffix in TEXT_SUFFIXES)
    if not files:
        raise FileNotFoundError(f"data source {path} holds no {', '.join(TEXT_SUFFIXES)} files")
    return [str(p) for p in files]


def document_name(ref: str, source: str) -> str:
    """The name of the document(s) behind a ref, the same wherever the source lives: the path relative to the
    source's root (the standard library's folder for the embedded corpus; the file name for a one-file source), or
    the pydoc topic key."""
    if ref.startswith(_TOPIC_PREFIX):
        return ref
    root = _stdlib_root() if source == EMBEDDED else Path(source)
    return Path(ref).name if root.is_file() else Path(ref).relative_to(root).as_posix()


def read_documents(ref: str, source: str, undecodable: list[str] | None = None) -> Iterator[tuple[str, str]]:
    """(name, text) for each document behind one ref of `source` (names from document_name: a .jsonl line is
    "<name>:<line index>"); a file that is not UTF-8 yields nothing and is appended to `undecodable` when given."""
    name = document_name(ref, source)
    if ref.startswith(_TOPIC_PREFIX):
        from pydoc_data.topics import topics

        yield ref, topics[ref[len(_TOPIC_PREFIX):]]
        return
    try:
        text = Path(ref).read_text(encoding="utf-8")
    except UnicodeDecodeError:
        if undecodable is not None:
            undecodable.append(ref)
        return
    if not ref.endswith(".jsonl"):
        yield name, text
        return
    for line_no, line in enumerate(text.splitlines()):
        if line.strip():
            try:
                yield f"{name}:{line_no}", json.loads(line)["text"]
            except (json.JSONDecodeError, KeyError, TypeError) as err:
                raise InputError(f"{ref} line {line_no + 1}: expected a JSON object with a 'text' field") from err


def split_of(name: str, val_fraction: float, test_fraction: float) -> str:
    """Stable document-level split ("train", "val" or "test"): the same document always lands in the same split."""
    bucket = int.from_bytes(hashlib.sha1(name.encode()).digest()[:4], "big") / 2 ** 32
    if bucket < val_fraction:
        return "val"
    return "test" if bucket < val_fraction + test_fraction else "train"
