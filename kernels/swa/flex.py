"""Sliding-window attention with sinks through PyTorch's FlexAttention (compiled; a GPU path).

The visibility rule is the one of kernels/swa/naive.py written as a `mask_mod`; FlexAttention turns it into a block
mask and skips every fully masked tile, so the cost is O(T * (W + n_sink)).

Decisions:
- Block masks are cached per (T, W, n_sink, device): the stochastic window schedule cycles through a few windows and
  rebuilding the mask each step would cost more than the attention at small T.
- The window and sink count enter the mask as Python ints captured by the closure; each new (W, n_sink) pair gets
  its own block mask and, once, its own compilation.
- flex_attention is wrapped in torch.compile once, on first use; uncompiled it materialises the scores.
"""
from __future__ import annotations

import functools

import torch

_compiled = None


@functools.lru_cache(maxsize=32)
def _block_mask(T: int, window: int, n_sink: int, device: str):
    from torch.nn.attention.flex_attention import create_block_mask

    def visible(b, h, q_idx, kv_idx):
        return (kv_idx <= q_idx) & ((q_idx - kv_idx < window) | (kv_idx < n_sink))

    return create_block_mask(visible, None, None, T, T, device=device)


def swa_flex(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, window: int | None, n_sink: int = 0,
             scale: float | None = None) -> torch.Tensor:
    """Same contract as kernels.swa.blocked.swa_blocked."""
    global _compiled
    if _compiled is None:
        from torch.nn.attention.flex_attention import flex_attention

        _compiled = torch.compile(flex_attention, dynamic=False)
    T = q.shape[1]
    window = T if window is None or window >= T else int(window)
    mask = _block_mask(T, window, min(n_sink, T), str(q.device))
    out = _compiled(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), block_mask=mask, scale=scale,
                    enable_gqa=q.shape[2] != k.shape[2])
    return out.transpose(1, 2)
