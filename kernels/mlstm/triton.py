"""Chunkwise mLSTM cell in Triton: forward and backward, state in and out. Written from the equations in naive.py.

Forward (chunks of L steps; b_t = cumulative log forget gate inside a chunk, g = b_{L-1}):
1. `_fwd_states_kernel`, one program per (batch*head, DQK tile, DV tile), a loop over the chunks in order: stores
   the stabilised state (C, n, m) entering every chunk, then folds the chunk in:
       m' = max(g + m, max_s(g - b_s + i_s)),  C' = exp(g + m - m') C + sum_s exp(g - b_s + i_s - m') k_s v_s^T.
2. `_fwd_output_kernel`, one program per (chunk, batch*head, DV tile), all chunks in parallel:
       log_d[t, s] = b_t - b_s + i_s (s <= t),  m_t = max(max_s log_d[t, s], b_t + m_in),
       h_t = (sum_s e^{log_d - m_t} (q_t.k_s) v_s + e^{b_t + m_in - m_t} q_t C_in) / N_t,
       N_t = max(|sum_s e^{log_d - m_t} (q_t.k_s) + e^{b_t + m_in - m_t} q_t.n_in|, e^{-m_t}) + eps.
   It saves m_t and N_t for the backward, and the chunk-entry states unless `recompute_states` asks the backward to
   run `_fwd_states_kernel` again (the same kernel on the same inputs: bit-identical states, B*H*NC*DQK*DV fp32 less
   memory per layer).

Backward. The stabiliser m and the normaliser N_t are treated as constants: h is invariant to m, and the per-head
norm that follows the cell in every mLSTM layer cancels N_t (docs/design.md section 3), so gradients agree with
the reference after that norm. With a_ts = e^{F_t - F_s + i_s - m_t} / N_t:
    dq_t = sum_s a_ts (dh_t.v_s) k_s + e_t C_in^T dh_t,    dk_s = sum_t a_ts (dh_t.v_s) q_t + w_s dC_end v_s,
    dv_s = sum_t a_ts (q_t.k_s) dh_t + w_s dC_end^T k_s,
where dC_end (the gradient reaching the state at a chunk's end) comes from `_bwd_dstates_kernel`, a reverse loop over
chunks. The gate gradients need no kernel: the pair log-weight is F_t - F_s + i_s, so
    d i~_s = k_s . dk_s,   dF_u = q_u . dq_u - k_u . dk_u,   d log f_j = sum_{u >= j} dF_u,
    d f~ = d log f * sigmoid(-f~).
The final state is an output without gradient; an initial state is an input without gradient (streaming inference).

Block sizes: chunk L (the layer's chunk_size: a power of two, 16..128), DQK and DV tiles of 64 (head dims up to 256 for
q/k and 512 for v are tiled). Loads are upcast to fp32 at once (the interpreter mishandles bf16); gates, states and
accumulators are fp32; h takes v's dtype. Dots are exact fp32 for fp32 inputs and TF32 for bf16/fp16 inputs
(`backends.triton_dot_precision`). T need not be a multiple of L: the tail is masked as forget gate 1, input
gate 0, which leaves the state unchanged.

Shared memory, from compiling every kernel for sm_90 on a CPU: at most 192 KiB per block (fp32 inputs, chunk 128),
within Hopper's 227 KiB. (TF32 dots on fp32 inputs would need 240-288 KiB there.)
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
import triton
import triton.language as tl
from swax_lightning.kernels.backends import triton_dot_precision
from swax_lightning.kernels.mlstm.naive import EPS, MLSTMState

TILE = 64
# Arguments that change from call to call (sequence length, heads, chunk count): Triton would compile a kernel for
# each of them equal to 1 or a multiple of 16; one serves all. Head dims stay specialised (fixed per model).
VARYING = ("T", "H", "NC")


@triton.jit
def _chunk_gates(LF, I, bh, c, T, L: tl.constexpr):
    """Cumulative log forget gate b [L] inside chunk c, input gate i [L] (padding: log f = 0, i = -inf)."""
    t = c * L + tl.arange(0, L)
    lf = tl.load(LF + bh * T + t, mask=t < T, other=0.0)
    i = tl.load(I + bh * T + t, mask=t < T, other=float("-inf"))
    return tl.cumsum(lf, 0), i, t


@triton.jit(do_not_specialize=VARYING)
def _fwd_states_kernel(K, V, LF, I, C0, N0, M0, C_IN, N_IN, M_IN, C_OUT, N_OUT, M_OUT,
                       s_b, s_t, s_h, sv_b, sv_t, sv_h, T, H, NC, DQK, DV,
                       HAS_INIT: tl.constexpr, L: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, PREC: tl.constexpr):
    bh, pk, pv = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    b, h = bh // H, bh % H
    dk = pk * BK + tl.arange(0, BK)
    dv = pv * BV + tl.arange(0, BV)
    mask_c = (dk[:, None] < DQK) & (dv[None, :] < DV)
    c_off = dk[:, None] * DV + dv[None, :]
    if HAS_INIT:
        C = tl.load(C0 + bh * DQK * DV + c_off, mask=mask_c, other=0.0).to(tl.float32)
        n = tl.load(N0 + bh * DQK + dk, mask=dk < DQK, other=0.0).to(tl.float32)
        m = tl.load(M0 + bh).to(tl.float32)
    else:
        C = tl.zeros([BK, BV], tl.float32)
        n = tl.zeros([BK], tl.float32)
        m = tl.sum(tl.zeros([1], tl.float32), 0)  # an fp32 scalar, as the loop will carry
    for c in range(0, NC):
        tl.store(C_IN + (bh * NC + c) * DQK * DV + c_off, C, mask=mask_c)
        if pv == 0:
            tl.store(N_IN + (bh * NC + c) * DQK + dk, n, mask=dk < DQK)
        if (pk == 0) & (pv == 0):
            tl.store(M_IN + bh * NC + c, m)
        bcum, i, t = _chunk_gates(LF, I, bh, c, T, L)
        g = tl.sum(tl.where(tl.arange(0, L) == L - 1, bcum, 0.0), 0)
        w_end = g - bcum + i
        m_new = tl.maximum(g + m, tl.max(w_end, 0))
        w = tl.exp(w_end - m_new)
        kb = tl.load(K + b * s_b + h * s_h + t[:, None] * s_t + dk[None, :],
                     mask=(t[:, None] < T) & (dk[None, :] < DQK), other=0.0).to(tl.float32)
        vb = tl.load(V + b * sv_b + h * sv_h + t[:, None] * sv_t + dv[None, :],
                     mask=(t[:, None] < T) & (dv[None, :] < DV), other=0.0).to(tl.float32)
        decay = tl.exp(g + m - m_new)
        C = decay * C + tl.dot(tl.trans(kb * w[:, None]), vb, input_precision=PREC)
        n = decay * n + tl.sum(kb * w[:, None], 0)
        m = m_new
    tl.store(C_OUT + bh * DQK * DV + c_off, C, mask=mask_c)
    if pv == 0:
        tl.store(N_OUT + bh * DQK + dk, n, mask=dk < DQK)
    if (pk == 0) & (pv == 0):
        tl.store(M_OUT + bh, m)


@triton.jit
def _intra_weights(bcum, i, m_inter, L: tl.constexpr):
    """Row max m_t, intra-chunk weights exp(log_d - m_t) [L, L] and the state's weight exp(b_t + m_in - m_t) [L]."""
    log_d = bcum[:, None] - bcum[None, :] + i[None, :]
    causal = tl.arange(0, L)[:, None] >= tl.arange(0, L)[None, :]
    log_d = tl.where(causal, log_d, float("-inf"))
    log_inter = bcum + m_inter
    m_t = tl.maximum(tl.max(log_d, 1), log_inter)
    return m_t, tl.exp(log_d - m_t[:, None]), tl.exp(log_inter - m_t)


@triton.jit(do_not_specialize=VARYING)
def _fwd_output_kernel(Q, K, V, LF, I, C_IN, N_IN, M_IN, HOUT, MT, NT,
                       s_b, s_t, s_h, sv_b, sv_t, sv_h, so_b, so_t, so_h, T, H, NC, DQK, DV, scale, eps,
                       L: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, PREC: tl.constexpr):
    c, bh, pv = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    b, h = bh // H, bh % H
    bcum, i, t = _chunk_gates(LF, I, bh, c, T, L)
    m_in = tl.load(M_IN + bh * NC + c)
    m_t, d_w, inter_w = _intra_weights(bcum, i, m_in, L)
    dv = pv * BV + tl.arange(0, BV)
    qk = tl.zeros([L, L], tl.float32)
    q_c = tl.zeros([L, BV], tl.float32)
    q_n = tl.zeros([L], tl.float32)
    for k0 in range(0, DQK, BK):
        dk = k0 + tl.arange(0, BK)
        rows = (t[:, None] < T) & (dk[None, :] < DQK)
        qb = tl.load(Q + b * s_b + h * s_h + t[:, None] * s_t + dk[None, :], mask=rows, other=0.0).to(tl.float32)
        qb = qb * scale
        kb = tl.load(K + b * s_b + h * s_h + t[:, None] * s_t + dk[None, :], mask=rows, other=0.0).to(tl.float32)
        cb = tl.load(C_IN + (bh * NC + c) * DQK * DV + dk[:, None] * DV + dv[None, :],
                     mask=(dk[:, None] < DQK) & (dv[None, :] < DV), other=0.0)
        nb = tl.load(N_IN + (bh * NC + c) * DQK + dk, mask=dk < DQK, other=0.0)
        qk += tl.dot(qb, tl.trans(kb), input_precision=PREC)
        q_c += tl.dot(qb, cb, input_precision=PREC)
        q_n += tl.sum(qb * nb[None, :], 1)
    scores = qk * d_w
    vb = tl.load(V + b * sv_b + h * sv_h + t[:, None] * sv_t + dv[None, :],
                 mask=(t[:, None] < T) & (dv[None, :] < DV), other=0.0).to(tl.float32)
    num = tl.dot(scores, vb, input_precision=PREC) + inter_w[:, None] * q_c
    den = tl.sum(scores, 1) + inter_w * q_n
    norm = tl.maximum(tl.abs(den), tl.exp(-m_t)) + eps
    out = num / norm[:, None]
    tl.store(HOUT + b * so_b + h * so_h + t[:, None] * so_t + dv[None, :], out.to(HOUT.dtype.element_ty),
             mask=(t[:, None] < T) & (dv[None, :] < DV))
    if pv == 0:
        tl.store(MT + bh * T + t, m_t, mask=t < T)
        tl.store(NT + bh * T + t, norm, mask=t < T)


@triton.jit(do_not_specialize=VARYING)
def _bwd_dstates_kernel(Q, DH, LF, I, M_IN, M_OUT, MT, NT, DC_END,
                        s_b, s_t, s_h, sv_b, sv_t, sv_h, T, H, NC, DQK, DV, scale,
                        L: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, PREC: tl.constexpr):
    bh, pk, pv = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    b, h = bh // H, bh % H
    dk = pk * BK + tl.arange(0, BK)
    dv = pv * BV + tl.arange(0, BV)
    mask_c = (dk[:, None] < DQK) & (dv[None, :] < DV)
    c_off = dk[:, None] * DV + dv[None, :]
    dC = tl.zeros([BK, BV], tl.float32)
    for j in range(0, NC):
        c = NC - 1 - j
        tl.store(DC_END + (bh * NC + c) * DQK * DV + c_off, dC, mask=mask_c)
        bcum, i, t = _chunk_gates(LF, I, bh, c, T, L)
        g = tl.sum(tl.where(tl.arange(0, L) == L - 1, bcum, 0.0), 0)
        m_in = tl.load(M_IN + bh * NC + c)
        m_next = tl.load(M_IN + bh * NC + c + 1, mask=c + 1 < NC, other=0.0)
        m_next = tl.where(c + 1 < NC, m_next, tl.load(M_OUT + bh))
        m_t = tl.load(MT + bh * T + t, mask=t < T, other=0.0)
        n_t = tl.load(NT + bh * T + t, mask=t < T, other=1.0)
        e = tl.where(t < T, tl.exp(bcum + m_in - m_t) / n_t, 0.0)
        qb = tl.load(Q + b * s_b + h * s_h + t[:, None] * s_t + dk[None, :],
                     mask=(t[:, None] < T) & (dk[None, :] < DQK), other=0.0).to(tl.float32) * scale
        dhb = tl.load(DH + b * sv_b + h * sv_h + t[:, None] * sv_t + dv[None, :],
                      mask=(t[:, None] < T) & (dv[None, :] < DV), other=0.0).to(tl.float32)
        dC = tl.exp(g + m_in - m_next) * dC + tl.dot(tl.trans(qb * e[:, None]), dhb, input_precision=PREC)


@triton.jit
def _pair_weights(LF, I, M_IN, M_OUT, MT, NT, bh, c, T, NC, L: tl.constexpr):
    """For chunk c: a [L, L] = exp(log_d - m_t) / N_t (query t, key s), e [L] = exp(b_t + m_in - m_t) / N_t (the
    entering state's weight in h_t), w [L] = exp(g - b_s + i_s - m_end) (key s's weight in the state at the end)."""
    bcum, i, t = _chunk_gates(LF, I, bh, c, T, L)
    m_in = tl.load(M_IN + bh * NC + c)
    m_t = tl.load(MT + bh * T + t, mask=t < T, other=0.0)
    n_t = tl.load(NT + bh * T + t, mask=t < T, other=1.0)
    valid = t < T
    log_d = bcum[:, None] - bcum[None, :] + i[None, :]
    causal = (tl.arange(0, L)[:, None] >= tl.arange(0, L)[None, :]) & valid[:, None]
    a = tl.where(causal, tl.exp(log_d - m_t[:, None]) / n_t[:, None], 0.0)
    e = tl.where(valid, tl.exp(bcum + m_in - m_t) / n_t, 0.0)
    g = tl.sum(tl.where(tl.arange(0, L) == L - 1, bcum, 0.0), 0)
    m_end = tl.load(M_IN + bh * NC + c + 1, mask=c + 1 < NC, other=0.0)
    m_end = tl.where(c + 1 < NC, m_end, tl.load(M_OUT + bh))
    w = tl.where(valid, tl.exp(g - bcum + i - m_end), 0.0)
    return a, e, w, t


@triton.jit(do_not_specialize=VARYING)
def _bwd_dqdk_kernel(Q, K, V, DH, LF, I, C_IN, DC_END, M_IN, M_OUT, MT, NT, DQ, DK,
                     s_b, s_t, s_h, sv_b, sv_t, sv_h, T, H, NC, DQK, DV, scale,
                     L: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, PREC: tl.constexpr):
    c, bh, pk = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    b, h = bh // H, bh % H
    a, e, w, t = _pair_weights(LF, I, M_IN, M_OUT, MT, NT, bh, c, T, NC, L)
    dk_idx = pk * BK + tl.arange(0, BK)
    rows_k = (t[:, None] < T) & (dk_idx[None, :] < DQK)
    dh_v = tl.zeros([L, L], tl.float32)        # dh_t . v_s
    dh_c = tl.zeros([L, BK], tl.float32)       # C_in^T dh_t   (for dq)
    v_dc = tl.zeros([L, BK], tl.float32)       # dC_end v_s    (for dk)
    for v0 in range(0, DV, BV):
        dv_idx = v0 + tl.arange(0, BV)
        rows_v = (t[:, None] < T) & (dv_idx[None, :] < DV)
        vb = tl.load(V + b * sv_b + h * sv_h + t[:, None] * sv_t + dv_idx[None, :], mask=rows_v,
                     other=0.0).to(tl.float32)
        dhb = tl.load(DH + b * sv_b + h * sv_h + t[:, None] * sv_t + dv_idx[None, :], mask=rows_v,
                      other=0.0).to(tl.float32)
        state = (bh * NC + c) * DQK * DV + dk_idx[:, None] * DV + dv_idx[None, :]
        mask_c = (dk_idx[:, None] < DQK) & (dv_idx[None, :] < DV)
        cb = tl.load(C_IN + state, mask=mask_c, other=0.0)
        dcb = tl.load(DC_END + state, mask=mask_c, other=0.0)
        dh_v += tl.dot(dhb, tl.trans(vb), input_precision=PREC)
        dh_c += tl.dot(dhb, tl.trans(cb), input_precision=PREC)
        v_dc += tl.dot(vb, tl.trans(dcb), input_precision=PREC)
    qb = tl.load(Q + b * s_b + h * s_h + t[:, None] * s_t + dk_idx[None, :], mask=rows_k, other=0.0).to(tl.float32)
    kb = tl.load(K + b * s_b + h * s_h + t[:, None] * s_t + dk_idx[None, :], mask=rows_k, other=0.0).to(tl.float32)
    p = a * dh_v                                # [t, s]
    dq = tl.dot(p, kb, input_precision=PREC) + e[:, None] * dh_c      # gradient w.r.t. the scaled q
    dk = tl.dot(tl.trans(p), qb * scale, input_precision=PREC) + w[:, None] * v_dc
    offs = b * s_b + h * s_h + t[:, None] * s_t + dk_idx[None, :]
    tl.store(DQ + offs, (dq * scale).to(DQ.dtype.element_ty), mask=rows_k)
    tl.store(DK + offs, dk.to(DK.dtype.element_ty), mask=rows_k)


@triton.jit(do_not_specialize=VARYING)
def _bwd_dv_kernel(Q, K, DH, LF, I, DC_END, M_IN, M_OUT, MT, NT, DV_OUT,
                   s_b, s_t, s_h, sv_b, sv_t, sv_h, T, H, NC, DQK, DV, scale,
                   L: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, PREC: tl.constexpr):
    c, bh, pv = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    b, h = bh // H, bh % H
    a, e, w, t = _pair_weights(LF, I, M_IN, M_OUT, MT, NT, bh, c, T, NC, L)
    dv_idx = pv * BV + tl.arange(0, BV)
    rows_v = (t[:, None] < T) & (dv_idx[None, :] < DV)
    qk = tl.zeros([L, L], tl.float32)          # q_t . k_s
    k_dc = tl.zeros([L, BV], tl.float32)       # dC_end^T k_s
    for k0 in range(0, DQK, BK):
        dk_idx = k0 + tl.arange(0, BK)
        rows_k = (t[:, None] < T) & (dk_idx[None, :] < DQK)
        qb = tl.load(Q + b * s_b + h * s_h + t[:, None] * s_t + dk_idx[None, :], mask=rows_k,
                     other=0.0).to(tl.float32) * scale
        kb = tl.load(K + b * s_b + h * s_h + t[:, None] * s_t + dk_idx[None, :], mask=rows_k,
                     other=0.0).to(tl.float32)
        dcb = tl.load(DC_END + (bh * NC + c) * DQK * DV + dk_idx[:, None] * DV + dv_idx[None, :],
                      mask=(dk_idx[:, None] < DQK) & (dv_idx[None, :] < DV), other=0.0)
        qk += tl.dot(qb, tl.trans(kb), input_precision=PREC)
        k_dc += tl.dot(kb, dcb, input_precision=PREC)
    dhb = tl.load(DH + b * sv_b + h * sv_h + t[:, None] * sv_t + dv_idx[None, :], mask=rows_v,
                  other=0.0).to(tl.float32)
    dv = tl.dot(tl.trans(a * qk), dhb, input_precision=PREC) + w[:, None] * k_dc
    tl.store(DV_OUT + b * sv_b + h * sv_h + t[:, None] * sv_t + dv_idx[None, :], dv.to(DV_OUT.dtype.element_ty),
             mask=rows_v)


def new_like(x: torch.Tensor, dtype: torch.dtype | None = None) -> torch.Tensor:
    """Output allocation; every element is written by a kernel (tests fill these with NaN to prove it)."""
    return torch.empty_like(x, dtype=dtype)


def _options(L: int, BK: int, BV: int, x: torch.Tensor) -> dict:
    """The compile-time options of a launch on inputs like x."""
    return dict(L=L, BK=BK, BV=BV, PREC=triton_dot_precision(x.dtype))


def _tile(d: int) -> int:
    return max(16, min(TILE, triton.next_power_of_2(d)))


def _chunk_states(k, v, lf, ig, init, dims):
    """Run `_fwd_states_kernel`: ((C, n, m) entering every chunk, the final (C, n, m)), all fp32."""
    B, T, H, DQK, DV, L, NC, BK, BV = dims
    f32 = dict(device=k.device, dtype=torch.float32)
    entering = (torch.empty(B * H, NC, DQK, DV, **f32), torch.empty(B * H, NC, DQK, **f32),
                torch.empty(B * H, NC, **f32))
    final = torch.empty(B, H, DQK, DV, **f32), torch.empty(B, H, DQK, **f32), torch.empty(B, H, **f32)
    strides = (k.stride(0), k.stride(1), k.stride(2), v.stride(0), v.stride(1), v.stride(2))
    _fwd_states_kernel[(B * H, triton.cdiv(DQK, BK), triton.cdiv(DV, BV))](
        k, v, lf, ig, *(init if init is not None else (k, k, k)), *entering, *final, *strides, T, H, NC, DQK, DV,
        HAS_INIT=init is not None, **_options(L, BK, BV, k))
    return entering, final


class MLSTMChunkwise(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, i_pre, f_pre, C0, n0, m0, chunk_size, eps, recompute_states):
        B, T, H, DQK = q.shape
        DV = v.shape[-1]
        L, NC = chunk_size, triton.cdiv(T, chunk_size)
        BK, BV = _tile(DQK), _tile(DV)
        q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
        # Gates as [B*H, T] fp32; the log forget gate is what the kernels use.
        lf = F.logsigmoid(f_pre.float()).permute(0, 2, 1).reshape(B * H, T).contiguous()
        ig = i_pre.float().permute(0, 2, 1).reshape(B * H, T).contiguous()
        init = (C0.float().contiguous(), n0.float().contiguous(), m0.float().contiguous()) if C0 is not None else None
        (C_in, n_in, m_in), (C_out, n_out, m_out) = _chunk_states(k, v, lf, ig, init, (B, T, H, DQK, DV, L, NC, BK, BV))
        h = new_like(v)
        f32 = dict(device=q.device, dtype=torch.float32)
        m_t, n_t = torch.empty(B * H, T, **f32), torch.empty(B * H, T, **f32)
        scale = DQK ** -0.5
        strides = (q.stride(0), q.stride(1), q.stride(2), v.stride(0), v.stride(1), v.stride(2))
        _fwd_output_kernel[(NC, B * H, triton.cdiv(DV, BV))](
            q, k, v, lf, ig, C_in, n_in, m_in, h, m_t, n_t, *strides, h.stride(0), h.stride(1), h.stride(2),
            T, H, NC, DQK, DV, scale, eps, **_options(L, BK, BV, q))
        # The chunk-entry states are the one saved tensor that grows with DQK x DV: recomputing them in the backward
        # costs one more pass of the states kernel (linear in T) and frees B*H*NC*DQK*DV fp32 per layer.
        states = (init or ()) if recompute_states else (C_in, m_in)
        ctx.save_for_backward(q, k, v, lf, ig, f_pre, m_out, m_t, n_t, *states)
        ctx.has_init, ctx.recompute_states = init is not None, recompute_states
        ctx.dims = (B, T, H, DQK, DV, L, NC, BK, BV, scale)
        ctx.mark_non_differentiable(C_out, n_out, m_out)
        return h, C_out, n_out, m_out

    @staticmethod
    def backward(ctx, dh, *_state_grads):
        q, k, v, lf, ig, f_pre, m_out, m_t, n_t, *states = ctx.saved_tensors
        B, T, H, DQK, DV, L, NC, BK, BV, scale = ctx.dims
        if ctx.recompute_states:  # the same kernel on the same inputs: bit-identical states
            (C_in, _, m_in), _ = _chunk_states(k, v, lf, ig, states if ctx.has_init else None, ctx.dims[:-1])
        else:
            C_in, m_in = states
        dh = dh.contiguous()
        strides = (q.stride(0), q.stride(1), q.stride(2), v.stride(0), v.stride(1), v.stride(2))
        dC_end = torch.empty_like(C_in)
        _bwd_dstates_kernel[(B * H, triton.cdiv(DQK, BK), triton.cdiv(DV, BV))](
            q, dh, lf, ig, m_in, m_out, m_t, n_t, dC_end, *strides, T, H, NC, DQK, DV, scale, **_options(L, BK, BV, q))
        # dq and dk in fp32: the gate gradients below take differences of their dot products with q and k.
        dq, dk, dv = new_like(q, torch.float32), new_like(k, torch.float32), new_like(v)
        _bwd_dqdk_kernel[(NC, B * H, triton.cdiv(DQK, BK))](
            q, k, v, dh, lf, ig, C_in, dC_end, m_in, m_out, m_t, n_t, dq, dk, *strides, T, H, NC, DQK, DV, scale,
            **_options(L, BK, BV, q))
        _bwd_dv_kernel[(NC, B * H, triton.cdiv(DV, BV))](
            q, k, dh, lf, ig, dC_end, m_in, m_out, m_t, n_t, dv, *strides, T, H, NC, DQK, DV, scale,
            **_options(L, BK, BV, q))
        # Gate gradients from dq and dk: d i~_s = k_s.dk_s; dF_u = q_u.dq_u - k_u.dk_u; d log f = reverse cumsum.
        d_i = (k.float() * dk.float()).sum(-1)
        d_cum = (q.float() * dq.float()).sum(-1) - d_i
        d_lf = d_cum.flip(1).cumsum(1).flip(1)
        d_f = d_lf * torch.sigmoid(-f_pre.float())
        return (dq.to(q.dtype), dk.to(k.dtype), dv, d_i.to(f_pre.dtype), d_f.to(f_pre.dtype),
                None, None, None, None, None, None)


def mlstm_chunkwise_triton(q, k, v, i_pre, f_pre, initial_state: MLSTMState | None = None, chunk_size: int = 64,
                           eps: float = EPS, recompute_states: bool = False):
    """Same contract as kernels.mlstm.chunk.mlstm_chunkwise: returns (h [B, T, H, DV], final MLSTMState).
    recompute_states: recompute the state entering every chunk in the backward instead of saving it."""
    for name, d in (("q/k head dim", q.shape[-1]), ("v head dim", v.shape[-1])):
        if d < 16:
            raise ValueError(f"Triton mLSTM: {name} must be >= 16 (got {d})")
    if chunk_size not in (16, 32, 64, 128):
        raise ValueError(f"Triton mLSTM: chunk_size must be 16, 32, 64 or 128 (got {chunk_size})")
    C0, n0, m0 = initial_state if initial_state is not None else (None, None, None)
    h, C, n, m = MLSTMChunkwise.apply(q, k, v, i_pre, f_pre, C0, n0, m0, chunk_size, eps, recompute_states)
    return h, MLSTMState(C, n, m)
