"""Building blocks shared by every layer kind: rotary embeddings, the per-head norm, the gated feed-forward, the
short causal convolution.

Decisions:
- RoPE angles are computed in fp32 from absolute positions on every call (cheap next to attention, and exact at
  131k positions), so training and a rolling decode cache rotate keys identically. A pretrained model's frequency
  scaling (ModelConfig.rope_scale: linear, llama3, dynamic NTK) is applied to the frequencies, as transformers does.
  Dynamic NTK depends on the call's largest position (transformers' rule for one forward call; transformers also
  keeps grown frequencies across calls, which a stateless layer does not): beyond max_positions a chunked prefill
  therefore rotates each chunk with its own frequencies, and equals one whole-sequence forward only within
  max_positions.
- Norms use torch's own RMSNorm. The per-head norms (mLSTM and Gated DeltaNet outputs) normalise each head's
  channels separately in fp32 with one weight vector over all heads' channels and no bias: MultiHeadLayerNorm
  (mean subtracted, then scaled by the inverse standard deviation; xLSTM-7B's mLSTM output norm, which casts back to
  the input dtype before the weight) or MultiHeadRMSNorm (no mean subtracted).
- ShortConv is a depthwise causal convolution over time followed by SiLU (Gated DeltaNet's short convolutions on q,
  k and v). Its streaming state is the last kernel-1 inputs, so a chunk or a single decode step continues exactly
  where the previous one stopped.
"""
from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from swax_lightning.kernels.util import fp32


def rope_frequencies(head_dim: int, theta: float, positions: torch.Tensor, scale: dict | None = None,
                     max_positions: int | None = None) -> torch.Tensor:
    """The [head_dim / 2] inverse frequencies in fp32, with a pretrained model's scaling (ModelConfig.rope_scale)."""
    exponents = torch.arange(0, head_dim, 2, device=positions.device, dtype=torch.float32) / head_dim
    kind = scale and scale["type"]
    if kind == "dynamic":
        length = positions.max() + 1  # a tensor, so the new base is computed in fp32 as transformers computes it
        if length > max_positions:
            factor = scale["factor"]
            theta = theta * (factor * length / max_positions - (factor - 1)) ** (head_dim / (head_dim - 2))
    inv_freq = 1.0 / theta ** exponents  # transformers' rounding: logits of an imported model match it bit for bit
    if kind == "linear":
        return inv_freq / scale["factor"]
    if kind == "llama3":
        return _llama3_frequencies(inv_freq, scale)
    return inv_freq


def _llama3_frequencies(inv_freq: torch.Tensor, scale: dict) -> torch.Tensor:
    """Llama 3.1: wavelengths longer than original / low_freq_factor are divided by factor, those shorter than
    original / high_freq_factor kept, and the ones between blended smoothly."""
    factor, low, high = scale["factor"], scale["low_freq_factor"], scale["high_freq_factor"]
    original = scale["original_max_position_embeddings"]
    wavelength = 2 * math.pi / inv_freq
    smooth = ((original / wavelength - low) / (high - low)).clamp(0, 1)  # 0 on long wavelengths, 1 on short ones
    return (1 - smooth) * inv_freq / factor + smooth * inv_freq


def rope_rotate(x: torch.Tensor, positions: torch.Tensor, theta: float, scale: dict | None = None,
                max_positions: int | None = None) -> torch.Tensor:
    """Rotary embedding of x [B, T, H, D] at absolute positions [T] or [B, T] (rotate-half layout), in fp32;
    scale and max_positions: ModelConfig.rope_scale and max_positions."""
    inv_freq = rope_frequencies(x.shape[-1], theta, positions, scale, max_positions)
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


GATE_ACTIVATIONS = {"silu": F.silu, "gelu_tanh": lambda x: F.gelu(x, approximate="tanh")}


class GatedFFN(nn.Module):
    """Feed-forward: down(act(gate(x)) * up(x)), no biases; act silu = SwiGLU (ModelConfig.ffn_activation), gelu_tanh
    = GeGLU with tanh-approximated GELU (Gemma)."""

    def __init__(self, d_model: int, hidden: int, activation: str = "silu"):
        super().__init__()
        self.activation = GATE_ACTIVATIONS[activation]
        self.gate = nn.Linear(d_model, hidden, bias=False)
        self.up = nn.Linear(d_model, hidden, bias=False)
        self.down = nn.Linear(hidden, d_model, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(self.activation(self.gate(x)) * self.up(x))


class ShortConv(nn.Module):
    """SiLU(depthwise causal conv over time) of x [B, T, C], kernel size K, no bias. `state` [B, K-1, C] holds the
    inputs before x (zeros at the start of a sequence); returns (y [B, T, C], the state after x)."""

    def __init__(self, channels: int, kernel: int):
        super().__init__()
        self.kernel = kernel
        self.weight = nn.Parameter(torch.empty(channels, 1, kernel))

    def new_state(self, batch: int, dtype: torch.dtype, device) -> torch.Tensor:
        return torch.zeros(batch, self.kernel - 1, self.weight.shape[0], dtype=dtype, device=device)

    def forward(self, x: torch.Tensor, state: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        if state is None:
            state = self.new_state(x.shape[0], x.dtype, x.device)
        padded = torch.cat([state.to(x.dtype), x], dim=1)
        y = F.conv1d(padded.transpose(1, 2), self.weight.to(x.dtype), groups=x.shape[-1]).transpose(1, 2)
        return F.silu(y), padded[:, padded.shape[1] - (self.kernel - 1):]


def short_convolved(convs: nn.ModuleList | None, projections: list[torch.Tensor], cache,
                    positions: torch.Tensor | None) -> list[torch.Tensor]:
    """Each projection [B, T, C] through its ShortConv (none: unchanged), the convolutions' states taken from and
    left in `cache.conv` when streaming; left padding (positions < 0) enters them as zeros, as before a sequence's
    first token, so a padded prompt's result equals its own."""
    if convs is None:
        return projections
    if positions is not None:
        projections = [t.masked_fill((positions < 0)[..., None], 0.0) for t in projections]
    states = cache.conv if cache is not None else [None] * len(projections)
    out = [conv(t, state) for conv, t, state in zip(convs, projections, states)]
    if cache is not None:
        cache.conv = [state for _, state in out]
    return [y for y, _ in out]
