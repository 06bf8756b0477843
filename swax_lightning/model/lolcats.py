"""LoLCATs linearised attention (pattern letter L; Zhang et al., arXiv 2410.10254): a softmax attention layer's
q/k/v/o, q/k norms and RoPE, plus a Hedgehog feature map for queries and one for keys and a learned window factor
per head. Each query combines softmax over a terraced window of recent keys with linear attention over every
earlier key (the formula and the window: kernels/lolcats/naive.py). The student of a retrofit
(pretrained/retrofit.py), built from the teacher's attention.

Facts taken from HazyResearch/lolcats at commit 375df84:
- Feature map (src/model/feature_map.py, FeatureMapMLP + SoftmaxDim; configs/model/distill_*_lk_smd_wtk64_fd64_w01
  .yaml: learned_kernel untied_head_einsum, feature_map softmax_dim, feature_dim 64, bias false, skip_connection
  false, eps 1e-12): per head a [head_dim, F] matrix, no bias; phi(x) = cat(softmax(x W), softmax(-x W)) over the
  features, clamped at 1e-12: 2 F features. Initialisation: ModelConfig.lolcats_feature_init (identity, from the
  README's --lk_zero_init, by default; or their config default, kaiming_uniform_ of the [H, D, F] tensor).
- Separate maps for q and k (tie_qk_kernels false), the key map a copy of the query map at the start
  (src/model/linear_attention/linear_attention.py, init_feature_map_: deepcopy). Both have one matrix per query
  head: the key map runs after the key heads are repeated (process_qkv: repeat_kv), so key features and the linear
  state are per query head. RoPE (and the q/k norms) come before the maps.
- Window factor (src/model/linear_attention/linear_window_attention_tk.py, __init__): a parameter [1, H, 1, 1], the
  softmax terms weighted by sigmoid of it, initialised to logit(0.1) = -2.1972245773362196 (init_window_factor in
  the configs), trained; the linear terms keep weight 1 (affine_attention_factors false in every config).
- Window 64 (window_size in the configs): ModelConfig.lolcats_window.
- Attention transfer trains the feature maps and the window factors only (src/model/load_model.py freezes every
  parameter before the attention is converted); LoRA then adapts q/k/v/o.

Decisions:
- Decode follows the training form exactly, unlike theirs: their generation
  (LinearAttentionTKWindowCache.update_for_decoding) keeps the 64 most recent keys in a plain sliding window, not
  the terrace (65 .. 128 keys) the layer was trained with. `LolcatsCache` keeps the linear state, the previous full
  block and the current partial one (at most 2 W - 1 keys and values), and folds a whole block into the state when
  it leaves the terrace: any chunking of a stream gives the full forward's outputs.
- Blocks start at each sequence's position 0. Their mask crops a block-aligned mask to the last T positions, which
  aligns the blocks to the end of the sequence when T is no multiple of the window; the two agree in their
  training regime (T = 1024, window 64), and start alignment is the one that is causal and decodable.
- Batched prompts of different lengths (left padding, negative positions) put the blocks of each sequence at
  different columns, so the cache keeps one state per sequence and serves each on its own real tokens; padded
  queries get zeros.
- Features, scores, states and normalisers in fp32 (the kernels switch autocast off); outputs in the values' dtype.
"""
from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.nn as nn

from swax_lightning.kernels import LinearState, lolcats_chunked, lolcats_one_block
from swax_lightning.kernels.lolcats.chunk import zero_state
from swax_lightning.kernels.lolcats.naive import repeat_kv
from swax_lightning.model.attention import add_projections
from swax_lightning.model.building_blocks import rope_rotate
from swax_lightning.model.config import ModelConfig

WINDOW_FACTOR_INIT = math.log(0.1 / 0.9)  # logit(0.1) = -2.1972245773362196, their init_window_factor
FEATURE_EPS = 1e-12  # their feature_map_kwargs.eps


class HedgehogFeatureMap(nn.Module):
    """phi(x) = cat(softmax(x W_h), softmax(-x W_h)) per head h, clamped at 1e-12: [B, T, H, D] -> [B, T, H, 2F]
    in fp32. `layer` [H, D, F] is their mlp.layer."""

    def __init__(self, n_heads: int, head_dim: int, feature_dim: int):
        super().__init__()
        self.layer = nn.Parameter(torch.empty(n_heads, head_dim, feature_dim))

    @torch.no_grad()
    def reset_parameters(self, init: str) -> None:
        if init == "identity":  # their zero_init with no skip connection: eye_ per head
            for matrix in self.layer:
                nn.init.eye_(matrix)
        else:  # "kaiming", their config default: on the 3-D tensor, so torch's fan_in is D * F
            nn.init.kaiming_uniform_(self.layer)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with torch.autocast(x.device.type, enabled=False):
            z = torch.einsum("bthd,hdf->bthf", x.float(), self.layer.float())
            return torch.cat([z.softmax(-1), (-z).softmax(-1)], -1).clamp(min=FEATURE_EPS)


class _SequenceState:
    """One sequence's decode state after n tokens: the linear state of positions < s0 and the keys/values of
    positions s0 .. n-1, s0 = max(0, (n // W - 1) * W), the start of the previous block (at most 2 W - 1 tokens)."""

    def __init__(self, window: int, state: LinearState, k: torch.Tensor, v: torch.Tensor):
        self.window, self.state, self.k, self.v, self.n = window, state, k, v, 0

    def attend(self, q, k, v, phi_q, window_factor, key_features: Callable) -> torch.Tensor:
        """Outputs of the C new tokens at positions n .. n+C-1 (q, phi_q [1, C, H, *], k, v [1, C, Hkv, D])."""
        C, W = q.shape[1], self.window
        keys, values = torch.cat([self.k, k.to(self.k.dtype)], 1), torch.cat([self.v, v.to(self.v.dtype)], 1)
        if (self.n + C) // W == self.n // W:  # inside one block, which it does not complete: nothing is folded
            y = lolcats_one_block(q, keys, values, phi_q, window_factor, self.state)
        else:  # the block form from the cache's start, a block boundary; its queries at cached positions dropped
            cached = keys.shape[1] - C
            y, self.state = lolcats_chunked(_left_zeros(q, cached), keys, values, _left_zeros(phi_q, cached),
                                            key_features(keys), window_factor, W, self.state)
            y = y[:, cached:]
            kept = self.n + C - max(0, ((self.n + C) // W - 1) * W)
            keys, values = keys[:, keys.shape[1] - kept:], values[:, values.shape[1] - kept:]
        self.k, self.v, self.n = keys, values, self.n + C
        return y

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (*self.state, self.k, self.v))


def _left_zeros(x: torch.Tensor, n: int) -> torch.Tensor:
    return torch.cat([x.new_zeros(x.shape[0], n, *x.shape[2:]), x], 1)


class LolcatsCache:
    """Decode state of one L layer, per sequence of the batch (see the module docstring); bounded in the context."""

    def __init__(self, sequences: list[_SequenceState], key_features: Callable):
        self.sequences, self.key_features = sequences, key_features

    def attend(self, q, k, v, phi_q, positions: torch.Tensor, window_factor) -> torch.Tensor:
        """q, phi_q [B, C, H, *], k, v [B, C, Hkv, D] at positions [B, C] (negative = left padding)."""
        y = q.new_zeros(*q.shape[:3], v.shape[-1]).to(v.dtype)
        for b, sequence in enumerate(self.sequences):
            real = positions[b] >= 0
            if not real.any():
                continue
            expected = sequence.n + torch.arange(int(real.sum()), device=positions.device)
            if not torch.equal(positions[b, real], expected):
                raise ValueError(f"LoLCATs decode: sequence {b} continues at position {sequence.n}, got positions "
                                 f"{positions[b, real].tolist()[:4]}...: a stream goes on where it stopped")
            y[b, real] = sequence.attend(q[b:b + 1, real], k[b:b + 1, real], v[b:b + 1, real],
                                         phi_q[b:b + 1, real], window_factor, self.key_features)[0]
        return y

    def nbytes(self) -> int:
        return sum(sequence.nbytes() for sequence in self.sequences)


class LolcatsAttention(nn.Module):
    """x [B, T, d_model] -> [B, T, d_model]; q_proj, k_proj, v_proj, out_proj, q_norm, k_norm as in Attention (so a
    retrofit copies them and LoRA adapts them), feature_map_q, feature_map_k and window_factors its own."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.n_heads, self.n_kv_heads, self.head_dim = cfg.n_heads, cfg.kv_heads, cfg.attn_head_dim
        self.rope_theta, self.rope_scale, self.max_positions = cfg.rope_theta, cfg.rope_scale, cfg.max_positions
        self.window, self.feature_init = cfg.lolcats_window, cfg.lolcats_feature_init
        add_projections(self, cfg)
        self.feature_map_q = HedgehogFeatureMap(self.n_heads, self.head_dim, cfg.lolcats_feature_dim)
        self.feature_map_k = HedgehogFeatureMap(self.n_heads, self.head_dim, cfg.lolcats_feature_dim)
        self.window_factors = nn.Parameter(torch.empty(1, self.n_heads, 1, 1))
        self.reset_own_parameters()

    @torch.no_grad()
    def reset_own_parameters(self) -> None:
        self.feature_map_q.reset_parameters(self.feature_init)
        self.feature_map_k.layer.copy_(self.feature_map_q.layer)  # their deepcopy: separate maps, same start
        self.window_factors.fill_(WINDOW_FACTOR_INIT)

    def window_factor(self) -> torch.Tensor:
        """w = sigmoid(window_factors), [H], fp32."""
        return torch.sigmoid(self.window_factors.float()).view(self.n_heads)

    def _rope(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        return rope_rotate(x, positions, self.rope_theta, self.rope_scale, self.max_positions)

    def _qkv(self, x: torch.Tensor, positions: torch.Tensor):
        """The teacher's q, k (norm, then RoPE at absolute positions) and v; k and v keep the key/value heads."""
        B, T, _ = x.shape
        q = self._rope(self.q_norm(self.q_proj(x).view(B, T, self.n_heads, self.head_dim)), positions)
        k = self._rope(self.k_norm(self.k_proj(x).view(B, T, self.n_kv_heads, self.head_dim)), positions)
        return q, k, self.v_proj(x).view(B, T, self.n_kv_heads, self.head_dim)

    def _key_features(self, k: torch.Tensor) -> torch.Tensor:
        """[B, T, Hkv, D] -> [B, T, H, 2F]: one key map per query head, after the key heads are repeated."""
        return self.feature_map_k(repeat_kv(k, self.n_heads))

    def new_cache(self, batch: int, dtype: torch.dtype, device) -> LolcatsCache:
        features = 2 * self.feature_map_q.layer.shape[-1]
        empty = (1, 0, self.n_kv_heads, self.head_dim)
        return LolcatsCache([_SequenceState(self.window, zero_state(1, self.n_heads, features, self.head_dim, device),
                                            torch.zeros(empty, dtype=dtype, device=device),
                                            torch.zeros(empty, dtype=dtype, device=device))
                             for _ in range(batch)], self._key_features)

    def forward(self, x: torch.Tensor, cache: LolcatsCache | None = None,
                positions: torch.Tensor | None = None) -> torch.Tensor:
        """x [B, T, d]. Training: no cache, positions 0 .. T-1. Streaming: a cache and positions [B, T]."""
        B, T, _ = x.shape
        if positions is None:
            positions = torch.arange(T, device=x.device)
        q, k, v = self._qkv(x, positions)
        phi_q = self.feature_map_q(q)
        if cache is None:
            y, _ = lolcats_chunked(q, k, v, phi_q, self._key_features(k), self.window_factor(), self.window)
        else:
            y = cache.attend(q, k, v, phi_q, positions, self.window_factor())
        return self.out_proj(y.reshape(B, T, -1))

    def extra_repr(self) -> str:
        return f"window={self.window}, heads={self.n_heads}/{self.n_kv_heads}"
