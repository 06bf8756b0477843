"""Test helper callback: what each rank did at every optimizer step, one JSON file per rank, rewritten after every
step (so a run killed with SIGKILL leaves what it did up to then).

Per step: the window, the rank's loss, a digest of the full (all-gathered) parameters after the step, and the rows
of the rank's batch. Optionally kills its own process with SIGKILL inside the validation at a given step.
"""
import hashlib
import json
import os
import signal
from pathlib import Path

import torch
from lightning.pytorch.callbacks import Callback


class RecordTraining(Callback):
    def __init__(self, out_dir: str, kill_in_validation_at: int = -1, kill_rank: int = 1):
        self.out_dir, self.kill_at, self.kill_rank = Path(out_dir), kill_in_validation_at, kill_rank
        self.steps, self.validations = {}, []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        step = trainer.global_step - 1  # global_step has just advanced
        self.steps[step] = {"window": pl_module.model.window, "loss": float(outputs["loss"]),
                            "params": params_digest(pl_module), "batch": batch.tolist()}
        self._write(trainer)

    def on_validation_batch_start(self, trainer, pl_module, batch, batch_idx, dataloader_idx=0):
        if trainer.sanity_checking or trainer.global_step != self.kill_at or trainer.global_rank != self.kill_rank:
            return
        os.kill(os.getpid(), signal.SIGKILL)

    def on_validation_end(self, trainer, pl_module):
        if not trainer.sanity_checking:
            self.validations.append({"step": trainer.global_step, "loss": float(trainer.callback_metrics["val/loss"])})
            self._write(trainer)

    def _write(self, trainer):
        self.out_dir.mkdir(parents=True, exist_ok=True)
        path = self.out_dir / f"rank{trainer.global_rank}-pid{os.getpid()}.json"
        path.write_text(json.dumps({"steps": self.steps, "validations": self.validations}))


def params_digest(pl_module) -> str:
    """sha256 of every parameter's full value (a collective under FSDP2: each rank gathers the whole model)."""
    digest = hashlib.sha256()
    for name, p in pl_module.named_parameters():
        full = p.full_tensor() if hasattr(p, "full_tensor") else p
        digest.update(name.encode())
        digest.update(full.detach().to(torch.float32).cpu().numpy().tobytes())
    return digest.hexdigest()


def read_records(out_dir) -> dict[int, dict]:
    """{rank: {"steps": {step: record}, "validations": [...]}} from every file of a run (later processes of the
    same rank, e.g. a resumed run, add to and override earlier ones)."""
    files = sorted(Path(out_dir).glob("rank*.json"), key=lambda f: f.stat().st_mtime)
    out: dict[int, dict] = {}
    for f in files:
        rank = int(f.name.split("-")[0].removeprefix("rank"))
        data = json.loads(f.read_text())
        entry = out.setdefault(rank, {"steps": {}, "validations": []})
        entry["steps"].update({int(k): v for k, v in data["steps"].items()})
        entry["validations"] += data["validations"]
    return out
