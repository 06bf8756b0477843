"""Sliding-window attention in PyTorch at O(T * W) cost: blocked local attention (the CPU path, and autograd-exact).

Algorithm (docs/design.md section 4). The sequence is cut into blocks of L >= W queries. A query at position t
needs keys t-W+1 .. t, which all lie in its own block or the block before it, so each query block attends to the
concatenation [sink keys | previous block | own block] (n_sink + 2L keys) in one batched SDPA call with a small
[L, n_sink + 2L] mask per block. Work is T * (n_sink + 2L), linear in T.

Decisions:
- L = max(W, min_block): tiny windows would otherwise make thousands of tiny blocks; a larger block only adds
  masked-out keys, never changes the result.
- Sink keys that are also inside the window are masked out of the sink columns, so no key is counted twice.
- T is zero-padded to a multiple of L; padded keys sit after every real query (never visible), padded query rows
  are dropped. W >= T (or W = None) falls through to plain causal SDPA, which is then also O(T * W).
- GQA goes through SDPA's enable_gqa, so key/value heads are never copied.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

MIN_BLOCK = 64


def _block_mask(n_blocks: int, block: int, window: int, n_sink: int, device) -> torch.Tensor:
    """[n_blocks, block, n_sink + 2 * block] visibility of [sinks | previous block | own block] for each query."""
    t = (torch.arange(n_blocks, device=device)[:, None] * block + torch.arange(block, device=device))[:, :, None]
    local = t - t % block - block + torch.arange(2 * block, device=device)  # absolute positions of the local keys
    local_visible = (local >= 0) & (local <= t) & (t - local < window)
    sink = torch.arange(n_sink, device=device)
    sink_visible = (sink <= t) & (t - sink >= window)
    return torch.cat([sink_visible, local_visible], dim=-1)


def swa_blocked(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, window: int | None, n_sink: int = 0,
                scale: float | None = None, min_block: int = MIN_BLOCK) -> torch.Tensor:
    """q [B, T, Hq, D], k and v [B, T, Hkv, D] with Hq a multiple of Hkv. Returns [B, T, Hq, D]."""
    B, T, Hq, D = q.shape
    Hkv = k.shape[2]
    gqa = Hq != Hkv
    if window is None or window >= T:
        out = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                             is_causal=True, scale=scale, enable_gqa=gqa)
        return out.transpose(1, 2)
    n_sink = min(n_sink, T)
    block = min(max(window, min_block), T)
    n_blocks = -(-T // block)
    pad = n_blocks * block - T

    def blocks(x: torch.Tensor) -> torch.Tensor:  # [B, T, H, D] -> [B, n_blocks, H, block, D]
        x = F.pad(x, (0, 0, 0, 0, 0, pad))
        return x.view(B, n_blocks, block, x.shape[2], D).transpose(2, 3)

    def keys(x: torch.Tensor) -> torch.Tensor:  # [B, n_blocks, H, n_sink + 2 * block, D]
        xb = blocks(x)
        prev = F.pad(xb, (0, 0, 0, 0, 0, 0, 1, 0))[:, :-1]
        sinks = x[:, :n_sink].transpose(1, 2)[:, None].expand(B, n_blocks, Hkv, n_sink, D)
        return torch.cat([sinks, prev, xb], dim=3)

    mask = _block_mask(n_blocks, block, window, n_sink, q.device)[None, :, None]
    out = F.scaled_dot_product_attention(blocks(q), keys(k), keys(v), attn_mask=mask, scale=scale,
                                         enable_gqa=gqa)
    return out.transpose(2, 3).reshape(B, n_blocks * block, Hq, D)[:, :T]
