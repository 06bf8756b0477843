"""Soft-capped cross-entropy over the LM head in chunks of rows: the training loss, without the [N, V] logits.

Forward: for each chunk of `rows` hidden states, logits = fp32(h_c @ W^T), y = cap * tanh(logits / cap), and the
loss sum adds logsumexp(y) - y[target]; only h and W are kept. Backward: each chunk's logits are recomputed and

    dy = (softmax(y) - onehot(target)) * g / N,   dz = dy * (1 - (y / cap)^2),   dh_c = dz @ W,   dW += dz^T @ h_c

so peak memory is a few [rows, V] fp32 tensors instead of about three [N, V] ones, for one extra head matmul.

Decisions:
- The head matmul runs in the weight's dtype (bf16 under mixed precision) and is upcast to fp32 (fp64 stays) as in
  the plain loss, so the two agree to rounding; dz is cast back to that dtype for the two gradient matmuls, and dW
  is accumulated in fp32 across chunks.
- rows = 1024 by default: at V = 50304 one fp32 [rows, V] tensor is 206 MB, small next to activations, and large
  enough that the matmuls stay efficient.
- The function takes the head weight as an input (not a module), so it must run inside the model's forward for
  FSDP2 to have gathered that weight (SWAXModel.forward with targets).
"""
from __future__ import annotations

import torch
from swax_lightning.kernels.util import fp32, soft_cap

ROWS = 1024


def _capped(h_c: torch.Tensor, weight: torch.Tensor, cap: float) -> torch.Tensor:
    return soft_cap(fp32(h_c @ weight.T), cap)


class _ChunkedSoftcapCE(torch.autograd.Function):
    @staticmethod
    def forward(ctx, h, weight, targets, cap, rows):
        total = torch.zeros((), dtype=fp32(h[:0]).dtype, device=h.device)
        for start in range(0, h.shape[0], rows):
            y = _capped(h[start:start + rows], weight, cap)
            picked = y.gather(1, targets[start:start + rows, None])
            total = total + (torch.logsumexp(y, dim=1, keepdim=True) - picked).sum()
        ctx.save_for_backward(h, weight, targets)
        ctx.cap, ctx.rows = cap, rows
        return total / h.shape[0]

    @staticmethod
    def backward(ctx, grad):
        h, weight, targets = ctx.saved_tensors
        cap, rows = ctx.cap, ctx.rows
        scale = grad / h.shape[0]
        dh = torch.empty_like(h)
        dw = torch.zeros_like(weight, dtype=fp32(weight[:0]).dtype)
        for start in range(0, h.shape[0], rows):
            h_c = h[start:start + rows]
            y = _capped(h_c, weight, cap)
            dy = torch.softmax(y, dim=1)
            dy.scatter_add_(1, targets[start:start + rows, None], dy.new_full((h_c.shape[0], 1), -1.0))
            dy.mul_(scale)
            if cap > 0:
                dy.mul_(1 - (y / cap) ** 2)
            dz = dy.to(weight.dtype)
            dh[start:start + rows] = dz @ weight
            dw.add_(dz.T @ h_c)
        return dh, dw.to(weight.dtype), None, None, None


def softcap_cross_entropy_chunked(h: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, cap: float,
                                  rows: int = ROWS) -> torch.Tensor:
    """Same contract as kernels.ce.naive.softcap_cross_entropy_reference: h [N, d], weight [V, d], targets [N]."""
    if rows < 1:
        raise ValueError(f"rows must be >= 1 (got {rows})")
    return _ChunkedSoftcapCE.apply(h, weight, targets, cap, rows)
