"""Reference forms of the mLSTM cell: parallel (quadratic) and recurrent (one step at a time).

Equations (docs/design.md section 3), per head, with q already scaled by 1/sqrt(DQK) inside these functions:
    lf_t = logsigmoid(f~_t)
    m_t  = max(lf_t + m_{t-1}, i~_t)
    C_t  = exp(lf_t + m_{t-1} - m_t) C_{t-1} + exp(i~_t - m_t) k_t v_t^T
    n_t  = exp(lf_t + m_{t-1} - m_t) n_{t-1} + exp(i~_t - m_t) k_t
    h_t  = q_t^T C_t / (max(|q_t^T n_t|, exp(-m_t)) + eps)
The state (C, n, m) is stabilised by its running max m (true C = C * exp(m)); it starts at zeros, m included.

Decisions:
- Every form takes an optional initial state and returns the final one, and the parallel form treats the initial
  state as one extra "key" with log-weight F_t + m_0. With that, parallel, chunkwise and recurrent compute the same
  running max m_t, so they agree to rounding even in the eps term (which depends on m).
- Gates, the max and the state are fp32 whatever the input dtype; h is returned in the dtype of v.
- Shapes: q, k [B, T, H, DQK], v [B, T, H, DV], i_pre, f_pre [B, T, H]; C [B, H, DQK, DV], n [B, H, DQK], m [B, H].
"""
from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F

from swax_lightning.kernels.util import fp32

EPS = 1e-6


class MLSTMState(NamedTuple):
    C: torch.Tensor  # [B, H, DQK, DV] fp32, stabilised by exp(-m)
    n: torch.Tensor  # [B, H, DQK] fp32
    m: torch.Tensor  # [B, H] fp32

    @staticmethod
    def zeros(batch: int, heads: int, dqk: int, dv: int, like: torch.Tensor) -> MLSTMState:
        """The empty state, in fp32 (fp64 when `like` is fp64) on `like`'s device."""
        opts = dict(dtype=fp32(like).dtype, device=like.device)
        return MLSTMState(torch.zeros(batch, heads, dqk, dv, **opts), torch.zeros(batch, heads, dqk, **opts),
                          torch.zeros(batch, heads, **opts))


def _heads_first_fp32(x: torch.Tensor) -> torch.Tensor:
    """[B, T, H, ...] -> [B, H, T, ...] in fp32."""
    return fp32(x).transpose(1, 2)


def mlstm_parallel(q, k, v, i_pre, f_pre, initial_state: MLSTMState | None = None, eps: float = EPS):
    """Quadratic form: builds the full [T, T] decay matrix. Returns (h [B, T, H, DV], final state)."""
    B, T, H, dqk = q.shape
    state = initial_state or MLSTMState.zeros(B, H, dqk, v.shape[-1], like=q)
    out_dtype = v.dtype
    q, k, v = _heads_first_fp32(q) * dqk ** -0.5, _heads_first_fp32(k), _heads_first_fp32(v)
    i_pre, lf = _heads_first_fp32(i_pre), F.logsigmoid(_heads_first_fp32(f_pre))           # [B, H, T]
    cum = torch.cumsum(lf, dim=-1)                                                 # F_t
    causal = torch.ones(T, T, dtype=torch.bool, device=q.device).tril()
    log_d = (cum[..., :, None] - cum[..., None, :] + i_pre[..., None, :]).masked_fill(~causal, float("-inf"))
    log_init = cum + state.m[..., None]                                            # weight of the initial state
    m = torch.maximum(log_d.amax(dim=-1), log_init)                                # [B, H, T]
    scores = (q @ k.transpose(-1, -2)) * torch.exp(log_d - m[..., None])
    init_w = torch.exp(log_init - m)[..., None]
    num = scores @ v + init_w * (q @ state.C)
    den = scores.sum(dim=-1, keepdim=True) + init_w * (q @ state.n[..., None])
    h = num / (torch.maximum(den.abs(), torch.exp(-m)[..., None]) + eps)
    # Final state: the weights of every key (and of the initial state) seen from the last step.
    w_last = cum[..., -1:] - cum + i_pre                                           # [B, H, T]
    m_last = torch.maximum(w_last.amax(dim=-1), log_init[..., -1])
    w = torch.exp(w_last - m_last[..., None])
    init_last = torch.exp(log_init[..., -1] - m_last)
    C = init_last[..., None, None] * state.C + (k * w[..., None]).transpose(-1, -2) @ v
    n = init_last[..., None] * state.n + (k * w[..., None]).sum(dim=-2)
    return h.transpose(1, 2).to(out_dtype), MLSTMState(C, n, m_last)


def mlstm_step(q, k, v, i_pre, f_pre, state: MLSTMState, eps: float = EPS):
    """One recurrent step. q, k [B, H, DQK], v [B, H, DV], gates [B, H]. Returns (h [B, H, DV] fp32, new state)."""
    q, k, v = fp32(q) * q.shape[-1] ** -0.5, fp32(k), fp32(v)
    lf, i_pre = F.logsigmoid(fp32(f_pre)), fp32(i_pre)
    m = torch.maximum(lf + state.m, i_pre)
    f_w, i_w = torch.exp(lf + state.m - m), torch.exp(i_pre - m)
    C = f_w[..., None, None] * state.C + i_w[..., None, None] * (k[..., :, None] * v[..., None, :])
    n = f_w[..., None] * state.n + i_w[..., None] * k
    num = (q[..., None, :] @ C).squeeze(-2)
    den = (q * n).sum(dim=-1, keepdim=True)
    h = num / (torch.maximum(den.abs(), torch.exp(-m)[..., None]) + eps)
    return h, MLSTMState(C, n, m)


def mlstm_recurrent(q, k, v, i_pre, f_pre, initial_state: MLSTMState | None = None, eps: float = EPS):
    """Step-by-step loop over T (the decode form, used here as a reference). Returns (h [B, T, H, DV], state)."""
    B, T, H, dqk = q.shape
    state = initial_state or MLSTMState.zeros(B, H, dqk, v.shape[-1], like=q)
    hs = []
    for t in range(T):
        h, state = mlstm_step(q[:, t], k[:, t], v[:, t], i_pre[:, t], f_pre[:, t], state, eps)
        hs.append(h)
    return torch.stack(hs, dim=1).to(v.dtype), state
