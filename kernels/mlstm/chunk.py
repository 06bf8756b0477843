"""Chunkwise mLSTM cell in PyTorch: parallel inside a chunk, recurrent between chunks. The training path on CPU.

Algorithm (equations in naive.py). The sequence is cut into chunks of L steps. With b_t the cumulative log forget
gate inside a chunk and (C, n, m) the state entering it:
- intra-chunk: log_d[t, s] = b_t - b_s + i_s (s <= t), as in the parallel form but only L x L;
- inter-chunk: the entering state reaches step t with log-weight b_t + m;
- m_t = max of both, and h_t = (q C~ + scores V) / (max(|q n~ + sum scores|, exp(-m_t)) + eps).
States are advanced chunk by chunk: each chunk's own contribution K^T diag(w) V is computed for all chunks at once,
stabilised by its local max, and a short Python loop over T / L chunks folds them into the running state.
Cost O(T * L) for the intra part plus O(T / L) state updates: linear in T.

Decisions:
- T need not be a multiple of L: the tail is padded with forget gate 1 (log 0) and input gate 0 (log -inf), which
  leaves the state unchanged, and the padded outputs are dropped. A chunk made only of such steps (left padding in
  batched inference) contributes exactly nothing.
- The state entering every chunk is materialised ([B, H, T/L, DQK, DV]); that is what autograd needs for backward.
- fp32 throughout for gates and state; the output has v's dtype.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from swax_lightning.kernels.mlstm.naive import EPS, MLSTMState
from swax_lightning.kernels.util import fp32


def mlstm_chunkwise(q, k, v, i_pre, f_pre, initial_state: MLSTMState | None = None, chunk_size: int = 64,
                    eps: float = EPS):
    """q, k [B, T, H, DQK], v [B, T, H, DV], gate pre-activations [B, T, H]. Returns (h [B, T, H, DV], state)."""
    B, T, H, dqk = q.shape
    dv, out_dtype, L = v.shape[-1], v.dtype, chunk_size
    state = initial_state or MLSTMState.zeros(B, H, dqk, dv, like=q)
    nc = -(-T // L)
    pad = nc * L - T

    def chunks(x: torch.Tensor, value: float = 0.0) -> torch.Tensor:  # [B, T, H, *] -> [B, H, nc, L, *] fp32
        x = fp32(x).transpose(1, 2)
        x = F.pad(x, (0, 0, 0, pad) if x.dim() == 4 else (0, pad), value=value)
        return x.reshape(B, H, nc, L, *x.shape[3:])

    q, k, v = chunks(q) * dqk ** -0.5, chunks(k), chunks(v)
    lf = chunks(F.logsigmoid(fp32(f_pre)))                 # padding: log forget 0 (gate 1)
    i_pre = chunks(i_pre, value=float("-inf"))               # padding: input gate 0
    b = torch.cumsum(lf, dim=-1)                             # [B, H, nc, L]

    # Each chunk's own contribution to the state at its end, stabilised by its local max.
    w_end = b[..., -1:] - b + i_pre                           # log-weight of step s at the chunk's end
    m_local = w_end.amax(dim=-1)                              # [B, H, nc]; -inf for a chunk with no input
    m_safe = torch.where(torch.isinf(m_local), torch.zeros_like(m_local), m_local)  # avoids -inf - -inf = nan
    w = torch.exp(w_end - m_safe[..., None])[..., None] * k   # [B, H, nc, L, DQK]
    C_local, n_local = w.transpose(-1, -2) @ v, w.sum(dim=-2)

    # Sequential scan over chunks: the state entering each chunk.
    C, n, m = state
    C_in, n_in, m_in = [], [], []
    for c in range(nc):
        C_in.append(C), n_in.append(n), m_in.append(m)
        m_new = torch.maximum(b[:, :, c, -1] + m, m_local[:, :, c])
        f_w, l_w = torch.exp(b[:, :, c, -1] + m - m_new), torch.exp(m_local[:, :, c] - m_new)
        C = f_w[..., None, None] * C + l_w[..., None, None] * C_local[:, :, c]
        n = f_w[..., None] * n + l_w[..., None] * n_local[:, :, c]
        m = m_new
    C_in, n_in, m_in = torch.stack(C_in, 2), torch.stack(n_in, 2), torch.stack(m_in, 2)

    # Outputs of all chunks at once: intra-chunk parallel part plus the entering state.
    causal = torch.ones(L, L, dtype=torch.bool, device=q.device).tril()
    log_d = (b[..., :, None] - b[..., None, :] + i_pre[..., None, :]).masked_fill(~causal, float("-inf"))
    log_inter = b + m_in[..., None]                           # [B, H, nc, L]
    m_t = torch.maximum(log_d.amax(dim=-1), log_inter)
    scores = (q @ k.transpose(-1, -2)) * torch.exp(log_d - m_t[..., None])
    inter_w = torch.exp(log_inter - m_t)[..., None]
    num = scores @ v + inter_w * (q @ C_in)
    den = scores.sum(dim=-1, keepdim=True) + inter_w * (q @ n_in[..., None])
    h = num / (torch.maximum(den.abs(), torch.exp(-m_t)[..., None]) + eps)
    h = h.reshape(B, H, nc * L, dv)[:, :, :T].transpose(1, 2)
    return h.to(out_dtype), MLSTMState(C, n, m)
