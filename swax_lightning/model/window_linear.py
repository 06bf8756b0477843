"""Window + linear layers (pattern letters G and M): the retrofit students that tell what a softmax window does from
what a linear-attention memory adds. Each is the teacher's attention restricted to a sliding window of
`lolcats_window` recent keys and `window_sinks` sink tokens, plus, beside it, a linear-attention layer of the
framework's own kind over the whole prefix (G: Gated DeltaNet, M: mLSTM); the two outputs add:

    y = SWA(W, s)(x) + linear(x)

Decisions:
- Additive, not LoLCATs' single normalised sum (the L layer, model/lolcats.py): that sum needs a linear part that is
  a feature-map attention with its own normaliser; Gated DeltaNet has no normaliser and the mLSTM's is
  max(|n.q|, exp(-m)), so each part keeps its own normalisation and the outputs add, as parallel hybrid heads do.
- The window is SWA(W, 4 sinks) by default: exactly what the training-free SWA(W, 4 sinks) variant puts in that
  layer, so a G or M student that learns nothing beyond its window is that variant, the strongest training-free one.
  Without sinks the window alone is far from the teacher's layer (the heads that rest on the first token spread that
  weight over the window instead: on SmolLM2, a 64-key window's mean relative error per layer is 0.85 without
  sinks and 0.22 with 4, on 1,024-token text), and the linear part would spend its capacity undoing that.
- The window part is an Attention layer with the teacher's q/k/v/o, q/k norms and RoPE (the full-attention base: it
  replaces a global layer), made a window by Attention.restrict_to_window, the training-free conversion's own
  step; the linear part is a D or X mixer, initialised from the same q/k/v/o by the retrofit
  (retrofit.init_from_attention).
- Decode: the window's bounded key/value cache and the linear part's recurrent state.
"""
from __future__ import annotations

import torch
import torch.nn as nn

from swax_lightning.model.attention import Attention
from swax_lightning.model.config import ModelConfig
from swax_lightning.model.layers import build_mixer


class WindowPlusLinearCache:
    def __init__(self, local, linear):
        self.local, self.linear = local, linear

    def nbytes(self) -> int:
        return self.local.nbytes() + self.linear.nbytes()


class WindowPlusLinear(nn.Module):
    """x [B, T, d_model] -> local(x) + linear(x): `local` the windowed attention, `linear` the D or X mixer."""

    def __init__(self, cfg: ModelConfig, linear: str):
        super().__init__()
        self.local = Attention(cfg, sliding=False)
        self.local.restrict_to_window(cfg.lolcats_window, cfg.window_sinks)
        self.linear = build_mixer(linear, cfg)

    def new_cache(self, batch: int, dtype: torch.dtype, device) -> WindowPlusLinearCache:
        return WindowPlusLinearCache(self.local.new_cache(batch, dtype, device),
                                     self.linear.new_cache(batch, dtype, device))

    def forward(self, x: torch.Tensor, cache: WindowPlusLinearCache | None = None,
                positions: torch.Tensor | None = None) -> torch.Tensor:
        local_cache, linear_cache = (None, None) if cache is None else (cache.local, cache.linear)
        return self.local(x, local_cache, positions) + self.linear(x, linear_cache, positions)
