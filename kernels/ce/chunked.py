"""Soft-capped cross-entropy over the LM head in chunks of rows: the training loss, without the [N, V] logits.

Forward: for each chunk of `rows` hidden states, logits = fp32(h_c @ W^T), y = cap * tanh(logits / cap), and the
loss sum adds logsumexp(y) - y[target] over the rows whose target is not `ignore_index`; only h and W are kept.
Backward: each chunk's logits are recomputed and

    dy = (softmax(y) - onehot(target)) * g / N,   dz = dy * (1 - (y / cap)^2),   dh_c = dz @ W,   dW += dz^T @ h_c

(rows with an ignored target get dy = 0; N counts the others, as torch's cross_entropy with reduction "mean"), so
peak memory is a few [rows, V] fp32 tensors instead of about three [N, V] ones, for one extra head matmul.

A frozen head (the weight needs no gradient, h does: the LoRA stage of a retrofit) takes a shorter road: the forward
computes dh for a unit upstream gradient in the same pass over the chunks (two head matmuls per chunk in all, against
four: no recomputed logits, no dW) and keeps dh instead of h and W; the backward scales it. Timed against the
trainable road by benchmarks/ce_frozen_head.py.

Decisions:
- Autocast: forward and backward run under the autocast state the forward was called in (torch.amp's custom_fwd /
  custom_bwd, one autograd Function per device type that has autocast), so under bf16 autocast all three head
  matmuls run in bf16, as the plain loss's would; without autocast they run in the weight's dtype. Their outputs are
  upcast to fp32 (fp64 stays) for the softmax; dz is cast once to the matmuls' dtype, and dW is accumulated in fp32
  across chunks.
- ignore_index (-100 by default, as torch's cross_entropy): those rows add nothing to the loss or the gradients, and
  the mean is over the rest (NaN when every target is ignored, as torch's).
- rows = 1024 by default: at V = 50304 one fp32 [rows, V] tensor is 206 MB, small next to activations, and large
  enough that the matmuls stay efficient.
- The function takes the head weight as an input (not a module), so it must run inside the model's forward for
  FSDP2 to have gathered that weight (SWAXModel.forward with targets).
"""
from __future__ import annotations

import functools

import torch

from swax_lightning.kernels.util import fp32, soft_cap

ROWS = 1024
IGNORE_INDEX = -100


def _logits(h_c: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """h_c @ W^T in the matmul's own dtype (the autocast dtype under autocast, else the weight's)."""
    return h_c @ weight.T


def _grad_logits(y: torch.Tensor, targets: torch.Tensor, kept: torch.Tensor, scale: torch.Tensor, cap: float,
                 dtype: torch.dtype) -> torch.Tensor:
    """dz, the gradient of one chunk's loss share at its logits (the module docstring's formula), in `dtype`."""
    dy = torch.softmax(y, dim=1)
    dy.scatter_add_(1, targets[:, None], dy.new_full((y.shape[0], 1), -1.0))
    dy.mul_(torch.where(kept[:, None], scale, 0.0))
    if cap > 0:
        dy.mul_(1 - (y / cap) ** 2)
    return dy.to(dtype)


def _forward(ctx, h, weight, targets, cap, rows, ignore_index, frozen_head):
    kept = targets != ignore_index
    picked_targets = torch.where(kept, targets, 0)  # any valid index: those rows are masked out below
    total = torch.zeros((), dtype=fp32(h[:0]).dtype, device=h.device)
    unit_scale = total.new_ones(()) / kept.sum()  # the backward's grad / N for a unit upstream gradient
    dh = torch.empty_like(h) if frozen_head else None
    for start in range(0, h.shape[0], rows):
        chunk = slice(start, start + rows)
        logits = _logits(h[chunk], weight)
        y = soft_cap(fp32(logits), cap)
        picked = y.gather(1, picked_targets[chunk, None])[:, 0]
        loss = torch.logsumexp(y, dim=1) - picked
        total = total + torch.where(kept[chunk], loss, 0.0).sum()
        if frozen_head:
            dh[chunk] = _grad_logits(y, picked_targets[chunk], kept[chunk], unit_scale, cap, logits.dtype) @ weight
    ctx.frozen_head, ctx.cap, ctx.rows = frozen_head, cap, rows  # cap and rows: the trainable road's backward
    ctx.save_for_backward(*((dh,) if frozen_head else (h, weight, picked_targets, kept)))
    return total / kept.sum()


def _backward(ctx, grad):
    if ctx.frozen_head:
        (dh,) = ctx.saved_tensors
        return dh * grad, None, None, None, None, None, None
    h, weight, targets, kept = ctx.saved_tensors
    cap, rows = ctx.cap, ctx.rows
    scale = grad / kept.sum()
    dh = torch.empty_like(h)
    dw = torch.zeros_like(weight, dtype=fp32(weight[:0]).dtype)
    for start in range(0, h.shape[0], rows):
        chunk = slice(start, start + rows)
        logits = _logits(h[chunk], weight)
        dz = _grad_logits(soft_cap(fp32(logits), cap), targets[chunk], kept[chunk], scale, cap, logits.dtype)
        dh[chunk] = dz @ weight
        dw.add_(dz.T @ h[chunk])
    return dh, dw.to(weight.dtype), None, None, None, None, None


@functools.cache
def _loss_function(device_type: str) -> type[torch.autograd.Function]:
    """The chunked loss as an autograd Function whose backward runs under its forward's autocast state on
    `device_type` (custom_fwd / custom_bwd take the device type when the class is made); as it is on a device
    without autocast (meta: the memory estimate)."""
    autocast = torch.amp.is_autocast_available(device_type)

    class ChunkedSoftcapCE(torch.autograd.Function):
        forward = staticmethod(torch.amp.custom_fwd(_forward, device_type=device_type) if autocast else _forward)
        backward = staticmethod(torch.amp.custom_bwd(_backward, device_type=device_type) if autocast else _backward)

    return ChunkedSoftcapCE


def softcap_cross_entropy_chunked(h: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, cap: float,
                                  rows: int = ROWS, ignore_index: int = IGNORE_INDEX) -> torch.Tensor:
    """Same contract as kernels.ce.naive.softcap_cross_entropy_reference: h [N, d], weight [V, d], targets [N]."""
    if rows < 1:
        raise ValueError(f"rows must be >= 1 (got {rows})")
    frozen_head = torch.is_grad_enabled() and h.requires_grad and not weight.requires_grad
    return _loss_function(h.device.type).apply(h, weight, targets, cap, rows, ignore_index, frozen_head)
