"""Sliding-window attention in PyTorch at O(T * W) cost: banded blocked attention (the CPU path, and autograd-exact).

Algorithm. A query at position t sees keys t-W+1 .. t (plus the first n_sink keys). The queries are split in two:
- The head, queries 0 .. n_sink+W-2, which see only the prefix: without sinks every earlier key of theirs is inside
  the window, so they are plain causal attention over the prefix (SDPA is_causal); with sinks, one dense-masked SDPA
  call over the prefix.
- The tail, the remaining queries, cut into blocks of L. Query block [s, s+L) needs exactly the keys s-W+1 .. s+L-1
  (W-1+L of them, taken as one strided `unfold` window per block) plus every sink, and since s >= n_sink+W-1 the
  sinks never overlap the window and are always visible. So the visibility mask is the SAME [L, n_sink+W-1+L] band
  for every block: one 2-D mask for one 4-D SDPA call.

Decisions:
- Why not one [sinks | previous block | own block] call with a per-block mask: a 5-D input or a per-block mask sends
  SDPA on CPU to its math kernel, which materialises every score; a shared 2-D mask on 4-D inputs keeps the fused
  flash kernel (forward and backward). This is what makes the window never slower than full attention.
- L = max(min_block, W // 4): each query then pays for about 1.25 W keys, and the unfolded keys and values cost
  about 5 copies of K and V; smaller L pays fewer masked keys but more copies and smaller matrices.
- Routing by cost: W >= T (or W = None) is plain causal SDPA. Short sequences (T < DENSE_BELOW) and windows for
  which the band would cover more than half the keys take one SDPA call with the dense [T, T] mask, which on CPU runs
  in the fused kernel at about the cost of causal attention: below that point the band's extra copies (slices,
  unfold, concatenation and their backward, each a fresh allocation) cost more than the work they save.
- Tail: T past the last block is zero-padded: padded keys sit after every real
  query (never visible) and padded query rows are dropped.
- GQA goes through SDPA's enable_gqa, so key/value heads are never repeated.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from swax_lightning.kernels.swa.naive import sliding_window_mask

MIN_BLOCK = 64
DENSE_BELOW = 512  # shorter sequences take one dense-mask call: fixed costs outweigh the work saved (measured,
# fwd + bwd at B 8, 4 heads of 32, 2 threads: the band is 0.6-0.8x causal at T 128-256, 1.15-2.3x at T 512)


def block_size(window: int, min_block: int = MIN_BLOCK) -> int:
    """Query block length L of the tail for window W."""
    return max(min_block, window // 4, 1)


def _heads_first(x: torch.Tensor) -> torch.Tensor:  # [B, T, H, D] <-> [B, H, T, D]
    return x.transpose(1, 2)


def _band_mask(block: int, window: int, n_sink: int, device) -> torch.Tensor:
    """[L, n_sink + W-1 + L]: query i of a tail block sees every sink and local key j with i <= j <= i + W - 1."""
    i = torch.arange(block, device=device)[:, None]
    j = torch.arange(window - 1 + block, device=device)[None, :]
    local = (j >= i) & (j <= i + window - 1)
    return torch.cat([local.new_ones(block, n_sink), local], dim=1)


def _head(q, k, v, window: int, n_sink: int, scale, gqa: bool) -> torch.Tensor:
    """Attention of the first P = q.shape[1] queries, which see only the first P keys."""
    P = q.shape[1]
    q, k, v = (_heads_first(x) for x in (q, k[:, :P], v[:, :P]))
    if n_sink == 0 and P <= window:  # every earlier key is inside the window: plain causal
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale, enable_gqa=gqa)
    else:
        mask = sliding_window_mask(P, window, n_sink, device=q.device)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale, enable_gqa=gqa)
    return _heads_first(out)


def _tail(q, k, v, start: int, window: int, n_sink: int, block: int, scale, gqa: bool) -> torch.Tensor:
    """Attention of queries start .. T-1 (start = n_sink + W - 1) in blocks of L with one shared band mask."""
    B, T, Hq, D = q.shape
    n_blocks = -(-(T - start) // block)
    pad = start + n_blocks * block - T
    span = window - 1 + block

    def padded(x, first):  # x[:, first:] zero-padded at the end to whole blocks (no copy when none is needed)
        return F.pad(x[:, first:], (0, 0, 0, 0, 0, pad)) if pad else x[:, first:]

    def query_blocks(x):  # [B, T, H, D] -> [B * n_blocks, H, L, D]
        x = padded(x, start)
        return x.reshape(B, n_blocks, block, Hq, D).transpose(2, 3).reshape(B * n_blocks, Hq, block, D)

    def key_blocks(x):  # [B, T, H, D] -> [B * n_blocks, H, n_sink + W-1 + L, D]
        H = x.shape[2]
        local = padded(x, n_sink).unfold(1, span, block).permute(0, 1, 2, 4, 3)  # [B, n_blocks, H, span, D]
        if n_sink:
            sinks = _heads_first(x[:, :n_sink])[:, None].expand(B, n_blocks, H, n_sink, D)
            local = torch.cat([sinks, local], dim=3)
        return local.reshape(B * n_blocks, H, n_sink + span, D)

    mask = _band_mask(block, window, n_sink, q.device)
    out = F.scaled_dot_product_attention(query_blocks(q), key_blocks(k), key_blocks(v), attn_mask=mask,
                                         scale=scale, enable_gqa=gqa)
    return out.view(B, n_blocks, Hq, block, D).transpose(2, 3).reshape(B, n_blocks * block, Hq, D)[:, :T - start]


def swa_band(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, window: int, n_sink: int = 0,
             scale: float | None = None, min_block: int = MIN_BLOCK) -> torch.Tensor:
    """The head + banded tail form for window < T, whatever the cost (swa_blocked chooses when to use it)."""
    T = q.shape[1]
    gqa = q.shape[2] != k.shape[2]
    n_sink = min(n_sink, T)
    start = min(n_sink + window - 1, T)
    if start == T:
        return _head(q, k, v, window, n_sink, scale, gqa)
    tail = _tail(q, k, v, start, window, n_sink, min(block_size(window, min_block), T - start), scale, gqa)
    return torch.cat([_head(q[:, :start], k, v, window, n_sink, scale, gqa), tail], dim=1) if start else tail


def swa_blocked(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, window: int | None, n_sink: int = 0,
                scale: float | None = None, min_block: int = MIN_BLOCK) -> torch.Tensor:
    """q [B, T, Hq, D], k and v [B, T, Hkv, D] with Hq a multiple of Hkv. Returns [B, T, Hq, D]. Picks the cheapest
    exact form: causal SDPA (W >= T), one dense-mask call (short T, or a window near T), or the banded form."""
    T = q.shape[1]
    gqa = q.shape[2] != k.shape[2]
    if window is None or window >= T:
        out = F.scaled_dot_product_attention(_heads_first(q), _heads_first(k), _heads_first(v), is_causal=True,
                                             scale=scale, enable_gqa=gqa)
        return _heads_first(out)
    n_sink = min(n_sink, T)
    if T < DENSE_BELOW or 2 * (n_sink + window + block_size(window, min_block)) > T:
        return _head(q, k, v, window, n_sink, scale, gqa)
    return swa_band(q, k, v, window, n_sink, scale, min_block)
