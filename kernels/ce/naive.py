"""Plain soft-capped cross-entropy: the reference the chunked loss is compared with.

It builds the full [N, V] logits (fp32, or fp64 for an fp64 model), caps them as cap * tanh(z / cap) and takes the
mean cross-entropy; autograd keeps the logits, their capped copy and the softmax for the backward, so at N = 4 x 16k
tokens and V = 50k it holds about three 12 GiB tensors. Exact, and used for tests and the memory benchmark.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from swax_lightning.kernels.util import fp32, soft_cap


def softcap_cross_entropy_reference(h: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, cap: float,
                                    ignore_index: int = -100) -> torch.Tensor:
    """h [N, d] final hidden states, weight [V, d] the LM head, targets [N] -> mean loss over the targets that are
    not ignore_index (a scalar)."""
    return F.cross_entropy(soft_cap(fp32(h @ weight.T), cap), targets, ignore_index=ignore_index)
