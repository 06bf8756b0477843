"""NumericsGuard: a non-finite loss or gradient norm stops training (or skips the step) instead of training on NaN.

Without it, a diverging run (e.g. lr 1e3) logs NaN from some step to the end, exits 0, and every checkpoint after
that step, last.ckpt included, holds NaN weights.

Decisions:
- Checked after the backward, before the optimizer step (`on_before_optimizer_step`): the step's loss (every
  micro-batch of it) and the global gradient norm (over all shards under FSDP2). The ranks agree on the decision (one
  boolean all-reduce), so no rank is left waiting in a collective the others abandoned. The losses and the norm stay
  on the device until that decision: one host sync per optimizer step, none per micro-batch. The norm is computed
  here as well as by the Trainer's clipping: one extra read of the gradients, small beside the step, and it keeps the
  guard independent of whether clipping is on.
- `action: stop` (default) raises an error naming the step, the loss and the norm before the weights change, so the
  weights and every checkpoint stay finite; it names the checkpoint that holds the last finite state (the newest this
  run wrote or resumed from), or says that there is none yet. `action: skip` drops the step's gradients (AdamW leaves
  parameters without a gradient untouched: no update, no weight decay), logs train/skipped_steps, and stops after
  `max_skips` skipped steps in a row.
- LatestCheckpoint (checkpoints.py) also refuses to write non-finite weights, whatever their cause.
"""
from __future__ import annotations

import warnings
from pathlib import Path
from typing import Literal

import torch
from lightning.pytorch.callbacks import Callback

from swax_lightning.training.checkpoints import LatestCheckpoint


class NonFiniteError(RuntimeError):
    pass


class NumericsGuard(Callback):
    """Stops (or skips) optimizer steps with a non-finite loss or gradient norm.

    Args:
        action: "stop" raises at the first bad step; "skip" drops its gradients and goes on.
        max_skips: Under "skip", this many bad steps in a row still stop training.
    """

    def __init__(self, action: Literal["stop", "skip"] = "stop", max_skips: int = 10):
        if action not in ("stop", "skip"):
            raise ValueError(f"NumericsGuard.action must be 'stop' or 'skip' (got {action!r})")
        if max_skips < 1:
            raise ValueError(f"NumericsGuard.max_skips must be >= 1 (got {max_skips})")
        self.action, self.max_skips = action, max_skips
        self.skipped_in_a_row, self.skipped = 0, 0
        self._step_losses: list[torch.Tensor] = []

    def on_before_backward(self, trainer, pl_module, loss: torch.Tensor) -> None:
        self._step_losses.append(loss.detach())  # kept on the device: no host sync per micro-batch

    def on_before_optimizer_step(self, trainer, pl_module, optimizer) -> None:
        grads = [p.grad for p in pl_module.parameters() if p.grad is not None]
        losses = torch.stack(self._step_losses) if self._step_losses else torch.zeros(0)
        self._step_losses = []
        norm = _global_norm(grads, losses.device)
        bad = ~(torch.isfinite(losses).all() & torch.isfinite(norm))
        # The one host sync of the step; the ranks agree (any rank bad = all stop or skip together).
        if not trainer.strategy.reduce_boolean_decision(bool(bad), all=False):
            self.skipped_in_a_row = 0
            return
        what = (f"non-finite loss or gradient at step {trainer.global_step} (loss {losses.tolist()}, "
                f"gradient norm {float(norm)})")
        self.skipped_in_a_row += 1
        if self.action == "stop" or self.skipped_in_a_row > self.max_skips:
            raise NonFiniteError(f"{what}: training stopped before the weights changed; {_finite_state(trainer)} "
                                 "(NumericsGuard; action: skip drops such steps instead)")
        warnings.warn(f"{what}: step skipped", stacklevel=2)
        self.skipped += 1
        for p in pl_module.parameters():
            p.grad = None
        pl_module.log("train/skipped_steps", float(self.skipped))

    def state_dict(self) -> dict:
        return {"skipped": self.skipped, "skipped_in_a_row": self.skipped_in_a_row}

    def load_state_dict(self, state: dict) -> None:
        self.skipped, self.skipped_in_a_row = state["skipped"], state["skipped_in_a_row"]


def _finite_state(trainer) -> str:
    """Where the last finite state is: the newest checkpoint this run wrote (LatestCheckpoint's last.ckpt, or a
    ModelCheckpoint's file: both are written only while the guard lets training go on) or resumed from."""
    written = [cb.written for cb in trainer.callbacks if isinstance(cb, LatestCheckpoint)]
    written += [getattr(cb, name, "") for cb in trainer.checkpoint_callbacks
                for name in ("last_model_path", "best_model_path")]
    written.append(trainer.ckpt_path)
    found = [Path(path) for path in written if path and Path(path).exists()]
    if not found:
        return "no checkpoint of this run was written before it, so none holds its weights"
    return f"the last finite state is in {max(found, key=lambda path: path.stat().st_mtime)}"


def _global_norm(grads: list[torch.Tensor], device: torch.device) -> torch.Tensor:
    if not grads:
        return torch.zeros((), device=device)
    norm = torch.nn.utils.get_total_norm(grads)
    return norm.full_tensor() if hasattr(norm, "full_tensor") else norm  # FSDP2: reduced over all shards
