"""Inference state per layer: what a streaming model keeps between prefill chunks and decode steps.

- WindowKVCache (S layers): a ring buffer of the last W keys/values plus the first n_sink keys/values (sink tokens),
  so its size never grows with the context. Keys are stored after RoPE, at their absolute positions.
- FullKVCache (A layers, baselines): every key/value so far; it grows with the context, by design.
- RecurrentCache (X and D layers): the recurrent state in fp32, a fixed size: (C, n, m) for the mLSTM, S for Gated
  DeltaNet.
- Every cache also carries its layer's short-convolution states (`conv`: [B, kernel-1, channels] each) when the layer
  has them (Gated DeltaNet's deltanet_conv, attention's attention_conv); None otherwise.

Decisions:
- A chunk of new tokens attends to [sinks | cached keys | its own keys] with a mask computed from absolute positions,
  so prefill chunks of any length and single decode steps go through the same exact attention rule as training
  (query t sees keys t-W+1 .. t and keys 0 .. n_sink-1). A window cache takes a long chunk in blocks of
  max(W, 256) queries, so a prefill costs O(T * (W + n_sink + block)); the full cache costs O(chunk * context).
- Batched prompts of different lengths are left-padded; padded tokens have negative positions, are never visible as
  keys, and (mLSTM) leave the state unchanged. A padded query sees only itself, which keeps its output finite.
- Ring slots are overwritten at position % W; attention is order-free, so slots need no reordering.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

# Queries per attention call when a chunk is long (a window cache's block is at least its window). A 4k-token
# prompt of SmolLM2 in 2,048-token chunks, 2 threads: SWA(64, 4) 17.2 s attended whole (2,048 x 2,116 masked scores
# per layer and chunk), 10.1 s in blocks of 256; full attention 21.1 s and 17.2 s (docs/pretrained.md, "Time").
BLOCK = 256


def _attend(q, k, v, q_pos, k_pos, window: int | None, n_sink: int = 0):
    """SDPA of the L new queries q [B, L, Hq, D] over keys k, v [B, N, Hkv, D] whose last L are the new tokens'.
    Visibility from absolute positions q_pos [B, L], k_pos [B, N] (negative = empty slot or padding):
    - the first n_sink columns are sink slots (already stored sinks): visible only outside the window, where the
      ring no longer holds them;
    - the other columns: visible inside the window, and new keys at positions < n_sink (sinks not stored yet) always;
    - each query sees its own key, so a padded query has one visible key and a finite output."""
    L, N = q.shape[1], k.shape[1]
    t, s = q_pos[:, :, None], k_pos[:, None, :]
    visible = (s >= 0) & (s <= t)
    if window is not None:
        in_window = t - s < window
        column = torch.arange(N, device=q.device)
        is_sink_slot, is_new = column < n_sink, column >= N - L
        visible &= torch.where(is_sink_slot, ~in_window, in_window | (is_new & (s < n_sink)))
    visible[:, torch.arange(L, device=q.device), N - L + torch.arange(L, device=q.device)] = True
    out = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                         attn_mask=visible[:, None], enable_gqa=q.shape[2] != k.shape[2])
    return out.transpose(1, 2)


def _in_blocks(attend_block, block: int, q, k, v, positions) -> torch.Tensor:
    """attend_block on consecutive blocks of at most `block` new tokens, in order (each block sees the cache as the
    blocks before it left it, as a stream of short chunks would), outputs concatenated."""
    return torch.cat([attend_block(q[:, i:i + block], k[:, i:i + block], v[:, i:i + block], positions[:, i:i + block])
                      for i in range(0, q.shape[1], block)], 1)


class WindowKVCache:
    """Last `window` keys/values (a ring) plus the first `n_sink` (sinks), per sequence of the batch."""

    def __init__(self, batch: int, window: int, n_sink: int, kv_heads: int, head_dim: int, dtype, device,
                 conv: list | None = None):
        self.window, self.n_sink, self.conv = window, n_sink, conv
        shape = (batch, window, kv_heads, head_dim)
        self.k, self.v = torch.zeros(shape, dtype=dtype, device=device), torch.zeros(shape, dtype=dtype, device=device)
        self.pos = torch.full((batch, window), -1, dtype=torch.long, device=device)
        sink_shape = (batch, n_sink, kv_heads, head_dim)
        self.sink_k = torch.zeros(sink_shape, dtype=dtype, device=device)
        self.sink_v = torch.zeros(sink_shape, dtype=dtype, device=device)
        self.sink_pos = torch.full((batch, n_sink), -1, dtype=torch.long, device=device)

    def attend(self, q, k, v, positions) -> torch.Tensor:
        """A long chunk goes in blocks of max(W, BLOCK) queries, each attending to [sinks | ring | its own block]
        and then written, exactly as a stream of shorter chunks: O(chunk * (W + block)) instead of O(chunk^2)."""
        return _in_blocks(self._attend_block, max(self.window, BLOCK), q, k, v, positions)

    def _attend_block(self, q, k, v, positions) -> torch.Tensor:
        keys = torch.cat([self.sink_k, self.k, k], 1)
        values = torch.cat([self.sink_v, self.v, v], 1)
        k_pos = torch.cat([self.sink_pos, self.pos, positions], 1)
        out = _attend(q, keys, values, positions, k_pos, self.window, self.n_sink)
        self._write(k, v, positions)
        return out

    def _write(self, k, v, positions) -> None:
        for s in range(self.n_sink):  # sink tokens are kept for good
            b, i = (positions == s).nonzero(as_tuple=True)
            self.sink_k[b, s], self.sink_v[b, s], self.sink_pos[b, s] = k[b, i], v[b, i], s
        # Only the last W new tokens can be seen by later queries.
        k, v, positions = k[:, -self.window:], v[:, -self.window:], positions[:, -self.window:]
        slots = positions.clamp(min=0) % self.window
        for b in range(k.shape[0]):
            real = positions[b] >= 0
            self.k[b, slots[b, real]], self.v[b, slots[b, real]] = k[b, real], v[b, real]
            self.pos[b, slots[b, real]] = positions[b, real]

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.k, self.v, self.sink_k, self.sink_v, *(self.conv or ())))


class FullKVCache:
    """Every key/value so far (full causal attention); grows with the context."""

    def __init__(self, batch: int, kv_heads: int, head_dim: int, dtype, device, conv: list | None = None):
        self.conv = conv
        self.k = torch.zeros(batch, 0, kv_heads, head_dim, dtype=dtype, device=device)
        self.v = torch.zeros_like(self.k)
        self.pos = torch.zeros(batch, 0, dtype=torch.long, device=device)

    def attend(self, q, k, v, positions) -> torch.Tensor:
        """In blocks of BLOCK queries, each over the keys up to its own last: a causal chunk's masked half of the
        scores is mostly skipped (a chunk attended whole computes every [chunk x context] score)."""
        return _in_blocks(self._attend_block, BLOCK, q, k, v, positions)

    def _attend_block(self, q, k, v, positions) -> torch.Tensor:
        self.k, self.v = torch.cat([self.k, k], 1), torch.cat([self.v, v], 1)
        self.pos = torch.cat([self.pos, positions], 1)
        return _attend(q, self.k, self.v, positions, self.pos, None)

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.k, self.v, *(self.conv or ())))


class RecurrentCache:
    """A recurrent layer's state (a tensor or a tuple of tensors), carried across chunks and steps, and the states of
    its short convolutions if it has any (a list of [B, kernel-1, channels] tensors)."""

    def __init__(self, state, conv: list | None = None):
        self.state, self.conv = state, conv

    def nbytes(self) -> int:
        tensors = (*(self.state if isinstance(self.state, tuple) else (self.state,)), *(self.conv or ()))
        return sum(t.numel() * t.element_size() for t in tensors)
