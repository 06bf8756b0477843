"""LoLCATs attention in linear time: the block form of naive.py's formula, O(T * window) time, no [T, T] matrix.

The sequence is cut into blocks of `window` tokens from position 0. Each block of queries takes softmax scores
against [previous block | own block] (2 * window keys, its own block causally), and reads the linear state of every
block before the previous one: an inclusive cumulative sum of the per-block sums phi_k(k) v^T and phi_k(k), shifted
by two blocks. Shapes and the formula are naive.py's.

Decisions:
- The max that shifts the softmax exponentials is over the window only and is kept in the autograd graph: the linear
  terms are not shifted by it, so the output depends on it (LoLCATs computes it the same way).
- A trailing partial block is zero-padded: padded keys come after every real query of the block (masked by causality)
  and their zero features add nothing to any state; padded query rows are dropped.
- State in and out (`LinearState`, fp32): `initial_state` holds keys before position 0 that every query of the call
  reads linearly; the returned state adds the keys a query at position T (the next one) reads linearly, those before
  the block preceding its own, so a decode cache keeps only the last full block and the current partial one.
  A caller that continues a sequence starts the call at a block boundary (the cache starts it at the previous block,
  whose queries it discards), so the blocks line up with the sequence's own.
- `lolcats_one_block`: queries that lie in one block, against cached keys that start at the previous block: the
  decode step, at O(window) per query instead of the block form's O(window^2) per call.
- Autocast is off inside: scores, features, states and normalisers in fp32 (fp64 kept, for tests).
"""
from __future__ import annotations

import math
from typing import NamedTuple

import torch
import torch.nn.functional as F

from swax_lightning.kernels.lolcats.naive import head_factor, repeat_kv
from swax_lightning.kernels.util import fp32


class LinearState(NamedTuple):
    """sum phi_k(k_j) v_j^T [B, H, F, D] and sum phi_k(k_j) [B, H, F] over the keys read linearly, fp32."""
    kv: torch.Tensor
    k: torch.Tensor


def zero_state(batch: int, heads: int, features: int, head_dim: int, device) -> LinearState:
    return LinearState(torch.zeros(batch, heads, features, head_dim, device=device),
                       torch.zeros(batch, heads, features, device=device))


def _blocks(x: torch.Tensor, window: int) -> torch.Tensor:
    """[B, T, H, X] -> [B, n, window, H, X], the tail zero-padded to a whole block."""
    B, T = x.shape[:2]
    n = -(-T // window)
    return F.pad(x, (0, 0, 0, 0, 0, n * window - T)).view(B, n, window, *x.shape[2:])


def _previous(x: torch.Tensor) -> torch.Tensor:
    """Block b -> block b - 1 along dim 1 (zeros before block 0: masked out by the caller)."""
    return torch.cat([torch.zeros_like(x[:, :1]), x[:, :-1]], 1)


def _window_terms(qb, kb, vb, w):
    """Softmax numerators [B, n, window, H, D] and denominators [B, n, window, H] of each block of queries over
    [previous block | own block], weighted by w [H]."""
    n, window, D = qb.shape[1], qb.shape[2], qb.shape[-1]
    keys, values = torch.cat([_previous(kb), kb], 2), torch.cat([_previous(vb), vb], 2)
    s = torch.einsum("bnihd,bnjhd->bnhij", qb, keys) / math.sqrt(D)                 # [B, n, H, w, 2w]
    i = torch.arange(window, device=qb.device)
    own = (i[None, :] <= i[:, None]).expand(n, window, window)
    previous = (torch.arange(n, device=qb.device) > 0)[:, None, None].expand(n, window, window)
    s = s.masked_fill(~torch.cat([previous, own], -1)[None, :, None], float("-inf"))
    e = torch.exp(s - s.amax(-1, keepdim=True))
    return torch.einsum("bnhij,bnjhd->bnihd", e, values) * w[:, None], e.sum(-1).transpose(2, 3) * w


def _shifted_cumsum(x: torch.Tensor) -> torch.Tensor:
    """Per-block sums [B, n, ...] -> for each block b, the sum over blocks 0 .. b-2 (zeros for blocks 0 and 1)."""
    n = x.shape[1]
    return torch.cat([torch.zeros_like(x[:, :min(2, n)]), x.cumsum(1)[:, :max(n - 2, 0)]], 1)


def lolcats_chunked(q, k, v, phi_q, phi_k, window_factor, window: int,
                    initial_state: LinearState | None = None) -> tuple[torch.Tensor, LinearState]:
    """naive.lolcats_reference in blocks. Returns (y [B, T, H, D] in v's dtype, the state a query at position T
    reads linearly, initial_state included)."""
    B, T, H, D = q.shape
    out_dtype = v.dtype
    with torch.autocast(q.device.type, enabled=False):
        q = fp32(q)
        qb, kb, vb = (_blocks(fp32(x), window) for x in (q, repeat_kv(k, H), repeat_kv(v, H)))
        fq, fk = _blocks(fp32(phi_q), window), _blocks(fp32(phi_k), window)
        num, den = _window_terms(qb, kb, vb, head_factor(window_factor, H, q))
        kv_blocks = torch.einsum("bnihf,bnihd->bnhfd", fk, vb)                      # per-block linear sums
        k_blocks = fk.sum(2)                                                        # [B, n, H, F]
        kv_read, k_read = _shifted_cumsum(kv_blocks), _shifted_cumsum(k_blocks)
        if initial_state is not None:
            kv_read, k_read = kv_read + initial_state.kv[:, None], k_read + initial_state.k[:, None]
        num = num + torch.einsum("bnihf,bnhfd->bnihd", fq, kv_read)
        den = den + torch.einsum("bnihf,bnhf->bnih", fq, k_read)
        y = (num / den[..., None]).reshape(B, -1, H, D)[:, :T]
        folded = max(T // window - 1, 0)                                            # blocks the next query reads
        state = LinearState(kv_blocks[:, :folded].sum(1), k_blocks[:, :folded].sum(1))  # linearly
        if initial_state is not None:
            state = LinearState(state.kv + initial_state.kv, state.k + initial_state.k)
    return y.to(out_dtype), state


def lolcats_one_block(q, keys, values, phi_q, window_factor, state: LinearState) -> torch.Tensor:
    """C new queries q, phi_q [B, C, H, *] of one block, whose softmax keys are `keys`, `values` [B, N, Hkv, D]
    (from the start of the previous block through the C new ones, which come last) and whose linear keys are in
    `state`. Query c sees keys 0 .. N - C + c. Returns [B, C, H, D] in values' dtype."""
    B, C, H, D = q.shape
    N, out_dtype = keys.shape[1], values.dtype
    with torch.autocast(q.device.type, enabled=False):
        q, keys, values = fp32(q), fp32(repeat_kv(keys, H)), fp32(repeat_kv(values, H))
        w = head_factor(window_factor, H, q)[:, None, None]                    # [H, 1, 1] for [B, H, C, *]
        s = torch.einsum("bchd,bjhd->bhcj", q, keys) / math.sqrt(D)
        visible = torch.arange(N, device=q.device)[None, :] <= (N - C + torch.arange(C, device=q.device))[:, None]
        s = s.masked_fill(~visible, float("-inf"))
        e = torch.exp(s - s.amax(-1, keepdim=True))
        fq = fp32(phi_q)
        num = w * torch.einsum("bhcj,bjhd->bhcd", e, values) + torch.einsum("bchf,bhfd->bhcd", fq, state.kv)
        den = w[..., 0] * e.sum(-1) + torch.einsum("bchf,bhf->bhc", fq, state.k)
        y = (num / den[..., None]).transpose(1, 2)
    return y.to(out_dtype)
