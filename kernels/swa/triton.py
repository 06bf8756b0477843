"""Sliding-window attention with sink tokens in Triton: forward and backward (FlashAttention-2 style).

Algorithm. Queries are processed in blocks of BLOCK_M rows, keys in blocks of BLOCK_N. For the query block starting at
m0, only key blocks that intersect [m0 - W + 1, m0 + BLOCK_M - 1] are visited (the loop bounds skip every other block:
nothing outside the window is loaded), plus key block 0 when it holds sink keys that the window loop does not reach.
Each visited block updates an online softmax (running max and sum in fp32, exp2 with log2(e)-scaled scores); the
output is written once, and the log-sum-exp of every row is saved for the backward. Work per query: W + BLOCK_M keys
(+ BLOCK_N for sinks): O(T * W) in total.

Backward: delta = rowsum(dO * O) (PyTorch), then
- dq kernel: one program per query block, the same key blocks as the forward: dS = P * (dO V^T - delta), dq += dS K;
- dk/dv kernel: one program per key block and key/value head; it loops over the query heads of its GQA group and
  over the query blocks that can see it (its own window span, and all later blocks for the sink block), so no
  atomics are needed: dv += P^T dO, dk += dS^T Q.
Visibility of key s for query t (docs/design.md section 2): s <= t and (t - s < W or s < n_sink).

Block sizes: BLOCK_M = BLOCK_N = 64 (BLOCK_N is also the largest supported n_sink), 4 warps; one configuration, since
`@triton.autotune` over several configurations fails under the interpreter (docs/design.md section 5). Dots take their
operands in the input dtype (bf16/fp16 tensor cores; probabilities and dS are cast to it, as in FlashAttention) and
accumulate in fp32; softmax statistics are fp32; outputs take the input dtype. Only bf16 on a CPU (the interpreter,
which computes bf16 wrongly) is upcast to fp32 right after loading. Any T (masked tails), head dims that are powers of
two from 16 to 256, GQA; in fp32 on a GPU, head dims up to 128 (at 256 the dk/dv kernel needs 272 KiB of shared
memory, a Hopper block has 227 KiB: figures from compiling for sm_90). Shared memory otherwise peaks at 192 KiB.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from swax_lightning.kernels.backends import (
    TRITON_FP32_MAX_HEAD_DIM,
    TRITON_MAX_SINKS,
    TRITON_SWA_HEAD_DIMS,
    triton_dot_precision,
)

# Arguments that change from call to call (sequence length, head counts, window, sinks): Triton would compile a kernel
# for each of them equal to 1 or a multiple of 16 (fp32 kernels take up to half a minute to compile); one serves all.
VARYING = ("T", "HQ", "HK", "GROUP", "W", "N_SINK")
BLOCK_M = 64
BLOCK_N = TRITON_MAX_SINKS  # sink keys are read as one key block
LOG2E = tl.constexpr(1.4426950408889634)  # scores are kept in base 2 (exp2)


@triton.jit
def _load_tile(ptr, mask, NATIVE: tl.constexpr):
    """Load a tile: in its own dtype for tensor-core dots (NATIVE), else upcast to fp32 at once."""
    x = tl.load(ptr, mask=mask, other=0.0)
    return x if NATIVE else x.to(tl.float32)


@triton.jit
def _visible(t, s, T, W, N_SINK):
    """[M, N] mask: key s visible to query t."""
    return (s[None, :] <= t[:, None]) & (s[None, :] < T) & \
        (((t[:, None] - s[None, :]) < W) | (s[None, :] < N_SINK))


@triton.jit
def _query_block(HQ, GROUP, BLOCK_M: tl.constexpr):
    """This program's batch, query head, key/value head, first row m0 and rows t."""
    pid_m, pid_bh = tl.program_id(0), tl.program_id(1)
    b, hq = pid_bh // HQ, pid_bh % HQ
    m0 = pid_m * BLOCK_M
    return b, hq, hq // GROUP, pid_bh, m0, m0 + tl.arange(0, BLOCK_M)


@triton.jit
def _key_blocks(m0, T, W, N_SINK, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """Key blocks the query block at m0 visits: the first n0, the window's first block lo, the end hi. The window
    covers [lo, hi); block 0 comes first when it holds sinks the window does not reach."""
    lo = tl.maximum(m0 - W + 1, 0) // BLOCK_N * BLOCK_N
    hi = tl.minimum(m0 + BLOCK_M, T)
    return tl.where((N_SINK > 0) & (lo > 0), 0, lo), lo, hi


@triton.jit
def _scores_block(q, k_base, v_base, n0, d, sk_t, T, scale, BLOCK_N: tl.constexpr, NATIVE: tl.constexpr,
                  PREC: tl.constexpr):
    """Key positions s, key and value tiles, and the base-2 scaled scores q k^T of the key block at n0."""
    s = n0 + tl.arange(0, BLOCK_N)
    kb = _load_tile(k_base + s[:, None] * sk_t + d[None, :], s[:, None] < T, NATIVE)
    vb = _load_tile(v_base + s[:, None] * sk_t + d[None, :], s[:, None] < T, NATIVE)
    return s, kb, vb, tl.dot(q, tl.trans(kb), input_precision=PREC) * (scale * LOG2E)


@triton.jit
def _next_key_block(n0, lo, BLOCK_N: tl.constexpr):
    """After the sink block, jump to the window."""
    return tl.where(n0 + BLOCK_N < lo, lo, n0 + BLOCK_N)


@triton.jit(do_not_specialize=VARYING)
def _fwd_kernel(Q, K, V, O, LSE, sq_b, sq_t, sq_h, sk_b, sk_t, sk_h, so_b, so_t, so_h,
                T, HQ, GROUP, W, N_SINK, scale,
                D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, NATIVE: tl.constexpr,
                PREC: tl.constexpr):
    b, hq, hk, pid_bh, m0, t = _query_block(HQ, GROUP, BLOCK_M)
    d = tl.arange(0, D)
    q = _load_tile(Q + b * sq_b + hq * sq_h + t[:, None] * sq_t + d[None, :], t[:, None] < T, NATIVE)
    k_base, v_base = K + b * sk_b + hk * sk_h, V + b * sk_b + hk * sk_h
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, D], tl.float32)
    n0, lo, hi = _key_blocks(m0, T, W, N_SINK, BLOCK_M, BLOCK_N)
    while n0 < hi:
        s, kb, vb, scores = _scores_block(q, k_base, v_base, n0, d, sk_t, T, scale, BLOCK_N, NATIVE, PREC)
        scores = tl.where(_visible(t, s, T, W, N_SINK), scores, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(scores, 1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        p = tl.exp2(scores - m_safe[:, None])
        alpha = tl.exp2(m_i - m_safe)
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None] + tl.dot(p.to(vb.dtype), vb, input_precision=PREC)
        m_i = m_new
        n0 = _next_key_block(n0, lo, BLOCK_N)
    l_i = tl.where(t < T, l_i, 1.0)  # rows past T see no key; every real row sees at least itself
    out = acc / l_i[:, None]
    tl.store(O + b * so_b + hq * so_h + t[:, None] * so_t + d[None, :], out.to(O.dtype.element_ty),
             mask=t[:, None] < T)
    tl.store(LSE + pid_bh * T + t, m_i + tl.log2(l_i), mask=t < T)  # base-2 log-sum-exp of scaled scores


@triton.jit(do_not_specialize=VARYING)
def _bwd_dq_kernel(Q, K, V, DO, DQ, LSE, DELTA, sq_b, sq_t, sq_h, sk_b, sk_t, sk_h,
                   T, HQ, GROUP, W, N_SINK, scale,
                   D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, NATIVE: tl.constexpr,
                   PREC: tl.constexpr):
    b, hq, hk, pid_bh, m0, t = _query_block(HQ, GROUP, BLOCK_M)
    d = tl.arange(0, D)
    row = b * sq_b + hq * sq_h + t[:, None] * sq_t + d[None, :]
    q = _load_tile(Q + row, t[:, None] < T, NATIVE)
    do = _load_tile(DO + row, t[:, None] < T, NATIVE)
    lse = tl.load(LSE + pid_bh * T + t, mask=t < T, other=0.0)
    delta = tl.load(DELTA + pid_bh * T + t, mask=t < T, other=0.0)
    k_base, v_base = K + b * sk_b + hk * sk_h, V + b * sk_b + hk * sk_h
    dq = tl.zeros([BLOCK_M, D], tl.float32)
    n0, lo, hi = _key_blocks(m0, T, W, N_SINK, BLOCK_M, BLOCK_N)
    while n0 < hi:
        s, kb, vb, scores = _scores_block(q, k_base, v_base, n0, d, sk_t, T, scale, BLOCK_N, NATIVE, PREC)
        p = tl.where(_visible(t, s, T, W, N_SINK), tl.exp2(scores - lse[:, None]), 0.0)
        dp = tl.dot(do, tl.trans(vb), input_precision=PREC)
        ds = p * (dp - delta[:, None])
        dq += tl.dot(ds.to(kb.dtype), kb, input_precision=PREC)
        n0 = _next_key_block(n0, lo, BLOCK_N)
    tl.store(DQ + row, (dq * scale).to(DQ.dtype.element_ty), mask=t[:, None] < T)


@triton.jit(do_not_specialize=VARYING)
def _bwd_dkdv_kernel(Q, K, V, DO, DK, DV, LSE, DELTA, sq_b, sq_t, sq_h, sk_b, sk_t, sk_h,
                     T, HQ, HK, GROUP, W, N_SINK, scale,
                     D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, NATIVE: tl.constexpr,
                     PREC: tl.constexpr):
    pid_n, pid_bh = tl.program_id(0), tl.program_id(1)
    b, hk = pid_bh // HK, pid_bh % HK
    n0 = pid_n * BLOCK_N
    s = n0 + tl.arange(0, BLOCK_N)
    d = tl.arange(0, D)
    kv_row = b * sk_b + hk * sk_h + s[:, None] * sk_t + d[None, :]
    kb = _load_tile(K + kv_row, s[:, None] < T, NATIVE)
    vb = _load_tile(V + kv_row, s[:, None] < T, NATIVE)
    dk = tl.zeros([BLOCK_N, D], tl.float32)
    dv = tl.zeros([BLOCK_N, D], tl.float32)
    # Queries that see this key block: t in [n0, n0 + BLOCK_N - 1 + W - 1]; with sinks in it, every later query.
    q_lo = n0 // BLOCK_M * BLOCK_M
    q_hi = tl.minimum(n0 + BLOCK_N + W - 1, T)
    q_hi = tl.where((N_SINK > 0) & (n0 < N_SINK), T, q_hi)
    for g in range(0, GROUP):
        hq = hk * GROUP + g
        bh = b * HQ + hq
        m0 = q_lo
        while m0 < q_hi:
            t = m0 + tl.arange(0, BLOCK_M)
            row = b * sq_b + hq * sq_h + t[:, None] * sq_t + d[None, :]
            q = _load_tile(Q + row, t[:, None] < T, NATIVE)
            do = _load_tile(DO + row, t[:, None] < T, NATIVE)
            lse = tl.load(LSE + bh * T + t, mask=t < T, other=0.0)
            delta = tl.load(DELTA + bh * T + t, mask=t < T, other=0.0)
            scores = tl.dot(q, tl.trans(kb), input_precision=PREC) * (scale * LOG2E)
            visible = _visible(t, s, T, W, N_SINK) & (t[:, None] < T)
            p = tl.where(visible, tl.exp2(scores - lse[:, None]), 0.0)
            dv += tl.dot(tl.trans(p).to(do.dtype), do, input_precision=PREC)
            dp = tl.dot(do, tl.trans(vb), input_precision=PREC)
            ds = p * (dp - delta[:, None])
            dk += tl.dot(tl.trans(ds).to(q.dtype), q, input_precision=PREC)
            m0 += BLOCK_M
    tl.store(DK + kv_row, (dk * scale).to(DK.dtype.element_ty), mask=s[:, None] < T)
    tl.store(DV + kv_row, dv.to(DV.dtype.element_ty), mask=s[:, None] < T)


def _native_dots(x: torch.Tensor) -> bool:
    """Dots in the input dtype (tensor cores, fp32 accumulation) on GPUs and for fp16; the interpreter computes bf16
    wrongly, so bf16 on CPU is upcast to fp32 right after loading."""
    return x.is_cuda or x.dtype in (torch.float16, torch.float32)


def new_like(x: torch.Tensor) -> torch.Tensor:
    """Output allocation; every element is written by a kernel (tests fill these with NaN to prove it)."""
    return torch.empty_like(x)


def _options(q: torch.Tensor) -> dict:
    """The compile-time options every launch shares."""
    return dict(D=q.shape[-1], BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, NATIVE=_native_dots(q),
                PREC=triton_dot_precision(q.dtype), num_warps=4)


def _check(q, k, v, n_sink):
    D = q.shape[-1]
    low, high = TRITON_SWA_HEAD_DIMS
    if D < low or D > high or D & (D - 1):
        raise ValueError(f"Triton SWA: head dim must be a power of two in [{low}, {high}] (got {D})")
    if n_sink > BLOCK_N:
        raise ValueError(f"Triton SWA: at most {BLOCK_N} sink tokens (got {n_sink})")
    if q.is_cuda and q.element_size() >= 4 and D > TRITON_FP32_MAX_HEAD_DIM:
        raise ValueError(f"Triton SWA: fp32 takes head dims up to {TRITON_FP32_MAX_HEAD_DIM} (got {D}): its backward "
                         "would need more shared memory than a GPU block has; use bf16/fp16 or the torch backend")
    if q.shape[2] % k.shape[2]:
        raise ValueError(f"Triton SWA: query heads {q.shape[2]} not a multiple of key/value heads {k.shape[2]}")


class SlidingWindowAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, window, n_sink, scale):
        B, T, HQ, _ = q.shape
        HK = k.shape[2]
        q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
        o = new_like(q)
        lse = torch.empty(B * HQ, T, device=q.device, dtype=torch.float32)
        grid = (triton.cdiv(T, BLOCK_M), B * HQ)
        _fwd_kernel[grid](q, k, v, o, lse, q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1),
                          k.stride(2), o.stride(0), o.stride(1), o.stride(2), T, HQ, HQ // HK, window, n_sink,
                          scale, **_options(q))
        ctx.save_for_backward(q, k, v, o, lse)
        ctx.window, ctx.n_sink, ctx.scale = window, n_sink, scale
        return o

    @staticmethod
    def backward(ctx, do):
        q, k, v, o, lse = ctx.saved_tensors
        B, T, HQ, _ = q.shape
        HK = k.shape[2]
        do = do.contiguous()
        delta = (do.float() * o.float()).sum(-1).permute(0, 2, 1).reshape(B * HQ, T).contiguous()
        dq, dk, dv = new_like(q), new_like(k), new_like(v)
        args = (ctx.window, ctx.n_sink, ctx.scale)
        _bwd_dq_kernel[(triton.cdiv(T, BLOCK_M), B * HQ)](
            q, k, v, do, dq, lse, delta, q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1),
            k.stride(2), T, HQ, HQ // HK, *args, **_options(q))
        _bwd_dkdv_kernel[(triton.cdiv(T, BLOCK_N), B * HK)](
            q, k, v, do, dk, dv, lse, delta, q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1),
            k.stride(2), T, HQ, HK, HQ // HK, *args, **_options(q))
        return dq, dk, dv, None, None, None


def swa_triton(q, k, v, window: int | None, n_sink: int = 0, scale: float | None = None) -> torch.Tensor:
    """Same contract as kernels.swa.blocked.swa_blocked: q [B, T, Hq, D], k, v [B, T, Hkv, D] -> [B, T, Hq, D]."""
    T = q.shape[1]
    n_sink = min(n_sink, T)  # sinks past the sequence do not exist: clamp before the sink limit is checked
    _check(q, k, v, n_sink)
    window = T if window is None or window >= T else int(window)
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    return SlidingWindowAttention.apply(q, k, v, window, n_sink, scale)
