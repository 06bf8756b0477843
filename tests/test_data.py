"""Data: shards written and read back, exact mid-epoch resume, and every way data can go wrong refused at start with
a line naming the file or field (changed content, meta.json problems, tokenizer mismatches, too little text)."""
import json
import multiprocessing
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from litdata import StreamingDataset, TokensLoader

from swax_lightning.core.errors import InputError
from swax_lightning.data.corpus import document_refs, read_documents, split_of
from swax_lightning.data.datamodule import TextDataModule, _running, shuffled
from swax_lightning.data.tokenizer import ByteTokenizer

SEQ = 31


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    """A folder with .txt, .py and .jsonl documents of varied lengths."""
    root = tmp_path_factory.mktemp("src")
    for i in range(40):
        (root / f"doc{i:02d}.txt").write_text(f"Document {i}. " + "word " * (20 + 13 * i))
    (root / "code.py").write_text("def f(x):\n    return x * 2\n" * 30)
    (root / "more.jsonl").write_text("\n".join(json.dumps({"text": f"json line {i} " * 25}) for i in range(10)))
    return root


@pytest.fixture(scope="module")
def prepared(source, tmp_path_factory):
    dm = TextDataModule(source=str(source), data_dir=str(tmp_path_factory.mktemp("shards") / "d"), seq_len=SEQ,
                        batch_size=4, val_fraction=0.2, test_fraction=0.2)
    dm.prepare_data()
    dm.setup("fit")
    return dm


@pytest.mark.parametrize("cores", [1, 3])
def test_shards_are_the_same_whatever_the_number_of_cores(prepared, tmp_path, monkeypatch, cores):
    """One tokenizing worker, or more workers than this machine has cores: every shard file and every figure of
    meta.json equal to those of the fixture's preparation (index.json aside: litdata stamps it with the time)."""
    import swax_lightning.data.datamodule as data

    monkeypatch.setattr(data.os, "cpu_count", lambda: cores)
    again = _reuse(prepared, data_dir=str(tmp_path / "d"))
    again.prepare_data()
    chunks = lambda root: {p.relative_to(root): p.read_bytes() for p in sorted(root.glob("*/*.bin"))}
    assert chunks(again.data_dir) and chunks(again.data_dir) == chunks(prepared.data_dir)
    meta = lambda root: {k: v for k, v in json.loads((root / "meta.json").read_text()).items() if k != "sha256"}
    assert meta(again.data_dir) == meta(prepared.data_dir)


def _reuse(prepared, **overrides):
    """A data module over the prepared shards (same settings unless overridden)."""
    settings = dict(source=prepared.source, data_dir=str(prepared.data_dir), seq_len=SEQ, batch_size=4,
                    val_fraction=0.2, test_fraction=0.2) | overrides
    return TextDataModule(**settings)


def _stream(source, split):
    """The split's token stream, written independently: its documents in order (the training split's shuffled)."""
    tok, ids = ByteTokenizer(), []
    refs = document_refs(str(source))
    for ref in shuffled(refs) if split == "train" else refs:
        for name, text in read_documents(ref, str(source)):
            if split_of(name, 0.2, 0.2) == split:
                ids += tok.encode(text) + [tok.eos_id]
    return ids


@pytest.mark.parametrize("split", ["train", "val", "test"])
def test_shards_read_back_as_the_token_stream(prepared, source, split):
    ds = StreamingDataset(str(prepared.data_dir / split), item_loader=TokensLoader(block_size=SEQ + 1))
    blocks = [ds[i].tolist() for i in range(len(ds))]
    stream = _stream(source, split)
    assert len(blocks) == len(stream) // (SEQ + 1) > 0
    for i, block in enumerate(blocks):
        assert block == stream[i * (SEQ + 1):(i + 1) * (SEQ + 1)]
    assert prepared.meta[f"{split}_tokens"] == len(stream)


def test_the_split_does_not_depend_on_where_the_source_lives(prepared, source, tmp_path):
    """The same documents in another folder give the same train / validation / test shards, byte for byte (the split
    was once a hash of the absolute path: moving the corpus moved held-out documents into training)."""
    moved = tmp_path / "elsewhere" / "deeper"
    shutil.copytree(source, moved)
    again = _reuse(prepared, source=str(moved), data_dir=str(tmp_path / "d"))
    again.prepare_data()
    chunks = lambda root: {p.relative_to(root): p.read_bytes() for p in sorted(root.glob("*/*.bin"))}
    assert chunks(again.data_dir) and chunks(again.data_dir) == chunks(prepared.data_dir)


def test_embedded_document_names_hold_no_machine_path():
    """The embedded corpus is named relative to the standard library's folder, wherever Python is installed."""
    import sysconfig

    from swax_lightning.data.corpus import EMBEDDED, document_name

    refs = document_refs(EMBEDDED)
    names = [document_name(ref, EMBEDDED) for ref in refs]
    stdlib = sysconfig.get_paths()["stdlib"]
    assert len(set(names)) == len(refs) and not any(stdlib in name or name.startswith("/") for name in names)
    assert "json/decoder.py" in names


def test_splits_are_disjoint_by_document(source):
    names = [n for ref in document_refs(str(source)) for n, _ in read_documents(ref, str(source))]
    splits = {split: {n for n in names if split_of(n, 0.2, 0.2) == split} for split in ("train", "val", "test")}
    assert all(splits.values()) and sum(map(len, splits.values())) == len(names) == 40 + 1 + 10


def test_test_loader_reads_the_test_split_not_validation(prepared, source):
    """test/loss is held-out text: the test loader streams the test documents, none of the validation ones."""
    streamed = [t for batch in prepared.test_dataloader() for block in batch["tokens"].tolist() for t in block]
    assert streamed == _stream(source, "test")[:len(streamed)] and streamed
    assert streamed[:SEQ + 1] != _stream(source, "val")[:SEQ + 1]


def _held_out_on(dm, ranks, rank, split="test"):
    """The held-out loader rank `rank` of `ranks` gets (a Trainer's distributed_sampler_kwargs, without a Trainer)."""
    dm.trainer = SimpleNamespace(distributed_sampler_kwargs={"num_replicas": ranks, "rank": rank})
    loader = dm.test_dataloader() if split == "test" else dm.val_dataloader()
    dm.trainer = None
    return loader


def test_three_ranks_on_ten_batches_evaluate_what_one_process_evaluates(prepared):
    """The test split cut into 10 batches (the last one short) on 3 ranks: 4 batches each, batches 0..9 each exactly
    once with weight 1 and 2 padding batches with weight 0; the token-weighted loss summed over the ranks (what the
    metric sync computes) equals the 1-process one. One rank reads through 2 loader workers."""
    from torchmetrics.aggregation import MeanMetric

    from swax_lightning.training.module import LanguageModule

    n_blocks = prepared.block_count("test", SEQ + 1)
    batch_size = next(b for b in range(1, n_blocks) if -(-n_blocks // b) == 10 and n_blocks % b)
    dm = _reuse(prepared, batch_size=batch_size)
    dm.setup("test")
    single = list(_held_out_on(dm, 1, 0))
    assert len(single) == 10 and {b["weight"] for b in single} == {1.0} and len(single[-1]["tokens"]) < batch_size
    module = LanguageModule(arch=dict(vocab_size=257, d_model=16, n_layers=2, n_heads=2, mlstm_heads=2, chunk_size=8,
                                      window=8))
    module.configure_model()
    metrics, seen = [], []
    for rank in range(3):
        dm.num_workers = 2 if rank == 1 else 0
        batches = list(_held_out_on(dm, 3, rank))
        assert len(batches) == 4
        seen += [(rank + 3 * k, b) for k, b in enumerate(batches) if b["weight"] == 1.0]
        assert [b["weight"] for b in batches] == ([1.0] * 4 if rank == 0 else [1.0, 1.0, 1.0, 0.0])
        metrics.append(MeanMetric())
        with torch.no_grad():
            for batch in batches:
                module._evaluate(batch, metrics[-1])
    assert sorted(j for j, _ in seen) == list(range(10))
    assert all(torch.equal(b["tokens"], single[j]["tokens"]) for j, b in seen)
    one_process = MeanMetric()
    with torch.no_grad():
        for batch in single:
            module._evaluate(batch, one_process)
    synced = sum(m.mean_value for m in metrics) / sum(m.weight for m in metrics)
    torch.testing.assert_close(synced, one_process.compute(), rtol=1e-6, atol=0)


def test_bytes_per_token_of_byte_tokenizer(prepared):
    assert 0.95 < prepared.meta["bytes_per_token"] < 1.0  # one end-of-text id per document


def test_mid_epoch_resume_yields_exactly_the_remaining_blocks(prepared):
    full = [b.clone() for b in prepared.train_dataloader()]
    assert len(full) >= 6
    loader = prepared.train_dataloader()
    seen = []
    for i, batch in enumerate(loader):
        seen.append(batch.clone())
        if i == 2:
            break
    state = loader.state_dict()
    resumed = _reuse(prepared)
    resumed.setup("fit")
    loader2 = resumed.train_dataloader()
    loader2.load_state_dict(state)
    rest = [b.clone() for b in loader2]
    assert len(seen) + len(rest) == len(full)
    for a, b in zip(seen + rest, full):
        assert torch.equal(a, b)


def test_reuses_shards_and_rejects_mismatched_settings(prepared):
    prepared.prepare_data()  # already there: a no-op
    other = _reuse(prepared, seq_len=SEQ + 1)
    with pytest.raises(ValueError, match="seq_len"):
        other.setup("fit")


def test_missing_source_folder_is_named(tmp_path):
    dm = TextDataModule(source=str(tmp_path / "no_such_folder"), data_dir=str(tmp_path / "d"))
    with pytest.raises(FileNotFoundError, match="no_such_folder"):
        dm.prepare_data()
    assert not (tmp_path / "d").exists()


def test_missing_data_dir_is_named(tmp_path):
    dm = TextDataModule(source=None, data_dir=str(tmp_path / "absent"))
    with pytest.raises(FileNotFoundError, match="absent"):
        dm.setup("fit")


def test_too_little_text_fails_without_writing(tmp_path):
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "a.txt").write_text("short")
    dm = TextDataModule(source=str(tmp_path / "src"), data_dir=str(tmp_path / "d"), seq_len=64)
    with pytest.raises(ValueError, match="split"):
        dm.prepare_data()
    assert not (tmp_path / "d").exists() and list(tmp_path.iterdir()) == [tmp_path / "src"]


@pytest.mark.parametrize("damage", ["truncate", "delete", "index"])
def test_corrupt_or_missing_shard_is_named(prepared, tmp_path, damage):
    copy = tmp_path / "copy"
    shutil.copytree(prepared.data_dir, copy)
    chunk = sorted((copy / "train").glob("chunk-*.bin"))[0]
    if damage == "truncate":
        chunk.write_bytes(chunk.read_bytes()[:10])
    elif damage == "delete":
        chunk.unlink()
    else:
        (copy / "train" / "index.json").write_text("{not json")
    dm = _reuse(prepared, data_dir=str(copy))
    expected = "index.json" if damage == "index" else chunk.name
    with pytest.raises((ValueError, FileNotFoundError), match=expected):
        dm.setup("fit")


@pytest.fixture(scope="module")
def bpe(source, tmp_path_factory):
    """A byte-level BPE tokenizer.json trained here with HF tokenizers (no download)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train([str(p) for p in sorted(source.glob("*.txt"))],
              trainers.BpeTrainer(vocab_size=300, special_tokens=["<|endoftext|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    path = tmp_path_factory.mktemp("bpe") / "tokenizer.json"
    tok.save(str(path))
    return path


def test_hf_tokenizer_json_trained_offline(source, bpe, tmp_path):
    """A BPE tokenizer.json drives the whole data path."""
    from tokenizers import Tokenizer

    dm = TextDataModule(source=str(source), tokenizer=str(bpe), data_dir=str(tmp_path / "d"), seq_len=15,
                        batch_size=2, val_fraction=0.2, test_fraction=0.2)
    dm.prepare_data()
    dm.setup("fit")
    eos = Tokenizer.from_file(str(bpe)).token_to_id("<|endoftext|>")
    assert dm.tokenizer.vocab_size <= 300 and dm.tokenizer.eos_id == eos
    assert dm.meta["bytes_per_token"] > 1.5  # BPE merges bytes
    batch = next(iter(dm.train_dataloader()))
    assert batch.shape == (2, 16) and int(batch.long().max()) < dm.tokenizer.vocab_size
    assert "word word" in dm.tokenizer.decode(dm.tokenizer.encode("Document 3. word word"))


def test_missing_tokenizer_file_is_named_at_construction(tmp_path):
    """The data module reads its tokenizer when built (checkpoints record its content), before any long work."""
    with pytest.raises(FileNotFoundError, match="nope.json"):
        TextDataModule(source="embedded", tokenizer=str(tmp_path / "nope.json"), data_dir=str(tmp_path / "d"))


def _copy(prepared, tmp_path):
    copy = tmp_path / "copy"
    shutil.copytree(prepared.data_dir, copy)
    return copy


@pytest.mark.parametrize("ids", ["random valid ids", "out-of-vocabulary ids"])
def test_shard_that_kept_its_size_but_not_its_content_is_named(prepared, tmp_path, ids):
    """The size check alone trained on such data (or crashed hundreds of steps later with a bare IndexError)."""
    copy = _copy(prepared, tmp_path)
    chunk = sorted((copy / "train").glob("chunk-*.bin"))[-1]
    data = np.frombuffer(chunk.read_bytes(), dtype=np.uint8).copy()
    n_tokens = 64
    new = np.random.default_rng(0).integers(0, 256, n_tokens) if ids == "random valid ids" else \
        np.full(n_tokens, 65535)
    data[-2 * n_tokens:] = new.astype(np.uint16).view(np.uint8)  # the last tokens of the chunk (uint16 ids)
    chunk.write_bytes(data.tobytes())
    with pytest.raises(ValueError, match=f"shard corrupt: .*{chunk.name}"):
        _reuse(prepared, data_dir=str(copy)).setup("fit")


def test_out_of_vocabulary_ids_without_checksums_are_named_not_an_index_error(prepared, tmp_path):
    """With data.verify_checksums false a changed shard is read as it is: a batch holding an id the tokenizer cannot
    produce is refused naming its split folder (it was a bare IndexError in the embedding)."""
    copy = _copy(prepared, tmp_path)
    for split in ("train", "val"):
        chunk = sorted((copy / split).glob("chunk-*.bin"))[0]
        data = np.frombuffer(chunk.read_bytes(), dtype=np.uint8).copy()
        data[-2 * 4000:] = np.full(4000, 65535).astype(np.uint16).view(np.uint8)  # the chunk's last tokens
        chunk.write_bytes(data.tobytes())
    dm = _reuse(prepared, data_dir=str(copy), verify_checksums=False)
    dm.setup("fit")
    with pytest.raises(InputError, match=f"{copy / 'train'} holds token id 65535, outside the tokenizer's 257 ids"):
        for _ in dm.train_dataloader():
            pass
    with pytest.raises(InputError, match=f"{copy / 'val'} holds token id 65535"):
        for _ in dm.val_dataloader():
            pass


def test_deleted_meta_json_is_refused_before_any_tokenisation(prepared, tmp_path, monkeypatch):
    copy = _copy(prepared, tmp_path)
    (copy / "meta.json").unlink()
    monkeypatch.setattr("swax_lightning.data.datamodule.optimize", None)  # writing shards would fail
    with pytest.raises(FileExistsError, match="no meta.json"):
        _reuse(prepared, data_dir=str(copy)).prepare_data()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["copy"]


def test_corrupt_meta_json_is_named(prepared, tmp_path):
    copy = _copy(prepared, tmp_path)
    (copy / "meta.json").write_text('{"seq_len": 3')
    with pytest.raises(ValueError, match="meta.json is corrupt"):
        _reuse(prepared, data_dir=str(copy)).setup("fit")


def test_other_tokenizer_than_the_shards_were_made_with_is_refused(prepared, bpe):
    """With source null the shards are used as they are: a different tokenizer would train and decode garbage."""
    dm = TextDataModule(source=None, tokenizer=str(bpe), data_dir=str(prepared.data_dir), seq_len=SEQ)
    with pytest.raises(ValueError, match=f"made with tokenizer 'byte'.*data.tokenizer is '{bpe}'"):
        dm.setup("fit")


def test_train_split_smaller_than_one_batch_is_refused(prepared):
    """Lightning would run zero steps and exit 0 ("No training batches")."""
    with pytest.raises(ValueError, match="fewer than one batch"):
        _reuse(prepared, batch_size=10_000).setup("fit")


def test_files_that_are_not_utf8_are_reported(source, tmp_path):
    src = tmp_path / "src"
    shutil.copytree(source, src)
    for name in ("latin1_a.txt", "latin1_b.txt"):
        (src / name).write_bytes("caf\xe9 cr\xe8me ".encode("latin-1") * 10)
    dm = TextDataModule(source=str(src), data_dir=str(tmp_path / "d"), seq_len=SEQ, val_fraction=0.2,
                        test_fraction=0.2)
    with pytest.warns(UserWarning, match="2 of the 44 files .* not UTF-8 .*latin1_a.txt"):
        dm.prepare_data()
    dm.setup("fit")
    assert dm.meta["undecodable_files"] == 2


def _sleep_forever():
    time.sleep(600)


def test_interrupted_preparation_leaves_no_folder_and_no_worker(source, tmp_path, monkeypatch):
    workers = []

    def interrupted_optimize(output_dir, **kwargs):
        Path(output_dir).mkdir(parents=True)
        worker = multiprocessing.get_context("fork").Process(target=_sleep_forever)
        worker.start()
        workers.append(worker)
        raise KeyboardInterrupt

    monkeypatch.setattr("swax_lightning.data.datamodule.optimize", interrupted_optimize)
    dm = TextDataModule(source=str(source), data_dir=str(tmp_path / "d"), seq_len=SEQ)
    try:
        with pytest.raises(KeyboardInterrupt):
            dm.prepare_data()
        assert not workers[0].is_alive()
        assert list(tmp_path.iterdir()) == []
    finally:
        workers[0].kill()  # a failing run must not leave the sleeper behind


INTERRUPTED_PREPARATION = """
import os, signal, sys, time
import swax_lightning.data.datamodule as data

# A process started from a terminal, where Ctrl-C exists: one launched in the background by a non-interactive shell
# (nohup ... &) inherits SIGINT ignored, and then no Ctrl-C would reach it (each input would sleep its 60 s).
signal.signal(signal.SIGINT, signal.default_int_handler)

def interrupting(position, **settings):  # a worker: Ctrl-C reaches the preparing process while it is busy
    with open(sys.argv[2] + ".all", "a") as f:  # every worker that got here, for the test to check they are gone
        f.write(f"{os.getpid()}\\n")
    try:  # the first worker here presses Ctrl-C once; the others just stay busy
        flag = os.open(sys.argv[2] + ".claimed", os.O_CREAT | os.O_EXCL)
    except FileExistsError:
        time.sleep(60)
        return
    os.close(flag)
    with open(sys.argv[2], "w") as f:
        f.write(str(os.getpid()))
    os.kill(os.getppid(), signal.SIGINT)
    time.sleep(60)

def interrupting_generator(position, **settings):
    interrupting(position)
    yield from ()

if sys.argv[4] == "litdata":
    data.staged_tokens = interrupting_generator
else:
    data.tokenize_ref = interrupting
data.TextDataModule(source=sys.argv[1], data_dir=sys.argv[3], seq_len=31).prepare_data()
"""


@pytest.mark.parametrize("stage", ["tokenizing", "litdata"])
def test_ctrl_c_inside_a_worker_fails_and_leaves_no_folder_and_no_worker(source, tmp_path, stage):
    """Ctrl-C while the tokenizing workers or litdata's writer are busy: a failure (litdata's own SIGINT handler
    exited with status 0, kept the temporary folder and orphaned its worker), no folder, no worker left."""
    script, worker_pid, out = tmp_path / "prepare.py", tmp_path / "worker.pid", tmp_path / "out"
    script.write_text(INTERRUPTED_PREPARATION)
    result = subprocess.run([sys.executable, str(script), str(source), str(worker_pid), str(out / "d"), stage],
                            capture_output=True, text=True, timeout=300,
                            env=os.environ | {"PYTHONPATH": str(Path(__file__).resolve().parents[1])})
    workers = {int(pid) for pid in Path(f"{worker_pid}.all").read_text().split()}
    try:
        assert result.returncode != 0 and "KeyboardInterrupt" in result.stderr, result.stderr[-2000:]
        assert list(out.iterdir()) == []
        deadline = time.time() + 10
        while any(map(_running, workers)) and time.time() < deadline:
            time.sleep(0.2)
        assert not any(map(_running, workers))
    finally:
        for worker in filter(_running, workers):
            os.kill(worker, signal.SIGKILL)


def test_a_failing_input_is_named_and_nothing_is_left(source, tmp_path, monkeypatch):
    """A tokenizing worker that fails: the preparation raises naming the input and the error, keeps no folder."""
    import swax_lightning.data.datamodule as data

    tokenize = data.tokenize_ref

    def failing(position, refs, **settings):
        if refs[position].endswith("doc07.txt"):
            raise ValueError("cannot tokenize this")
        tokenize(position, refs=refs, **settings)

    monkeypatch.setattr(data, "tokenize_ref", failing)  # the workers are forked: they see it
    dm = TextDataModule(source=str(source), data_dir=str(tmp_path / "out" / "d"), seq_len=SEQ)
    (tmp_path / "out").mkdir()
    with pytest.raises(RuntimeError, match=r"(?s)doc07\.txt: .*ValueError: cannot tokenize this"):
        dm.prepare_data()
    assert list((tmp_path / "out").iterdir()) == []
    assert not multiprocessing.active_children()


def test_temporary_folder_of_a_killed_preparation_is_removed(prepared, tmp_path):
    dead = subprocess.Popen(["true"])
    dead.wait()
    stale = tmp_path / f".d.tmp-{dead.pid}"
    (stale / "train").mkdir(parents=True)
    _reuse(prepared, data_dir=str(tmp_path / "d")).prepare_data()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["d"]


def test_preparation_says_where_and_how_much(prepared, tmp_path, capsys):
    again = _reuse(prepared, data_dir=str(tmp_path / "d"))
    again.prepare_data()
    meta = json.loads((tmp_path / "d/meta.json").read_text())
    assert capsys.readouterr().out.strip().splitlines()[-1] == (
        f"prepared {tmp_path / 'd'} from 42 inputs: train {meta['train_tokens']:,} tokens, validation "
        f"{meta['val_tokens']:,}, test {meta['test_tokens']:,}")
