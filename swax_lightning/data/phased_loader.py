"""PhasedLoader: a training stream that reads one loader for its first N batches, then another (a data curriculum).

The study's short-gap phase (RecallMix.short_gap_steps) is its one use: attention forms a lookup by key on recall
episodes with short gaps and no text, which it does not when long gaps and text come from the first step
(docs/study/what_was_tried.md 17-18); the mixed training split follows.

Decisions:
- The phase is counted in batches served, not in epochs or steps, so it is a pure function of the run's position:
  a resumed run reads what an uninterrupted one would. The batch count, the first loader's position while its phase
  lasts, and the second loader's once it has begun make the state Lightning saves in checkpoints (it calls
  `state_dict` / `load_state_dict` on any loader that has them); each inner loader keeps its own (litdata's).
- The first loader is left after its N batches, never exhausted: its split only has to hold them (the data module
  checks that it does, naming the field to raise). Epochs are the second loader's: a new epoch starts it again,
  the phase never comes back.
"""
from __future__ import annotations

from collections.abc import Iterator


class PhasedLoader:
    """`first` for the first `first_batches` batches, then `then`, epoch after epoch."""

    def __init__(self, first, then, first_batches: int):
        if first_batches < 0:
            raise ValueError(f"PhasedLoader.first_batches must be >= 0 (got {first_batches})")
        self.first, self.then, self.first_batches = first, then, first_batches
        self.first_served, self.then_started = 0, False

    def __len__(self) -> int:
        """Batches of the first epoch (the phase's left, then one of `then`)."""
        return self.first_batches - self.first_served + len(self.then)

    def __iter__(self) -> Iterator:
        if self.first_served < self.first_batches:
            batches = iter(self.first)
            try:
                while self.first_served < self.first_batches:
                    batch = next(batches, None)
                    if batch is None:
                        raise RuntimeError(f"PhasedLoader: the first loader ended after {self.first_served} of its "
                                           f"{self.first_batches} batches")
                    self.first_served += 1  # counted before it is handed out, as litdata counts its own
                    yield batch
            finally:
                close = getattr(batches, "close", None)
                if close:
                    close()  # its worker processes stop now, not when garbage-collected
        self.then_started = True
        yield from self.then

    def state_dict(self) -> dict:
        in_phase = self.first_served < self.first_batches
        return {"first_served": self.first_served,
                "first": self.first.state_dict() if in_phase and self.first_served else None,
                "then": self.then.state_dict() if self.then_started else None}

    def load_state_dict(self, state: dict) -> None:
        self.first_served = state["first_served"]
        if state["first"] is not None:
            self.first.load_state_dict(state["first"])
        self.then_started = state["then"] is not None
        if self.then_started:
            self.then.load_state_dict(state["then"])
