"""The dispatch point between the model and its compute kernels: sliding-window attention and the mLSTM cell.

The layers in swax_lightning/ call `sliding_window_attention` and `mlstm_chunkwise` and never pick an
implementation themselves. Each kernel lives beside its slow reference (flash-linear-attention's layout):
    kernels/swa/naive.py      dense masked SDPA, O(T^2): the test reference
    kernels/swa/blocked.py    blocked local attention in PyTorch, O(T * W): the CPU / autograd path
    kernels/mlstm/naive.py    parallel (quadratic) and recurrent-step forms: references and the decode step
    kernels/swa/triton.py     Triton forward + backward, O(T * W): the GPU path
    kernels/mlstm/chunk.py    chunkwise form in PyTorch, O(T * chunk): the CPU / autograd path
    kernels/mlstm/triton.py   chunkwise Triton forward + backward with state in and out: the GPU path
    kernels/deltanet/naive.py gated delta rule, recurrent step and loop: reference and decode step
    kernels/deltanet/chunk.py chunkwise (WY / UT-transform) form in PyTorch: the training path (no Triton yet)
The backend is chosen per call from the environment variable SWAX_KERNELS:
    auto (default)  Triton for CUDA tensors where a Triton kernel exists, PyTorch otherwise
    torch           always the PyTorch paths
    triton          always Triton (CPU tensors need TRITON_INTERPRET=1 set before triton is imported: the
                    interpreter, for tests)
Triton modules are imported on first use, so CPU-only runs never import triton.
"""
from __future__ import annotations

import importlib
import os
from collections.abc import Callable

from kernels.deltanet.chunk import gated_delta_chunkwise as _gated_delta_chunkwise_torch
from kernels.deltanet.naive import gated_delta_recurrent, gated_delta_step
from kernels.mlstm.chunk import mlstm_chunkwise as _mlstm_chunkwise_torch
from kernels.mlstm.naive import MLSTMState, mlstm_parallel, mlstm_recurrent, mlstm_step
from kernels.swa.blocked import swa_blocked
from kernels.swa.naive import sliding_window_mask, swa_reference

BACKENDS = ("auto", "torch", "triton")
_TRITON = {  # operation -> (module, function) of its Triton kernel
    "swa": ("kernels.swa.triton", "swa_triton"),
    "mlstm": ("kernels.mlstm.triton", "mlstm_chunkwise_triton"),
}


def backend() -> str:
    """The backend asked for by SWAX_KERNELS, validated."""
    choice = os.environ.get("SWAX_KERNELS", "auto").lower()
    if choice not in BACKENDS:
        raise ValueError(f"SWAX_KERNELS={choice!r}: expected one of {', '.join(BACKENDS)}")
    return choice


def _triton_impl(op: str) -> Callable:
    module, name = _TRITON[op]
    return getattr(importlib.import_module(module), name)


def _pick(op: str, torch_impl: Callable, is_cuda: bool) -> Callable:
    choice = backend()
    if choice == "torch":
        return torch_impl
    if op not in _TRITON:
        if choice == "triton":
            raise NotImplementedError(f"SWAX_KERNELS=triton: no Triton kernel for {op!r}; use auto or torch")
        return torch_impl
    if is_cuda or choice == "triton":
        return _triton_impl(op)
    return torch_impl


def sliding_window_attention(q, k, v, window: int | None, n_sink: int = 0, scale: float | None = None):
    """Causal attention where query t sees keys t-W+1 .. t and the first n_sink keys. window=None: full causal.
    q [B, T, Hq, D], k and v [B, T, Hkv, D]; returns [B, T, Hq, D]."""
    return _pick("swa", swa_blocked, q.is_cuda)(q, k, v, window, n_sink, scale)


def mlstm_chunkwise(q, k, v, i_pre, f_pre, initial_state: MLSTMState | None = None, chunk_size: int = 64):
    """The mLSTM cell over a sequence. Returns (h [B, T, H, DV], final MLSTMState)."""
    return _pick("mlstm", _mlstm_chunkwise_torch, q.is_cuda)(q, k, v, i_pre, f_pre, initial_state, chunk_size)


def gated_delta_chunkwise(q, k, v, beta, g, initial_state=None, chunk_size: int = 64):
    """The gated delta rule over a sequence. Returns (o [B, T, H, DV], final state [B, H, DK, DV])."""
    return _pick("gated_delta", _gated_delta_chunkwise_torch, q.is_cuda)(q, k, v, beta, g, initial_state, chunk_size)


__all__ = ["MLSTMState", "backend", "gated_delta_chunkwise", "gated_delta_recurrent", "gated_delta_step",
           "mlstm_chunkwise", "mlstm_parallel", "mlstm_recurrent", "mlstm_step",
           "sliding_window_attention", "sliding_window_mask", "swa_blocked", "swa_reference"]
