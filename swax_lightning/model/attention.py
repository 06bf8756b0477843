"""Attention layer: sliding-window attention with optional sink tokens (pattern letter S), or full causal attention
(letter A, the same layer with no window).

Decisions:
- The window is a plain Python attribute (`self.window`), not a buffer or parameter: the window callback changes it
  between steps with no rebuild and it is never saved in a checkpoint (it is a run-time setting; the config's
  `window` is the evaluation default). A full-attention layer has window None; SWAXModel.set_window and set_sinks
  change only the sliding layers.
- RoPE at absolute positions (docs/design.md section 2), so a query's relative view is the same at any offset. A
  full-attention model masked to a window with sinks (training-free SWA) therefore keeps the positions it was
  trained with: the model is the same, only the mask changes.
- Pretrained imports (swax_lightning/pretrained/hf_import.py) may add q/k/v biases (qkv_bias, Qwen2), a per-head
  RMSNorm of queries and keys before RoPE (qk_norm, Qwen3 and Gemma 3: one weight of head_dim shared by the heads,
  as in transformers), RoPE frequency scaling (rope_scale) and another RoPE base for the sliding layers
  (sliding_rope_theta, Gemma 3); the attention arithmetic is unchanged. The RoPE of a layer is fixed when it is
  built, so a full-attention layer converted to SWA (training-free) keeps the rotation it was trained with.
- GQA: n_kv_heads key/value heads shared by groups of query heads.
- The attention itself is `kernels.sliding_window_attention`, with the backend the config's `kernels.attention`
  names (auto: SDPA for full attention, the blocked O(T * W) PyTorch path on CPU, flash-attn or Triton on GPU).
- Streaming inference passes a cache (cache.py) and the tokens' absolute positions; the cache then holds the keys
  and values the chunk needs, and nothing else changes.
- attention_conv K > 0: short causal convolutions (depthwise, SiLU, as Gated DeltaNet's) on q, k and v before the
  norms and RoPE, so a key carries the K - 1 tokens before it and one layer can look a value up by the key written
  before it (an induction step that otherwise needs two layers). Off (0) by default: the paper's SWA has none; the
  window study's pilots tried it on every attention layer (docs/study/what_was_tried.md item 15). The convolutions'
  states ride in the cache, so streaming stays exact; a window of W keys then reads W + K - 1 tokens back.
"""
from __future__ import annotations

import torch
import torch.nn as nn

from swax_lightning.kernels import sliding_window_attention
from swax_lightning.model.building_blocks import ShortConv, rope_rotate, short_convolved
from swax_lightning.model.cache import FullKVCache, WindowKVCache
from swax_lightning.model.config import ModelConfig


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig, sliding: bool):
        super().__init__()
        self.n_heads, self.n_kv_heads, self.head_dim = cfg.n_heads, cfg.kv_heads, cfg.attn_head_dim
        self.rope_theta, self.rope_scale, self.max_positions = cfg.rope_theta, cfg.rope_scale, cfg.max_positions
        if sliding and cfg.sliding_rope_theta is not None:  # Gemma 3's local layers: their own base, no scaling
            self.rope_theta, self.rope_scale = cfg.sliding_rope_theta, None
        self.sliding = sliding
        self.window: int | None = cfg.window if sliding else None
        self.n_sink = cfg.n_sink if sliding else 0
        self.kernel = cfg.kernels["attention"]
        add_projections(self, cfg)
        widths = (self.n_heads * self.head_dim, *2 * (self.n_kv_heads * self.head_dim,))
        self.convs = nn.ModuleList(ShortConv(w, cfg.attention_conv) for w in widths) if cfg.attention_conv else None

    def restrict_to_window(self, window: int, n_sink: int) -> None:
        """Attend to the `window` most recent keys plus the first `n_sink` from now on: only the mask changes (the
        RoPE base and the weights stay the ones this layer was built with), the training-free SWA conversion."""
        self.sliding, self.window, self.n_sink = True, int(window), int(n_sink)

    def new_cache(self, batch: int, dtype: torch.dtype, device) -> WindowKVCache | FullKVCache:
        conv = [conv.new_state(batch, dtype, device) for conv in self.convs] if self.convs else None
        if self.sliding:
            return WindowKVCache(batch, self.window, self.n_sink, self.n_kv_heads, self.head_dim, dtype, device, conv)
        return FullKVCache(batch, self.n_kv_heads, self.head_dim, dtype, device, conv)

    def forward(self, x: torch.Tensor, cache: WindowKVCache | FullKVCache | None = None,
                positions: torch.Tensor | None = None) -> torch.Tensor:
        """x [B, T, d]. Training: no cache, positions 0 .. T-1. Streaming: a cache and positions [B, T]."""
        B, T, _ = x.shape
        q, k, v = short_convolved(self.convs, [self.q_proj(x), self.k_proj(x), self.v_proj(x)], cache, positions)
        if positions is None:
            positions = torch.arange(T, device=x.device)
        q = self._rope(self.q_norm(q.view(B, T, self.n_heads, self.head_dim)), positions)
        k = self._rope(self.k_norm(k.view(B, T, self.n_kv_heads, self.head_dim)), positions)
        v = v.view(B, T, self.n_kv_heads, self.head_dim)
        if cache is None:
            out = sliding_window_attention(q, k, v, self.window, self.n_sink, kernel=self.kernel)
        else:
            out = cache.attend(q, k, v, positions)
        return self.out_proj(out.reshape(B, T, -1))

    def _rope(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        return rope_rotate(x, positions, self.rope_theta, self.rope_scale, self.max_positions)

    def extra_repr(self) -> str:
        conv = f", conv={self.convs[0].kernel}" if self.convs else ""
        return f"window={self.window}, n_sink={self.n_sink}, heads={self.n_heads}/{self.n_kv_heads}{conv}"


def add_projections(layer: nn.Module, cfg: ModelConfig) -> None:
    """An attention layer's q/k/v/o (GQA: n_kv_heads key/value heads) and optional per-head q/k RMSNorms, as the
    teacher's attention has them: Attention and the LoLCATs student (lolcats.py) share these names and shapes."""
    layer.q_proj = nn.Linear(cfg.d_model, layer.n_heads * layer.head_dim, bias=cfg.qkv_bias)
    layer.k_proj = nn.Linear(cfg.d_model, layer.n_kv_heads * layer.head_dim, bias=cfg.qkv_bias)
    layer.v_proj = nn.Linear(cfg.d_model, layer.n_kv_heads * layer.head_dim, bias=cfg.qkv_bias)
    layer.out_proj = nn.Linear(layer.n_heads * layer.head_dim, cfg.d_model, bias=False)
    if cfg.qk_norm:
        layer.q_norm = nn.RMSNorm(layer.head_dim, eps=cfg.norm_eps)
        layer.k_norm = nn.RMSNorm(layer.head_dim, eps=cfg.norm_eps)
    else:
        layer.q_norm = layer.k_norm = nn.Identity()
