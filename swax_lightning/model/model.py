"""SWAXModel: token embedding, pre-norm residual blocks in pattern order, final norm, LM head.

    block(x) = x + mixer(RMSNorm(x));  x + SwiGLU(RMSNorm(x))
    mixer = Attention (S, A), MLSTMLayer (X), GatedDeltaNetLayer (D) or LolcatsAttention (L)

An imported Gemma adds an RMSNorm on each branch's output (post_norms: x + RMSNorm(mixer(RMSNorm(x)))), GeGLU for
SwiGLU (ffn_activation) and embeddings times sqrt(d_model) (embed_scale); nothing else changes.

Decisions:
- One block class for every layer kind; only the mixer differs, built from the pattern letter's entry in the
  table of layer letters (layers.py).
- Plain single-device PyTorch (torchtitan's rule): no distribution, logging or kernel choice in here. Sharding wraps
  `model.blocks` from outside; kernels are picked in kernels/.
- `set_window(w)` changes the window of every sliding-window layer at once (one window per step, docs/design.md
  section 1); `set_sinks(n)` their sink count (an inference-time override). A window larger than the positions a
  pretrained model was trained on (ModelConfig.max_positions) is refused.
- Training-free SWA with sinks (`convert_full_attention`) takes the window in either convention (`swa_window`): w
  recent keys plus s sinks (this framework's), or w keys in all with the s sinks among them.
- The same forward serves streaming inference when given per-block caches and positions (swax_lightning/model/cache.py,
  swax_lightning/model/inference.py).
- Logits are soft-capped (xLSTM-7B) and returned in fp32 (fp64 for an fp64 model) for a stable cross-entropy.
  Given targets, forward returns the training loss instead, from the chunked cross-entropy (no full logits).
"""
from __future__ import annotations

import math
import zlib

import torch
import torch.nn as nn

from swax_lightning.core.errors import ConfigError
from swax_lightning.kernels.ce.chunked import softcap_cross_entropy_chunked
from swax_lightning.kernels.util import fp32, soft_cap
from swax_lightning.model.attention import Attention
from swax_lightning.model.building_blocks import GatedFFN, MultiHeadLayerNorm, MultiHeadRMSNorm, ShortConv
from swax_lightning.model.config import ModelConfig
from swax_lightning.model.layers import build_mixer


def swa_window(window: int, n_sink: int, window_includes_sinks: bool = False) -> int:
    """The window W the layers use (recent keys, the current token included; the n_sink sinks come on top) for
    SWA(window, n_sink) in either convention: window_includes_sinks False: window recent keys plus the sinks (W =
    window); True: window keys in all, the sinks among them (W = window - n_sink, which must be >= 1). Both see the
    same keys once the sinks have left the window; before that every earlier key."""
    if n_sink < 0:
        raise ConfigError(f"n_sink must be >= 0 (got {n_sink})")
    if not window_includes_sinks:
        return window
    if window <= n_sink:
        raise ConfigError(f"window {window} counted with its {n_sink} sinks (window_includes_sinks) leaves no recent "
                          f"key: give a window > n_sink")
    return window - n_sink


def check_window(cfg: ModelConfig, window: int) -> None:
    """A window must be >= 1 and, for a pretrained model, within the positions it was trained on (max_positions)."""
    if window < 1:
        raise ConfigError(f"window must be >= 1 (got {window})")
    if cfg.max_positions is not None and window > cfg.max_positions:
        raise ConfigError(f"window {window} is larger than the {cfg.max_positions} positions the model was trained "
                          f"on (ModelConfig.max_positions): give a window <= {cfg.max_positions}")


class Block(nn.Module):
    def __init__(self, kind: str, cfg: ModelConfig):
        super().__init__()
        self.kind = kind
        self.mixer_norm = nn.RMSNorm(cfg.d_model, eps=cfg.norm_eps)
        self.mixer = build_mixer(kind, cfg)
        self.ffn_norm = nn.RMSNorm(cfg.d_model, eps=cfg.norm_eps)
        self.ffn = GatedFFN(cfg.d_model, cfg.ffn_width, cfg.ffn_activation)
        if cfg.post_norms:
            self.mixer_post_norm = nn.RMSNorm(cfg.d_model, eps=cfg.norm_eps)
            self.ffn_post_norm = nn.RMSNorm(cfg.d_model, eps=cfg.norm_eps)
        else:
            self.mixer_post_norm = self.ffn_post_norm = nn.Identity()

    def forward(self, x: torch.Tensor, cache=None, positions: torch.Tensor | None = None) -> torch.Tensor:
        x = x + self.mixer_post_norm(self.mixer(self.mixer_norm(x), cache, positions))
        return x + self.ffn_post_norm(self.ffn(self.ffn_norm(x)))


class SWAXModel(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        self.embed = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.blocks = nn.ModuleList(Block(kind, cfg) for kind in cfg.layer_kinds)
        self.norm = nn.RMSNorm(cfg.d_model, eps=cfg.norm_eps)
        self.lm_head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        if cfg.tie_embeddings:
            self.lm_head.weight = self.embed.weight
        if not self.embed.weight.is_meta:  # a model built on the meta device is initialised as it is materialised
            self.reset_parameters()

    @torch.no_grad()
    def reset_parameters(self, seed: int | None = None) -> None:
        """(Re)initialise every weight from `seed` (default: drawn from torch's global RNG); see init_weights."""
        self.init_weights(self, int(torch.randint(0, 2**62, (), device="cpu")) if seed is None else seed)

    @torch.no_grad()
    def init_weights(self, root: nn.Module, seed: int) -> None:
        """Initialise the weights under `root` (the model or one of its parts): normal(init_std), residual output
        projections scaled by 1/sqrt(2 n_layers), zero biases, xLSTM gate biases, ones for norms, short convolutions
        uniform in +-1/sqrt(kernel).

        Each weight draws from its own generator, seeded by (seed, its name in the model): the result does not depend
        on the order in which parts are initialised, so sharded training, which materialises the model part by part
        (swax_lightning/training/parallel.py), starts from exactly the weights of a 1-process run with the same seed."""
        std = self.cfg.init_std
        out_std = std / math.sqrt(2 * self.cfg.n_layers)
        prefix = next(name for name, module in self.named_modules() if module is root)
        for name, module in root.named_modules(prefix=prefix):
            if isinstance(module, nn.Embedding) and self.cfg.tie_embeddings:
                continue  # the head's weight: drawn under the head's name
            if isinstance(module, (nn.Linear, nn.Embedding)):
                is_out = name.endswith(("out_proj", "ffn.down"))
                generator = _generator(seed, f"{name}.weight", module.weight.device)
                nn.init.normal_(module.weight, std=out_std if is_out else std, generator=generator)
                if getattr(module, "bias", None) is not None:
                    nn.init.zeros_(module.bias)
            elif isinstance(module, (nn.RMSNorm, MultiHeadRMSNorm, MultiHeadLayerNorm)):
                nn.init.ones_(module.weight)
            elif isinstance(module, ShortConv):  # torch's Conv1d default for a depthwise kernel: fan-in = kernel
                bound = module.kernel ** -0.5
                nn.init.uniform_(module.weight, -bound, bound,
                                 generator=_generator(seed, f"{name}.weight", module.weight.device))
        for module in root.modules():  # after the generic pass, which zeroes every bias
            if hasattr(module, "reset_own_parameters"):  # a layer's own init (gate biases, decay): layers.py
                module.reset_own_parameters()

    def embed_tokens(self, idx: torch.Tensor) -> torch.Tensor:
        """The first block's input: token embeddings times cfg.embed_scale (1 but for an imported Gemma)."""
        x = self.embed(idx)
        return x if self.cfg.embed_scale == 1.0 else x * self.cfg.embed_scale

    def attention_layers(self, sliding: bool | None = None) -> list[Attention]:
        """The attention mixers: all, or only the sliding-window (True) or full-attention (False) ones."""
        return [b.mixer for b in self.blocks
                if isinstance(b.mixer, Attention) and (sliding is None or b.mixer.sliding == sliding)]

    def set_window(self, window: int) -> None:
        """Window of every sliding-window layer, in recent keys (full-attention and recurrent layers are
        unaffected)."""
        check_window(self.cfg, window)
        for layer in self.attention_layers(sliding=True):
            layer.window = int(window)

    @property
    def window(self) -> int | None:
        """The current window of the sliding-window layers (None when the model has none)."""
        return next((layer.window for layer in self.attention_layers(sliding=True)), None)

    @property
    def n_sink(self) -> int:
        """The current sink count of the sliding-window layers (0 when the model has none)."""
        return next((layer.n_sink for layer in self.attention_layers(sliding=True)), 0)

    def attention_windows(self) -> dict[str, int]:
        """How many attention layers see which keys: {"full": n, "<W>+<sinks>": n} (W recent keys, the current
        token included, plus the sinks): one entry for a SWAX model, two for a Gemma 3 whose global layers were
        converted to SWA while its local layers keep theirs."""
        counts: dict[str, int] = {}
        for layer in self.attention_layers():
            key = f"{layer.window}+{layer.n_sink}" if layer.sliding else "full"
            counts[key] = counts.get(key, 0) + 1
        return counts

    def num_params(self, exclude_embedding: bool = False) -> int:
        n = sum(p.numel() for p in self.parameters())
        return n - self.embed.weight.numel() if exclude_embedding and not self.cfg.tie_embeddings else n

    def set_sinks(self, n_sink: int) -> None:
        """Sink-token count of every sliding-window layer (an inference-time override)."""
        if n_sink < 0:
            raise ConfigError(f"n_sink must be >= 0 (got {n_sink})")
        for layer in self.attention_layers(sliding=True):
            layer.n_sink = int(n_sink)

    def convert_full_attention(self, window: int, n_sink: int, window_includes_sinks: bool = False) -> None:
        """Turn every full-attention layer (A) into sliding-window attention with sinks, SWA(window, n_sink): the
        training-free conversion of arXiv 2608.28444 (the mask changes; weights and RoPE positions stay the ones the
        model was trained with). window_includes_sinks: the convention of `window` (swa_window). With a window >= T
        it is exactly full attention."""
        check_window(self.cfg, window)
        recent = swa_window(window, n_sink, window_includes_sinks)
        for layer in self.attention_layers(sliding=False):
            layer.restrict_to_window(recent, n_sink)

    def new_caches(self, batch: int, dtype: torch.dtype = torch.float32, device=None) -> list:
        """Empty inference state, one per block, for the current window and sink settings."""
        device = device or self.embed.weight.device
        return [block.mixer.new_cache(batch, dtype, device) for block in self.blocks]

    def forward(self, idx: torch.Tensor, caches: list | None = None, positions: torch.Tensor | None = None,
                targets: torch.Tensor | None = None, last_only: bool = False,
                logits_at: torch.Tensor | None = None) -> torch.Tensor:
        """idx [B, T] token ids -> logits [B, T, vocab] in fp32. Streaming: per-block caches (new_caches) and the
        tokens' absolute positions [B, T] (negative for left padding); the caches are updated in place.
        targets [B, T]: returns instead the mean next-token loss, computed by the chunked soft-capped cross-entropy
        (kernels/ce/chunked.py) so the [B, T, vocab] logits never exist; it runs here, inside the model's forward,
        so a sharded LM head is gathered for it. last_only: the logits of the last position only, [B, 1, vocab] (a
        prefill chunk needs no others; the LM head is a fifth of a small model's work per token). logits_at [B, T]
        bool: the logits of those positions only, [n, vocab] in row-major order (a scorer's: a multiple-choice item
        needs its answer's few tokens, not the logits of its whole context; Gemma 3's head is about 60% of its work
        per token)."""
        x = self.embed_tokens(idx)
        for i, block in enumerate(self.blocks):
            x = block(x, None if caches is None else caches[i], positions)
        if targets is not None:
            h = self.norm(x)
            return softcap_cross_entropy_chunked(h.reshape(-1, h.shape[-1]), self.lm_head.weight,
                                                 targets.reshape(-1), self.cfg.logit_soft_cap)
        if last_only:
            x = x[:, -1:]
        elif logits_at is not None:
            x = x[logits_at]
        return soft_cap(fp32(self.lm_head(self.norm(x))), self.cfg.logit_soft_cap)


def _generator(seed: int, name: str, device: torch.device) -> torch.Generator:
    """A generator for one named weight: crc32 (not Python's salted hash) keeps the seed equal in every process."""
    return torch.Generator(device=device).manual_seed((seed * 1_000_003 + zlib.crc32(name.encode())) % 2**63)
