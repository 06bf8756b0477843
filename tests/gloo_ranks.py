"""Two CPU processes joined in one gloo process group, for the FSDP2 tests.

They meet through a file (no fixed TCP port another process could hold, no store server to vanish while the other
rank still talks to it), and both pass a barrier and FSDP2Strategy's teardown pause (let_collectives_go) before the
group is destroyed. With a fixed port, no barrier and no pause, one full CI run (2026-12-06) saw rank 1 abort
(SIGABRT, "terminate called without an active exception") where the test passes alone: most likely the abort that
swax_lightning/training/watchdog.py explains (a rank leaving right after a collective, the group kept alive by the
FSDP2 model), which the pause removes.
"""
from pathlib import Path

import torch.distributed as dist
import torch.multiprocessing as mp

from swax_lightning.training.watchdog import let_collectives_go


def run_on_two_ranks(fn, args: tuple, folder: Path) -> None:
    """`fn(rank, *args)` on ranks 0 and 1 (spawned: `fn` must be a module-level function)."""
    rendezvous = folder / "rendezvous"  # FileStore makes it, and removes it when both are done
    mp.start_processes(_rank, args=(fn, args, str(rendezvous)), nprocs=2, start_method="spawn")


def _rank(rank: int, fn, args: tuple, rendezvous: str) -> None:
    dist.init_process_group("gloo", init_method=f"file://{rendezvous}", rank=rank, world_size=2)
    fn(rank, *args)
    dist.barrier()
    let_collectives_go()
    dist.destroy_process_group()
