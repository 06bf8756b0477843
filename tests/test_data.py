"""Data: shards written and read back, exact mid-epoch resume, clear errors for missing or corrupt data."""
import json

import pytest
import torch
from litdata import StreamingDataset, TokensLoader

from swax_lightning.corpus import document_refs, is_validation, read_documents
from swax_lightning.data import TextDataModule
from swax_lightning.tokenizer import ByteTokenizer

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
                        batch_size=4, val_fraction=0.2)
    dm.prepare_data()
    dm.setup("fit")
    return dm


def _stream(source, split):
    tok, ids = ByteTokenizer(), []
    for ref in document_refs(str(source)):
        for name, text in read_documents(ref):
            if is_validation(name, 0.2) == (split == "val"):
                ids += tok.encode(text) + [tok.eos_id]
    return ids


@pytest.mark.parametrize("split", ["train", "val"])
def test_shards_read_back_as_the_token_stream(prepared, source, split):
    ds = StreamingDataset(str(prepared.data_dir / split), item_loader=TokensLoader(block_size=SEQ + 1))
    blocks = [ds[i].tolist() for i in range(len(ds))]
    stream = _stream(source, split)
    assert len(blocks) == len(stream) // (SEQ + 1) > 0
    for i, block in enumerate(blocks):
        assert block == stream[i * (SEQ + 1):(i + 1) * (SEQ + 1)]
    assert prepared.meta[f"{split}_tokens"] == len(stream)


def test_splits_are_disjoint_by_document(source):
    names = [n for ref in document_refs(str(source)) for n, _ in read_documents(ref)]
    val = {n for n in names if is_validation(n, 0.2)}
    assert 0 < len(val) < len(names)
    assert len(names) == 40 + 1 + 10


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
    resumed = TextDataModule(source=prepared.source, data_dir=str(prepared.data_dir), seq_len=SEQ, batch_size=4,
                             val_fraction=0.2)
    resumed.setup("fit")
    loader2 = resumed.train_dataloader()
    loader2.load_state_dict(state)
    rest = [b.clone() for b in loader2]
    assert len(seen) + len(rest) == len(full)
    for a, b in zip(seen + rest, full):
        assert torch.equal(a, b)


def test_reuses_shards_and_rejects_mismatched_settings(prepared):
    prepared.prepare_data()  # already there: a no-op
    other = TextDataModule(source=prepared.source, data_dir=str(prepared.data_dir), seq_len=SEQ + 1,
                           val_fraction=0.2)
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
    import shutil

    copy = tmp_path / "copy"
    shutil.copytree(prepared.data_dir, copy)
    chunk = sorted((copy / "train").glob("chunk-*.bin"))[0]
    if damage == "truncate":
        chunk.write_bytes(chunk.read_bytes()[:10])
    elif damage == "delete":
        chunk.unlink()
    else:
        (copy / "train" / "index.json").write_text("{not json")
    dm = TextDataModule(source=prepared.source, data_dir=str(copy), seq_len=SEQ, val_fraction=0.2)
    expected = "index.json" if damage == "index" else chunk.name
    with pytest.raises((ValueError, FileNotFoundError), match=expected):
        dm.setup("fit")


def test_hf_tokenizer_json_trained_offline(source, tmp_path):
    """A byte-level BPE trained here with HF tokenizers (no download) drives the whole data path."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers, decoders

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train([str(p) for p in sorted(source.glob("*.txt"))],
              trainers.BpeTrainer(vocab_size=300, special_tokens=["<|endoftext|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    path = tmp_path / "tokenizer.json"
    tok.save(str(path))
    dm = TextDataModule(source=str(source), tokenizer=str(path), data_dir=str(tmp_path / "d"), seq_len=15,
                        batch_size=2, val_fraction=0.2)
    dm.prepare_data()
    dm.setup("fit")
    assert dm.tokenizer.vocab_size <= 300 and dm.tokenizer.eos_id == tok.token_to_id("<|endoftext|>")
    assert dm.meta["bytes_per_token"] > 1.5  # BPE merges bytes
    batch = next(iter(dm.train_dataloader()))
    assert batch.shape == (2, 16) and int(batch.long().max()) < dm.tokenizer.vocab_size
    assert "word word" in dm.tokenizer.decode(dm.tokenizer.encode("Document 3. word word"))


def test_missing_tokenizer_file_is_named(tmp_path):
    dm = TextDataModule(source="embedded", tokenizer=str(tmp_path / "nope.json"), data_dir=str(tmp_path / "d"))
    with pytest.raises(FileNotFoundError, match="nope.json"):
        dm.prepare_data()
