"""The mLSTM cell through NX-AI's TFLA kernels (`mlstm_kernels`, arXiv 2503.14376; the NXAI Community License, an
optional extra): `chunkwise--triton_xl_chunk`, Tiled Flash Linear Attention, the xLSTM authors' own chunkwise Triton
forward and backward.

Conventions mapped onto this project's (kernels/mlstm/naive.py), checked against their PyTorch chunkwise form: the
same cell (logsigmoid forget gate, running max m, h = q C / (max(|q n|, exp(-m)) + eps), q scaled by 1/sqrt(DQK),
state C [DQK, DV] with n and m, zeros at start); their layout is [B, H, T, D] (transposed here) and their m is
[B, H, 1]. The gates arrive soft-capped and in fp32 from the layer and go in as they are: the call runs with CUDA
autocast off, because their autograd Function casts every floating input, gates included, to its kernel dtype under
autocast. Their kernels take T a multiple of 16: a power of two below 128 steps, else a multiple of the chunk; the
tail is padded with input gate 0 and forget gate 1 (finite: -/+1e4 before the gates, which leaves the state
unchanged and keeps their backward free of inf - inf) and the padded outputs dropped. The layer's chunk_size is their
target chunk size.

Their backward holds the normaliser and the stabiliser constant (as most mLSTM kernels do): exact only where the
per-head norm after the cell cancels them (tests/kernels/test_mlstm_tfla.py measures how far it is at the soft cap).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from swax_lightning.kernels.backends import TFLA_CHUNKS
from swax_lightning.kernels.mlstm.naive import EPS, MLSTMState
from swax_lightning.kernels.util import fp32

PAD_GATE = 1e4  # log input gate -1e4 (exp: 0) and forget gate pre-activation 1e4 (logsigmoid: 0) on padded steps
SMALL_T = 128   # below it their kernels take a power of two of at least 16 steps


def padded_length(T: int, chunk_size: int) -> int:
    """The sequence length their kernels take for T steps at this chunk size."""
    if T < SMALL_T:
        return max(16, 1 << (T - 1).bit_length())
    return -(-T // chunk_size) * chunk_size


def mlstm_chunkwise_tfla(q, k, v, i_pre, f_pre, initial_state: MLSTMState | None = None, chunk_size: int = 64,
                         eps: float = EPS):
    """Same contract as kernels.mlstm.chunk.mlstm_chunkwise: returns (h [B, T, H, DV], final MLSTMState)."""
    from mlstm_kernels.torch import get_mlstm_kernel

    if chunk_size not in TFLA_CHUNKS:
        raise ValueError(f"TFLA mLSTM: chunk_size must be one of {TFLA_CHUNKS} (got {chunk_size})")
    T = q.shape[1]
    pad = padded_length(T, chunk_size) - T

    def heads_first(x, value=0.0):  # [B, T, H, ...] -> [B, H, T + pad, ...]
        x = x.transpose(1, 2)
        return F.pad(x, (0, 0, 0, pad) if x.dim() == 4 else (0, pad), value=value).contiguous()

    state = {}
    if initial_state is not None:
        state = dict(c_initial=initial_state.C.float(), n_initial=initial_state.n.float(),
                     m_initial=initial_state.m.float()[..., None])
    kernel = get_mlstm_kernel("chunkwise--triton_xl_chunk")
    with torch.autocast("cuda", enabled=False):
        h, (C, n, m) = kernel(heads_first(q), heads_first(k), heads_first(v), heads_first(fp32(i_pre), -PAD_GATE),
                              heads_first(fp32(f_pre), PAD_GATE), return_last_states=True, eps=eps,
                              chunk_size=chunk_size, autocast_kernel_dtype=v.dtype, **state)
    return h[:, :, :T].transpose(1, 2).to(v.dtype), MLSTMState(C.float(), n.float(), m.float()[..., 0])
