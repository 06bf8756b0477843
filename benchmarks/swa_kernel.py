"""Sliding-window attention kernels side by side: ms and TFLOP/s, forward and forward+backward, with a check.

    python benchmarks/swa_kernel.py                      # on a GPU: T in {4k, 16k, 64k}, W in {128, 2048}, bf16
    TRITON_INTERPRET=1 python benchmarks/swa_kernel.py --device cpu --dtype float32 --lengths 256 --windows 16 64 \\
        --heads 2 --head_dim 32                          # smoke test of the script itself on a CPU

Implementations: this repo's Triton kernel (kernels/swa/triton.py), PyTorch SDPA with a dense T x T mask, FlexAttention
with a sliding-window-plus-sinks block mask (compiled), flash-attn's sliding window (no sinks: run with n_sink 0)
where installed, and the blocked PyTorch path (kernels/swa/blocked.py). TFLOP/s count only the window's work:
4 * head_dim FLOPs per visible (query, key) pair forward, 2.5 times that for the backward. Every implementation's
output is compared with the blocked PyTorch path in fp32 (max abs error). One JSON line per measurement, then a table.
Budget on one H200: about 3 minutes.
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
from swax_lightning.kernels.swa.blocked import swa_blocked  # noqa: E402
from swax_lightning.kernels.swa.naive import sliding_window_mask  # noqa: E402


def visible_pairs(T: int, W: int, n_sink: int) -> int:
    t = torch.arange(T, dtype=torch.float64)
    in_window = torch.minimum(t + 1, torch.tensor(float(W)))
    sinks = torch.clamp(torch.minimum(t - W + 1, torch.tensor(float(n_sink))), min=0)
    return int((in_window + sinks).sum())


def implementations(W: int, n_sink: int, T: int, device: str, max_dense: int):
    """name -> attention function of (q, k, v) in [B, T, H, D] layout, for those available here."""
    from swax_lightning.kernels.swa.triton import swa_triton

    impls = {"triton (ours)": lambda q, k, v: swa_triton(q, k, v, W, n_sink),
             "blocked pytorch": lambda q, k, v: swa_blocked(q, k, v, W, n_sink)}
    if T <= max_dense:
        mask = sliding_window_mask(T, W, n_sink, device=device)
        impls["sdpa dense mask"] = lambda q, k, v: F.scaled_dot_product_attention(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), attn_mask=mask).transpose(1, 2)
    if device == "cuda":
        try:
            from torch.nn.attention.flex_attention import create_block_mask, flex_attention

            def mask_mod(b, h, q_idx, kv_idx):
                return (kv_idx <= q_idx) & ((q_idx - kv_idx < W) | (kv_idx < n_sink))

            block_mask = create_block_mask(mask_mod, None, None, T, T, device=device)
            flex = torch.compile(flex_attention)
            impls["flex attention"] = lambda q, k, v: flex(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                                           block_mask=block_mask).transpose(1, 2)
        except Exception as err:  # noqa: BLE001 - report and go on without it
            print(f"# flex attention unavailable: {err}", file=sys.stderr)
        if n_sink == 0:
            try:
                from flash_attn import flash_attn_func

                impls["flash-attn"] = lambda q, k, v: flash_attn_func(q, k, v, causal=True, window_size=(W - 1, 0))
            except ImportError:
                pass
    return impls


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--lengths", nargs="+", type=int, default=[4096, 16384, 65536])
    parser.add_argument("--windows", nargs="+", type=int, default=[128, 2048])
    parser.add_argument("--n_sink", type=int, default=4)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--heads", type=int, default=16)
    parser.add_argument("--head_dim", type=int, default=128)
    parser.add_argument("--max_dense", type=int, default=16384, help="longest T for the dense-mask baseline")
    parser.add_argument("--impls", nargs="+", default=None,
                        help="only these implementations (table names, e.g. 'triton (ours)' 'flex attention')")
    args = parser.parse_args()
    dtype = getattr(torch, args.dtype)
    rows = []
    for T in args.lengths:
        for W in args.windows:
            g = torch.Generator(device=args.device).manual_seed(0)
            q, k, v = (torch.randn(args.batch, T, args.heads, args.head_dim, device=args.device, generator=g,
                                   dtype=dtype) for _ in range(3))
            reference = swa_blocked(q.float(), k.float(), v.float(), W, args.n_sink)
            flops = 4 * args.head_dim * visible_pairs(T, W, args.n_sink) * args.batch * args.heads
            for name, fn in implementations(W, args.n_sink, T, args.device, args.max_dense).items():
                if args.impls and name not in args.impls:
                    continue
                row = {"impl": name, "T": T, "W": W, "n_sink": args.n_sink if name != "flash-attn" else 0}
                grad = torch.randn_like(q)
                measure(row, fn, [q, k, v], reference if row["n_sink"] == args.n_sink else None,
                        lambda out: (out.float() * grad).sum(), args.device)
                if "error" not in row:
                    row["fwd_tflops"] = flops / row["fwd_ms"] / 1e9
                    row["fwd_bwd_tflops"] = 3.5 * flops / row["fwd_bwd_ms"] / 1e9
                rows.append(row)
                print(json.dumps(row), flush=True)
    print("\n| impl | T | W | fwd ms | fwd TFLOP/s | fwd+bwd ms | fwd+bwd TFLOP/s | max abs err |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        if "error" in r:
            print(f"| {r['impl']} | {r['T']} | {r['W']} | {r['error']} | | | | |")
            continue
        err = "n/a (no sinks)" if r["max_abs_err"] is None else f"{r['max_abs_err']:.1e}"
        print(f"| {r['impl']} | {r['T']} | {r['W']} | {r['fwd_ms']:.3f} | {r['fwd_tflops']:.1f} | "
              f"{r['fwd_bwd_ms']:.3f} | {r['fwd_bwd_tflops']:.1f} | {err} |")


if __name__ == "__main__":
    main()
