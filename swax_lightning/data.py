"""TextDataModule: tokenized text in litdata shards, streamed in blocks of seq_len + 1 tokens.

prepare_data() turns a text source (corpus.py) into two litdata datasets, `train/` and `val/`, under `data_dir`,
unless they are already there; training streams them with StreamingDataset + StreamingDataLoader.

Decisions:
- Shards are written with litdata's `optimize` and `TokensLoader` (documents concatenated, each followed by the
  end-of-text id), with a chunk size that is a multiple of seq_len + 1 so no block straddles a chunk
  (../shared/DESIGN.md section 8).
- Nothing half-written replaces good data: shards are written to a temporary sibling folder and renamed into place;
  an existing `data_dir` is reused only if its meta.json matches the source, tokenizer and seq_len.
- Before training, every shard named by each index.json is checked to exist with its recorded size, so a missing or
  truncated file is reported by name instead of failing deep inside a worker.
- Resume mid-epoch is Lightning's: it saves the StreamingDataLoader state in the checkpoint.
- Bits per byte needs bytes per token; it is measured on the validation split when the shards are written and kept
  in meta.json (exactly 1 minus the end-of-text share for the byte tokenizer).
"""
from __future__ import annotations

import functools
import json
import os
import re
import shutil
import sys
from pathlib import Path

import lightning as L
import numpy as np
from litdata import StreamingDataLoader, StreamingDataset, TokensLoader, optimize
from torch.utils.data import DataLoader

from swax_lightning.corpus import EMBEDDED, document_refs, is_validation, read_documents
from swax_lightning.inference import read_prompts
from swax_lightning.tokenizer import load_tokenizer

SPLITS = ("train", "val")
CHUNK_TOKENS = 1 << 22  # ~4M tokens per shard file, rounded down to whole blocks
# fork needs no importable __main__ (notebooks, stdin, pytest) and starts fast; macOS keeps its default (spawn).
START_METHOD = "fork" if sys.platform == "linux" else None


@functools.lru_cache(maxsize=4)
def _tokenizer(spec: str):
    return load_tokenizer(spec)


def tokenize_ref(ref: str, tokenizer: str, split: str, val_fraction: float):
    """litdata `optimize` worker: yields one token array per document of `ref` that belongs to `split`."""
    tok = _tokenizer(tokenizer)
    dtype = np.uint16 if tok.vocab_size <= 1 << 16 else np.int32
    for name, text in read_documents(ref):
        if is_validation(name, val_fraction) == (split == "val"):
            yield np.asarray(tok.encode(text) + [tok.eos_id], dtype=dtype)


class TextDataModule(L.LightningDataModule):
    """Token blocks from litdata shards.

    Args:
        source: "embedded" (the Python standard library's sources and reference prose: on every machine), a folder
            or file of .txt/.md/.py/.jsonl text, or null to use shards already in data_dir.
        tokenizer: "byte" (257 ids, no file) or a path to a HF tokenizers tokenizer.json.
        data_dir: Where the shards go; empty = data/<source name>-<tokenizer>-<seq_len>.
        seq_len: Tokens per training sequence (each block holds seq_len + 1 tokens: inputs and shifted targets).
        batch_size: Sequences per micro-batch per device.
        val_fraction: Share of documents held out for validation (split by document).
        num_workers: DataLoader worker processes.
        seed: Shuffle seed of the training stream.
        prompts: Prompts for `main.py predict` (continued with the model's `generation` settings).
        prompts_file: A text file with one prompt per line, for `main.py predict`.
    """

    def __init__(self, source: str | None = EMBEDDED, tokenizer: str = "byte", data_dir: str | None = None,
                 seq_len: int = 512, batch_size: int = 16, val_fraction: float = 0.02, num_workers: int = 0,
                 seed: int = 0, prompts: list[str] | None = None, prompts_file: str | None = None):
        super().__init__()
        self.save_hyperparameters()  # kept in checkpoints: inference finds the tokenizer there
        if seq_len < 1:
            raise ValueError(f"TextDataModule.seq_len must be >= 1 (got {seq_len})")
        if batch_size < 1:
            raise ValueError(f"TextDataModule.batch_size must be >= 1 (got {batch_size})")
        if not 0 < val_fraction < 1:
            raise ValueError(f"TextDataModule.val_fraction must be in (0, 1) (got {val_fraction})")
        if source is None and data_dir is None:
            raise ValueError("TextDataModule: set `source` (to build shards) or `data_dir` (existing shards)")
        self.source, self.tokenizer_spec = source, tokenizer
        self.seq_len, self.batch_size, self.val_fraction = seq_len, batch_size, val_fraction
        self.num_workers, self.seed = num_workers, seed
        self.prompts, self.prompts_file = list(prompts or []), prompts_file
        self.data_dir = Path(data_dir or f"data/{self._slug()}")
        self.meta: dict = {}
        self.datasets: dict[str, StreamingDataset] = {}

    def _slug(self) -> str:
        src = "embedded" if self.source == EMBEDDED else Path(self.source).name
        tok = "byte" if self.tokenizer_spec == "byte" else Path(self.tokenizer_spec).stem
        return re.sub(r"[^A-Za-z0-9_.-]+", "_", f"{src}-{tok}-{self.seq_len}")

    def _expected_meta(self) -> dict:
        return {"source": self.source, "tokenizer": self.tokenizer_spec, "seq_len": self.seq_len,
                "val_fraction": self.val_fraction}

    @property
    def tokenizer(self):
        return _tokenizer(self.tokenizer_spec)

    # ---- writing -------------------------------------------------------------------------------------------
    def prepare_data(self) -> None:
        if (self.data_dir / "meta.json").exists() or self.source is None:
            return  # checked in setup(): reused if it matches, an error naming the mismatch otherwise
        refs = document_refs(self.source)
        self.tokenizer  # load it here: a missing tokenizer file is reported by name, not from inside a worker
        block = self.seq_len + 1
        chunk = max(1, CHUNK_TOKENS // block) * block
        tmp = self.data_dir.with_name(f".{self.data_dir.name}.tmp-{os.getpid()}")
        shutil.rmtree(tmp, ignore_errors=True)
        try:
            for split in SPLITS:
                fn = functools.partial(tokenize_ref, tokenizer=self.tokenizer_spec, split=split,
                                       val_fraction=self.val_fraction)
                optimize(fn=fn, inputs=refs, output_dir=str(tmp / split), chunk_size=chunk,
                         item_loader=TokensLoader(), num_workers=1, reorder_files=False, verbose=False,
                         start_method=START_METHOD)
            meta = self._expected_meta() | self._measure(refs, tmp)
            (tmp / "meta.json").write_text(json.dumps(meta, indent=2))
            tmp.parent.mkdir(parents=True, exist_ok=True)
            os.replace(tmp, self.data_dir)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)

    def _measure(self, refs: list[str], out: Path) -> dict:
        """Tokens per split (from the indexes) and bytes per token of the validation text."""
        tok, n_bytes, n_tokens = self.tokenizer, 0, 0
        for ref in refs:
            for name, text in read_documents(ref):
                if is_validation(name, self.val_fraction):
                    n_bytes += len(text.encode("utf-8"))
                    n_tokens += len(tok.encode(text)) + 1
        counts = {f"{split}_tokens": sum(c["dim"] for c in _read_index(out / split)["chunks"]) for split in SPLITS}
        for split in SPLITS:
            if counts[f"{split}_tokens"] < self.seq_len + 1:
                raise ValueError(f"the {split} split of {self.source} has {counts[f'{split}_tokens']} tokens, fewer "
                                 f"than one block of seq_len + 1 = {self.seq_len + 1}: add text or change "
                                 f"val_fraction / seq_len")
        return counts | {"vocab_size": tok.vocab_size, "bytes_per_token": n_bytes / max(n_tokens, 1)}

    # ---- reading -------------------------------------------------------------------------------------------
    def setup(self, stage: str | None = None) -> None:
        meta_path = self.data_dir / "meta.json"
        if not meta_path.exists():
            raise FileNotFoundError(f"no shards in {self.data_dir} ({meta_path} missing): set `source` to build "
                                    f"them, or point data_dir at a folder written by this data module")
        self.meta = json.loads(meta_path.read_text())
        expected = self._expected_meta() if self.source is not None else {"seq_len": self.seq_len}
        wrong = {k: (self.meta.get(k), v) for k, v in expected.items() if self.meta.get(k) != v}
        if wrong:
            raise ValueError(f"{meta_path} was written for other settings (field: (on disk, configured)): {wrong}; "
                             f"use another data_dir or delete {self.data_dir}")
        for split in SPLITS:
            check_shards(self.data_dir / split)
            self.datasets[split] = StreamingDataset(
                str(self.data_dir / split), item_loader=TokensLoader(block_size=self.seq_len + 1),
                shuffle=(split == "train"), drop_last=(split == "train"), seed=self.seed)

    def _loader(self, split: str) -> StreamingDataLoader:
        return StreamingDataLoader(self.datasets[split], batch_size=self.batch_size, num_workers=self.num_workers,
                                   drop_last=(split == "train"))

    def train_dataloader(self):
        return self._loader("train")

    def val_dataloader(self):
        return self._loader("val")

    def test_dataloader(self):
        return self._loader("val")

    def predict_dataloader(self):
        """Batches of prompt strings (data.prompts, then the lines of data.prompts_file)."""
        prompts = read_prompts(self.prompts, self.prompts_file)
        if not prompts:
            raise ValueError("main.py predict needs --data.prompts '[...]' or --data.prompts_file FILE")
        return DataLoader(prompts, batch_size=self.batch_size, collate_fn=list)


def _read_index(split_dir: Path) -> dict:
    index = split_dir / "index.json"
    if not index.exists():
        raise FileNotFoundError(f"shard index missing: {index}")
    try:
        return json.loads(index.read_text())
    except json.JSONDecodeError as err:
        raise ValueError(f"shard index is corrupt: {index} ({err})") from err


def check_shards(split_dir: Path) -> None:
    """Every chunk file listed in the index exists with the size the index records."""
    for chunk in _read_index(split_dir)["chunks"]:
        path = split_dir / chunk["filename"]
        if not path.exists():
            raise FileNotFoundError(f"shard missing: {path} (listed in {split_dir / 'index.json'})")
        if path.stat().st_size != chunk["chunk_bytes"]:
            raise ValueError(f"shard corrupt: {path} has {path.stat().st_size} bytes, the index records "
                             f"{chunk['chunk_bytes']}")
