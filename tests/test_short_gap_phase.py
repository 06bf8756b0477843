"""The short-gap phase (RecallMix.short_gap_steps): training reads short-gap MQAR documents, and nothing else, for
its first steps, then the mixed training split; a run stopped inside the phase or after it resumes exactly."""
import csv

import lightning as L
import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.loggers import CSVLogger
from litdata import StreamingDataset, TokensLoader

from swax_lightning.core.errors import InputError
from swax_lightning.data import mqar_episodes as mqar
from swax_lightning.data.datamodule import SHORT_GAPS, TextDataModule
from swax_lightning.data.phased_loader import PhasedLoader
from swax_lightning.data.recall_documents import RecallMix, training_document, training_pieces
from swax_lightning.training.module import LanguageModule
from tests.stop_at import StopAt

SEQ, BATCH = 64, 2
MIX = dict(kind="mqar", documents=6, doc_chars=1500, max_gap=160, copy_share=0.3, short_gap_steps=3,
           short_max_gap=16, short_gap_documents=4)


def _source(tmp_path):
    source = tmp_path / "text"
    source.mkdir(exist_ok=True)
    for i in range(20):
        (source / f"doc{i}.txt").write_text(f"Plain prose number {i}, written to be the text of the mix. " * 12)
    return source


def _data(tmp_path, **mix) -> TextDataModule:
    return TextDataModule(source=str(_source(tmp_path)), data_dir=str(tmp_path / "shards"), seq_len=SEQ,
                          batch_size=BATCH, val_fraction=0.1, test_fraction=0.1, seed=5, recall=MIX | mix)


def _blocks(folder) -> set[tuple[int, ...]]:
    stream = StreamingDataset(str(folder), item_loader=TokensLoader(block_size=SEQ + 1))
    return {tuple(torch.as_tensor(stream[i]).tolist()) for i in range(len(stream))}


def test_the_phase_reads_only_short_gap_episodes_then_the_training_split(tmp_path, capsys):
    data = _data(tmp_path)
    data.prepare_data()
    data.setup("fit")
    assert f"short-gap phase {data.meta[f'{SHORT_GAPS}_tokens']:,}" in capsys.readouterr().out
    phase, train = _blocks(tmp_path / "shards" / SHORT_GAPS), _blocks(tmp_path / "shards/train")
    assert not phase & train
    loader = data.train_dataloader()
    assert isinstance(loader, PhasedLoader)
    batches = list(loader)
    assert len(batches) == 3 + len(data.datasets["train"]) // BATCH
    rows = [[tuple(row.tolist()) for row in batch] for batch in batches]
    assert all(row in phase for batch in rows[:3] for row in batch)  # the first 3 steps: the phase's split only
    assert all(row in train for batch in rows[3:] for row in batch)  # then the training split, all of it
    assert len({row for batch in rows[3:] for row in batch}) == len(rows[3:]) * BATCH
    # The phase's split is its documents and nothing else (no text): their tokens, one end-of-text id each.
    mix = RecallMix(**MIX)
    documents = [training_pieces(mix.documents + i, mix.short_gap_phase, 5) for i in range(mix.short_gap_documents)]
    assert data.meta[f"{SHORT_GAPS}_tokens"] == sum(len("".join(p for p, _ in doc)) + 1 for doc in documents)
    # ... whose every recall lies within the reach of gaps up to short_max_gap (a copy's: its span + 1, up to 49);
    # the training split's go further.
    short = [training_document(mix.documents + i, mix.short_gap_phase, 5)[1] for i in range(mix.short_gap_documents)]
    long = [training_document(i, mix, 5)[1] for i in range(mix.documents)]
    reach = max(mqar.max_reach(mix.pairs, mix.key_length, 16), mix.copy_lengths[1] + 1)
    assert max(max(r) for r in short) <= reach < max(max(r) for r in long)


def test_too_few_phase_documents_and_bad_fields_are_named(tmp_path):
    data = _data(tmp_path, short_gap_documents=1, short_gap_steps=40)
    data.prepare_data()
    data.setup("fit")
    with pytest.raises(InputError, match=r"needs 40 batches .* raise data.recall.short_gap_documents \(now 1\)"):
        data.train_dataloader()
    bad = ((dict(short_max_gap=200), "short_max_gap"), (dict(short_gap_documents=0), "short_gap_documents"),
           (dict(short_gap_steps=-1), "short_gap_steps"), (dict(kind="facts"), "short_gap_steps"))
    for fields, name in bad:
        with pytest.raises(ValueError, match=rf"RecallMix\.{name}"):
            RecallMix(**MIX | fields)


def _run(tmp, name, source, max_steps, ckpt_path=None, extra=()):
    L.seed_everything(0)
    module = LanguageModule(arch=dict(vocab_size=257, d_model=16, n_layers=2, n_heads=2, mlstm_heads=2,
                                      chunk_size=16, window=16), optim=dict(lr=1e-2, warmup_steps=2))
    trainer = L.Trainer(
        accelerator="cpu", devices=1, max_steps=max_steps, limit_val_batches=0, log_every_n_steps=1,
        logger=CSVLogger(tmp, name=name, version=0), enable_progress_bar=False, enable_model_summary=False,
        deterministic=True, accumulate_grad_batches=2,
        callbacks=[ModelCheckpoint(dirpath=f"{tmp}/ckpt", save_last=True, every_n_train_steps=1), *extra])
    trainer.fit(module, _data(source), ckpt_path=ckpt_path)
    return trainer


def _losses(tmp, name):
    with open(f"{tmp}/{name}/version_0/metrics.csv") as f:
        return {int(r["step"]): float(r["train/loss"]) for r in csv.DictReader(f) if r.get("train/loss")}


@pytest.mark.parametrize("stop", [1, 3])  # inside the phase (3 steps of 2 batches), and at its end
def test_a_run_stopped_inside_or_after_the_phase_resumes_exactly(tmp_path, stop):
    _run(tmp_path / "full", "full", tmp_path, max_steps=6)
    _run(tmp_path / "part", "a", tmp_path, max_steps=6, extra=[StopAt(stop)])
    resumed = _run(tmp_path / "part", "b", tmp_path, max_steps=6, ckpt_path=str(tmp_path / "part/ckpt/last.ckpt"))
    assert resumed.global_step == 6
    full, parts = _losses(tmp_path / "full", "full"), _losses(tmp_path / "part", "a") | _losses(tmp_path / "part", "b")
    assert sorted(parts) == sorted(full) == list(range(6))
    for step in full:
        assert parts[step] == pytest.approx(full[step], rel=1e-6, abs=1e-7), step
