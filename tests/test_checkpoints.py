"""last.ckpt is always the newest finite state, and the numerics guard stops (or skips) non-finite steps without
letting a NaN model replace a good checkpoint (one process, tiny model, in-process Lightning runs). The one checkpoint
loader checks the tokenizer by content, for every command that loads a checkpoint (run as a user types them)."""
import errno
import math
import os
import subprocess
import sys
from pathlib import Path

import lightning as L
import pytest
import torch
from fsspec.implementations.local import LocalFileOpener
from lightning.pytorch.callbacks import Callback, ModelCheckpoint
from lightning.pytorch.loggers import CSVLogger

from swax_lightning.core.errors import InputError
from swax_lightning.data.datamodule import TextDataModule
from swax_lightning.training.checkpoints import LAST, LatestCheckpoint
from swax_lightning.training.module import LanguageModule
from swax_lightning.training.numerics import NonFiniteError, NumericsGuard

ROOT = Path(__file__).resolve().parents[1]
TINY = dict(vocab_size=257, d_model=32, n_layers=2, n_heads=2, mlstm_heads=2, chunk_size=16, window=32)


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    return str(tmp_path_factory.mktemp("data") / "shards")


def _fit(tmp, data_dir, max_steps, lr=1e-2, callbacks=(), every=0, val_every=2, guard="stop", ckpt_path=None):
    L.seed_everything(0)
    module = LanguageModule(arch=TINY, optim=dict(lr=lr, warmup_steps=0))
    trainer = L.Trainer(
        accelerator="cpu", devices=1, max_steps=max_steps, val_check_interval=val_every, check_val_every_n_epoch=None,
        limit_val_batches=1, log_every_n_steps=1, logger=CSVLogger(tmp, name="run", version=0),
        enable_progress_bar=False, enable_model_summary=False,
        callbacks=[*callbacks, ModelCheckpoint(dirpath=f"{tmp}/ckpt", monitor="val/loss"),
                   LatestCheckpoint(every_n_train_steps=every), NumericsGuard(action=guard)])
    trainer.fit(module, TextDataModule(source="embedded", data_dir=data_dir, seq_len=64, batch_size=2),
                ckpt_path=ckpt_path)
    return trainer, module


def _last(tmp):
    return torch.load(tmp / "ckpt" / LAST, weights_only=False)


def test_last_checkpoint_is_the_final_step_not_the_last_validation(tmp_path, data_dir):
    trainer, module = _fit(tmp_path, data_dir, max_steps=5, val_every=2)
    saved = _last(tmp_path)
    assert saved["global_step"] == 5 == trainer.global_step  # ModelCheckpoint(save_last) would hold step 4
    for name, value in module.state_dict().items():
        assert torch.equal(saved["state_dict"][name], value), name
    assert not list((tmp_path / "ckpt").glob(".*"))  # no temporary file left behind


def test_last_checkpoint_records_the_best_checkpoint_that_exists_and_a_resume_leaves_no_orphan(tmp_path, data_dir):
    def model_checkpoint_state(saved):
        [state] = [v for k, v in saved["callbacks"].items() if k.startswith("ModelCheckpoint")]
        return state

    trainer, _ = _fit(tmp_path, data_dir, max_steps=6, val_every=2)  # validations at steps 2, 4, 6; top-1 kept
    best = Path(trainer.checkpoint_callback.best_model_path)
    recorded = model_checkpoint_state(_last(tmp_path))
    assert Path(recorded["best_model_path"]) == best and best.is_file(), (recorded["best_model_path"], best)
    _fit(tmp_path, data_dir, max_steps=10, val_every=2, ckpt_path=str(tmp_path / "ckpt" / LAST))
    state = model_checkpoint_state(_last(tmp_path))
    kept = sorted(p.name for p in (tmp_path / "ckpt").glob("*.ckpt") if p.name != LAST)
    assert kept == [Path(state["best_model_path"]).name], kept  # exactly the best; no file from before the resume


@pytest.mark.parametrize("fills_at", ["ModelCheckpoint", "last.ckpt"])
def test_a_save_that_fails_for_lack_of_space_leaves_no_half_written_file_and_says_so(tmp_path, data_dir,
                                                                                      monkeypatch, fills_at):
    """The disk fills during the step-4 validation's saves (first ModelCheckpoint's file, then last.ckpt's
    temporary one): half of the bytes reach the file, then ENOSPC, as a full disk does."""
    write, target = LocalFileOpener.write, {"ModelCheckpoint": "step=4.ckpt", "last.ckpt": ".last.ckpt.tmp"}[fills_at]
    full = {"at": None}

    def write_until_full(self, data):
        if full["at"] is not None and target in str(self.path):
            write(self, data[:len(data) // 2])
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return write(self, data)

    class DiskFillsAtStep4(Callback):
        def on_validation_start(self, trainer, pl_module):
            full["at"] = 4 if trainer.global_step == 4 else None

    monkeypatch.setattr(LocalFileOpener, "write", write_until_full)
    with pytest.raises(InputError, match=r"step 4: saving .* failed \(No space left on device\)"):
        _fit(tmp_path, data_dir, max_steps=6, val_every=2, callbacks=[DiskFillsAtStep4()])
    assert _last(tmp_path)["global_step"] == 2  # the good state stays
    left = sorted(p.name for p in (tmp_path / "ckpt").iterdir())
    assert left == (["epoch=0-step=2.ckpt", LAST] if fills_at == "ModelCheckpoint"
                    else ["epoch=0-step=4.ckpt", LAST]), left  # no half-written or temporary file


def test_non_finite_loss_stops_with_the_step_named_and_keeps_the_last_finite_checkpoint(tmp_path, data_dir):
    with pytest.raises(NonFiniteError, match=r"non-finite loss or gradient at step (\d+)") as err:
        _fit(tmp_path, data_dir, max_steps=60, lr=1e3, every=1)
    bad_step = int(err.value.args[0].split("at step ")[1].split()[0])
    assert f"the last finite state is in {tmp_path / 'ckpt' / LAST} " in err.value.args[0]
    saved = _last(tmp_path)
    assert 0 < saved["global_step"] <= bad_step
    assert all(torch.isfinite(v).all() for v in saved["state_dict"].values())


def test_non_finite_loss_before_any_checkpoint_says_there_is_none(tmp_path, data_dir):
    """NaN at step 1, before the first save (validation every 2 steps, no step-wise saves): no promise of one."""
    with pytest.raises(NonFiniteError, match="at step 1") as err:
        _fit(tmp_path, data_dir, max_steps=5, callbacks=[NaNLossAt(1)], every=0)
    assert "no checkpoint of this run was written before it, so none holds its weights" in err.value.args[0]
    assert not (tmp_path / "ckpt").exists()


class PoisonWeights(Callback):
    """Writes NaN into one weight right after the optimizer step of `step` (before LatestCheckpoint sees it)."""

    def __init__(self, step):
        self.step = step

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if trainer.global_step == self.step:
            with torch.no_grad():
                pl_module.model.lm_head.weight[0, 0] = math.nan


def test_non_finite_weights_never_replace_last_checkpoint(tmp_path, data_dir):
    with pytest.warns(UserWarning, match=f"step 3: the weights are not finite; {LAST} keeps the previous state"):
        with pytest.raises(NonFiniteError, match="at step 3"):
            _fit(tmp_path, data_dir, max_steps=10, every=1, callbacks=[PoisonWeights(3)])
    saved = _last(tmp_path)
    assert saved["global_step"] == 2
    assert all(torch.isfinite(v).all() for v in saved["state_dict"].values())


class NaNLossAt(Callback):
    """Makes the loss of optimizer step `step` NaN (through the batch: an id the model has no row for is not enough,
    so the module's loss is patched for that one step)."""

    def __init__(self, step):
        self.step, self.params_before = step, None

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        if trainer.global_step == self.step:
            self.params_before = {n: p.detach().clone() for n, p in pl_module.named_parameters()}
            original = pl_module.loss
            pl_module.loss = lambda b: (original(b)[0] * math.nan, original(b)[1])
            self._restore = lambda: setattr(pl_module, "loss", original)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if self.params_before is not None and trainer.global_step == self.step + 1:
            self._restore()
            self.params_after = {n: p.detach().clone() for n, p in pl_module.named_parameters()}


def test_skip_mode_drops_the_bad_step_and_goes_on(tmp_path, data_dir):
    probe = NaNLossAt(2)
    with pytest.warns(UserWarning, match="non-finite loss or gradient at step 2.*step skipped"):
        trainer, module = _fit(tmp_path, data_dir, max_steps=5, callbacks=[probe], guard="skip")
    assert trainer.global_step == 5
    for name, before in probe.params_before.items():
        assert torch.equal(probe.params_after[name], before), name  # no update, no weight decay
    assert all(torch.isfinite(p).all() for p in module.parameters())
    assert trainer.callback_metrics["train/skipped_steps"] == 1


# ---- the one loader: a checkpoint's tokenizer is checked by content ------------------------------------------------
def _bpe(text: str, path: Path, vocab: int = 300) -> Path:
    """A byte-level BPE tokenizer.json trained on `text` (different texts give different merges, same size)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer, tok.decoder = pre_tokenizers.ByteLevel(add_prefix_space=False), decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab, special_tokens=["<|endoftext|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator([text] * 20, trainer)
    tok.save(str(path))
    return path


@pytest.mark.slow
def test_a_replaced_tokenizer_file_is_refused_by_test_generate_export_and_resume(tmp_path):
    """fit records the tokenizer's content fingerprint in the checkpoint; a different tokenizer of the same size put
    at the same path is refused, in one line, by every command that loads the checkpoint."""
    (tmp_path / "src").mkdir()
    for i in range(40):
        (tmp_path / "src" / f"doc{i}.py").write_text(f"def f{i}(x):\n    return x * {i} + {i * i}\n" * 30)
    tokenizer = _bpe("def return x * + 1 2 3 4 5 6 7 8 9 0\n" * 10, tmp_path / "tokenizer.json")
    common = ["--config", str(ROOT / "configs/tiny.yaml"), "--data.source", str(tmp_path / "src"),
              "--data.tokenizer", str(tokenizer), "--data.data_dir", str(tmp_path / "data"), "--data.seq_len", "64",
              "--data.batch_size", "2", "--data.val_fraction", "0.1", "--data.test_fraction", "0.1",
              "--model.arch.vocab_size", "320",
              "--trainer.logger.init_args.save_dir", str(tmp_path / "runs"), "--trainer.enable_progress_bar", "false"]
    fit = _command("main.py", "fit", *common, "--trainer.max_steps", "1", "--trainer.limit_val_batches", "0")
    assert fit.returncode == 0, fit.stderr[-3000:]
    ckpt = tmp_path / "runs/tiny/w64/checkpoints/last.ckpt"
    recorded = torch.load(ckpt, weights_only=False)["datamodule_hyper_parameters"]["tokenizer_fingerprint"]
    assert recorded.startswith("sha256:")
    _bpe("completely other words for another vocabulary of merges\n" * 10, tokenizer)  # same path, same size
    runs = {"test": _command("main.py", "test", *common, "--ckpt_path", str(ckpt)),
            "resume": _command("main.py", "fit", *common, "--ckpt_path", str(ckpt), "--trainer.max_steps", "2"),
            "generate": _command("-m", "swax_lightning", "generate", "--ckpt_path", str(ckpt), "--prompt", "def"),
            "export": _command("-m", "swax_lightning", "export", "--ckpt_path", str(ckpt), "--out",
                               str(tmp_path / "hf"))}
    for name, run in runs.items():
        lines = run.stderr.strip().splitlines()
        assert run.returncode == 2 and len(lines) == 1, (name, run.stderr[-2000:])
        assert str(tokenizer) in lines[0] and recorded in lines[0], (name, lines)
    assert not (tmp_path / "hf").exists()


def _command(*args):
    return subprocess.run([sys.executable, *args], cwd=ROOT, capture_output=True, text=True, timeout=300)
