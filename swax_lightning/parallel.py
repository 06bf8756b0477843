"""Training-time wrapping of a SWAXModel: activation checkpointing, torch.compile, FSDP2 sharding.

Kept outside the model (torchtitan's rule: model code stays single-device). LanguageModule.configure_model calls
`prepare_model`, under Lightning's ModelParallelStrategy for sharding (docs/design.md section 7) or under any
other strategy (single device, DDP) for the first two.

Decisions:
- Order per block, as torchtitan: activation checkpointing, then compile, then fully_shard; the root is sharded last
  (embedding, final norm, head), so each block's parameters are gathered just in time and freed after use.
- Sharded models are built on the meta device and materialised block by block: one block at a time is allocated in
  full on each rank, initialised with the model's own init (same seed on every rank, hence identical weights), then
  sharded. Peak memory is one block, not the whole model, so a 7B model never exists unsharded.
- Gradient clipping needs nothing special: FSDP2 parameters are DTensors, and torch.nn.utils.clip_grad_norm_ (what
  the Trainer's gradient_clip_val calls) computes the global norm over all shards (tests/test_distributed.py).
"""
from __future__ import annotations

import torch
import torch.nn as nn
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper

from swax_lightning.config import ModelConfig
from swax_lightning.model import SWAXModel


def wrap_blocks(model: SWAXModel, activation_checkpointing: bool, compile_blocks: bool) -> None:
    for i, block in enumerate(model.blocks):
        if activation_checkpointing:
            block = checkpoint_wrapper(block)
        if compile_blocks:
            block.compile()
        model.blocks[i] = block


def build_sharded(cfg: ModelConfig, mesh, device: torch.device, activation_checkpointing: bool = False,
                  compile_blocks: bool = False) -> SWAXModel:
    """A SWAXModel sharded with FSDP2 over `mesh`, materialised on `device` block by block."""
    from torch.distributed.fsdp import fully_shard

    with torch.device("meta"):
        model = SWAXModel(cfg)
    for block in model.blocks:
        _materialize(model, block, device)
    wrap_blocks(model, activation_checkpointing, compile_blocks)
    for block in model.blocks:
        fully_shard(block, mesh=mesh)
    for part in (model.embed, model.norm, model.lm_head):
        _materialize(model, part, device)
    fully_shard(model, mesh=mesh)
    return model


def _materialize(model: SWAXModel, part: nn.Module, device: torch.device) -> None:
    if any(p.is_meta for p in part.parameters()):
        part.to_empty(device=device)
        model.init_weights(part)


def build_local(cfg: ModelConfig, activation_checkpointing: bool = False, compile_blocks: bool = False) -> SWAXModel:
    model = SWAXModel(cfg)
    wrap_blocks(model, activation_checkpointing, compile_blocks)
    return model
