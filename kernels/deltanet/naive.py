"""Reference forms of the gated delta rule (Gated DeltaNet, Yang et al. 2024): recurrent step and loop.

Per head, with state S [DK, DV] (fp32, zeros at start), q and k L2-normalised by the layer, q scaled by 1/sqrt(DK)
here, beta_t in (0, 1) (write strength) and g_t <= 0 (log decay, alpha_t = exp(g_t)):
    S_t = alpha_t (I - beta_t k_t k_t^T) S_{t-1} + beta_t k_t v_t^T
        = S' + beta_t k_t (v_t - S'^T k_t)^T      with S' = alpha_t S_{t-1}
    o_t = S_t^T q_t
Shapes: q, k [B, T, H, DK], v [B, T, H, DV], beta, g [B, T, H]; state [B, H, DK, DV]. Outputs take v's dtype.
"""
from __future__ import annotations

import torch

from swax_lightning.kernels.util import fp32


def zero_state(batch: int, heads: int, dk: int, dv: int, like: torch.Tensor) -> torch.Tensor:
    return torch.zeros(batch, heads, dk, dv, dtype=fp32(like).dtype, device=like.device)


def gated_delta_step(q, k, v, beta, g, state: torch.Tensor):
    """One step. q, k [B, H, DK], v [B, H, DV], beta, g [B, H]. Returns (o [B, H, DV], new state)."""
    q, k, v = fp32(q) * q.shape[-1] ** -0.5, fp32(k), fp32(v)
    decayed = torch.exp(fp32(g))[..., None, None] * state
    delta = fp32(beta)[..., None] * (v - (k[..., None, :] @ decayed).squeeze(-2))
    state = decayed + k[..., :, None] * delta[..., None, :]
    return (q[..., None, :] @ state).squeeze(-2), state


def gated_delta_recurrent(q, k, v, beta, g, initial_state: torch.Tensor | None = None):
    """Step-by-step loop over T (the decode form, and the reference). Returns (o [B, T, H, DV], final state)."""
    B, T, H, dk = q.shape
    state = initial_state if initial_state is not None else zero_state(B, H, dk, v.shape[-1], q)
    outs = []
    for t in range(T):
        o, state = gated_delta_step(q[:, t], k[:, t], v[:, t], beta[:, t], g[:, t], state)
        outs.append(o)
    return torch.stack(outs, 1).to(v.dtype), state
