"""Compile every own Triton kernel for a GPU without having one, and print its shared memory per block.

    TRITON_INTERPRET=0 python benchmarks/kernel_shared_memory.py            # sm_90 (Hopper), all configurations
    TRITON_INTERPRET=0 python benchmarks/kernel_shared_memory.py --ops swa --dtypes bfloat16 --head_dims 64

A kernel whose tiles need more shared memory than a block may have compiles, and fails only at its first launch on
the GPU ("out of resource: shared memory"). This script finds those on a CPU machine: it drives the real wrappers
(`swa_triton`, `mlstm_chunkwise_triton`, forward and backward) on small CPU tensors with Triton's launch replaced by a
recorder, then compiles each recorded launch with `triton.compile` for `--arch` (the ptxas bundled with Triton does
the last step; no driver is needed). Dots are taken as on a GPU (bf16 tensor cores: NATIVE on). One JSON line per
kernel configuration (shared bytes, compile seconds, over the limit or not), then a table. All configurations take a
few minutes on 2 cores (fp32 kernels compile slowest). Figures from it are in the README (Kernels).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

if os.environ.get("TRITON_INTERPRET") == "1":
    sys.exit("kernel_shared_memory.py compiles kernels: run it with TRITON_INTERPRET=0")

import torch  # noqa: E402
import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402
from triton.runtime.jit import JITFunction  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import swax_lightning.kernels.swa.triton as swa_module  # noqa: E402
from swax_lightning.kernels.mlstm.naive import MLSTMState  # noqa: E402
from swax_lightning.kernels.mlstm.triton import mlstm_chunkwise_triton  # noqa: E402

POINTER_TYPES = {torch.float32: "*fp32", torch.bfloat16: "*bf16", torch.float16: "*fp16", torch.int32: "*i32",
                 torch.int64: "*i64"}


def record_launches() -> dict:
    """Replace Triton's launch with a recorder; returns the dict it fills: key -> (kernel, signature, constexprs,
    options). Output buffers stay uninitialised, which is all the next launch needs (shapes)."""
    launches = {}

    def run(self, *args, grid, warmup, **kwargs):
        names = self.arg_names
        values = dict(zip(names, args), **{k: v for k, v in kwargs.items() if k in names})
        signature, constexprs = {}, {}
        for param, name in zip(self.params, names):
            value = values[name]
            if param.is_constexpr or value is None:
                signature[name], constexprs[name] = "constexpr", value
            elif isinstance(value, torch.Tensor):
                signature[name] = POINTER_TYPES[value.dtype]
            elif isinstance(value, bool):
                signature[name] = "i1"
            elif isinstance(value, int):
                signature[name] = "i32" if -2**31 <= value < 2**31 else "i64"
            else:
                signature[name] = "fp32"
        options = {k: v for k, v in kwargs.items() if k not in names}
        key = json.dumps([self.fn.__name__, signature, constexprs, options], sort_keys=True, default=str)
        launches.setdefault(key, (self, signature, constexprs, options))

    JITFunction.run = run
    swa_module._native_dots = lambda x: True  # as on a GPU: dots in the input dtype
    return launches


def drive_swa(dtype: torch.dtype, head_dim: int) -> None:
    q, k, v = (torch.randn(1, 100, 2, head_dim, dtype=dtype, requires_grad=True) for _ in range(3))
    swa_module.swa_triton(q, k, v, 16, 4).sum().backward()


def drive_mlstm(dtype: torch.dtype, qk_dim: int, v_dim: int, chunk: int, initial_state: bool) -> None:
    T, H = 70, 2
    q, k = (torch.randn(1, T, H, qk_dim, dtype=dtype, requires_grad=True) for _ in range(2))
    v = torch.randn(1, T, H, v_dim, dtype=dtype, requires_grad=True)
    gates = [torch.randn(1, T, H, requires_grad=True) for _ in range(2)]
    state = MLSTMState(torch.zeros(1, H, qk_dim, v_dim), torch.zeros(1, H, qk_dim), torch.zeros(1, H)) \
        if initial_state else None
    h, _ = mlstm_chunkwise_triton(q, k, v, *gates, state, chunk_size=chunk)
    h.float().sum().backward()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--arch", type=int, default=90, help="compute capability x 10 (90: Hopper)")
    parser.add_argument("--limit_kib", type=float, default=227, help="shared memory a block may have (Hopper: 227)")
    parser.add_argument("--ops", nargs="+", default=["swa", "mlstm"], choices=["swa", "mlstm"])
    parser.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16"])
    parser.add_argument("--head_dims", nargs="+", type=int, default=[32, 64, 128, 256], help="SWA head dims")
    parser.add_argument("--chunks", nargs="+", type=int, default=[16, 32, 64, 128], help="mLSTM chunk sizes")
    args = parser.parse_args()
    launches = record_launches()
    for dtype in (getattr(torch, name) for name in args.dtypes):
        if "swa" in args.ops:
            for head_dim in args.head_dims:
                drive_swa(dtype, head_dim)
        if "mlstm" in args.ops:
            for chunk in args.chunks:  # head dims 64 and up give the same 64-wide tiles: 64 x 128 covers them
                for initial_state in (False, True):
                    drive_mlstm(dtype, 64, 128, chunk, initial_state)
    target = GPUTarget("cuda", args.arch, 32)
    rows = []
    for kernel, signature, constexprs, options in launches.values():
        start = time.perf_counter()
        compiled = triton.compile(ASTSource(kernel, signature, constexprs), target=target,
                                  options={k: v for k, v in options.items() if k in ("num_warps", "num_stages")})
        shared = compiled.metadata.shared
        inputs = next(t for n, t in signature.items() if n in ("Q", "K"))[1:]
        row = {"kernel": kernel.fn.__name__, "inputs": inputs,
               **{k: v for k, v in constexprs.items() if v is not None}, "shared_kib": shared / 1024,
               "over_limit": shared > args.limit_kib * 1024, "compile_s": round(time.perf_counter() - start, 1)}
        rows.append(row)
        print(json.dumps(row), flush=True)
    print(f"\n| kernel | inputs | configuration | shared KiB | over {args.limit_kib:g} KiB |")
    print("|---|---|---|---|---|")
    for r in rows:
        config = ", ".join(f"{k}={v}" for k, v in r.items()
                           if k not in ("kernel", "inputs", "shared_kib", "over_limit", "compile_s"))
        over = "yes" if r["over_limit"] else ""
        print(f"| {r['kernel']} | {r['inputs']} | {config} | {r['shared_kib']:.0f} | {over} |")


if __name__ == "__main__":
    main()
