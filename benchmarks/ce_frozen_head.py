"""Time of the chunked training loss, forward + backward, with the LM head trainable and frozen (kernels/ce/chunked.py):
a frozen head computes dh in the forward (two head matmuls per chunk) where a trainable one recomputes the logits
and adds dW (four). A frozen head went the trainable road before, so the first row is also what a retrofit's LoRA
stage paid per step until then.

    python benchmarks/ce_frozen_head.py                          # Gemma 3 270M's head: V 262,144, d 640, 1,024 rows
    python benchmarks/ce_frozen_head.py --vocab 49152 --d 576    # SmolLM2-135M's

Both rows in one process on the same inputs (median of three calls, bench_ms); prints one JSON line per head and
their ratio, and checks that both give the same dh bit for bit.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.common import bench_ms  # noqa: E402
from swax_lightning.kernels.ce.chunked import softcap_cross_entropy_chunked  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", type=int, default=1024, help="rows of h: one LoRA step of the retrofit configs")
    parser.add_argument("--vocab", type=int, default=262_144)
    parser.add_argument("--d", type=int, default=640)
    parser.add_argument("--cap", type=float, default=0.0, help="logit soft cap (Gemma 3 and SmolLM2: none)")
    args = parser.parse_args()
    g = torch.Generator().manual_seed(0)
    h = torch.randn(args.tokens, args.d, generator=g).requires_grad_()
    w = 0.02 * torch.randn(args.vocab, args.d, generator=g)
    t = torch.randint(0, args.vocab, (args.tokens,), generator=g)
    rows, grads = [], {}
    for head, weight in (("trainable", w.clone().requires_grad_()), ("frozen", w)):
        def step():
            return torch.autograd.grad(softcap_cross_entropy_chunked(h, weight, t, args.cap), h)[0]
        grads[head] = step()
        rows.append({"head": head, "tokens": args.tokens, "V": args.vocab, "d": args.d,
                     "threads": torch.get_num_threads(), "fwd_bwd_ms": round(bench_ms(step, "cpu"), 1)})
        print(json.dumps(rows[-1]), flush=True)
    print(f"frozen head {rows[0]['fwd_bwd_ms'] / rows[1]['fwd_bwd_ms']:.2f}x faster; "
          f"dh equal bit for bit: {torch.equal(grads['trainable'], grads['frozen'])}")


if __name__ == "__main__":
    main()
