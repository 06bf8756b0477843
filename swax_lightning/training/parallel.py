"""Training-time wrapping of a SWAXModel: activation checkpointing, torch.compile, FSDP2 sharding, and the way back
to one unsharded copy for evaluation.

Kept outside the model (torchtitan's rule: model code stays single-device). LanguageModule.configure_model calls
`build_sharded` under FSDP2Strategy (strategy.py: a 1-D mesh for FSDP2, 2-D for HSDP) and `build_local` under any
other strategy (single device, DDP).

Decisions:
- Order per block, as torchtitan: activation checkpointing, then compile, then fully_shard; the root is sharded last
  (embedding, final norm, head), so each block's parameters are gathered just in time and freed after use.
- Sharded models are built on the meta device and materialised block by block: one block at a time is allocated in
  full on each rank, initialised with the model's own init (same seed on every rank, hence identical weights), then
  sharded. Peak memory is one block, not the whole model, so a 7B model never exists unsharded.
- Mixed precision is FSDP2's own (torchtitan's choice): under bf16-mixed, fully_shard gets a MixedPrecisionPolicy
  with bf16 parameters (so the all-gather moves half the bytes and the matmuls run in bf16) and fp32 gradient
  reduction; the sharded master weights and the optimizer state stay fp32.
- Evaluation after sharded training (evals/suite.py) runs on an unsharded copy gathered on rank 0 (`unsharded_copy`):
  the suite decodes one sequence at a time with a streaming cache, so a sharded model would all-gather every block for
  every generated token, and every rank would have to take part in every forward of a rank-0 loop; the copy makes the
  scores those of a 1-process run by construction, and a 7B copy (14 GB in bf16, 28 GB in fp32) fits one GPU.
- Gradient clipping needs nothing special: FSDP2 parameters are DTensors, and torch.nn.utils.clip_grad_norm_ (what
  the Trainer's gradient_clip_val calls) computes the global norm over all shards (tests/test_distributed.py).
"""
from __future__ import annotations

import torch
import torch.nn as nn
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper

from swax_lightning.model.config import ModelConfig
from swax_lightning.model.model import SWAXModel
from swax_lightning.training.strategy import replica_mesh_message


def wrap_blocks(model: SWAXModel, activation_checkpointing: bool, compile_blocks: bool) -> None:
    for i, block in enumerate(model.blocks):
        if activation_checkpointing:
            block = checkpoint_wrapper(block)
        if compile_blocks:
            block.compile()
        model.blocks[i] = block


def fsdp_mesh(strategy):
    """The mesh to shard over: FSDP2Strategy's own; for Lightning's ModelParallelStrategy, its data-parallel dimension,
    refused when a tensor-parallel dimension would make each rank train its own replica (SWAX has no TP plan)."""
    mesh = strategy.device_mesh
    if "tensor_parallel" not in (mesh.mesh_dim_names or ()):
        return mesh
    dp, tp = mesh["data_parallel"].size(), mesh["tensor_parallel"].size()
    if tp > 1:
        raise ValueError(replica_mesh_message(dp, tp, dp * tp))
    return mesh["data_parallel"]


def mixed_precision_policy(precision: str):
    """FSDP2's MixedPrecisionPolicy for a Lightning precision string (None: parameters stay in their dtype)."""
    from torch.distributed.fsdp import MixedPrecisionPolicy

    if precision == "bf16-mixed":
        return MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    return None


def build_sharded(cfg: ModelConfig, mesh, device: torch.device, seed: int, activation_checkpointing: bool = False,
                  compile_blocks: bool = False, mp_policy=None) -> SWAXModel:
    """A SWAXModel sharded with FSDP2 over `mesh` (1-D: FSDP2, 2-D (replicate, shard): HSDP), materialised on
    `device` block by block; `mp_policy` from mixed_precision_policy."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    shard = dict(mesh=mesh, mp_policy=mp_policy or MixedPrecisionPolicy())
    with torch.device("meta"):
        model = SWAXModel(cfg)
    for block in model.blocks:
        _materialize(model, block, device, seed)
    wrap_blocks(model, activation_checkpointing, compile_blocks)
    for block in model.blocks:
        fully_shard(block, **shard)
    for part in (model.embed, model.norm, model.lm_head):
        _materialize(model, part, device, seed)
    if cfg.tie_embeddings:  # one tensor again (materialising split it), initialised as the head, as in SWAXModel
        model.lm_head.weight = model.embed.weight
        model.init_weights(model.lm_head, seed)
    fully_shard(model, **shard)
    return model


def unsharded_copy(model: SWAXModel, device: torch.device) -> SWAXModel | None:
    """A plain SWAXModel with the full weights of a sharded one, on rank 0 (None on the other ranks). Every rank must
    call it (the gather is a collective); the copy is in eval mode with the sharded model's window."""
    import torch.distributed as dist
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    state = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    if dist.get_rank() != 0:
        return None
    with torch.device("meta"):  # no throw-away initialisation of a model the size of the trained one
        copy = SWAXModel(model.cfg)
    copy.load_state_dict(state, assign=True)
    if model.cfg.tie_embeddings:
        copy.lm_head.weight = copy.embed.weight
    if model.window is not None:
        copy.set_window(model.window)
    return copy.to(device).eval()


def _materialize(model: SWAXModel, part: nn.Module, device: torch.device, seed: int) -> None:
    if any(p.is_meta for p in part.parameters()):
        part.to_empty(device=device)
        model.init_weights(part, seed)


def build_local(cfg: ModelConfig, seed: int, activation_checkpointing: bool = False,
                compile_blocks: bool = False) -> SWAXModel:
    model = SWAXModel(cfg)
    model.reset_parameters(seed)
    wrap_blocks(model, activation_checkpointing, compile_blocks)
    return model


def evaluation_model(trainer, pl_module) -> SWAXModel | None:
    """The model rank 0 evaluates on (None on the other ranks): an unsharded copy under FSDP2 (all ranks take part in
    the gather), the module's own model otherwise."""
    from lightning.pytorch.strategies import ModelParallelStrategy

    if isinstance(trainer.strategy, ModelParallelStrategy):
        return unsharded_copy(pl_module.model, trainer.strategy.root_device)
    return pl_module.model if trainer.is_global_zero else None
