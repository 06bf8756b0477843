"""Chunkwise gated delta rule in PyTorch (the training path): the WY / UT-transform form, O(T * chunk).

Derivation (equations in naive.py). Inside a chunk of L steps entering with state S0, let b_t be the cumulative log
decay and A_t = exp(b_t). Writing S_t = A_t S0 + sum_{s<=t} e^{b_t - b_s} k_s u_s^T, the delta rule gives the
"pseudo-values" u as the solution of a unit lower-triangular system:
    (I + diag(beta) M) u = diag(beta) (V - diag(A) K S0),   M[t, s] = e^{b_t - b_s} (k_t . k_s) for s < t,
so u = U - W S0 with U, W from one triangular solve per chunk (independent of S0, all chunks at once). Then
    O = diag(A) Q S0 + (Gamma o Q K^T) u,   Gamma[t, s] = e^{b_t - b_s} for s <= t,
    S_end = A_L S0 + K^T (e^{b_L - b} o u),
with a short Python loop over chunks carrying S. Every exponent is <= 0 (decays only shrink), so no running max is
needed. T need not be a multiple of L: the tail is padded with beta = 0 and g = 0, which leaves the state unchanged.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from swax_lightning.kernels.deltanet.naive import zero_state
from swax_lightning.kernels.util import fp32


def gated_delta_chunkwise(q, k, v, beta, g, initial_state: torch.Tensor | None = None, chunk_size: int = 64):
    """q, k [B, T, H, DK], v [B, T, H, DV], beta, g [B, T, H]. Returns (o [B, T, H, DV], final state)."""
    B, T, H, dk = q.shape
    dv, out_dtype, L = v.shape[-1], v.dtype, chunk_size
    nc = -(-T // L)
    pad = nc * L - T

    def chunks(x: torch.Tensor) -> torch.Tensor:  # [B, T, H, *] -> [B, H, nc, L, *], at least fp32, zero-padded
        x = fp32(x).transpose(1, 2)
        x = F.pad(x, (0, 0, 0, pad) if x.dim() == 4 else (0, pad))
        return x.reshape(B, H, nc, L, *x.shape[3:])

    q, k, v = chunks(q) * dk ** -0.5, chunks(k), chunks(v)
    beta, b = chunks(beta), torch.cumsum(chunks(g), dim=-1)              # [B, H, nc, L]
    strict = torch.ones(L, L, dtype=torch.bool, device=q.device).tril(-1)
    causal = torch.ones(L, L, dtype=torch.bool, device=q.device).tril()
    diff = b[..., :, None] - b[..., None, :]                                  # b_t - b_s
    decay_strict = torch.where(strict, diff, float("-inf")).exp()
    gamma = torch.where(causal, diff, float("-inf")).exp()
    system = torch.eye(L, device=q.device, dtype=q.dtype) + beta[..., None] * decay_strict * (k @ k.transpose(-1, -2))
    rhs = beta[..., None] * torch.cat([v, torch.exp(b)[..., None] * k], dim=-1)
    solved = torch.linalg.solve_triangular(system, rhs, upper=False, unitriangular=True)
    U, W = solved[..., :dv], solved[..., dv:]                                 # u = U - W S0
    attn = gamma * (q @ k.transpose(-1, -2))
    to_end = torch.exp(b[..., -1:] - b)                                       # e^{b_L - b_s}
    state = initial_state if initial_state is not None else zero_state(B, H, dk, dv, q)
    outs = []
    for c in range(nc):
        u = U[:, :, c] - W[:, :, c] @ state
        outs.append(torch.exp(b[:, :, c])[..., None] * (q[:, :, c] @ state) + attn[:, :, c] @ u)
        state = torch.exp(b[:, :, c, -1])[..., None, None] * state + \
            (k[:, :, c] * to_end[:, :, c, :, None]).transpose(-1, -2) @ u
    o = torch.stack(outs, 2).reshape(B, H, nc * L, dv)[:, :, :T].transpose(1, 2)
    return o.to(out_dtype), state
