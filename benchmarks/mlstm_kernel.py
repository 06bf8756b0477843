"""Chunkwise mLSTM implementations side by side: ms and tokens/s, forward and forward+backward, with a check.

    python benchmarks/mlstm_kernel.py          # on a GPU: T in {4k, 16k, 64k}, xLSTM-7B shape and a small one, bf16
    TRITON_INTERPRET=1 python benchmarks/mlstm_kernel.py --device cpu --dtype float32 --lengths 128 \\
        --shapes 2x32x32                       # smoke test of the script itself on a CPU

Implementations: this repo's Triton kernel (kernels/mlstm/triton.py), the PyTorch chunkwise path
(kernels/mlstm/chunk.py) and NX-AI's TFLA kernel (kernels/mlstm/tfla.py, where mlstm_kernels is installed; at its own
default chunk, --tfla_chunk 128); --impls picks some. Shapes are HEADSxDQKxDV (default: the xLSTM-7B layer,
8x256x512, and 8x64x128), batch 1, chunk 64 for the others. The output of each is
compared with the PyTorch chunkwise path in fp32 (max abs error of h); the backward is timed through a per-head
RMSNorm, as in the model. One JSON line per measurement, then a table. Budget on one H200: about 3 minutes.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.common import measure  # noqa: E402
from swax_lightning.kernels.mlstm.chunk import mlstm_chunkwise  # noqa: E402


def implementations(chunk: int, tfla_chunk: int):
    from swax_lightning.kernels import backends
    from swax_lightning.kernels.mlstm.triton import mlstm_chunkwise_triton

    impls = {"triton (ours)": lambda *a: mlstm_chunkwise_triton(*a, chunk_size=chunk)[0],
             "pytorch chunkwise": lambda *a: mlstm_chunkwise(*a, chunk_size=chunk)[0]}
    if backends.installed("mlstm_kernels"):
        from swax_lightning.kernels.mlstm.tfla import mlstm_chunkwise_tfla

        impls["tfla (NX-AI)"] = lambda *a: mlstm_chunkwise_tfla(*a, chunk_size=tfla_chunk)[0]
    return impls


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--lengths", nargs="+", type=int, default=[4096, 16384, 65536])
    parser.add_argument("--shapes", nargs="+", default=["8x256x512", "8x64x128"])
    parser.add_argument("--chunk", type=int, default=64)
    parser.add_argument("--tfla_chunk", type=int, default=128, help="TFLA's chunk (its own default: 128)")
    parser.add_argument("--impls", nargs="+", default=None,
                        help="only these implementations (names as in the table, e.g. 'triton (ours)' 'tfla (NX-AI)')")
    args = parser.parse_args()
    dtype = getattr(torch, args.dtype)
    rows = []
    for shape in args.shapes:
        H, dqk, dv = map(int, shape.split("x"))
        for T in args.lengths:
            g = torch.Generator(device=args.device).manual_seed(0)
            rnd = lambda *s: torch.randn(*s, device=args.device, generator=g)
            q, k, v = rnd(1, T, H, dqk).to(dtype), rnd(1, T, H, dqk).to(dtype), rnd(1, T, H, dv).to(dtype)
            i_pre, f_pre = rnd(1, T, H) - 3.0, rnd(1, T, H) + 4.0
            reference = mlstm_chunkwise(q.float(), k.float(), v.float(), i_pre, f_pre, chunk_size=args.chunk)[0]
            for name, fn in implementations(args.chunk, args.tfla_chunk).items():
                if args.impls and name not in args.impls:
                    continue
                row = {"impl": name, "shape": shape, "T": T}
                measure(row, fn, [q, k, v, i_pre, f_pre], reference,
                        lambda out: F.rms_norm(out.float(), (dv,)).sum(), args.device)  # as in the layer
                if "error" not in row:
                    row["fwd_tokens_per_s"] = T / row["fwd_ms"] * 1e3
                    row["fwd_bwd_tokens_per_s"] = T / row["fwd_bwd_ms"] * 1e3
                rows.append(row)
                print(json.dumps(row), flush=True)
    print("\n| impl | heads x dqk x dv | T | fwd ms | fwd tokens/s | fwd+bwd ms | fwd+bwd tokens/s | max abs err |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        if "error" in r:
            print(f"| {r['impl']} | {r['shape']} | {r['T']} | {r['error']} | | | | |")
            continue
        print(f"| {r['impl']} | {r['shape']} | {r['T']} | {r['fwd_ms']:.3f} | {r['fwd_tokens_per_s']:,.0f} | "
              f"{r['fwd_bwd_ms']:.3f} | {r['fwd_bwd_tokens_per_s']:,.0f} | {r['max_abs_err']:.1e} |")


if __name__ == "__main__":
    main()
