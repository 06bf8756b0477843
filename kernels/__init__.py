"""The dispatch point between the model and its compute kernels: sliding-window attention and the mLSTM cell.

The layers in swax_lightning/ call `sliding_window_attention` and `mlstm_chunkwise` and never pick an
implementation themselves. Each kernel lives beside its slow reference (flash-linear-attention's layout):
    kernels/swa/naive.py      dense masked SDPA, O(T^2): the test reference
    kernels/swa/blocked.py    blocked local attention in PyTorch, O(T * W): the CPU / autograd path
    kernels/mlstm/naive.py    parallel (quadratic) and recurrent-step forms: references and the decode step
    kernels/mlstm/chunk.py    chunkwise form in PyTorch, O(T * chunk): the CPU / autograd path
The backend is chosen per call from the environment variable SWAX_KERNELS:
    auto (default)  the fastest implementation available for the tensor's device
    torch           always the PyTorch paths above
    triton          the Triton kernels (an error until they exist for the operation)
Today every operation has only its PyTorch path; the Triton kernels plug in by adding an entry to _TRITON below.
"""
from __future__ import annotations

import os
from typing import Callable

from kernels.mlstm.chunk import mlstm_chunkwise as _mlstm_chunkwise_torch
from kernels.mlstm.naive import MLSTMState, mlstm_parallel, mlstm_recurrent, mlstm_step
from kernels.swa.blocked import swa_blocked
from kernels.swa.naive import sliding_window_mask, swa_reference

BACKENDS = ("auto", "torch", "triton")
_TRITON: dict[str, Callable] = {}  # operation name -> Triton implementation (for CUDA tensors)


def backend() -> str:
    """The backend asked for by SWAX_KERNELS, validated."""
    choice = os.environ.get("SWAX_KERNELS", "auto").lower()
    if choice not in BACKENDS:
        raise ValueError(f"SWAX_KERNELS={choice!r}: expected one of {', '.join(BACKENDS)}")
    return choice


def _pick(op: str, torch_impl: Callable, is_cuda: bool) -> Callable:
    choice = backend()
    if choice == "torch":
        return torch_impl
    if op in _TRITON and (is_cuda or choice == "triton"):
        return _TRITON[op]
    if choice == "triton":
        raise NotImplementedError(f"SWAX_KERNELS=triton: no Triton kernel for {op!r} yet; use auto or torch")
    return torch_impl


def sliding_window_attention(q, k, v, window: int | None, n_sink: int = 0, scale: float | None = None):
    """Causal attention where query t sees keys t-W+1 .. t and the first n_sink keys. window=None: full causal.
    q [B, T, Hq, D], k and v [B, T, Hkv, D]; returns [B, T, Hq, D]."""
    return _pick("swa", swa_blocked, q.is_cuda)(q, k, v, window, n_sink, scale)


def mlstm_chunkwise(q, k, v, i_pre, f_pre, initial_state: MLSTMState | None = None, chunk_size: int = 64):
    """The mLSTM cell over a sequence. Returns (h [B, T, H, DV], final MLSTMState)."""
    return _pick("mlstm", _mlstm_chunkwise_torch, q.is_cuda)(q, k, v, i_pre, f_pre, initial_state, chunk_size)


__all__ = ["MLSTMState", "backend", "mlstm_chunkwise", "mlstm_parallel", "mlstm_recurrent", "mlstm_step",
           "sliding_window_attention", "sliding_window_mask", "swa_blocked", "swa_reference"]
