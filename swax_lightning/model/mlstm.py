"""mLSTM layer (pattern letter X): the xLSTM-7B matrix-memory layer around the cell in kernels/mlstm/.

    q, k = Linear(d, qk_factor * d)        v = Linear(d, v_factor * d)        (no biases)
    i~, f~ = cap * tanh(Linear(d, H) / cap)   (per-head scalar gates, with biases)
    h = cell(q, k, v, i~, f~)                the chunkwise form (kernels.mlstm_chunkwise)
    y = out_proj(MultiHeadLayerNorm(h) * sigmoid(Linear(d, v_factor * d)))   (mlstm_norm: layernorm | rmsnorm)

Decisions:
- Gate pre-activations are computed and soft-capped in fp32 (also under bf16 autocast), so +-30 inputs stay finite.
- Init as in xLSTM: input-gate bias igate_bias_init (-10: writes start small), forget-gate biases spread linearly
  over the heads in fgate_bias_init (3..6: from ~50 to ~400 steps of memory).
- The per-head output norm is xLSTM-7B's LayerNorm (mean subtracted, fp32, weight, no bias) unless the config asks
  for RMSNorm (`mlstm_norm: rmsnorm`, the earlier form, kept for comparison). Either cancels the cell's normaliser
  scale; that is why gradients of the cell's forms are compared after this norm (docs/design.md section 3).
- Streaming inference passes a RecurrentCache: a chunk continues from its state with the chunkwise form, a single
  token with the recurrent step. Padding tokens (positions < 0) get input gate 0 and forget gate 1: the state stays
  as is.
"""
from __future__ import annotations

from contextlib import nullcontext

import torch
import torch.nn as nn

from swax_lightning.kernels import MLSTMState, mlstm_chunkwise, mlstm_step
from swax_lightning.kernels.util import fp32, soft_cap
from swax_lightning.model.building_blocks import MultiHeadLayerNorm, MultiHeadRMSNorm
from swax_lightning.model.cache import RecurrentCache
from swax_lightning.model.config import ModelConfig


class MLSTMLayer(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        d, self.heads = cfg.d_model, cfg.mlstm_heads
        self.qk_dim, self.v_dim = int(cfg.mlstm_qk_factor * d), int(cfg.mlstm_v_factor * d)
        self.gate_soft_cap, self.chunk_size = cfg.gate_soft_cap, cfg.chunk_size
        self.kernel, self.recompute_states = cfg.kernels["mlstm"], cfg.mlstm_recompute_states
        self.q_proj = nn.Linear(d, self.qk_dim, bias=False)
        self.k_proj = nn.Linear(d, self.qk_dim, bias=False)
        self.v_proj = nn.Linear(d, self.v_dim, bias=False)
        self.igate = nn.Linear(d, self.heads)
        self.fgate = nn.Linear(d, self.heads)
        self.ogate = nn.Linear(d, self.v_dim, bias=False)
        norm = MultiHeadLayerNorm if cfg.mlstm_norm == "layernorm" else MultiHeadRMSNorm
        self.norm = norm(self.heads, self.v_dim // self.heads, cfg.norm_eps)
        self.out_proj = nn.Linear(self.v_dim, d, bias=False)
        self.igate_bias_init, self.fgate_bias_init = cfg.igate_bias_init, cfg.fgate_bias_init

    def reset_own_parameters(self) -> None:
        with torch.no_grad():
            self.igate.bias.fill_(self.igate_bias_init)
            self.fgate.bias.copy_(torch.linspace(*self.fgate_bias_init, self.heads, device=self.fgate.bias.device))

    def gates(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Soft-capped fp32 gate pre-activations (i~, f~), each [B, T, H]."""
        real_device = x.device.type in ("cpu", "cuda")  # autocast cannot be entered on the meta device
        no_autocast = torch.autocast(x.device.type, enabled=False) if real_device else nullcontext()
        with no_autocast:
            x32 = fp32(x)
            i_pre = nn.functional.linear(x32, fp32(self.igate.weight), fp32(self.igate.bias))
            f_pre = nn.functional.linear(x32, fp32(self.fgate.weight), fp32(self.fgate.bias))
        return soft_cap(i_pre, self.gate_soft_cap), soft_cap(f_pre, self.gate_soft_cap)

    def new_cache(self, batch: int, dtype: torch.dtype, device) -> RecurrentCache:
        like = torch.empty(0, dtype=dtype, device=device)  # the state takes fp32 (fp64 for an fp64 model)
        return RecurrentCache(MLSTMState.zeros(batch, self.heads, self.qk_dim // self.heads, self.v_dim // self.heads,
                                           like=like))

    def forward(self, x: torch.Tensor, cache: RecurrentCache | None = None,
                positions: torch.Tensor | None = None) -> torch.Tensor:
        B, T, _ = x.shape
        q = self.q_proj(x).view(B, T, self.heads, -1)
        k = self.k_proj(x).view(B, T, self.heads, -1)
        v = self.v_proj(x).view(B, T, self.heads, -1)
        i_pre, f_pre = self.gates(x)
        if cache is None:
            h, _ = mlstm_chunkwise(q, k, v, i_pre, f_pre, chunk_size=self.chunk_size, kernel=self.kernel,
                                   recompute_states=self.recompute_states)
        else:
            if positions is not None:  # padding leaves the state unchanged
                pad = (positions < 0)[..., None]
                i_pre = i_pre.masked_fill(pad, float("-inf"))
                f_pre = f_pre.masked_fill(pad, float("inf"))
            if T == 1:
                h, cache.state = mlstm_step(q[:, 0], k[:, 0], v[:, 0], i_pre[:, 0], f_pre[:, 0], cache.state)
                h = h[:, None].to(v.dtype)
            else:
                h, cache.state = mlstm_chunkwise(q, k, v, i_pre, f_pre, cache.state, self.chunk_size,
                                                 kernel=self.kernel)
        return self.out_proj(self.norm(h).reshape(B, T, self.v_dim) * torch.sigmoid(self.ogate(x)))
