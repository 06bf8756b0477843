"""Integrity of litdata shard folders: what was written is what is read, or an error names the file.

A split folder (`train/`, `val/`, `test/`) holds litdata's `index.json` and the `chunk-*.bin` files it lists.

Decisions:
- Content checksums (sha256 of every file of every split) are recorded in meta.json when the shards are written and
  compared before training: a file that kept its size but not its content (random but valid ids, ids outside the
  vocabulary) is refused at start by name, not at step 594 with a bare IndexError. Hashing reads every byte once
  (about 1 GB/s); `verify_checksums=False` in the data module keeps only the cheap size check for huge corpora.
- The size check against the index runs first and always: a missing or truncated file gets the plainest message.
- Block counts come from the index alone (`dim` tokens per chunk; a block never straddles a chunk), so a corpus too
  small for one batch is refused without opening a chunk.
"""
from __future__ import annotations

import hashlib
from pathlib import Path

from swax_lightning.core import atomic
from swax_lightning.core.errors import InputError


def read_index(split_dir: Path) -> dict:
    index = split_dir / "index.json"
    if not index.exists():
        raise FileNotFoundError(f"shard index missing: {index}")
    return atomic.read_json(index, f"delete {split_dir.parent} to prepare the shards again")


def split_tokens(split_dir: Path) -> int:
    return sum(chunk["dim"] for chunk in read_index(split_dir)["chunks"])


def split_blocks(split_dir: Path, block: int) -> int:
    """Whole blocks of `block` tokens the split yields (each chunk's tail shorter than a block is dropped)."""
    return sum(chunk["dim"] // block for chunk in read_index(split_dir)["chunks"])


def check_sizes(split_dir: Path) -> None:
    """Every chunk file listed in the index exists with the size the index records."""
    found = {path.name: path.stat().st_size for path in split_dir.iterdir() if path.is_file()}
    check_listed_sizes(read_index(split_dir), found, str(split_dir))


def check_listed_sizes(index: dict, found: dict[str, int], folder: str) -> None:
    """The chunks a split's index lists against {file name: bytes} of what its folder (local or in a bucket) holds;
    the first missing or wrong-sized one is named."""
    for chunk in index["chunks"]:
        name, expected = chunk["filename"], chunk["chunk_bytes"]
        if name not in found:
            raise FileNotFoundError(f"shard missing: {folder}/{name} (listed in {folder}/index.json)")
        if found[name] != expected:
            raise InputError(f"shard corrupt: {folder}/{name} has {found[name]} bytes, the index records {expected}")


def file_sha256(path: Path) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def checksums(root: Path, splits: tuple[str, ...]) -> dict[str, str]:
    """{"train/chunk-0-0.bin": sha256, ...} for every file of every split folder under root."""
    return {path.relative_to(root).as_posix(): file_sha256(path)
            for split in splits for path in sorted((root / split).iterdir()) if path.is_file()}


def check_checksums(root: Path, recorded: dict[str, str]) -> None:
    """Every file recorded at preparation still has its content; the first that does not is named."""
    for name, digest in recorded.items():
        path = root / name
        if not path.exists():
            raise FileNotFoundError(f"shard missing: {path} (recorded in {root / 'meta.json'})")
        if file_sha256(path) != digest:
            raise InputError(f"shard corrupt: {path} no longer has the content written at preparation (its sha256 "
                             f"differs from {root / 'meta.json'}); delete {root} to prepare the shards again")
