"""Test helper callback: what each rank did at every optimizer step, one JSON file per rank, rewritten after every
step (so a run killed with SIGKILL leaves what it did up to then).

Per step: the window, the rank's loss, a digest of the full (all-gathered) parameters after the step, and the rows
of the rank's batch; per validation and test, the synced loss. Optionally kills its own process with SIGKILL inside
the validation at a given step, or makes one rank run one forward more than the others at the end of that validation
(what an uneven split of the batches did: that rank waits in an all-gather while the others wait in the metric sync),
after writing the file `extra-forward-rank<k>` to out_dir.
"""
import hashlib
import json
import os
import signal
from pathlib import Path

import torch
from lightning.pytorch.callbacks import Callback


class RecordTraining(Callback):
    def __init__(self, out_dir: str, kill_in_validation_at: int = -1, kill_rank: int = 1,
                 extra_forward_in_validation_at: int = -1):
        self.out_dir, self.kill_at, self.kill_rank = Path(out_dir), kill_in_validation_at, kill_rank
        self.extra_forward_at = extra_forward_in_validation_at
        self.steps, self.validations, self.tests = {}, [], []
        self._batch = None

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        step = trainer.global_step - 1  # global_step has just advanced
        self.steps[step] = {"window": pl_module.model.window, "loss": float(outputs["loss"]),
                            "params": params_digest(pl_module), "batch": batch.tolist()}
        self._write(trainer)

    def on_validation_batch_start(self, trainer, pl_module, batch, batch_idx, dataloader_idx=0):
        self._batch = batch
        if self._chosen(trainer, self.kill_at):
            os.kill(os.getpid(), signal.SIGKILL)

    def on_validation_epoch_end(self, trainer, pl_module):  # runs before the module's (its metric sync)
        if self._chosen(trainer, self.extra_forward_at):
            self.out_dir.mkdir(parents=True, exist_ok=True)
            (self.out_dir / f"extra-forward-rank{trainer.global_rank}").touch()
            pl_module.loss(self._batch["tokens"])

    def _chosen(self, trainer, step):
        return not trainer.sanity_checking and trainer.global_step == step and trainer.global_rank == self.kill_rank

    def on_validation_end(self, trainer, pl_module):
        if not trainer.sanity_checking:
            self.validations.append({"step": trainer.global_step, "loss": float(trainer.callback_metrics["val/loss"])})
            self._write(trainer)

    def on_test_end(self, trainer, pl_module):
        self.tests.append({"step": trainer.global_step, "loss": float(trainer.callback_metrics["test/loss"])})
        self._write(trainer)

    def _write(self, trainer):
        self.out_dir.mkdir(parents=True, exist_ok=True)
        path = self.out_dir / f"rank{trainer.global_rank}-pid{os.getpid()}.json"
        path.write_text(json.dumps({"steps": self.steps, "validations": self.validations, "tests": self.tests}))


def params_digest(pl_module) -> str:
    """sha256 of every parameter's full value (a collective under FSDP2: each rank gathers the whole model)."""
    digest = hashlib.sha256()
    for name, p in pl_module.named_parameters():
        full = p.full_tensor() if hasattr(p, "full_tensor") else p
        digest.update(name.encode())
        digest.update(full.detach().to(torch.float32).cpu().numpy().tobytes())
    return digest.hexdigest()


def read_records(out_dir) -> dict[int, dict]:
    """{rank: {"steps": {step: record}, "validations": [...], "tests": [...]}} from every file of a run (later
    processes of the same rank, e.g. a resumed run, add to and override earlier ones)."""
    files = sorted(Path(out_dir).glob("rank*.json"), key=lambda f: f.stat().st_mtime)
    out: dict[int, dict] = {}
    for f in files:
        rank = int(f.name.split("-")[0].removeprefix("rank"))
        data = json.loads(f.read_text())
        entry = out.setdefault(rank, {"steps": {}, "validations": [], "tests": []})
        entry["steps"].update({int(k): v for k, v in data["steps"].items()})
        entry["validations"] += data["validations"]
        entry["tests"] += data["tests"]
    return out
