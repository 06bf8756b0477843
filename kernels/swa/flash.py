"""Sliding-window attention through flash-attn (an optional extra, CUDA only): the proven kernel for windows without
sinks.

flash-attn's `window_size=(left, right)` lets query t see keys t-left .. t+right, so our window W (keys t-W+1 .. t,
the current token included) is `window_size=(W - 1, 0)` with causal=True. It takes the [B, T, H, D] layout and GQA
natively; it has no sink tokens, so the dispatcher never sends it a call with sinks (kernels/backends.py checks
this when the config is read).
"""
from __future__ import annotations

import torch


def swa_flash(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, window: int | None, n_sink: int = 0,
              scale: float | None = None) -> torch.Tensor:
    """Same contract as kernels.swa.blocked.swa_blocked, n_sink = 0 only; fp16 / bf16 CUDA tensors."""
    from flash_attn import flash_attn_func

    if n_sink:
        raise ValueError(f"flash-attn has no sink tokens (got n_sink={n_sink})")
    T = q.shape[1]
    left = -1 if window is None or window >= T else window - 1  # -1: unbounded
    return flash_attn_func(q, k, v, softmax_scale=scale, causal=True, window_size=(left, 0))
