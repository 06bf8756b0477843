"""LoRA: low-rank adapters on a model's linear layers, trained while every other weight stays frozen, then merged.

    y = W x + (alpha / rank) * B (A x)        A [rank, in] random, B [out, rank] = 0 at the start

Decisions:
- B starts at zero, so a model with fresh adapters computes exactly what it computed before (tested); A is drawn
  from a seeded generator (Kaiming-uniform, as the LoRA paper's reference code and peft do).
- The adapted layer is one linear map with the effective weight W + (alpha / rank) B A, exposed as `.weight`, so
  code that reads a layer's weight directly (the mLSTM's fp32 gates) sees the adapter too. Forming B A costs
  rank * in * out multiply-adds per call, nothing next to a sequence's matmul.
- `merge_lora` folds B A into W and puts the plain nn.Linear back: the model is an ordinary SWAXModel again, and its
  checkpoint loads wherever any other does (load_model, main.py test, generate, export).
- Our own module rather than peft: it is these few lines, and peft (which installs cleanly on CPU) requires
  transformers, which retrofitting a framework checkpoint otherwise never needs.
"""
from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F


class LoRALinear(nn.Module):
    """A frozen nn.Linear plus a trainable low-rank update."""

    def __init__(self, base: nn.Linear, rank: int, alpha: float, generator: torch.Generator):
        super().__init__()
        self.base, self.scale = base, alpha / rank
        weight = base.weight
        self.lora_a = nn.Parameter(torch.empty(rank, base.in_features, dtype=weight.dtype, device=weight.device))
        self.lora_b = nn.Parameter(torch.zeros(base.out_features, rank, dtype=weight.dtype, device=weight.device))
        bound = 1 / math.sqrt(base.in_features)  # kaiming_uniform_(a=sqrt(5)) of a [rank, in] matrix
        with torch.no_grad():
            self.lora_a.copy_(torch.rand(self.lora_a.shape, generator=generator) * 2 * bound - bound)

    @property
    def weight(self) -> torch.Tensor:
        """The effective weight W + scale * B A: layers that read `.weight` directly (the mLSTM's fp32 gates) see
        the adapted layer too."""
        return self.base.weight + (self.lora_b @ self.lora_a) * self.scale

    @property
    def bias(self) -> torch.Tensor | None:
        return self.base.bias

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight, self.bias)

    @torch.no_grad()
    def merged(self) -> nn.Linear:
        """The base layer with the update folded into its weight."""
        self.base.weight.copy_(self.weight)
        return self.base


def add_lora(root: nn.Module, rank: int, alpha: float, seed: int = 0) -> list[str]:
    """Freeze every parameter of `root` and put a LoRA adapter on each nn.Linear below it (in place); returns the
    adapted layers' names. Only the adapters train."""
    if rank < 1:
        raise ValueError(f"LoRA rank must be >= 1 (got {rank})")
    root.requires_grad_(False)
    generator = torch.Generator().manual_seed(seed)
    names = [name for name, module in root.named_modules() if isinstance(module, nn.Linear)]
    for name in names:
        parent, _, child = name.rpartition(".")
        owner = root.get_submodule(parent) if parent else root
        setattr(owner, child, LoRALinear(getattr(owner, child), rank, alpha, generator))
    return names


def merge_lora(root: nn.Module) -> int:
    """Fold every adapter below `root` into its layer (in place); returns how many there were."""
    names = [name for name, module in root.named_modules() if isinstance(module, LoRALinear)]
    for name in names:
        parent, _, child = name.rpartition(".")
        owner = root.get_submodule(parent) if parent else root
        setattr(owner, child, getattr(owner, child).merged())
    return len(names)
