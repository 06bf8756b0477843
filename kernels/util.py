"""Numeric helpers shared by the kernels and the model layers: one home for each.

- `fp32`: the precision of recurrent state, gates and losses (fp32 also under bf16 autocast; fp64 kept, for tests).
- `soft_cap`: the tanh cap of mLSTM gate pre-activations and output logits, cap * tanh(x / cap) (0 = none).
"""
from __future__ import annotations

import torch


def fp32(x: torch.Tensor) -> torch.Tensor:
    """At least fp32: half types are upcast, fp64 (used by tests for tight comparisons) is kept."""
    return x if x.dtype == torch.float64 else x.float()


def soft_cap(x: torch.Tensor, cap: float) -> torch.Tensor:
    """cap * tanh(x / cap), or x unchanged when cap is 0."""
    return cap * torch.tanh(x / cap) if cap > 0 else x
