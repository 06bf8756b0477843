"""StochasticWindow: the Lightning Callback that picks the SWA window of every training step (the paper's recipe).

For each optimizer step s the window is drawn from `windows` with probabilities `probs` (the paper: 128 with p,
2048 with 1 - p; p = 0.5 at 1.4B, 0.75 at 7B), except in the last `anneal_fraction` of max_steps, which all use
`anneal_window` (default: the largest window). Validation, test and prediction run at `eval_window`. A fixed-window arm
is the same callback with one window; left empty, `windows` and `eval_window` default to the model's configured
window, so a run without a schedule trains and evaluates at ModelConfig.window (the CLI always installs this callback,
from the YAML section `window:`).

Decisions:
- The window of step s is a pure function of (seed, s): a counter-based generator seeded with [seed, s]. Every rank
  computes the same sequence without communication, a resumed run continues it exactly, and changing max_steps
  moves only the anneal point.
- One window per optimizer step: micro-batches of one step under gradient accumulation share `global_step`, hence
  the window. All SWA layers get it at once through `SWAXModel.set_window`.
- Logged every optimizer step, straight to the loggers: train/window and, where the schedule has more than one
  window, train/short_window_fraction (share of steps so far at the smallest window).
  The counts behind the fraction are the callback's state and go into the checkpoint.
"""
from __future__ import annotations

import math
import warnings

import lightning as L
import numpy as np
from lightning.pytorch.callbacks import Callback


class StochasticWindow(Callback):
    """Per-step attention window for SWA layers.

    Args:
        windows: Candidate windows in keys (current token included), e.g. [128, 2048]. Empty = the model's window.
        probs: Probability of each window; must sum to 1. Empty = uniform.
        anneal_fraction: Final share of max_steps trained at anneal_window only (the paper: 0.1). In [0, 1).
        anneal_window: Window of the anneal phase; empty = max(windows).
        eval_window: Window for validation, test and prediction (the paper: 2048). Empty = the model's window.
        seed: Seed of the window sequence (independent of the global seed).
    """

    def __init__(self, windows: list[int] | None = None, probs: list[float] | None = None,
                 anneal_fraction: float = 0.1, anneal_window: int | None = None, eval_window: int | None = None,
                 seed: int = 0):
        self.requested = dict(windows=windows, probs=probs, anneal_window=anneal_window, eval_window=eval_window)
        self.anneal_fraction, self.seed = float(anneal_fraction), int(seed)
        self.steps_counted = 0  # optimizer steps whose window has been counted (== next step to count)
        self.short_steps = 0
        self.resolve(default_window=windows[0] if windows else 1)

    def resolve(self, default_window: int) -> None:
        """Fill the empty fields from the model's window and validate everything."""
        req = self.requested
        self.windows = [int(w) for w in req["windows"]] if req["windows"] else [int(default_window)]
        n = len(self.windows)
        self.probs = [float(p) for p in req["probs"]] if req["probs"] is not None else [1.0 / n] * n
        self.anneal_window = int(max(self.windows) if req["anneal_window"] is None else req["anneal_window"])
        self.eval_window = int(default_window if req["eval_window"] is None else req["eval_window"])
        self._validate()
        self._cum = np.cumsum(self.probs)
        self.short_window = min(self.windows)

    def _validate(self) -> None:
        for name, values in (("windows", self.windows), ("anneal_window", [self.anneal_window]),
                             ("eval_window", [self.eval_window])):
            if any(w < 1 for w in values):
                raise ValueError(f"StochasticWindow.{name} must be >= 1 (got {values})")
        if len(self.probs) != len(self.windows):
            raise ValueError(f"StochasticWindow.probs needs one probability per window ({len(self.windows)}), "
                             f"got {self.probs}")
        if any(not 0.0 <= p <= 1.0 for p in self.probs):
            raise ValueError(f"StochasticWindow.probs must each be in [0, 1] (got {self.probs})")
        if not math.isclose(sum(self.probs), 1.0, abs_tol=1e-6):
            raise ValueError(f"StochasticWindow.probs must sum to 1 (got {self.probs}, sum {sum(self.probs)})")
        if not 0.0 <= self.anneal_fraction < 1.0:
            raise ValueError(f"StochasticWindow.anneal_fraction must be in [0, 1) (got {self.anneal_fraction})")

    # ---- the schedule: a pure function of (seed, step) ------------------------------------------------------
    def anneal_start(self, max_steps: int) -> int:
        """First step of the anneal phase."""
        return math.ceil((1.0 - self.anneal_fraction) * max_steps)

    def window_at(self, step: int, max_steps: int) -> int:
        if step >= self.anneal_start(max_steps):
            return self.anneal_window
        u = np.random.default_rng([self.seed, step]).random()
        return self.windows[min(int(np.searchsorted(self._cum, u, side="right")), len(self.windows) - 1)]

    # ---- Lightning hooks ------------------------------------------------------------------------------------
    @staticmethod
    def _max_steps(trainer: L.Trainer) -> int:
        return trainer.max_steps if trainer.max_steps > 0 else int(trainer.estimated_stepping_batches)

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        self.resolve(default_window=pl_module.arch.window)
        seq_len = getattr(trainer.datamodule, "seq_len", None)
        if seq_len is not None:
            for w in sorted(set(self.windows + [self.anneal_window, self.eval_window])):
                if w >= seq_len:
                    warnings.warn(f"StochasticWindow: window {w} >= seq_len {seq_len}: full causal attention "
                                  f"for those steps", stacklevel=2)

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        step = trainer.global_step
        window = self.window_at(step, self._max_steps(trainer))
        pl_module.model.set_window(window)
        if step >= self.steps_counted:  # count and log each optimizer step once, whatever the accumulation
            self.steps_counted = step + 1
            self.short_steps += window == self.short_window
            metrics = {"train/window": window}
            if len(set(self.windows) | {self.anneal_window}) > 1:  # a single-window arm has no short window to count
                metrics["train/short_window_fraction"] = self.short_steps / self.steps_counted
            # Straight to the loggers (rank zero only): self.log would thin this out to log_every_n_steps.
            for logger in trainer.loggers:
                logger.log_metrics(metrics, step=step)

    def _use_eval_window(self, trainer, pl_module) -> None:
        pl_module.model.set_window(self.eval_window)

    on_validation_start = on_test_start = on_predict_start = _use_eval_window

    def state_dict(self) -> dict:
        return {"seed": self.seed, "steps_counted": self.steps_counted, "short_steps": self.short_steps}

    def load_state_dict(self, state_dict: dict) -> None:
        if state_dict["seed"] != self.seed:
            warnings.warn(f"StochasticWindow: checkpoint seed {state_dict['seed']} != configured {self.seed}; "
                          f"the window sequence changes from here", stacklevel=2)
        self.steps_counted, self.short_steps = state_dict["steps_counted"], state_dict["short_steps"]
