"""Dense reference for sliding-window attention with sink tokens: the slow, obviously-correct twin.

It builds the full T x T boolean mask and calls SDPA once, so it costs O(T^2) time and memory. It exists for tests and
for reading: every fast path (the blocked PyTorch path, the Triton kernel) is compared against it.

Convention (docs/design.md section 2): a window W is the number of keys a query sees, the current token
included, so query t sees keys max(0, t-W+1) .. t, plus keys 0 .. n_sink-1 when sinks are on. W = None or W >= T is
full causal attention.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F


def sliding_window_mask(q_len: int, window: int | None, n_sink: int = 0, *, k_len: int | None = None,
                        q_offset: int = 0, device=None) -> torch.Tensor:
    """Boolean visibility mask [q_len, k_len]; query i sits at absolute position q_offset + i, key j at position j."""
    k_len = q_offset + q_len if k_len is None else k_len
    t = torch.arange(q_len, device=device)[:, None] + q_offset
    s = torch.arange(k_len, device=device)[None, :]
    visible = s <= t
    if window is not None:
        visible &= (t - s < window) | (s < n_sink)
    return visible


def swa_reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, window: int | None, n_sink: int = 0,
                  scale: float | None = None) -> torch.Tensor:
    """q [B, T, Hq, D], k and v [B, T, Hkv, D] with Hq a multiple of Hkv (GQA). Returns [B, T, Hq, D]."""
    T, n_rep = q.shape[1], q.shape[2] // k.shape[2]
    mask = sliding_window_mask(T, window, n_sink, device=q.device)
    k, v = (x.repeat_interleave(n_rep, dim=2) for x in (k, v))
    out = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                         attn_mask=mask, scale=scale)
    return out.transpose(1, 2)
