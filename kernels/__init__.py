"""The dispatch point between the model and its compute kernels: sliding-window attention, the mLSTM cell and the
gated delta rule.

The layers in swax_lightning/model/ call `sliding_window_attention`, `mlstm_chunkwise` and `gated_delta_chunkwise`
and never pick an implementation themselves. Each kernel lives beside its slow reference (flash-linear-attention's
layout):
    kernels/swa/naive.py      dense masked SDPA, O(T^2): the test reference
    kernels/swa/blocked.py    blocked local attention in PyTorch, O(T * W): the CPU / autograd path
    kernels/mlstm/naive.py    parallel (quadratic) and recurrent-step forms: references and the decode step
    kernels/swa/triton.py     Triton forward + backward, O(T * W): the GPU path
    kernels/mlstm/chunk.py    chunkwise form in PyTorch, O(T * chunk): the CPU / autograd path
    kernels/mlstm/triton.py   chunkwise Triton forward + backward with state in and out: the GPU path
    kernels/mlstm/tfla.py     NX-AI's TFLA chunkwise Triton kernels (mlstm_kernels; optional extra, CUDA)
    kernels/deltanet/naive.py gated delta rule, recurrent step and loop: reference and decode step
    kernels/deltanet/chunk.py chunkwise (WY / UT-transform) form in PyTorch: the training path (no Triton yet)
    kernels/deltanet/fla.py   fla's gated delta rule kernel (optional extra, CUDA)
    kernels/lolcats/naive.py  LoLCATs' window + linear attention with dense masks, O(T^2): the test reference
    kernels/lolcats/chunk.py  its block form in PyTorch, O(T * W), linear state in and out, and the decode read
    kernels/ce/naive.py       cross-entropy over the full logits: the reference
    kernels/ce/chunked.py     chunked cross-entropy (never the full logits): the training loss
    kernels/swa/flash.py      flash-attn's window (optional extra, CUDA, no sinks)
    kernels/swa/flex.py       FlexAttention with a sliding-window-plus-sinks block mask (compiled, GPU)
The backend is chosen per call from the layer's config choice (ModelConfig.kernels: auto, torch, triton, flash,
flex, sdpa for attention; auto, torch, triton, tfla for the mLSTM; auto, torch, fla for the delta rule), overridden
for every operation by the environment variable SWAX_KERNELS=auto|torch|triton when it is set. What `auto` picks and
what each backend can take is in kernels/backends.py; `triton` on CPU tensors needs TRITON_INTERPRET=1 set before
triton is imported (the interpreter, for tests).
Triton modules are imported on first use, so CPU-only runs never import triton.
"""
from __future__ import annotations

import importlib
from collections.abc import Callable
from contextlib import contextmanager

from swax_lightning.kernels import backends
from swax_lightning.kernels.deltanet.chunk import gated_delta_chunkwise as _gated_delta_chunkwise_torch
from swax_lightning.kernels.deltanet.naive import gated_delta_recurrent, gated_delta_step
from swax_lightning.kernels.lolcats.chunk import LinearState, lolcats_chunked, lolcats_one_block
from swax_lightning.kernels.lolcats.naive import lolcats_reference
from swax_lightning.kernels.mlstm.chunk import mlstm_chunkwise as _mlstm_chunkwise_torch
from swax_lightning.kernels.mlstm.naive import MLSTMState, mlstm_parallel, mlstm_recurrent, mlstm_step
from swax_lightning.kernels.swa.blocked import swa_blocked
from swax_lightning.kernels.swa.naive import sliding_window_mask, swa_reference

_IMPLS = {  # backend name -> (module, function), imported on first use so CPU runs never import triton
    "triton": ("swax_lightning.kernels.swa.triton", "swa_triton"),
    "flash": ("swax_lightning.kernels.swa.flash", "swa_flash"),
    "flex": ("swax_lightning.kernels.swa.flex", "swa_flex"),
    "mlstm_triton": ("swax_lightning.kernels.mlstm.triton", "mlstm_chunkwise_triton"),
    "mlstm_tfla": ("swax_lightning.kernels.mlstm.tfla", "mlstm_chunkwise_tfla"),
    "deltanet_fla": ("swax_lightning.kernels.deltanet.fla", "gated_delta_chunkwise_fla"),
}


_SUBSTITUTES: dict[str, Callable] = {}  # operation -> function, while `substituted` is active


@contextmanager
def substituted(**operations: Callable):
    """Within the block, the named operations (attention, mlstm, deltanet) run the given functions, with the same
    arguments, instead of any backend: the dispatch's own hook for tools that need a layer's kernel to behave
    differently (the memory estimate saves what the GPU kernels save, on the meta device) without touching the layers.
    """
    unknown = set(operations) - set(backends.CHOICES)
    if unknown:
        raise ValueError(f"substituted: unknown operations {sorted(unknown)}; expected {sorted(backends.CHOICES)}")
    saved = dict(_SUBSTITUTES)
    _SUBSTITUTES.update(operations)
    try:
        yield
    finally:
        _SUBSTITUTES.clear()
        _SUBSTITUTES.update(saved)


def _impl(name: str) -> Callable:
    module, function = _IMPLS[name]
    return getattr(importlib.import_module(module), function)


def _causal(q, k, v, window, n_sink, scale):
    """Full causal attention in SDPA (flash / cuDNN on GPU, the fused kernel on CPU)."""
    return swa_blocked(q, k, v, None, 0, scale)


def _sdpa_dense(q, k, v, window, n_sink, scale):
    """One SDPA call with the dense [T, T] mask: the O(T^2) baseline."""
    return swa_reference(q, k, v, window, n_sink, scale)


def sliding_window_attention(q, k, v, window: int | None, n_sink: int = 0, scale: float | None = None,
                             kernel: str = "auto"):
    """Causal attention where query t sees keys t-W+1 .. t and the first n_sink keys. window=None: full causal.
    q [B, T, Hq, D], k and v [B, T, Hkv, D]; returns [B, T, Hq, D]. kernel: the config's choice
    (kernels/backends.py)."""
    if "attention" in _SUBSTITUTES:
        return _SUBSTITUTES["attention"](q, k, v, window, n_sink, scale)
    name = backends.attention_backend(kernel, is_cuda=q.is_cuda, dtype=q.dtype, head_dim=q.shape[-1], T=q.shape[1],
                                      window=window, n_sink=n_sink)
    fn = {"torch": swa_blocked, "causal": _causal, "sdpa": _sdpa_dense}.get(name) or _impl(name)
    return fn(q, k, v, window, n_sink, scale)


def mlstm_chunkwise(q, k, v, i_pre, f_pre, initial_state: MLSTMState | None = None, chunk_size: int = 64,
                    kernel: str = "auto", recompute_states: bool = False):
    """The mLSTM cell over a sequence. Returns (h [B, T, H, DV], final MLSTMState). recompute_states: the Triton
    kernel recomputes the state entering every chunk in the backward instead of saving it (the PyTorch path keeps
    what autograd saves)."""
    if "mlstm" in _SUBSTITUTES:
        return _SUBSTITUTES["mlstm"](q, k, v, i_pre, f_pre, initial_state, chunk_size, recompute_states)
    name = backends.mlstm_backend(kernel, is_cuda=q.is_cuda, qk_head_dim=q.shape[-1], v_head_dim=v.shape[-1],
                                  chunk_size=chunk_size)
    if name == "triton":
        return _impl("mlstm_triton")(q, k, v, i_pre, f_pre, initial_state, chunk_size,
                                     recompute_states=recompute_states)
    if name == "tfla":  # recomputes the chunk states in its backward always
        return _impl("mlstm_tfla")(q, k, v, i_pre, f_pre, initial_state, chunk_size)
    return _mlstm_chunkwise_torch(q, k, v, i_pre, f_pre, initial_state, chunk_size)


def gated_delta_chunkwise(q, k, v, beta, g, initial_state=None, chunk_size: int = 64, kernel: str = "auto"):
    """The gated delta rule over a sequence. Returns (o [B, T, H, DV], final state [B, H, DK, DV])."""
    if "deltanet" in _SUBSTITUTES:
        return _SUBSTITUTES["deltanet"](q, k, v, beta, g, initial_state, chunk_size)
    if backends.deltanet_backend(kernel, is_cuda=q.is_cuda) == "fla":
        return _impl("deltanet_fla")(q, k, v, beta, g, initial_state, chunk_size)
    return _gated_delta_chunkwise_torch(q, k, v, beta, g, initial_state, chunk_size)


__all__ = ["LinearState", "MLSTMState", "backends", "gated_delta_chunkwise", "gated_delta_recurrent",
           "gated_delta_step", "lolcats_chunked", "lolcats_one_block", "lolcats_reference",
           "mlstm_chunkwise", "mlstm_parallel", "mlstm_recurrent", "mlstm_step",
           "sliding_window_attention", "sliding_window_mask", "substituted", "swa_blocked", "swa_reference"]
