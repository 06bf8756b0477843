"""Chunkwise mLSTM cell in Triton: forward and backward, state in and out. Written from the equations in naive.py.

Forward (chunks of L steps; b_t = cumulative log forget gate inside a chunk, g = b_{L-1}):
1. `_fwd_states_kernel`, one program per (batch*head, DQK tile, DV tile), a loop over the chunks in order: stores
   the stabilised state (C, n, m) entering every chunk, then folds the chunk in:
       m' = max(g + m, max_s(g - b_s + i_s)),  C' = exp(g + m - m') C + sum_s exp(g - b_s + i_s - m') k_s v_s^T.
2. `_fwd_output_kernel`, one program per (chunk, batch*head, DV tile), all chunks in parallel:
       log_d[t, s] = b_t - b_s + i_s (s <= t),  m_t = max(max_s log_d[t, s], b_t + m_in),
       h_t = (sum_s e^{log_d - m_t} (q_t.k_s) v_s + e^{b_t + m_in - m_t} q_t C_in) / N_t,
       N_t = max(|sum_s e^{log_d - m_t} (q_t.k_s) + e^{b_t + m_in - m_t} q_t.n_in|, e^{-m_t}) + eps.
   It saves m_t, N_t and which term of N_t's max won for the backward, and the chunk-entry states unless
   `recompute_states` asks the backward to run `_fwd_states_kernel` again (the same kernel on the same inputs:
   bit-identical states, B*H*NC*(DQK*DV + DQK) fp32 less memory per layer).

Backward: the exact gradient of h, eps included. h_t = num_t / N_t with the unstabilised num~, den~ and
N~_t = max(|den~_t|, 1) + eps e^{m_t}: the stabiliser cancels except in eps. So the gradient has, beside the one
through num (the normaliser and stabiliser held constant), a term through |den_t| where it wins the max, with weight
beta_t = sign(den_t) dh_t.h_t, and one through m_t, dL/dm_t = -eps dh_t.h_t / N_t. A per-head norm after the cell
nearly cancels both (it is scale-invariant up to its own eps), but not where the eps terms are of the norm's size:
at gates near the soft cap they are most of the gradient. With a_ts = e^{F_t - F_s + i_s - m_t} / N_t the normaliser
is C's extra value column of ones (n) with output gradient -beta_t:
    dq_t = sum_s a_ts (dh_t.v_s - beta_t) k_s + e_t (C_in^T dh_t - beta_t n_in),
    dk_s = sum_t a_ts (dh_t.v_s - beta_t) q_t + w_s (dC_end v_s + dn_end),
    dv_s = sum_t a_ts (q_t.k_s) dh_t + w_s dC_end^T k_s,
where dC_end, dn_end (the gradients reaching the state at a chunk's end) come from `_bwd_dstates_kernel`, a reverse
loop over chunks. Gate gradients are gradients of log-weights: a pair (t, s) has log-weight F_t - F_s + i_s, which
holds i~_s and log f_j for s < j <= t. `_bwd_dqdk_kernel` sums them per chunk over the terms that hold each gate
(the pairs straddling j, the entering state's weight in h_t for t >= j, the keys' weights in the state at the end for
s < j, the chunk's decay), never as differences of larger sums (a reverse cumsum of q.dq - k.dk, equal in exact
arithmetic, loses its digits to cancellation). In fp32 each dominant term (the log-weight that m_t comes from, whose
gradient is a difference of nearly equal numbers under the norm) is replaced by an exact sum minus the other terms,
as autograd does through the max: `_dominant_term_fixes`, which also carries dL/dm_t to the key the max comes from.
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

from swax_lightning.kernels.backends import TRITON_MLSTM_CHUNKS, TRITON_MLSTM_MIN_HEAD_DIM, triton_dot_precision
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
def _fwd_output_kernel(Q, K, V, LF, I, C_IN, N_IN, M_IN, HOUT, MT, NT, ST,
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
        # d N_t / d den_t: sign(den_t) where |den_t| is the larger term of the max, else 0.
        tl.store(ST + bh * T + t, tl.where(tl.abs(den) > tl.exp(-m_t), tl.where(den < 0, -1.0, 1.0), 0.0), mask=t < T)


@triton.jit(do_not_specialize=VARYING)
def _bwd_dstates_kernel(Q, DH, BETA, LF, I, M_IN, M_OUT, MT, NT, DC_END, DN_END,
                        s_b, s_t, s_h, sv_b, sv_t, sv_h, T, H, NC, DQK, DV, scale,
                        L: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, PREC: tl.constexpr):
    bh, pk, pv = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    b, h = bh // H, bh % H
    dk = pk * BK + tl.arange(0, BK)
    dv = pv * BV + tl.arange(0, BV)
    mask_c = (dk[:, None] < DQK) & (dv[None, :] < DV)
    c_off = dk[:, None] * DV + dv[None, :]
    dC = tl.zeros([BK, BV], tl.float32)
    dn = tl.zeros([BK], tl.float32)
    for j in range(0, NC):
        c = NC - 1 - j
        tl.store(DC_END + (bh * NC + c) * DQK * DV + c_off, dC, mask=mask_c)
        if pv == 0:
            tl.store(DN_END + (bh * NC + c) * DQK + dk, dn, mask=dk < DQK)
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
        beta = tl.load(BETA + bh * T + t, mask=t < T, other=0.0)
        decay = tl.exp(g + m_in - m_next)
        dC = decay * dC + tl.dot(tl.trans(qb * e[:, None]), dhb, input_precision=PREC)
        dn = decay * dn - tl.sum(qb * (e * beta)[:, None], 0)


@triton.jit
def _pair_weights(LF, I, M_IN, M_OUT, MT, NT, bh, c, T, NC, L: tl.constexpr):
    """For chunk c: a [L, L] = exp(log_d - m_t) / N_t (query t, key s), e [L] = exp(b_t + m_in - m_t) / N_t (the
    entering state's weight in h_t), w [L] = exp(g - b_s + i_s - m_end) (key s's weight in the state at the end),
    decay = exp(g + m_in - m_end) (the entering state's weight in the state at the end)."""
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
    return a, e, w, t, tl.exp(g + m_in - m_end)


@triton.jit(do_not_specialize=VARYING)
def _bwd_dqdk_kernel(Q, K, V, DH, BETA, LF, I, C_IN, N_IN, DC_END, DN_END, M_IN, M_OUT, MT, NT, DQ, DK, GATE, CARRY,
                     s_b, s_t, s_h, sv_b, sv_t, sv_h, T, H, NC, DQK, DV, scale,
                     L: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, PREC: tl.constexpr):
    c, bh, pk = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    b, h = bh // H, bh % H
    a, e, w, t, decay = _pair_weights(LF, I, M_IN, M_OUT, MT, NT, bh, c, T, NC, L)
    dk_idx = pk * BK + tl.arange(0, BK)
    rows_k = (t[:, None] < T) & (dk_idx[None, :] < DQK)
    dh_v = tl.zeros([L, L], tl.float32)        # dh_t . v_s
    dh_c = tl.zeros([L, BK], tl.float32)       # C_in^T dh_t   (for dq)
    v_dc = tl.zeros([L, BK], tl.float32)       # dC_end v_s    (for dk)
    carry = tl.sum(tl.zeros([1], tl.float32), 0)  # <dC_end, C_in> over this DQK tile
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
        carry += tl.sum(tl.sum(cb * dcb, 1), 0)
    qb = tl.load(Q + b * s_b + h * s_h + t[:, None] * s_t + dk_idx[None, :], mask=rows_k, other=0.0).to(tl.float32)
    qb = qb * scale
    kb = tl.load(K + b * s_b + h * s_h + t[:, None] * s_t + dk_idx[None, :], mask=rows_k, other=0.0).to(tl.float32)
    nb = tl.load(N_IN + (bh * NC + c) * DQK + dk_idx, mask=dk_idx < DQK, other=0.0)
    dnb = tl.load(DN_END + (bh * NC + c) * DQK + dk_idx, mask=dk_idx < DQK, other=0.0)
    # The normaliser's term: n is C's extra value column of ones, and its output gradient is -beta_t.
    beta = tl.load(BETA + bh * T + t, mask=t < T, other=0.0)
    dh_v -= beta[:, None]
    dh_c -= beta[:, None] * nb[None, :]
    v_dc += dnb[None, :]
    p = a * dh_v                                # [t, s]
    dq = tl.dot(p, kb, input_precision=PREC) + e[:, None] * dh_c      # gradient w.r.t. the scaled q
    dk = tl.dot(tl.trans(p), qb, input_precision=PREC) + w[:, None] * v_dc
    offs = b * s_b + h * s_h + t[:, None] * s_t + dk_idx[None, :]
    tl.store(DQ + offs, (dq * scale).to(DQ.dtype.element_ty), mask=rows_k)
    tl.store(DK + offs, dk.to(DK.dtype.element_ty), mask=rows_k)
    # This DQK tile's share of the gradients of the log-weights (q.k and the state dots are sums over tiles):
    pair = p * tl.dot(qb, tl.trans(kb), input_precision=PREC)   # of pair (t, s): F_t - F_s + i_s
    inter = e * tl.sum(qb * dh_c, 1)            # of the entering state in h_t: b_t
    write = w * tl.sum(kb * v_dc, 1)            # of key s in the state at the chunk's end: g - b_s + i_s
    carry = decay * (carry + tl.sum(nb * dnb, 0))  # of the entering state in the state at the end: g
    # log f_j is in the pairs with s < j <= t, the entering state's weight for t >= j, the keys' end weights for
    # s < j and the chunk's decay g: each sum taken only over the terms that hold it (no differences of sums).
    j = tl.arange(0, L)
    before = j[None, :] < j[:, None]            # [j, s]: s < j
    after = j[None, :] >= j[:, None]            # [j, t]: t >= j
    d_lf = (tl.sum(tl.where(before, tl.cumsum(pair, 0, reverse=True), 0.0), 1) + carry
            + tl.sum(tl.where(after, inter[None, :], 0.0), 1) + tl.sum(tl.where(before, write[None, :], 0.0), 1))
    d_i = tl.sum(pair, 0) + write
    # GATE [5, DQK tiles, B*H, T]: d log f, d i~, and the parts the stabiliser terms need; CARRY [DQK tiles, B*H, NC].
    gate = (pk * tl.num_programs(1) + bh) * T + t
    part = tl.num_programs(2) * tl.num_programs(1) * T
    tl.store(GATE + gate, d_lf, mask=t < T)
    tl.store(GATE + part + gate, d_i, mask=t < T)
    tl.store(GATE + 2 * part + gate, tl.sum(pair, 1) + inter, mask=t < T)
    tl.store(GATE + 3 * part + gate, inter, mask=t < T)
    tl.store(GATE + 4 * part + gate, write, mask=t < T)
    tl.store(CARRY + (pk * tl.num_programs(1) + bh) * NC + c, carry)


@triton.jit(do_not_specialize=VARYING)
def _bwd_dv_kernel(Q, K, DH, LF, I, DC_END, M_IN, M_OUT, MT, NT, DV_OUT,
                   s_b, s_t, s_h, sv_b, sv_t, sv_h, T, H, NC, DQK, DV, scale,
                   L: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, PREC: tl.constexpr):
    c, bh, pv = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    b, h = bh // H, bh % H
    a, e, w, t, _ = _pair_weights(LF, I, M_IN, M_OUT, MT, NT, bh, c, T, NC, L)
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


def new_like(x: torch.Tensor, dtype: torch.dtype | None = None, shape: tuple | None = None) -> torch.Tensor:
    """Output allocation (x's shape unless given); every element is written by a kernel (tests fill these with NaN
    to prove it)."""
    return x.new_empty(shape or x.shape, dtype=dtype or x.dtype)


def _options(L: int, BK: int, BV: int, x: torch.Tensor) -> dict:
    """The compile-time options of a launch on inputs like x."""
    return dict(L=L, BK=BK, BV=BV, PREC=triton_dot_precision(x.dtype))


def _tile_size(d: int) -> int:
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
        BK, BV = _tile_size(DQK), _tile_size(DV)
        q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
        # Gates as [B*H, T] fp32; the log forget gate is what the kernels use.
        lf = F.logsigmoid(f_pre.float()).permute(0, 2, 1).reshape(B * H, T).contiguous()
        ig = i_pre.float().permute(0, 2, 1).reshape(B * H, T).contiguous()
        init = (C0.float().contiguous(), n0.float().contiguous(), m0.float().contiguous()) if C0 is not None else None
        (C_in, n_in, m_in), (C_out, n_out, m_out) = _chunk_states(k, v, lf, ig, init, (B, T, H, DQK, DV, L, NC, BK, BV))
        h = new_like(v)
        m_t, n_t, s_t = (new_like(lf) for _ in range(3))
        scale = DQK ** -0.5
        strides = (q.stride(0), q.stride(1), q.stride(2), v.stride(0), v.stride(1), v.stride(2))
        _fwd_output_kernel[(NC, B * H, triton.cdiv(DV, BV))](
            q, k, v, lf, ig, C_in, n_in, m_in, h, m_t, n_t, s_t, *strides, h.stride(0), h.stride(1), h.stride(2),
            T, H, NC, DQK, DV, scale, eps, **_options(L, BK, BV, q))
        # The chunk-entry states are the one saved tensor that grows with DQK x DV: recomputing them in the backward
        # costs one more pass of the states kernel (linear in T) and frees B*H*NC*DQK*DV fp32 per layer.
        states = (init or ()) if recompute_states else (C_in, n_in, m_in)
        ctx.save_for_backward(q, k, v, h, lf, ig, f_pre, m_out, m_t, n_t, s_t, *states)
        ctx.has_init, ctx.recompute_states, ctx.eps = init is not None, recompute_states, eps
        ctx.dims = (B, T, H, DQK, DV, L, NC, BK, BV, scale)
        ctx.mark_non_differentiable(C_out, n_out, m_out)
        return h, C_out, n_out, m_out

    @staticmethod
    def backward(ctx, dh, *_state_grads):
        q, k, v, h, lf, ig, f_pre, m_out, m_t, n_t, s_t, *states = ctx.saved_tensors
        B, T, H, DQK, DV, L, NC, BK, BV, scale = ctx.dims
        if ctx.recompute_states:  # the same kernel on the same inputs: bit-identical states
            (C_in, n_in, m_in), _ = _chunk_states(k, v, lf, ig, states if ctx.has_init else None, ctx.dims[:-1])
        else:
            C_in, n_in, m_in = states
        dh = dh.contiguous()
        dh_h = (dh.float() * h.float()).sum(-1).permute(0, 2, 1).reshape(B * H, T)  # dh_t . h_t
        beta = (s_t * dh_h).contiguous()  # the gradient reaching |den_t| through N_t, times -N_t
        strides = (q.stride(0), q.stride(1), q.stride(2), v.stride(0), v.stride(1), v.stride(2))
        dC_end, dn_end = torch.empty_like(C_in), torch.empty_like(n_in)
        _bwd_dstates_kernel[(B * H, triton.cdiv(DQK, BK), triton.cdiv(DV, BV))](
            q, dh, beta, lf, ig, m_in, m_out, m_t, n_t, dC_end, dn_end, *strides, T, H, NC, DQK, DV, scale,
            **_options(L, BK, BV, q))
        dq, dk, dv = new_like(q), new_like(k), new_like(v)
        gate = new_like(lf, shape=(5, triton.cdiv(DQK, BK), B * H, T))
        carry = new_like(lf, shape=(triton.cdiv(DQK, BK), B * H, NC))
        _bwd_dqdk_kernel[(NC, B * H, triton.cdiv(DQK, BK))](
            q, k, v, dh, beta, lf, ig, C_in, n_in, dC_end, dn_end, m_in, m_out, m_t, n_t, dq, dk, gate, carry, *strides,
            T, H, NC, DQK, DV, scale, **_options(L, BK, BV, q))
        _bwd_dv_kernel[(NC, B * H, triton.cdiv(DV, BV))](
            q, k, dh, lf, ig, dC_end, m_in, m_out, m_t, n_t, dv, *strides, T, H, NC, DQK, DV, scale,
            **_options(L, BK, BV, q))
        # What h_t's log-weights sum to, the eps term included: 0 where |den_t| wins the max (a shift of all of them
        # changes nothing), dh_t.h_t exp(-m_t) / N_t where exp(-m_t) does.
        row_total = torch.where(s_t == 0, dh_h.double() * torch.exp(-m_t.double()) / n_t, 0.0)
        d_lf, d_i, row, inter, write = gate.double().sum(1)
        d_lf_fix, d_i_fix = _dominant_term_fixes(lf, ig, m_in[:, 0], L, row_total, row, inter, write,
                                                 carry.double().sum(0))
        d_lf, d_i = d_lf + d_lf_fix, d_i + d_i_fix
        d_i, d_lf = (x.view(B, H, T).permute(0, 2, 1) for x in (d_i, d_lf))
        d_f = d_lf * torch.sigmoid(-f_pre.double())
        return dq, dk, dv, d_i.to(f_pre.dtype), d_f.to(f_pre.dtype), None, None, None, None, None, None


def _dominant_term_fixes(lf, ig, m0, L, row_total, row, inter, write, carry):
    """Gate-gradient corrections [B*H, T] (for log f, i~) that make the sums of log-weight gradients exact.

    Every output h_t is a sum over log-weighted terms (the chunk's keys s <= t and the state entering the chunk), and
    every chunk-end state S_{c+1} is too (its keys and the carried S_c). Shifting all log-weights of h_t by one
    constant changes h_t only through the eps term: their gradients sum to `row_total`. Shifting those of S_{c+1}
    scales it: theirs sum to Gamma_{c+1}, the gradient of S_{c+1}'s log-scale, = sum over the next chunk's rows of
    their state-term gradient (`inter`) + S_{c+1}'s own carry term. In fp32 the dominant term of each sum (the
    largest log-weight: the key or state that m_t, or the state's m, comes from) is a difference of nearly equal
    numbers where a per-head norm follows the cell; the others are small. As autograd does through the max, each
    dominant term is replaced by the exact sum minus the others: the difference is routed here to the log-weight it
    belongs to (pair (t, s) holds i~_s and log f_j for s < j <= t). This also carries dL/dm_t, the eps term's
    gradient, to the key the running max comes from. Dominance from the gates in fp64: F over the whole sequence
    outgrows fp32's digits. The gradients of the initial state are not needed (it is an input without gradient)."""
    BH, T = lf.shape
    NC = carry.shape[1]
    device = lf.device
    cum = lf.double().cumsum(1)
    # m_t = F_t + max(m0, max_{s <= t} (i~_s - F_s)): the dominant term of h_t is key best[t] (-1: initial state).
    candidates = torch.cat([m0.double()[:, None], ig.double() - cum], 1)
    best = candidates.cummax(1).indices[:, 1:] - 1
    t = torch.arange(T, device=device)
    start = t // L * L                                         # first step of t's chunk
    from_state = best < start                                  # h_t's dominant term is the entering state
    row_fix = row_total - row                                  # exact sum minus computed sum, per h_t
    inter = inter + torch.where(from_state, row_fix, 0.0)
    # Chunk-end states: S_{c+1}'s dominant term is the carry or key best[end of chunk c].
    ends = torch.clamp(torch.arange(1, NC + 1, device=device) * L, max=T) - 1
    carried = best[:, ends] < start[ends]                      # [B*H, NC]
    pad = NC * L - T

    def per_chunk(x):  # [B*H, T] -> [B*H, NC]: sums over each chunk
        return F.pad(x, (0, pad)).view(BH, NC, L).sum(-1)

    write_sum = per_chunk(write)
    # Gamma_c = sum_{t in c} inter_t + (carry_c, or Gamma_{c+1} - write_sum_c where the carry dominates): a linear
    # recurrence with 0/1 coefficients, summed segment by segment (a segment ends at a chunk whose key dominates).
    step = per_chunk(inter) + torch.where(carried, -write_sum, carry)
    after = F.pad(step.flip(1).cumsum(1).flip(1), (0, 1))     # sum of step over chunks >= c
    idx = torch.arange(NC, device=device).expand(BH, NC)
    stop = torch.where(carried, NC - 1, idx).flip(1).cummin(1).values.flip(1)
    gamma = after[:, :NC] - after.gather(1, stop + 1)
    gamma_next = F.pad(gamma[:, 1:], (0, 1))                   # the final state takes no gradient
    state_fix = gamma_next - (carry + write_sum)
    # Route each fix to its pair (hi, lo): log f_j for lo < j <= hi, and i~_lo when lo is a key.
    hi = torch.cat([t.expand(BH, T), ends.expand(BH, NC)], 1)
    lo = torch.cat([torch.where(from_state, start - 1, best), torch.where(carried, start[ends] - 1, best[:, ends])], 1)
    fix = torch.cat([row_fix, state_fix], 1)
    is_key = torch.cat([~from_state, ~carried], 1)
    steps = torch.zeros(BH, T + 1, dtype=torch.float64, device=device)
    steps.scatter_add_(1, lo + 1, fix).scatter_add_(1, hi + 1, -fix)
    d_i = torch.zeros_like(steps).scatter_add_(1, torch.where(is_key, lo + 1, 0), torch.where(is_key, fix, 0.0))
    return steps.cumsum(1)[:, :T], d_i[:, 1:]


def mlstm_chunkwise_triton(q, k, v, i_pre, f_pre, initial_state: MLSTMState | None = None, chunk_size: int = 64,
                           eps: float = EPS, recompute_states: bool = False):
    """Same contract as kernels.mlstm.chunk.mlstm_chunkwise: returns (h [B, T, H, DV], final MLSTMState).
    recompute_states: recompute the state entering every chunk in the backward instead of saving it."""
    for name, d in (("q/k head dim", q.shape[-1]), ("v head dim", v.shape[-1])):
        if d < TRITON_MLSTM_MIN_HEAD_DIM:
            raise ValueError(f"Triton mLSTM: {name} must be >= {TRITON_MLSTM_MIN_HEAD_DIM} (got {d})")
    if chunk_size not in TRITON_MLSTM_CHUNKS:
        raise ValueError(f"Triton mLSTM: chunk_size must be one of {TRITON_MLSTM_CHUNKS} (got {chunk_size})")
    C0, n0, m0 = initial_state if initial_state is not None else (None, None, None)
    h, C, n, m = MLSTMChunkwise.apply(q, k, v, i_pre, f_pre, C0, n0, m0, chunk_size, eps, recompute_states)
    return h, MLSTMState(C, n, m)
