"""Peak CPU memory of the training loss, forward + backward: the plain soft-capped cross-entropy (full [N, V] logits)
against the chunked one (kernels/ce/chunked.py).

    python benchmarks/ce_memory.py                       # B=4, T=4096, V=50304, d=128: needs about 16 GB free
    python benchmarks/ce_memory.py --batch 1             # the same at a quarter of the tokens

Each variant runs in a fresh child process, and its figure is the growth of the peak resident set (ru_maxrss) over
the loss's forward and backward, past the inputs and weights already allocated: on CPU torch keeps no allocator
statistics, and a fresh process keeps one variant's peak from hiding the other's. The model width d only sets the
size of h and W (small next to the logits), so a small d keeps the CPU time short without changing the comparison.
Prints one JSON line per variant and the ratio.
"""
from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from swax_lightning.kernels.ce.chunked import softcap_cross_entropy_chunked  # noqa: E402
from swax_lightning.kernels.ce.naive import softcap_cross_entropy_reference  # noqa: E402

LOSSES = {"plain": softcap_cross_entropy_reference, "chunked": softcap_cross_entropy_chunked}


def peak_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux reports KiB


def child(args) -> None:
    N = args.batch * args.seq
    g = torch.Generator().manual_seed(0)
    h = torch.randn(N, args.d, generator=g).requires_grad_()
    w = (0.1 * torch.randn(args.vocab, args.d, generator=g)).requires_grad_()
    t = torch.randint(0, args.vocab, (N,), generator=g)
    before = peak_mib()
    loss = LOSSES[args.variant](h, w, t, 30.0)
    loss.backward()
    print(json.dumps({"variant": args.variant, "B": args.batch, "T": args.seq, "V": args.vocab, "d": args.d,
                      "loss": float(loss), "peak_growth_mib": round(peak_mib() - before, 1),
                      "logits_fp32_mib": round(N * args.vocab * 4 / 2**20, 1)}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--seq", type=int, default=4096)
    parser.add_argument("--vocab", type=int, default=50304)
    parser.add_argument("--d", type=int, default=128)
    parser.add_argument("--variant", choices=list(LOSSES), help="(internal) run one variant in this process")
    args = parser.parse_args()
    if args.variant:
        return child(args)
    rows = []
    for variant in LOSSES:
        cmd = [sys.executable, __file__, "--variant", variant, "--batch", str(args.batch), "--seq", str(args.seq),
               "--vocab", str(args.vocab), "--d", str(args.d)]
        rows.append(json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout))
        print(json.dumps(rows[-1]), flush=True)
    plain, chunked = (r["peak_growth_mib"] for r in rows)
    print(f"peak growth: plain {plain:,.0f} MiB, chunked {chunked:,.0f} MiB ({plain / max(chunked, 1):.1f}x less); "
          f"losses equal to {abs(rows[0]['loss'] - rows[1]['loss']):.1e}")


if __name__ == "__main__":
    main()
