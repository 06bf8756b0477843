"""FSDP2Strategy: Lightning's ModelParallelStrategy with a data-parallel mesh that is right by construction.

Lightning's ModelParallelStrategy sizes its mesh as data_parallel = num_nodes and tensor_parallel = devices per node.
SWAX models have no tensor-parallel plan, so on one node with 2 devices that default shards each model over a mesh of
size 1: every rank keeps and trains its own replica on its own data, and nothing complains. This strategy has no
tensor-parallel dimension at all; every rank is a data-parallel rank and the mesh is one of:

- `sharding: full` (default): FSDP2 over all num_nodes x devices ranks (a 1-D mesh "shard"). Parameters, gradients and
  optimizer state are split across every rank; each block is all-gathered just before it runs.
- `sharding: hybrid`: HSDP, a 2-D mesh ("replicate", "shard"): shard inside a group of `shard_size` ranks (default:
  the devices of one node, whose links are fast), replicate across groups (gradients all-reduced across nodes).
  Less memory saving, less inter-node traffic.

Decisions:
- The mesh is computed from (num_nodes, devices) at start-up, on the launching process, before any worker starts; a
  shard_size that does not divide the world size is one error line naming the fields.
- Every rank gets different data: the sampler sees num_replicas = world size and rank = global rank in both modes.
- Mixed precision follows torchtitan: with `precision: bf16-mixed` LanguageModule gives fully_shard a
  MixedPrecisionPolicy (bf16 parameters for compute and the all-gather, fp32 gradient reduction); the fp32 master
  weights and optimizer state stay sharded (parallel.py).
- Registered as `--trainer.strategy fsdp2` and `--trainer.strategy hsdp` (Lightning's StrategyRegistry), so the
  command line needs no class path.
"""
from __future__ import annotations

from typing import Literal

from lightning.pytorch.strategies import ModelParallelStrategy, StrategyRegistry


def mesh_shape(sharding: str, num_nodes: int, devices: int, shard_size: int | None = None) -> tuple[int, ...]:
    """The FSDP2 mesh for num_nodes x devices ranks: (world,) for full sharding, (replicas, shard_size) for hybrid."""
    world = num_nodes * devices
    if sharding == "full":
        if shard_size not in (None, world):
            raise ValueError(f"FSDP2Strategy.shard_size ({shard_size}) applies to sharding: hybrid; with "
                             f"sharding: full every rank shards (world size = num_nodes {num_nodes} x devices "
                             f"{devices} = {world})")
        return (world,)
    if sharding != "hybrid":
        raise ValueError(f"FSDP2Strategy.sharding must be 'full' or 'hybrid' (got {sharding!r})")
    shard = devices if shard_size is None else shard_size
    if shard < 1 or world % shard:
        raise ValueError(f"FSDP2Strategy.shard_size ({shard}) must divide the world size: num_nodes ({num_nodes}) x "
                         f"devices ({devices}) = {world}")
    return (world // shard, shard)


def refuse_replica_mesh(strategy) -> None:
    """Lightning's own ModelParallelStrategy, at start-up: its mesh must be data-parallel over every rank, since SWAX
    has no tensor-parallel plan (a tensor-parallel dimension leaves each rank training its own replica)."""
    if not isinstance(strategy, ModelParallelStrategy) or isinstance(strategy, FSDP2Strategy):
        return
    nodes, devices = strategy.num_nodes, strategy.num_processes
    dp = nodes if strategy._data_parallel_size == "auto" else strategy._data_parallel_size
    tp = devices if strategy._tensor_parallel_size == "auto" else strategy._tensor_parallel_size
    if tp != 1 or dp != nodes * devices:
        raise ValueError(replica_mesh_message(dp, tp, nodes * devices))


def replica_mesh_message(dp: int, tp: int, world: int) -> str:
    return (f"ModelParallelStrategy: data_parallel_size ({dp}) x tensor_parallel_size ({tp}) must be "
            f"data_parallel_size = world size ({world}) x tensor_parallel_size 1: SWAX models have no tensor-parallel "
            "plan, so each rank would train its own replica; use --trainer.strategy fsdp2 (or hsdp), which sets the "
            "mesh itself")


class FSDP2Strategy(ModelParallelStrategy):
    """FSDP2 over every rank (or HSDP), for SWAX models built in LanguageModule.configure_model.

    Args:
        sharding: "full" (FSDP2 over all ranks) or "hybrid" (HSDP: shard inside groups, replicate across them).
        shard_size: Ranks per shard group under hybrid sharding (default: devices per node).
        save_distributed_checkpoint: Each rank writes its shard (a checkpoint is a folder); False gathers one file
            on rank 0 (slow and memory-hungry at scale).
        process_group_backend: "nccl" on GPU, "gloo" on CPU by default.
    """

    def __init__(self, sharding: Literal["full", "hybrid"] = "full", shard_size: int | None = None,
                 save_distributed_checkpoint: bool = True, process_group_backend: str | None = None, **kwargs):
        super().__init__(data_parallel_size="auto", tensor_parallel_size=1,
                         save_distributed_checkpoint=save_distributed_checkpoint,
                         process_group_backend=process_group_backend, **kwargs)
        mesh_shape(sharding, 1, shard_size or 1, shard_size)  # checks the names early; sizes at launch
        self.sharding, self.shard_size = sharding, shard_size

    @property
    def mesh_shape(self) -> tuple[int, ...]:
        return mesh_shape(self.sharding, self.num_nodes, self.num_processes, self.shard_size)

    def _configure_launcher(self) -> None:
        self.mesh_shape  # noqa: B018  (fails here, on the launching process, before any worker starts)
        super()._configure_launcher()

    def setup_environment(self) -> None:
        from torch.distributed.device_mesh import init_device_mesh

        self._setup_distributed()
        names = ("shard",) if self.sharding == "full" else ("replicate", "shard")
        self._device_mesh = init_device_mesh(self.root_device.type, self.mesh_shape, mesh_dim_names=names)
        self.lightning_module._device_mesh = self._device_mesh

    @property
    def distributed_sampler_kwargs(self) -> dict:
        return {"num_replicas": self.world_size, "rank": self.global_rank}


StrategyRegistry.register("fsdp2", FSDP2Strategy, description="FSDP2 over every rank", sharding="full")
StrategyRegistry.register("hsdp", FSDP2Strategy, description="FSDP2 inside each node, replicated across nodes",
                          sharding="hybrid")
