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
- No rank waits on the others forever (watchdog.py): each process runs a Watchdog that ends it with one line
  (`error: rank R: ...`, naming the phase) when `collective_timeout` seconds pass inside a loop without a step
  starting or ending, on SIGTERM, or when a collective fails because another rank ended. The default, 1800 s, is
  Lightning's default process-group timeout: longer than any healthy step, validation batch or checkpoint save,
  including the first step's compilation. The process group's own timeout is set a minute longer,
  so inside the loops the watchdog speaks first, and outside them (start-up, data preparation) it still bounds a
  collective.
- Start-up refuses a launch that would wait for ranks that never come (`check_launch`): devices x num_nodes that
  differ from the processes torchrun or SLURM started, and num_nodes > 1 with nothing that starts the other nodes.
- Teardown ends with a short pause (watchdog.let_collectives_go), so that a rank leaving right after its last
  collective does not abort at interpreter shutdown.
"""
from __future__ import annotations

import os
import signal
import subprocess
from datetime import timedelta
from typing import Literal

from lightning.fabric.plugins.environments import LightningEnvironment
from lightning.pytorch.strategies import ModelParallelStrategy, ParallelStrategy, StrategyRegistry

from swax_lightning.training.watchdog import Watchdog, collective_failure, let_collectives_go

DEFAULT_COLLECTIVE_TIMEOUT_S = 1800.0
PROCESS_GROUP_MARGIN_S = 60.0  # the process group's timeout is the watchdog's plus this: the watchdog speaks first
SIGTERM_WAIT_S = 10.0  # how long rank 0, ending, waits for the ranks it launched to end on SIGTERM (then SIGKILL)
# Strategy methods that run one step of a loop: the watchdog's beats, when each starts and ends.
STEPS = ("training_step", "backward", "optimizer_step", "validation_step", "test_step", "predict_step")


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
    """Why a (data_parallel, tensor_parallel) mesh of Lightning's ModelParallelStrategy does not fit SWAX."""
    fix = "use --trainer.strategy fsdp2 (or hsdp), which sets the mesh itself"
    if tp == 1:
        return (f"ModelParallelStrategy: data_parallel_size ({dp}) x tensor_parallel_size (1) = {dp} ranks, but the "
                f"world size (num_nodes x devices) is {world}: the mesh must cover every rank; {fix}")
    return (f"ModelParallelStrategy: data_parallel_size ({dp}) x tensor_parallel_size ({tp}) must be "
            f"data_parallel_size = world size ({world}) x tensor_parallel_size 1: SWAX models have no tensor-parallel "
            f"plan, so each rank would train its own replica; {fix}")


def check_launch(strategy) -> None:
    """At start-up, on every process: the ranks the configuration asks for are the ranks that will come. torchrun and
    SLURM start the processes themselves, and Lightning compares their count with devices x num_nodes only when it
    launches them itself (else init_device_mesh fails on every rank with a long traceback); num_nodes > 1 with
    nothing that starts the other nodes (no launcher, no NODE_RANK) waits for them forever."""
    if not isinstance(strategy, ParallelStrategy) or strategy.cluster_environment is None:
        return
    environment, nodes, devices = strategy.cluster_environment, strategy.num_nodes, strategy.num_processes
    if environment.creates_processes_externally:
        world = environment.world_size()
        if nodes * devices != world:
            raise ValueError(f"trainer.devices ({devices}) x trainer.num_nodes ({nodes}) = {nodes * devices} ranks, "
                             f"but the launcher ({type(environment).__name__}) started {world} processes: set "
                             f"devices and num_nodes to what it starts (e.g. torchrun --nproc-per-node = devices, "
                             f"--nnodes = num_nodes)")
    elif type(environment) is LightningEnvironment and nodes > 1 and not _node_rank_set():
        raise ValueError(f"trainer.num_nodes is {nodes}, but nothing starts the other nodes: launch this command on "
                         f"every node with srun (SLURM) or torchrun, or set MASTER_ADDR, MASTER_PORT and NODE_RANK "
                         f"on each; started alone it would wait for them forever")


def _node_rank_set() -> bool:
    return "NODE_RANK" in os.environ or "GROUP_RANK" in os.environ


class FSDP2Strategy(ModelParallelStrategy):
    """FSDP2 over every rank (or HSDP), for SWAX models built in LanguageModule.configure_model.

    Args:
        sharding: "full" (FSDP2 over all ranks) or "hybrid" (HSDP: shard inside groups, replicate across them).
        shard_size: Ranks per shard group under hybrid sharding (default: devices per node).
        save_distributed_checkpoint: Each rank writes its shard (a checkpoint is a folder); False gathers one file
            on rank 0 (slow and memory-hungry at scale).
        process_group_backend: "nccl" on GPU, "gloo" on CPU by default.
        collective_timeout: Seconds a rank may go without a step starting or ending inside training, validation or
            test (a collective waiting for a rank that stopped) before it ends with one line naming the rank and
            the phase (watchdog.py). The evaluation suite on rank 0 is not limited by it.
    """

    def __init__(self, sharding: Literal["full", "hybrid"] = "full", shard_size: int | None = None,
                 save_distributed_checkpoint: bool = True, process_group_backend: str | None = None,
                 collective_timeout: float = DEFAULT_COLLECTIVE_TIMEOUT_S, **kwargs):
        if not collective_timeout > 0:
            raise ValueError(f"FSDP2Strategy.collective_timeout must be > 0 seconds (got {collective_timeout})")
        if "timeout" in kwargs:
            raise ValueError("FSDP2Strategy: set collective_timeout (seconds) instead of timeout")
        super().__init__(data_parallel_size="auto", tensor_parallel_size=1,
                         save_distributed_checkpoint=save_distributed_checkpoint,
                         process_group_backend=process_group_backend,
                         timeout=timedelta(seconds=collective_timeout + PROCESS_GROUP_MARGIN_S), **kwargs)
        mesh_shape(sharding, 1, shard_size or 1, shard_size)  # checks the names early; sizes at launch
        self.sharding, self.shard_size = sharding, shard_size
        self.collective_timeout = collective_timeout
        self.watchdog: Watchdog | None = None

    @property
    def mesh_shape(self) -> tuple[int, ...]:
        return mesh_shape(self.sharding, self.num_nodes, self.num_processes, self.shard_size)

    def _configure_launcher(self) -> None:
        self.mesh_shape  # noqa: B018  (fails here, on the launching process, before any worker starts)
        super()._configure_launcher()

    def setup_environment(self) -> None:
        from torch.distributed.device_mesh import init_device_mesh

        self._setup_distributed()
        if self.watchdog is None:
            self.watchdog = Watchdog(self.global_rank, self.collective_timeout, on_end=self._stop_launched_ranks)
            self.watchdog.start()
        names = ("shard",) if self.sharding == "full" else ("replicate", "shard")
        self._device_mesh = init_device_mesh(self.root_device.type, self.mesh_shape, mesh_dim_names=names)
        self.lightning_module._device_mesh = self._device_mesh

    @property
    def distributed_sampler_kwargs(self) -> dict:
        return {"num_replicas": self.world_size, "rank": self.global_rank}

    def _stop_launched_ranks(self) -> None:
        """Under Lightning's launcher (rank 0: the node's other ranks are its children), SIGTERM for them too, and
        a wait for them to end on it (a rank 0 that left at once would break their collectives first); one that
        did not end by then is frozen (SIGSTOP, a hung device) and gets SIGKILL: nothing outlives the run."""
        if self.launcher is None:
            return
        self.launcher.kill(signal.SIGTERM)
        for process in getattr(self.launcher, "procs", []):
            try:
                process.wait(timeout=SIGTERM_WAIT_S)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()

    def _beat(self) -> None:
        stage = self.lightning_module.trainer.state.stage
        if self.watchdog is not None and stage is not None:
            self.watchdog.beat(stage.value)

    def on_exception(self, exception: BaseException) -> None:
        """A collective that failed because another rank ended (or timed out) ends this rank with one line too."""
        reason = collective_failure(exception)
        if self.watchdog is not None and reason is not None:
            self.watchdog.end(1, f"a collective failed in {self.watchdog.phase}: another rank ended or timed out "
                                 f"({reason}); stopped")
        super().on_exception(exception)

    def teardown(self) -> None:
        if self.watchdog is not None:
            self.watchdog.rest("teardown")
        super().teardown()
        let_collectives_go()


def _beating(name: str):
    """FSDP2Strategy's `name`: ModelParallelStrategy's, with a watchdog beat when it starts and when it ends."""
    def step(self, *args, **kwargs):
        self._beat()
        result = getattr(super(FSDP2Strategy, self), name)(*args, **kwargs)
        self._beat()
        return result

    step.__name__ = name
    return step


for _name in STEPS:
    setattr(FSDP2Strategy, _name, _beating(_name))


StrategyRegistry.register("fsdp2", FSDP2Strategy, description="FSDP2 over every rank", sharding="full")
StrategyRegistry.register("hsdp", FSDP2Strategy, description="FSDP2 inside each node, replicated across nodes",
                          sharding="hybrid")
