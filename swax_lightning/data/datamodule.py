"""TextDataModule: tokenized text in litdata shards, streamed in blocks of seq_len + 1 tokens.

prepare_data() turns a text source (corpus.py) into three litdata datasets, `train/`, `val/` and `test/` (split by
document), under `data_dir`, unless they are already there; training streams them with StreamingDataset +
StreamingDataLoader. `main.py validate` reads `val/`, `main.py test` the held-out `test/` split.

Decisions:
- The source is read and tokenized once, by one worker process per core (inputs dealt round-robin) into staging
  files per split; litdata's `optimize` then writes each split's shards from them in one process, so the shards are
  byte for byte those of a single process whatever the number of cores. A worker's failure is raised by the parent
  naming the input; Ctrl-C is held back while workers start, so none is left running that nothing stops.
- Shards hold documents concatenated, each followed by the end-of-text id (`TokensLoader`), in chunks of a multiple
  of seq_len + 1 tokens so no block straddles a chunk (docs/design.md section 8).
- Nothing half-written replaces good data: shards are written to a temporary sibling folder and renamed into place;
  an interrupted preparation removes that folder and stops its workers (litdata's own Ctrl-C handler, which exits
  with status 0 and orphans a worker, is replaced meanwhile); a killed one's folder is removed by the next. An
  existing `data_dir` is reused only if its meta.json matches the source, tokenizer and seq_len; a folder without a
  readable meta.json is refused, never re-tokenised over. Two preparations of one folder on one machine take turns
  on a lock file: the second reuses the first's shards.
- Everything checkable is checked in prepare_data/setup, before any training step, naming the field or file: the
  tokenizer against the one the shards were made with (content fingerprint), each shard's size and checksum
  (shards.py), a train split of at least one batch per device and worker.
- The training documents are written in a fixed shuffled order (a pure function of the document list): litdata
  shuffles chunks and the items inside each, so a short run reads one chunk's documents only, and in source order
  those would be a few neighbouring files, or none of the recall documents appended after the text.
- `recall` adds synthetic long-range recall documents (recall_documents.py) to the training split only, so
  validation and test losses stay those of the source's text; meta.json records their tokens and share. They are
  written from `seed` (the run's), so the default folder's name carries a digest of the mix and the seed. An
  associative-recall document's tokens other than its queried values are written marked context-only (int32
  shards; loss_mask.py), so that training scores the values alone.
- A recall mix with a short-gap phase (`short_gap_steps`) gets a fourth split, `short_gaps/`: MQAR documents whose
  gaps stay short, and no text. Training reads it for those first steps, then the training split (PhasedLoader,
  phased_loader.py: the switch is counted in batches, so a resumed run switches where an uninterrupted one does).
- `data_dir` may be an s3:// folder (remote.py): prepared in a local cache by the same code, checked and uploaded
  once for the cluster (global rank 0), streamed by litdata through that cache on every node.
- Resume mid-epoch is Lightning's: it saves the StreamingDataLoader state in the checkpoint.
- Validation and test read the split as one fixed list of batches, the same for any number of ranks: rank r of W
  takes batches r, r + W, ... and every rank gets exactly ceil(n / W), the missing ones padding batches (a real
  batch of weight 0: it runs the forward, which FSDP2 needs on every rank, and counts in no metric). So no rank
  waits on another and the token-weighted losses equal a 1-process run's over the same batches. litdata's own split
  deals whole chunks (uneven counts), and Lightning's DistributedSampler repeats real samples (counted twice).
  `limit_val_batches` / `limit_test_batches` apply per rank: an integer L on W ranks evaluates the first L x W
  batches of the list, as a 1-process run with limit L x W.
- Bits per byte needs bytes per token; it is measured on the validation split when the shards are written and kept
  in meta.json (exactly 1 minus the end-of-text share for the byte tokenizer).
"""
from __future__ import annotations

import functools
import hashlib
import json
import math
import multiprocessing
import os
import random
import re
import shutil
import signal
import sys
import tempfile
import traceback
import warnings
from contextlib import contextmanager
from dataclasses import asdict
from pathlib import Path

import lightning as L
import numpy as np
import torch
from filelock import FileLock
from litdata import StreamingDataLoader, StreamingDataset, TokensLoader, optimize
from litdata.processing.data_processor import DataProcessor
from litdata.streaming.resolver import Dir
from torch.utils.data import DataLoader, Dataset, DistributedSampler

from swax_lightning.core import atomic
from swax_lightning.core.errors import ConfigError, InputError
from swax_lightning.data import loss_mask
from swax_lightning.data.corpus import EMBEDDED, document_refs, read_documents, split_of
from swax_lightning.data.loss_mask import mark
from swax_lightning.data.phased_loader import PhasedLoader
from swax_lightning.data.prompts import read_prompts
from swax_lightning.data.recall_documents import RecallMix, training_pieces
from swax_lightning.data.remote import RemoteFolder, default_cache_dir, remote_url
from swax_lightning.data.shards import check_checksums, check_sizes, checksums, read_index, split_blocks, split_tokens
from swax_lightning.data.tokenizer import load_tokenizer

RECALL_PREFIX = "recall:"
SHORT_GAP_PREFIX = "recall-short-gaps:"
TRAIN_ORDER = "shuffled"  # recorded in meta.json: shards written in source order are not reused
SPLIT_BY = "relative path"  # recorded in meta.json: shards split by absolute path (machine-dependent) are not reused
SPLITS = ("train", "val", "test")
SHORT_GAPS = "short_gaps"  # the short-gap phase's split (RecallMix.short_gap_steps), when there is one
CHUNK_TOKENS = 1 << 22  # ~4M tokens per shard file, rounded down to whole blocks


def shuffled(refs: list[str]) -> list[str]:
    """The training split's document order: a fixed permutation of `refs` (the same on every machine)."""
    order = list(refs)
    random.Random(f"train-order-{len(order)}").shuffle(order)
    return order


# fork needs no importable __main__ (notebooks, stdin, pytest) and starts fast; macOS keeps its default (spawn).
START_METHOD = "fork" if sys.platform == "linux" else None
UNDECODABLE_EXAMPLES = 3


@functools.lru_cache(maxsize=4)
def _tokenizer(spec: str):
    return load_tokenizer(spec)


def tokenize_ref(position: int, refs: list[str], source: str, tokenizer: str, val_fraction: float,
                 test_fraction: float, recall: dict | None, recall_seed: int, staging: Path) -> None:
    """Reads `refs[position]` once and writes the tokens of its documents, each followed by the end-of-text id, to
    staging/<position>.npz, one array per split (a recall document, ref "recall:<index>", belongs to the training
    split; a short-gap phase's one, "recall-short-gaps:<index>", to `short_gaps`), and to staging/<position>.json what
    meta.json needs from it: the validation text's bytes and tokens, the recall tokens, and the ref if it is not
    UTF-8."""
    ref = refs[position]
    tok = _tokenizer(tokenizer)
    mix = RecallMix(**recall) if recall else None
    dtype = np.uint16 if tok.vocab_size <= 1 << 16 and not (mix and mix.has_context_only) else np.int32
    splits = splits_of(mix)
    tokens = {split: [] for split in splits}
    counts = {"val_bytes": 0, "val_tokens": 0, "recall_tokens": 0, "undecodable": None}
    if ref.startswith((RECALL_PREFIX, SHORT_GAP_PREFIX)):
        split, pieces = recall_pieces(ref, mix, recall_seed)
        ids = [t for piece, scored in pieces for t in mark(tok.encode(piece), scored)] + [tok.eos_id]
        tokens[split].append(ids)
        counts["recall_tokens"] = len(ids) if split == "train" else 0
    else:
        undecodable = []
        for name, text in read_documents(ref, source, undecodable):
            split = split_of(name, val_fraction, test_fraction)
            tokens[split].append(tok.encode(text) + [tok.eos_id])
            if split == "val":
                counts["val_bytes"] += len(text.encode("utf-8"))
                counts["val_tokens"] += len(tokens[split][-1])
        counts["undecodable"] = undecodable[0] if undecodable else None
    np.savez(staging / f"{position}.npz", **{split: np.asarray([t for ids in tokens[split] for t in ids], dtype=dtype)
                                            for split in splits})
    (staging / f"{position}.json").write_text(json.dumps(counts))


def recall_pieces(ref: str, mix: RecallMix, seed: int) -> tuple[str, list[tuple[str, bool]]]:
    """(split, pieces) of a recall document's ref. A short-gap phase's documents take the indices after the training
    split's, so that their episodes are drawn apart from those."""
    if ref.startswith(SHORT_GAP_PREFIX):
        return SHORT_GAPS, training_pieces(mix.documents + int(ref[len(SHORT_GAP_PREFIX):]), mix.short_gap_phase,
                                           seed)
    return "train", training_pieces(int(ref[len(RECALL_PREFIX):]), mix, seed)


def splits_of(mix: RecallMix | None) -> tuple[str, ...]:
    """The split folders of a data folder: train, val, test, and short_gaps with a short-gap phase."""
    return SPLITS + ((SHORT_GAPS,) if mix and mix.short_gap_steps else ())


def tokenizing_worker(index: int, workers: int, refs: list[str], staging: Path, settings: dict) -> None:
    """One of `workers` processes: tokenizes inputs index, index + workers, ... (`tokenize_ref`). Ctrl-C is the
    parent's to handle, so SIGINT is ignored here; a failure is written to staging/worker-<index>.err, naming the
    input, and ends the process with status 1."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    for position in range(index, len(refs), workers):
        try:
            tokenize_ref(position, refs=refs, staging=staging, **settings)
        except Exception:  # noqa: BLE001 - reported to the parent, which raises it
            (staging / f"worker-{index}.err").write_text(f"{refs[position]}: {traceback.format_exc()}")
            sys.exit(1)


def staged_tokens(position: int, staging: Path, split: str):
    """litdata `optimize` worker: the staged tokens of input `position` for `split`. The inputs are positions, not
    refs: litdata treats inputs that name files as its input folder and wants every input to name one."""
    tokens = np.load(staging / f"{position}.npz")[split]
    if tokens.size:
        yield tokens


def within_vocabulary(tokens: torch.Tensor, vocab_size: int, where: Path) -> torch.Tensor:
    """The batch itself, or an InputError naming the split when it holds an id no tokenizer of this size produces
    (shards changed after preparation and not checked, data.verify_checksums false), instead of an IndexError deep in
    the embedding. Context-only marks (loss_mask.py) are not ids: they are removed before the check."""
    top = int(loss_mask.unmarked(tokens).max())
    if top >= vocab_size:
        raise InputError(f"{where} holds token id {top}, outside the tokenizer's {vocab_size} ids: its shards changed "
                         f"after preparation (data.verify_checksums true names the file) or come from another "
                         f"tokenizer")
    return tokens


def stack_within_vocabulary(items: list, vocab_size: int, where: Path) -> torch.Tensor:
    """The training loader's collate: the blocks stacked into a batch, checked by within_vocabulary."""
    return within_vocabulary(torch.stack([torch.as_tensor(item) for item in items]), vocab_size, where)


class HeldOutBatches(Dataset):
    """A held-out split as the fixed list of batches every run reads (module docstring): item j < n is batch j,
    {"tokens": [rows, block] tensor, "weight": 1.0}; item j >= n is a padding batch, batch j mod n with weight 0.0."""

    def __init__(self, blocks: StreamingDataset, n_blocks: int, batch_size: int, vocab_size: int, where: Path):
        self.blocks, self.n_blocks, self.batch_size = blocks, n_blocks, batch_size
        self.vocab_size, self.where = vocab_size, where
        self.n_batches = math.ceil(n_blocks / batch_size)

    def __len__(self) -> int:
        return self.n_batches

    def __getitem__(self, j: int) -> dict:
        start = (j % self.n_batches) * self.batch_size
        rows = [torch.as_tensor(self.blocks[i]) for i in range(start, min(start + self.batch_size, self.n_blocks))]
        tokens = within_vocabulary(torch.stack(rows), self.vocab_size, self.where)
        return {"tokens": tokens, "weight": 1.0 if j < self.n_batches else 0.0}


class DealtSampler(DistributedSampler):
    """Rank r of W takes batches r, r + W, ... up to ceil(n / W) of them, indices >= n standing for padding batches
    (HeldOutBatches). A DistributedSampler, so that Lightning keeps it instead of injecting its own."""

    def __init__(self, batches: HeldOutBatches, num_replicas: int, rank: int):
        super().__init__(batches, num_replicas=num_replicas, rank=rank, shuffle=False, drop_last=False)

    def __iter__(self):
        return iter(range(self.rank, self.total_size, self.num_replicas))


class TextDataModule(L.LightningDataModule):
    """Token blocks from litdata shards.

    Args:
        source: "embedded" (the Python standard library's sources and reference prose: on every machine), a folder
            or file of .txt/.md/.py/.jsonl text, or null to use shards already in data_dir.
        tokenizer: "byte" (257 ids, no file) or a path to a HF tokenizers tokenizer.json; must be the one the
            shards were made with.
        data_dir: Where the shards go; empty = data/<source name>-<tokenizer>-<seq_len>. An s3://bucket/folder is
            prepared locally once, uploaded, and streamed from the bucket (remote.py).
        cache_dir: For an s3:// data_dir: the local folder that mirrors it (meta.json, indexes, the chunks read so
            far); empty = data/cache/<bucket>/<folder>.
        storage_options: For an s3:// data_dir: options of litdata's S3 client, e.g. {endpoint_url: ...} for an
            S3-compatible store. Credentials belong in the usual AWS variables and files: the run's config.yaml
            records this field (checkpoints do not).
        seq_len: Tokens per training sequence (each block holds seq_len + 1 tokens: inputs and shifted targets).
        batch_size: Sequences per micro-batch per device.
        val_fraction: Share of documents held out for validation (split by document).
        test_fraction: Share of documents held out for `main.py test` (split by document, disjoint from val).
        num_workers: DataLoader worker processes.
        seed: Seed of the training stream's shuffle and of the recall documents (main.py sets it to the run's
            seed_everything: two seeds, two data orders and two recall corpora).
        verify_checksums: Compare every shard's sha256 with the one recorded at preparation before using it (reads
            the shards once, ~1 GB/s; sizes are always checked).
        recall: Synthetic long-range recall documents added to the training split (recall_documents.py:
            RecallMix fields, `documents` of them); empty = none. Validation and test stay the source's text.
        prompts: Prompts for `main.py predict` (continued with the model's `generation` settings).
        prompts_file: A text file with one prompt per line, for `main.py predict`.
    """

    def __init__(self, source: str | None = EMBEDDED, tokenizer: str = "byte", data_dir: str | None = None,
                 cache_dir: str | None = None, storage_options: dict | None = None, seq_len: int = 512,
                 batch_size: int = 16, val_fraction: float = 0.02, test_fraction: float = 0.02, num_workers: int = 0,
                 seed: int = 0, verify_checksums: bool = True, recall: RecallMix | None = None,
                 prompts: list[str] | None = None, prompts_file: str | None = None):
        super().__init__()
        # Kept in checkpoints (inference finds the tokenizer there); storage_options may hold credentials: not kept.
        self.save_hyperparameters(ignore=["storage_options"])
        if seq_len < 1:
            raise ValueError(f"TextDataModule.seq_len must be >= 1 (got {seq_len})")
        if batch_size < 1:
            raise ValueError(f"TextDataModule.batch_size must be >= 1 (got {batch_size})")
        if num_workers < 0:
            raise ValueError(f"TextDataModule.num_workers must be >= 0 (got {num_workers})")
        for name, fraction in (("val_fraction", val_fraction), ("test_fraction", test_fraction)):
            if not 0 < fraction < 1:
                raise ValueError(f"TextDataModule.{name} must be in (0, 1) (got {fraction})")
        if val_fraction + test_fraction >= 1:
            raise ValueError(f"TextDataModule.val_fraction + test_fraction must be < 1, leaving documents to train "
                             f"on (got {val_fraction} + {test_fraction})")
        if source is None and data_dir is None:
            raise ValueError("TextDataModule: set `source` (to build shards) or `data_dir` (existing shards)")
        self.source, self.tokenizer_spec = source, tokenizer
        self.seq_len, self.batch_size = seq_len, batch_size
        self.val_fraction, self.test_fraction = val_fraction, test_fraction
        self.num_workers, self.seed, self.verify_checksums = num_workers, seed, verify_checksums
        self.prompts, self.prompts_file = list(prompts or []), prompts_file
        self.recall = RecallMix(**recall) if isinstance(recall, dict) else recall
        self.remote, self.storage_options = remote_url(data_dir), dict(storage_options or {})
        if cache_dir is not None and self.remote is None:
            raise ValueError(f"TextDataModule.cache_dir is for an s3:// data_dir (got data_dir {data_dir!r})")
        if self.remote:
            self.data_dir = Path(cache_dir) if cache_dir else default_cache_dir(self.remote)
        else:
            self.data_dir = Path(data_dir or f"data/{self._slug()}")
        self.prepare_data_per_node = self.remote is None  # a bucket is prepared and uploaded once, not per node
        # Checkpoints record the tokenizer by content too: test, generate and export refuse another file at that path.
        self.hparams["tokenizer_fingerprint"] = self.tokenizer.fingerprint
        self.meta: dict = {}
        self.datasets: dict[str, StreamingDataset] = {}
        self._verified = False

    def _slug(self) -> str:
        """The default folder's name: source, tokenizer and seq_len, and for a recall mix a digest of it and of the
        seed (each seed writes its own recall documents, so each gets its own folder)."""
        src = "embedded" if self.source == EMBEDDED else Path(self.source).name
        tok = "byte" if self.tokenizer_spec == "byte" else Path(self.tokenizer_spec).stem
        recall = ""
        if self.recall:
            digest = hashlib.sha256(json.dumps([asdict(self.recall), self.seed], sort_keys=True).encode()).hexdigest()
            recall = f"-recall-{digest[:10]}"
        return re.sub(r"[^A-Za-z0-9_.-]+", "_", f"{src}-{tok}-{self.seq_len}{recall}")

    def _expected_meta(self) -> dict:
        """The settings that define the shards; with source null only seq_len (the tokenizer is checked apart)."""
        if self.source is None:
            return {"seq_len": self.seq_len}
        return {"source": self.source, "tokenizer": self.tokenizer_spec, "seq_len": self.seq_len,
                "val_fraction": self.val_fraction, "test_fraction": self.test_fraction,
                "recall": json.loads(json.dumps(asdict(self.recall))) if self.recall else None,  # as meta.json has it
                "recall_seed": self.seed if self.recall else None, "train_order": TRAIN_ORDER,
                "split_by": SPLIT_BY}

    @property
    def splits(self) -> tuple[str, ...]:
        return splits_of(self.recall)

    @property
    def tokenizer(self):
        return _tokenizer(self.tokenizer_spec)

    # ---- writing -------------------------------------------------------------------------------------------
    def prepare_data(self) -> None:
        self.tokenizer  # noqa: B018  (loaded here, before any long work: a bad file is named, not found in a worker)
        if self.remote:
            self._prepare_remote()
        else:
            self._prepare_local()

    def _prepare_remote(self) -> None:
        """Shards prepared in the cache folder, checked, and uploaded (meta.json last), unless the bucket has them."""
        folder = self._folder()
        if folder.exists("meta.json"):
            return  # checked in setup(), as a local folder is
        if not folder.is_empty():
            raise FileExistsError(f"{self.remote} holds files but no meta.json (an interrupted upload, or not written "
                                  f"by this data module): delete it (aws s3 rm --recursive {self.remote}/) to prepare "
                                  f"the shards again, or set data.data_dir to another folder")
        if self.source is None:
            raise FileNotFoundError(f"no shards in {self.remote} (no meta.json): set data.source to build them")
        self._prepare_local()  # reuses a cache folder that a previous, interrupted upload left complete
        meta = read_meta(self.data_dir)
        self._check_settings(meta)
        self._check_local_shards(meta, content=True)
        folder.upload(self.data_dir, sorted(meta["sha256"]))

    def _prepare_local(self) -> None:
        """Shards written unless there; one process at a time per folder (others wait, then reuse them)."""
        if self.source is None:
            return
        with FileLock(preparation_lock(self.data_dir)):
            self._prepare_unlocked()

    def _prepare_unlocked(self) -> None:
        if (self.data_dir / "meta.json").exists():
            return  # checked in setup(): reused if it matches, an error naming the mismatch otherwise
        if self.data_dir.exists() and any(self.data_dir.iterdir()):
            raise FileExistsError(f"{self.data_dir} holds files but no meta.json (deleted, or not written by this "
                                  f"data module): delete that folder to prepare the shards again, or set "
                                  f"data.data_dir to another folder")
        self._write(document_refs(self.source))

    def _write(self, refs: list[str]) -> None:
        """Shards of every split and meta.json, written to a temporary sibling and renamed into place."""
        block = self.seq_len + 1
        chunk = max(1, CHUNK_TOKENS // block) * block
        _remove_stale_temporaries(self.data_dir)
        tmp = atomic.temporary_sibling(self.data_dir)
        shutil.rmtree(tmp, ignore_errors=True)
        workers_before = set(multiprocessing.active_children())
        try:
            with _interruptible():
                recall = [f"{RECALL_PREFIX}{i}" for i in range(self.recall.documents)] if self.recall else []
                short_gaps = [f"{SHORT_GAP_PREFIX}{i}" for i in range(self.recall.short_gap_documents)] \
                    if SHORT_GAPS in self.splits else []
                inputs = refs + recall + short_gaps
                counts = self._tokenize(inputs, tmp / "staging")
                position = {ref: i for i, ref in enumerate(inputs)}
                for split in self.splits:
                    order = {"train": [position[ref] for ref in shuffled(refs + recall)],
                             SHORT_GAPS: range(len(refs) + len(recall), len(inputs))}.get(split, range(len(refs)))
                    fn = functools.partial(staged_tokens, staging=tmp / "staging", split=split)
                    optimize(fn=fn, inputs=list(order), output_dir=str(tmp / split), chunk_size=chunk,
                             item_loader=TokensLoader(), num_workers=1, reorder_files=False, verbose=False,
                             start_method=START_METHOD)
            shutil.rmtree(tmp / "staging")
            meta = (self._expected_meta() | self._measure(counts, len(refs), tmp)
                    | {"tokenizer_fingerprint": self.tokenizer.fingerprint, "sha256": checksums(tmp, self.splits)})
            (tmp / "meta.json").write_text(json.dumps(meta, indent=2))
            atomic.replace(tmp, self.data_dir)
            print(preparation_summary(self.data_dir, meta, len(refs)), flush=True)
        except BaseException:  # KeyboardInterrupt included: no worker may outlive the preparation
            _stop(set(multiprocessing.active_children()) - workers_before)
            raise
        finally:
            shutil.rmtree(tmp, ignore_errors=True)

    def _tokenize(self, inputs: list[str], staging: Path) -> list[dict]:
        """Every input read and tokenized once, by one worker process per core (`tokenizing_worker`), into `staging`;
        returns each input's counts. Plain processes, each stopped whatever it is doing: this method never returns
        or raises with one alive."""
        staging.mkdir(parents=True)
        settings = dict(source=self.source, tokenizer=self.tokenizer_spec, val_fraction=self.val_fraction,
                        test_fraction=self.test_fraction, recall=asdict(self.recall) if self.recall else None,
                        recall_seed=self.seed)
        n = min(os.cpu_count() or 1, max(1, len(inputs)))
        context = multiprocessing.get_context(START_METHOD)
        # Daemons: should one ever escape, the interpreter's exit stops it instead of waiting for it.
        workers = [context.Process(target=tokenizing_worker, args=(k, n, inputs, staging, settings), daemon=True)
                   for k in range(n)]
        try:
            # Ctrl-C is held back while the workers start: one arriving inside Process.start() could leave a
            # running worker that is not yet known as started, which nothing would stop.
            signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
            try:
                for worker in workers:
                    worker.start()
            finally:
                signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
            for worker in workers:
                worker.join()
        finally:
            _stop({worker for worker in workers if worker.is_alive()})
        for k, worker in enumerate(workers):
            if worker.exitcode != 0:
                report = staging / f"worker-{k}.err"
                raise RuntimeError(f"tokenizing {self.source} failed: "
                                   + (report.read_text() if report.exists() else f"worker exit code {worker.exitcode}"))
        return [json.loads((staging / f"{position}.json").read_text()) for position in range(len(inputs))]

    def _measure(self, counts: list[dict], n_refs: int, out: Path) -> dict:
        """Tokens per split (from the indexes), bytes per token of the validation text, skipped files reported."""
        tok = self.tokenizer
        n_bytes, n_tokens = sum(c["val_bytes"] for c in counts), sum(c["val_tokens"] for c in counts)
        undecodable = [c["undecodable"] for c in counts if c["undecodable"]]
        if undecodable:
            warnings.warn(f"{len(undecodable)} of the {n_refs} files of {self.source} are not UTF-8 text and were "
                          f"skipped, e.g. {', '.join(undecodable[:UNDECODABLE_EXAMPLES])}", stacklevel=3)
        split_counts = {f"{split}_tokens": split_tokens(out / split) for split in self.splits}
        for split in self.splits:
            if split_counts[f"{split}_tokens"] < self.seq_len + 1:
                raise InputError(f"the {split} split of {self.source} has {split_counts[f'{split}_tokens']} tokens, "
                                 f"fewer than one block of seq_len + 1 = {self.seq_len + 1}: add text or change "
                                 f"val_fraction / test_fraction / seq_len")
        recall_tokens = sum(c["recall_tokens"] for c in counts)
        return split_counts | {"vocab_size": tok.vocab_size, "bytes_per_token": n_bytes / max(n_tokens, 1),
                               "undecodable_files": len(undecodable), "recall_train_tokens": recall_tokens,
                               "recall_share_of_train": recall_tokens / max(split_counts["train_tokens"], 1)}

    # ---- reading -------------------------------------------------------------------------------------------
    def setup(self, stage: str | None = None) -> None:
        if not self._verified:
            if self.remote:
                self._fetch_descriptions()
            self.meta = read_meta(self.data_dir)
            self._check_settings(self.meta)
            self._check_tokenizer()
            if self.remote:
                self._folder().check_sizes({split: read_index(self.data_dir / split) for split in self.splits})
            else:
                self._check_local_shards(self.meta, content=self.verify_checksums)
            self._verified = True
        if stage in (None, "fit"):
            self._check_one_batch()
        for split in self.splits:
            self.datasets[split] = self.blocks(split, self.seq_len + 1, shuffle=split in ("train", SHORT_GAPS))

    def blocks(self, split: str, block_size: int, shuffle: bool = False) -> StreamingDataset:
        """The split as blocks of `block_size` tokens, streamed from the local folder or from the bucket. drop_last
        only matters to litdata's iteration, which reads the training split; the held-out splits are read by index
        (HeldOutBatches, perplexity.py), where it changes nothing but litdata's warning about it."""
        where = Dir(path=str(self.data_dir / split), url=f"{self.remote}/{split}") if self.remote else \
            str(self.data_dir / split)
        return StreamingDataset(where, item_loader=TokensLoader(block_size=block_size), shuffle=shuffle,
                                drop_last=True, seed=self.seed, storage_options=self.storage_options)

    def _folder(self) -> RemoteFolder:
        return RemoteFolder(self.remote, self.storage_options)

    def _fetch_descriptions(self) -> None:
        """The bucket's meta.json and indexes, copied into the cache folder; cached chunks of other shards (the
        bucket's folder prepared again since) are dropped, as chunk names repeat."""
        folder = self._folder()
        if not folder.exists("meta.json"):
            raise FileNotFoundError(f"no shards in {self.remote} ({self.remote}/meta.json missing): set data.source "
                                    f"to build them, or point data_dir at a folder written by this data module")
        cached = self.data_dir / "meta.json"
        before = read_meta(self.data_dir)["sha256"] if cached.exists() else None
        folder.fetch("meta.json", cached)
        if before is not None and before != read_meta(self.data_dir)["sha256"]:
            for split in self.splits:
                shutil.rmtree(self.data_dir / split, ignore_errors=True)
        for split in self.splits:
            folder.fetch(f"{split}/index.json", self.data_dir / split / "index.json")

    def _check_local_shards(self, meta: dict, content: bool) -> None:
        for split in self.splits:
            check_sizes(self.data_dir / split)
        if content:
            check_checksums(self.data_dir, meta["sha256"])

    def _check_settings(self, meta: dict) -> None:
        wrong = {k: (meta.get(k), v) for k, v in self._expected_meta().items() if meta.get(k) != v}
        if wrong:
            where = self.remote or self.data_dir
            raise InputError(f"{where}/meta.json was written for other settings (field: (on disk, configured)): "
                             f"{wrong}; use another data_dir or delete {where}")

    def _check_tokenizer(self) -> None:
        made_with = self.meta.get("tokenizer_fingerprint")
        if made_with != self.tokenizer.fingerprint:
            raise InputError(f"the shards in {self.data_dir} were made with tokenizer {self.meta.get('tokenizer')!r} "
                             f"({made_with}), but data.tokenizer is {self.tokenizer_spec!r} "
                             f"({self.tokenizer.fingerprint}): set data.tokenizer to the one the shards were made "
                             f"with, or prepare new shards in another data_dir")

    def _check_one_batch(self) -> None:
        """Refuses a train split smaller than one batch on every device and loader worker (else Lightning runs
        zero steps and exits 0)."""
        devices = self.trainer.world_size if self.trainer is not None else 1
        needed = self.batch_size * devices * max(1, self.num_workers)
        blocks = split_blocks(self.data_dir / "train", self.seq_len + 1)
        if blocks < needed:
            raise InputError(f"the train split in {self.data_dir} holds {blocks} blocks of seq_len + 1 = "
                             f"{self.seq_len + 1} tokens, fewer than one batch: data.batch_size {self.batch_size} x "
                             f"{devices} device(s) x {max(1, self.num_workers)} worker(s) = {needed}; add text, or "
                             f"lower batch_size / seq_len / num_workers")

    def train_dataloader(self):
        """The training split's batches; with a short-gap phase, its split's first (PhasedLoader)."""
        train = self._streaming_loader("train")
        if SHORT_GAPS not in self.splits:
            return train
        accumulate = getattr(self.trainer, "accumulate_grad_batches", 1) if self.trainer is not None else 1
        phase_batches = self.recall.short_gap_steps * accumulate
        phase = self._streaming_loader(SHORT_GAPS)
        if len(phase) < phase_batches:
            raise InputError(f"the short-gap phase needs {phase_batches} batches per rank (data.recall.short_gap_steps "
                             f"{self.recall.short_gap_steps} x accumulate_grad_batches {accumulate}), but its split in "
                             f"{self.data_dir / SHORT_GAPS} holds {len(phase)}: raise data.recall.short_gap_documents "
                             f"(now {self.recall.short_gap_documents}) in proportion")
        return PhasedLoader(phase, train, phase_batches)

    def _streaming_loader(self, split: str) -> StreamingDataLoader:
        collate = functools.partial(stack_within_vocabulary, vocab_size=self.tokenizer.vocab_size,
                                    where=self.data_dir / split)
        return StreamingDataLoader(self.datasets[split], batch_size=self.batch_size, num_workers=self.num_workers,
                                   drop_last=True, collate_fn=collate)

    def val_dataloader(self):
        return self._held_out_loader("val")

    def test_dataloader(self):
        return self._held_out_loader("test")

    def _held_out_loader(self, split: str) -> DataLoader:
        """This rank's share of the split's batches, padded to the same count on every rank (module docstring)."""
        batches = HeldOutBatches(self.datasets[split], self.block_count(split, self.seq_len + 1), self.batch_size,
                                 self.tokenizer.vocab_size, self.data_dir / split)
        ranks = getattr(self.trainer, "distributed_sampler_kwargs", None) or {"num_replicas": 1, "rank": 0}
        return DataLoader(batches, batch_size=None, sampler=DealtSampler(batches, **ranks),
                          num_workers=self.num_workers)

    def block_count(self, split: str, block_size: int) -> int:
        """Blocks of `block_size` tokens in the whole split (litdata's len() is this rank's share)."""
        return split_blocks(self.data_dir / split, block_size)

    def predict_dataloader(self):
        """Batches of prompt strings (data.prompts, then the lines of data.prompts_file)."""
        prompts = read_prompts(self.prompts, self.prompts_file)
        if not prompts:
            raise ConfigError("main.py predict needs --data.prompts '[...]' or --data.prompts_file FILE")
        return DataLoader(prompts, batch_size=self.batch_size, collate_fn=list)


def preparation_summary(data_dir: Path, meta: dict, n_inputs: int) -> str:
    """The line printed when shards are written: where, and how many tokens each split holds."""
    recall_tokens = meta["recall_train_tokens"]
    recall = f" (of which {recall_tokens:,} recall-document tokens)" if recall_tokens else ""
    phase = f", short-gap phase {meta[f'{SHORT_GAPS}_tokens']:,}" if f"{SHORT_GAPS}_tokens" in meta else ""
    return (f"prepared {data_dir} from {n_inputs:,} inputs: train {meta['train_tokens']:,} tokens{recall}, "
            f"validation {meta['val_tokens']:,}, test {meta['test_tokens']:,}{phase}")


def read_meta(data_dir: Path) -> dict:
    """meta.json of a shard folder, or an error that names the file and says what to do."""
    path = data_dir / "meta.json"
    if not path.exists():
        raise FileNotFoundError(f"no shards in {data_dir} ({path} missing): set `source` to build them, or point "
                                f"data_dir at a folder written by this data module")
    meta = atomic.read_json(path, f"delete {data_dir} to prepare the shards again")
    if not isinstance(meta, dict) or "sha256" not in meta:
        raise InputError(f"{path} is not a shard description written by this version (no 'sha256' checksums): "
                         f"delete {data_dir} to prepare the shards again")
    return meta


def preparation_lock(data_dir: Path) -> Path:
    """The lock file that preparations of `data_dir` on this machine take turns on: in the temporary folder, named by
    the folder's absolute path, so nothing is left beside the data."""
    folder = Path(tempfile.gettempdir()) / "swax-lightning-locks"
    folder.mkdir(exist_ok=True)
    return folder / (hashlib.sha256(str(data_dir.resolve()).encode()).hexdigest()[:32] + ".lock")


def _remove_stale_temporaries(data_dir: Path) -> None:
    """Temporary folders of preparations whose process is gone (killed before its own clean-up ran)."""
    for tmp in data_dir.parent.glob(f".{data_dir.name}.tmp-*"):
        pid = tmp.name.rsplit("-", 1)[-1]
        if pid.isdigit() and not _running(int(pid)):
            shutil.rmtree(tmp, ignore_errors=True)


def _running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # someone else's live process
    return True


@contextmanager
def _interruptible():
    """Ctrl-C during litdata's `optimize` raises KeyboardInterrupt, so our clean-up runs.

    `optimize` installs a SIGINT handler that stops its queues and calls os._exit(0): the process ends with status 0,
    no `finally` runs (the temporary folder stays), a busy worker is orphaned, and the handler stays installed for
    the rest of the run (a later Ctrl-C in training would exit 0 too). Here its handler raises KeyboardInterrupt
    instead, and the previous handler is restored afterwards."""
    previous_handler, litdata_handler = signal.getsignal(signal.SIGINT), DataProcessor._signal_handler
    DataProcessor._signal_handler = _raise_keyboard_interrupt
    try:
        yield
    finally:
        DataProcessor._signal_handler = litdata_handler
        signal.signal(signal.SIGINT, previous_handler)


def _raise_keyboard_interrupt(processor, signum, frame):
    raise KeyboardInterrupt


def _stop(processes: set) -> None:
    """SIGTERM, then SIGKILL for any process still alive after 5 s."""
    for process in processes:
        process.terminate()
    for process in processes:
        process.join(timeout=5)
        if process.is_alive():
            process.kill()
            process.join()
