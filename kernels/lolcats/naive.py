"""LoLCATs attention, the quadratic reference: full [T, T] masks, obviously correct, for tests.

Per query t, with w = sigmoid(window_factors) per head and s_tj = q_t.k_j / sqrt(head_dim):

    y_t = (w * sum_{j in win(t)} exp(s_tj - m_t) v_j + sum_{j in lin(t)} phi_q(q_t).phi_k(k_j) v_j)
          / (w * sum_{j in win(t)} exp(s_tj - m_t)     + sum_{j in lin(t)} phi_q(q_t).phi_k(k_j))

m_t = max over the window only; the linear terms are weighted 1, not 1 - w, and there is no epsilon (HazyResearch/
lolcats @375df84, src/model/linear_attention/linear_window_attention_tk.py, hybrid_attention_quadratic, with
affine_attention_factors false in every distill config). The terraced window (same file, get_masks): blocks of
`window` tokens from position 0; a query in block b = t // window sees with softmax its own block up to itself and
all of block b - 1, and linearly every key of the blocks before b - 1.

Shapes: q [B, T, H, D], k and v [B, T, Hkv, D] (GQA: query head h reads key/value head h // (H / Hkv)), phi_q and
phi_k [B, T, H, F] (the key features per query head: the key map runs after the key heads are repeated),
window_factor w: a number or [H]. Arithmetic in fp32 (fp64 kept); the output takes v's dtype.
"""
from __future__ import annotations

import math

import torch

from swax_lightning.kernels.util import fp32


def repeat_kv(x: torch.Tensor, n_heads: int) -> torch.Tensor:
    """[B, T, Hkv, D] -> [B, T, H, D], each key/value head repeated for the query heads that share it."""
    return x if x.shape[2] == n_heads else x.repeat_interleave(n_heads // x.shape[2], dim=2)


def head_factor(window_factor, n_heads: int, like: torch.Tensor) -> torch.Tensor:
    """The softmax weight w as an [H] tensor in like's (fp32 or fp64) dtype."""
    w = torch.as_tensor(window_factor, device=like.device).to(like.dtype).reshape(-1)
    return w.expand(n_heads)


def terraced_masks(T: int, window: int, device=None) -> tuple[torch.Tensor, torch.Tensor]:
    """(softmax keys, linear keys) [T, T] of query t (rows) over key j (columns)."""
    pos = torch.arange(T, device=device)
    query_block, key_block = (pos // window)[:, None], (pos // window)[None, :]
    causal = pos[None, :] <= pos[:, None]
    return causal & (key_block >= query_block - 1), key_block < query_block - 1


def lolcats_reference(q, k, v, phi_q, phi_k, window_factor, window: int) -> torch.Tensor:
    """The formula above with dense masks; returns [B, T, H, D]."""
    B, T, H, D = q.shape
    out_dtype = v.dtype
    with torch.autocast(q.device.type, enabled=False):  # scores and normalisers in fp32 under bf16 autocast too
        q, k, v = fp32(q), fp32(repeat_kv(k, H)), fp32(repeat_kv(v, H))
        w = head_factor(window_factor, H, q)[:, None, None]                    # [H, 1, 1] for [B, H, T, T]
        in_window, linear = terraced_masks(T, window, q.device)
        s = torch.einsum("bthd,bjhd->bhtj", q, k) / math.sqrt(D)
        s = s.masked_fill(~in_window, float("-inf"))
        soft = w * torch.exp(s - s.amax(-1, keepdim=True))                     # shifted by the window's max only
        lin = torch.einsum("bthf,bjhf->bhtj", fp32(phi_q), fp32(phi_k)) * linear
        a = soft + lin
        y = torch.einsum("bhtj,bjhd->bthd", a, v) / a.sum(-1).transpose(1, 2)[..., None]
    return y.to(out_dtype)
