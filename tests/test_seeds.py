"""One seed per run, through main.py as a user runs it: `--seed_everything` sets the initial weights, the training
stream's order, the recall documents and the window schedule. Two seeds differ in each; one seed twice trains the
same weights bit for bit."""
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from swax_lightning.commands.cli import SwaxCLI
from swax_lightning.data.datamodule import TextDataModule
from swax_lightning.data.recall_documents import training_document
from swax_lightning.training.module import LanguageModule
from swax_lightning.training.window import StochasticWindow

ROOT = Path(__file__).resolve().parents[1]
CONFIG = str(ROOT / "configs/tiny_stochastic.yaml")
MQAR = ["--data.recall", '{"kind": "mqar", "documents": 8, "doc_chars": 2048}']


def _parsed(seed: int, folder: Path) -> SwaxCLI:
    """The run main.py would build for this seed (parsed and instantiated, not started)."""
    return SwaxCLI(LanguageModule, TextDataModule, run=False, seed_everything_default=0,
                   args=["--config", CONFIG, "--seed_everything", str(seed), "--trainer.logger", "false",
                         "--data.data_dir", str(folder / f"data-{seed}"), *MQAR])


def _first_batches(data: TextDataModule, n: int = 3) -> torch.Tensor:
    data.prepare_data()
    data.setup("fit")
    batches = iter(data.train_dataloader())
    return torch.cat([next(batches) for _ in range(n)])


def test_two_seeds_give_two_data_orders_recall_corpora_and_window_schedules(tmp_path):
    runs = {seed: _parsed(seed, tmp_path) for seed in (1, 2)}
    again = _parsed(1, tmp_path / "again")
    for seed, cli in runs.items():
        [window] = [c for c in cli.trainer.callbacks if isinstance(c, StochasticWindow)]
        assert cli.datamodule.seed == window.seed == seed
    schedule = {seed: [w.window_at(s, 1000) for s in range(200) for w in cli.trainer.callbacks
                       if isinstance(w, StochasticWindow)] for seed, cli in runs.items()}
    assert schedule[1] != schedule[2] and set(schedule[1]) == set(schedule[2]) == {16, 64}
    mix = runs[1].datamodule.recall
    assert training_document(0, mix, seed=1) != training_document(0, mix, seed=2)
    first = {seed: _first_batches(cli.datamodule) for seed, cli in runs.items()}
    assert not torch.equal(first[1], first[2])
    assert torch.equal(first[1], _first_batches(again.datamodule))  # the same seed: the same stream


@pytest.mark.slow
def test_one_seed_twice_trains_the_same_weights_and_another_seed_others(tmp_path):
    def fit(seed: int, name: str) -> dict:
        run = subprocess.run([sys.executable, str(ROOT / "main.py"), "fit", "--config", CONFIG,
                              "--seed_everything", str(seed), "--data.data_dir", str(tmp_path / "data"),
                              "--trainer.logger.init_args.save_dir", str(tmp_path / name), "--trainer.max_steps", "6",
                              "--trainer.val_check_interval", "6", "--trainer.limit_val_batches", "1",
                              "--trainer.enable_progress_bar", "false"],
                             cwd=tmp_path, capture_output=True, text=True, timeout=600)
        assert run.returncode == 0, run.stderr[-3000:]
        [ckpt] = (tmp_path / name).glob("*/*/checkpoints/last.ckpt")
        return torch.load(ckpt, map_location="cpu", weights_only=True)["state_dict"]

    first, second, other = fit(1, "a"), fit(1, "b"), fit(2, "c")
    assert first.keys() == second.keys() == other.keys()
    assert all(torch.equal(first[k], second[k]) for k in first)
    assert not all(torch.equal(first[k], other[k]) for k in first)
