"""The gated delta rule through flash-linear-attention (fla, MIT, an optional extra, CUDA only): its chunkwise Triton
kernel `chunk_gated_delta_rule`, the Gated DeltaNet authors' own.

Conventions mapped onto this project's (kernels/deltanet/naive.py): fla takes (q, k, v, g, beta), g before beta,
in the [B, T, H, D] layout; g is the log decay (<= 0) and beta the write strength after the sigmoid, as here; its
default query scale is 1/sqrt(DK), as here; q and k arrive L2-normalised from the layer, so fla's in-kernel
normalisation stays off; the state is [B, H, DK, DV] (K-first), as here. fla computes in the inputs' dtype with
fp32 accumulation and an fp32 state, so q, k, v and beta are cast to v's dtype and g kept fp32.
"""
from __future__ import annotations

import torch


def gated_delta_chunkwise_fla(q, k, v, beta, g, initial_state: torch.Tensor | None = None, chunk_size: int = 64):
    """Same contract as kernels.deltanet.chunk.gated_delta_chunkwise (fla picks its own chunk size, 64)."""
    from fla.ops.gated_delta_rule import chunk_gated_delta_rule

    dtype = v.dtype
    o, state = chunk_gated_delta_rule(q.to(dtype), k.to(dtype), v, g.float(), beta.to(dtype),
                                      scale=q.shape[-1] ** -0.5,
                                      initial_state=None if initial_state is None else initial_state.float(),
                                      output_final_state=True, use_qk_l2norm_in_kernel=False)
    return o.to(dtype), state
