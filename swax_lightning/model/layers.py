"""The table of layer letters: one entry per letter of ModelConfig.pattern, read by everything that depends on the
kind of a layer, so that a new kind is one `register(LayerKind(...))` (docs/extending.md).

Who reads an entry:
- ModelConfig checks a pattern's letters against the table, and checks the backend of each kernel operation the
  pattern's kinds use (`kernel`: the ModelConfig.kernels entry, "attention", "mlstm" or "deltanet") and no other.
- SWAXModel builds each block's mixer with `build_mixer` (the entry's `mixer`, called with the config).
- The FLOPs estimate (training/throughput.py) adds each layer's `mixing_flops` to the projections' 2 x params.
- The memory estimate (commands/memory.py) needs nothing per letter: it traces the model and swaps in the GPU
  kernels' saved sets per kernel operation.

Decisions:
- `mixer` is "module:callable" (imported when a model is built, so that this table imports no layer and the config
  that every layer imports can read it without a cycle) or the callable itself (a toy or out-of-tree layer).
- The FLOPs functions take the config and a sequence length and count forward FLOPs of the mixing alone (the
  attention scores and weighted sums over the visible pairs; the chunkwise recurrence of the recurrent kinds).
"""
from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass, field


@dataclass(frozen=True)
class LayerKind:
    """One pattern letter.

    Args:
        letter: The letter in ModelConfig.pattern.
        name: What it is, for messages and docs.
        mixer: The mixer's constructor, (cfg) -> nn.Module with forward(x, cache=None, positions=None) and
            new_cache(batch, dtype, device), and optionally reset_own_parameters() (its own initialisation, run
            after SWAXModel's generic one, which draws every Linear and zeroes every bias): "module:callable", or
            the callable.
        kernel: The ModelConfig.kernels operation its layers run (None: none of them; a tuple: several).
        mixing_flops: (cfg, seq_len, window) -> forward FLOPs of one sequence's mixing beyond the projections.
        options: Keyword arguments given to `mixer` after the config.
    """

    letter: str
    name: str
    mixer: str | Callable
    kernel: str | tuple[str, ...] | None
    mixing_flops: Callable[..., int]
    options: dict = field(default_factory=dict)


LAYERS: dict[str, LayerKind] = {}


def register(kind: LayerKind) -> LayerKind:
    if len(kind.letter) != 1 or not kind.letter.isupper():
        raise ValueError(f"a layer letter is one capital letter (got {kind.letter!r})")
    LAYERS[kind.letter] = kind
    return kind


def build_mixer(letter: str, cfg):
    kind = LAYERS[letter]
    make = kind.mixer
    if isinstance(make, str):
        module, _, name = make.partition(":")
        make = getattr(importlib.import_module(module), name)
    return make(cfg, **kind.options)


def kernels_used(pattern: str) -> set[str]:
    """The kernel operations the layers of `pattern` run."""
    used = set()
    for letter in set(pattern):
        kernel = LAYERS[letter].kernel
        used |= set(kernel) if isinstance(kernel, tuple) else {kernel}
    return used - {None}


# ---- FLOPs of the mixing ------------------------------------------------------------------------------------------
def visible_pairs(T: int, window: int | None, n_sink: int) -> int:
    """(query, key) pairs of causal attention over T tokens with window W and n_sink sinks."""
    if window is None or window >= T:
        return T * (T + 1) // 2
    W = window
    in_window = W * (W + 1) // 2 + (T - W) * W  # query t sees min(t + 1, W) keys in its window
    n_sink = min(n_sink, T)
    extra_sinks = sum(min(n_sink, t - W + 1) for t in range(W, min(T, W + n_sink))) + max(0, T - W - n_sink) * n_sink
    return in_window + extra_sinks


def sliding_attention_flops(cfg, seq_len: int, window: int) -> int:
    return 4 * cfg.attn_head_dim * cfg.n_heads * visible_pairs(seq_len, window, cfg.n_sink)


def full_attention_flops(cfg, seq_len: int, window: int) -> int:
    return 4 * cfg.attn_head_dim * cfg.n_heads * visible_pairs(seq_len, None, 0)


def chunkwise_recurrence_flops(heads: int, qk_factor: float, v_factor: float, cfg, seq_len: int) -> int:
    """A chunkwise linear recurrence: the intra-chunk products (chunk x (dqk + dv) per token) and the state update
    and read-out (4 dqk dv per token), per head."""
    dqk, dv = int(qk_factor * cfg.d_model) // heads, int(v_factor * cfg.d_model) // heads
    return heads * seq_len * (2 * cfg.chunk_size * (dqk + dv) + 4 * dqk * dv)


def mlstm_flops(cfg, seq_len: int, window: int) -> int:
    return chunkwise_recurrence_flops(cfg.mlstm_heads, cfg.mlstm_qk_factor, cfg.mlstm_v_factor, cfg, seq_len)


def deltanet_flops(cfg, seq_len: int, window: int) -> int:
    return chunkwise_recurrence_flops(cfg.deltanet_heads, cfg.deltanet_qk_factor, cfg.deltanet_v_factor, cfg, seq_len)


def terraced_pairs(T: int, window: int) -> int:
    """(query, key) softmax pairs of LoLCATs' terraced window over T tokens: query t sees t % W + 1 keys of its own
    block and, from the second block on, the W keys of the previous one."""
    full, rest = divmod(T, window)
    return full * window * (window + 1) // 2 + rest * (rest + 1) // 2 + window * max(0, T - window)


def lolcats_flops(cfg, seq_len: int, window: int) -> int:
    """Per head: the softmax pairs (scores and weighted values, 4 D each), and per token the two feature maps
    (2 D F each: 3-D weights, so not in the projections' 2 x params) and the linear state's update and read-out
    (phi_k v^T and phi_q S over 2F features and D values plus the normaliser: 2 x 2 x 2F (D + 1))."""
    D, F = cfg.attn_head_dim, cfg.lolcats_feature_dim
    per_token = 4 * D * F + 8 * F * (D + 1)
    return cfg.n_heads * (4 * D * terraced_pairs(seq_len, cfg.lolcats_window) + seq_len * per_token)


def window_plus(linear_flops: Callable[..., int]) -> Callable[..., int]:
    """The FLOPs of a window + linear layer (window_linear.py): a sliding window of lolcats_window keys, no sinks,
    plus the linear part."""
    def flops(cfg, seq_len: int, window: int) -> int:
        pairs = visible_pairs(seq_len, cfg.lolcats_window, 0)
        return 4 * cfg.attn_head_dim * cfg.n_heads * pairs + linear_flops(cfg, seq_len, window)
    return flops


register(LayerKind("S", "sliding-window attention", "swax_lightning.model.attention:Attention", "attention",
                   sliding_attention_flops, {"sliding": True}))
register(LayerKind("A", "full causal attention", "swax_lightning.model.attention:Attention", "attention",
                   full_attention_flops, {"sliding": False}))
register(LayerKind("X", "mLSTM", "swax_lightning.model.mlstm:MLSTMLayer", "mlstm", mlstm_flops))
register(LayerKind("D", "Gated DeltaNet", "swax_lightning.model.deltanet:GatedDeltaNetLayer", "deltanet",
                   deltanet_flops))
register(LayerKind("L", "LoLCATs linear attention + softmax window", "swax_lightning.model.lolcats:LolcatsAttention",
                   None, lolcats_flops))
register(LayerKind("G", "softmax window + Gated DeltaNet", "swax_lightning.model.window_linear:WindowPlusLinear",
                   ("attention", "deltanet"), window_plus(deltanet_flops), {"linear": "D"}))
register(LayerKind("M", "softmax window + mLSTM", "swax_lightning.model.window_linear:WindowPlusLinear",
                   ("attention", "mlstm"), window_plus(mlstm_flops), {"linear": "X"}))
