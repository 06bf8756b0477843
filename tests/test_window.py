"""The window schedule: statistics, anneal, purity in (seed, step), bad values, and exact resume of a real run."""
import csv
import math
from types import SimpleNamespace

import lightning as L
import pytest
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.loggers import CSVLogger

from swax_lightning.data.datamodule import TextDataModule
from swax_lightning.training.module import LanguageModule
from swax_lightning.training.window import StochasticWindow
from tests.stop_at import StopAt

PAPER = dict(windows=[128, 2048], probs=[0.75, 0.25], anneal_fraction=0.1, eval_window=2048)


@pytest.mark.parametrize("p", [0.5, 0.75])
def test_short_fraction_matches_p_and_last_tenth_is_long(p):
    cb = StochasticWindow(windows=[128, 2048], probs=[p, 1 - p], seed=1)
    max_steps = 20000
    seq = [cb.window_at(s, max_steps) for s in range(max_steps)]
    start = cb.anneal_start(max_steps)
    assert start == 18000
    assert all(w == 2048 for w in seq[start:])
    n = start
    short = sum(w == 128 for w in seq[:start])
    assert abs(short / n - p) < 4 * math.sqrt(p * (1 - p) / n)  # within 4 sigma of the binomial
    assert set(seq[:start]) == {128, 2048}


def test_window_is_a_pure_function_of_seed_and_step():
    a, b, c = StochasticWindow(**PAPER, seed=7), StochasticWindow(**PAPER, seed=7), StochasticWindow(**PAPER, seed=8)
    seq_a = [a.window_at(s, 1000) for s in range(900)]
    assert seq_a == [b.window_at(s, 1000) for s in range(900)]
    assert seq_a == [a.window_at(s, 1000) for s in reversed(range(900))][::-1]  # order of queries is irrelevant
    assert seq_a != [c.window_at(s, 1000) for s in range(900)]
    # max_steps only moves the anneal point: the sampled prefix is unchanged.
    assert [a.window_at(s, 2000) for s in range(900)] == seq_a
    assert a.anneal_start(2000) == 1800 and a.anneal_start(1000) == 900


def test_defaults_to_the_model_window():
    cb = StochasticWindow()
    cb.resolve(default_window=64)
    assert cb.windows == [64] and cb.eval_window == 64 and cb.window_at(5, 10) == 64


@pytest.mark.parametrize("kwargs,field", [
    (dict(windows=[128, 2048], probs=[1.2, -0.2]), "probs"),
    (dict(windows=[128, 2048], probs=[0.5, 0.6]), "probs"),
    (dict(windows=[128, 2048], probs=[1.0]), "probs"),
    (dict(windows=[128], anneal_fraction=1.0), "anneal_fraction"),
    (dict(windows=[128], anneal_fraction=-0.1), "anneal_fraction"),
    (dict(windows=[0, 128]), "windows"),
    (dict(windows=[128], eval_window=0), "eval_window"),
    (dict(windows=[128], anneal_window=-3), "anneal_window"),
])
def test_bad_values_name_the_field(kwargs, field):
    with pytest.raises(ValueError, match=rf"StochasticWindow\.{field}"):
        StochasticWindow(**kwargs)


def test_window_at_or_above_seq_len_warns():
    cb = StochasticWindow(windows=[16, 300], probs=[0.5, 0.5], eval_window=300)
    trainer = SimpleNamespace(datamodule=SimpleNamespace(seq_len=256))
    with pytest.warns(UserWarning, match="300 >= seq_len 256"):
        cb.setup(trainer, SimpleNamespace(arch=SimpleNamespace(window=64)), "fit")


# ---- exact resume of a real training run ----------------------------------------------------------------------
TINY = dict(vocab_size=257, d_model=32, n_layers=2, n_heads=2, mlstm_heads=2, chunk_size=16, window=32)


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    return str(tmp_path_factory.mktemp("data") / "shards")


def _run(tmp, name, data_dir, max_steps, ckpt_path=None, extra=()):
    L.seed_everything(0)
    module = LanguageModule(arch=TINY, optim=dict(lr=1e-2, warmup_steps=2))
    data = TextDataModule(source="embedded", data_dir=data_dir, seq_len=64, batch_size=4)
    trainer = L.Trainer(
        accelerator="cpu", devices=1, max_steps=max_steps, limit_val_batches=0, log_every_n_steps=1,
        logger=CSVLogger(tmp, name=name, version=0), enable_progress_bar=False, enable_model_summary=False,
        deterministic=True, accumulate_grad_batches=2,
        callbacks=[StochasticWindow(windows=[8, 32], probs=[0.5, 0.5], seed=3),
                   ModelCheckpoint(dirpath=f"{tmp}/ckpt", save_last=True, every_n_train_steps=1), *extra])
    trainer.fit(module, data, ckpt_path=ckpt_path)
    return trainer


def _series(tmp, name, key):
    with open(f"{tmp}/{name}/version_0/metrics.csv") as f:
        return {int(r["step"]): float(r[key]) for r in csv.DictReader(f) if r.get(key)}


def test_resume_continues_the_same_windows_and_losses(tmp_path, data_dir):
    _run(tmp_path / "full", "full", data_dir, max_steps=10)
    first = _run(tmp_path / "part", "a", data_dir, max_steps=10, extra=[StopAt(4)])
    assert first.global_step == 4
    resumed = _run(tmp_path / "part", "b", data_dir, max_steps=10, ckpt_path=str(tmp_path / "part/ckpt/last.ckpt"))
    assert resumed.global_step == 10
    for key in ("train/window", "train/loss", "train/short_window_fraction"):
        full = _series(tmp_path / "full", "full", key)
        parts = _series(tmp_path / "part", "a", key) | _series(tmp_path / "part", "b", key)
        assert len(full) >= 9 and sorted(parts) == sorted(full), key
        for step in full:
            assert parts[step] == pytest.approx(full[step], rel=1e-6, abs=1e-7), (key, step)
    windows = _series(tmp_path / "full", "full", "train/window")
    assert {windows[s] for s in range(9)} == {8.0, 32.0} and windows[9] == 32.0  # sampled, then annealed


@pytest.mark.parametrize("windows,logged", [([16], False), ([4, 64], True)])
def test_the_short_window_fraction_is_logged_only_where_there_are_two_windows(windows, logged):
    """A fixed-window arm logged a short-window fraction of 1.0, as if it trained at a short window."""
    from types import SimpleNamespace

    seen = []
    callback = StochasticWindow(windows=windows, anneal_fraction=0.0)
    trainer = SimpleNamespace(global_step=0, max_steps=10, loggers=[SimpleNamespace(
        log_metrics=lambda metrics, step: seen.append(metrics))])
    module = SimpleNamespace(model=SimpleNamespace(set_window=lambda w: None))
    callback.on_train_batch_start(trainer, module, None, 0)
    assert ("train/short_window_fraction" in seen[0]) == logged and "train/window" in seen[0]
