"""Ranks that leave right after their last collective, while a device mesh still holds the process group.

`python tests/gloo_leave.py --rounds 10` runs 10 rounds of 3 CPU processes. Each joins one gloo group (rank 0 holds
the TCP store, as under Lightning's launcher), builds a 1-D device mesh (FSDP2's: it keeps the group alive past
destroy_process_group), runs 20 all-gathers and a barrier, then does what a rank does at the end of `main.py test`
under FSDP2: rank 0 computes for 2 s on both cores (the evaluation suite) while the others leave at once, through
FSDP2Strategy's teardown pause (`let_collectives_go`) and destroy_process_group. It prints each rank that did not end
with code 0, then how many rounds had one. `--no-pause` leaves the pause out, the only difference. On this machine (2
cores, torch 2.13, Python 3.11; 2026-12-06): 11 of 60 rounds failed without the pause (a rank's SIGABRT, "terminate
called without an active exception", the failure swax_lightning/training/watchdog.py explains), 0 of 60 with it.
"""
import argparse
import socket
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
WORLD = 3
HELD = []  # freed only at interpreter shutdown, as the trainer and the model are (they are in reference cycles)


def rank_main(rank: int, port: int, pause: bool) -> None:
    """One rank's work; the mesh, the shard and the last gather's output stay in HELD."""
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    from swax_lightning.training.watchdog import let_collectives_go  # imported in both modes: same program

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=WORLD)
    mesh = init_device_mesh("cpu", (WORLD,), mesh_dim_names=("shard",))
    shard = torch.full((1000,), float(rank))  # a parameter's shard, which the model holds to the end
    for _ in range(20):
        gathered = [torch.empty_like(shard) for _ in range(WORLD)]
        dist.all_gather(gathered, shard)
    dist.barrier()
    if rank == 0:  # the evaluation suite: both cores busy while the others leave
        busy, start = torch.randn(512, 512), time.monotonic()
        while time.monotonic() - start < 2.0:
            busy @ busy
    if pause:
        let_collectives_go()
    HELD.extend([mesh, shard, gathered])
    dist.destroy_process_group()


def failed_rounds(rounds: int, pause: bool) -> list[str]:
    """One line per rank that did not end with code 0: its round, rank, code and last stderr line."""
    failures = []
    for round_ in range(rounds):
        command = [sys.executable, __file__, "--rank", "{}", "--port", str(free_port())]
        if not pause:
            command.append("--no-pause")
        ranks = [subprocess.Popen([part.format(rank) for part in command], cwd=ROOT, stdout=subprocess.DEVNULL,
                                  stderr=subprocess.PIPE, text=True) for rank in range(WORLD)]
        for rank, process in enumerate(ranks):
            _, err = process.communicate(timeout=300)
            if process.returncode != 0:
                last = (err.strip().splitlines() or [""])[-1]
                failures.append(f"round {round_}: rank {rank} ended with code {process.returncode}: {last}")
    return failures


def free_port() -> int:
    """A port free now, for rank 0's TCP store (as Lightning's launcher picks MASTER_PORT)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--no-pause", dest="pause", action="store_false", help="leave the teardown pause out")
    parser.add_argument("--rank", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.rank is not None:
        rank_main(args.rank, args.port, args.pause)
        return
    failures = failed_rounds(args.rounds, args.pause)
    print("\n".join(failures + [f"{len({f.split(':')[0] for f in failures})} of {args.rounds} rounds failed"]))


if __name__ == "__main__":
    main()
