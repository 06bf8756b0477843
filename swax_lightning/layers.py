"""Building blocks shared by every layer kind: rotary embeddings, the per-head norm, the SwiGLU feed-forward.

Decisions:
- RoPE angles are computed in fp32 from absolute positions on every call (cheap next to attention, and exact at
  131k positions), so training and a rolling decode cache rotate keys identically.
- Norms use torch's own RMSNorm. The per-head norms (mLSTM and Gated DeltaNet outputs) normalise each head's
  channels separately in fp32 with one weight vector over all heads' channels and no bias: MultiHeadLayerNorm
  (mean subtracted, then scaled by the inverse standard deviation; xLSTM-7B's mLSTM output norm, which casts back to
  the input dtype before the weight) or MultiHeadRMSNorm (no mean subtracted).
"""
from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from kernels.mlstm.naive import fp32


def rope_rotate(x: torch.Tensor, positions: torch.Tensor, theta: float) -> torch.Tensor:
    """Rotary embedding of x [B, T, H, D] at absolute positions [T] or [B, T] (rotate-half layout), in fp32."""
    d = x.shape[-1]
    inv_freq = theta ** (-torch.arange(0, d, 2, device=x.device, dtype=torch.float32) / d)
    angles = positions.to(torch.float32)[..., None] * inv_freq               # [(B,) T, D/2]
    cos, sin = angles.cos()[..., None, :], angles.sin()[..., None, :]        # [(B,) T, 1, D/2]
    x1, x2 = x.float().chunk(2, dim=-1)
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1).to(x.dtype)


class MultiHeadRMSNorm(nn.Module):
    """RMSNorm applied to each head separately: x [..., H, D], weight [H * D]."""

    def __init__(self, heads: int, head_dim: int, eps: float):
        super().__init__()
        self.heads, self.head_dim, self.eps = heads, head_dim, eps
        self.weight = nn.Parameter(torch.ones(heads * head_dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.rms_norm(x.float(), (self.head_dim,), eps=self.eps)
        return (y * self.weight.view(self.heads, self.head_dim)).to(x.dtype)


class MultiHeadLayerNorm(nn.Module):
    """LayerNorm applied to each head separately, weight and no bias (xLSTM-7B's mLSTM output norm): x [..., H, D],
    weight [H * D]. Statistics in fp32 (fp64 for an fp64 model)."""

    def __init__(self, heads: int, head_dim: int, eps: float):
        super().__init__()
        self.heads, self.head_dim, self.eps = heads, head_dim, eps
        self.weight = nn.Parameter(torch.ones(heads * head_dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.layer_norm(fp32(x), (self.head_dim,), eps=self.eps).to(x.dtype)
        return y * self.weight.view(self.heads, self.head_dim).to(x.dtype)


class SwiGLU(nn.Module):
    """Feed-forward: down(silu(gate(x)) * up(x)), no biases."""

    def __init__(self, d_model: int, hidden: int):
        super().__init__()
        self.gate = nn.Linear(d_model, hidden, bias=False)
        self.up = nn.Linear(d_model, hidden, bias=False)
        self.down = nn.Linear(hidden, d_model, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(F.silu(self.gate(x)) * self.up(x))
