"""Shared by the kernel benchmarks: timing, and one measurement row (forward, forward+backward, error)."""
from __future__ import annotations

import time

import torch


def bench_ms(fn, device: str) -> float:
    """Milliseconds per call: triton.testing.do_bench on a GPU, the median of three calls elsewhere."""
    if device == "cuda":
        import triton.testing

        return triton.testing.do_bench(fn, warmup=10, rep=50)
    times = []
    for _ in range(3):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return 1e3 * sorted(times)[1]


def measure(row: dict, fn, inputs: list[torch.Tensor], reference: torch.Tensor | None, loss, device: str) -> dict:
    """Fill `row` with fwd_ms, fwd_bwd_ms and max_abs_err (None without a reference), or an error message: one
    failing implementation must not stop the table."""
    try:
        out = fn(*inputs)
        row["max_abs_err"] = None if reference is None else float((out.float() - reference).abs().max())
        row["fwd_ms"] = bench_ms(lambda: fn(*inputs), device)
        leaves = [x.clone().requires_grad_() for x in inputs]
        row["fwd_bwd_ms"] = bench_ms(lambda: torch.autograd.grad(loss(fn(*leaves)), leaves), device)
    except torch.OutOfMemoryError:
        row["error"] = "out of memory"
    except Exception as err:  # noqa: BLE001
        row["error"] = f"{type(err).__name__}: {err}"[:120]
    if device == "cuda":
        torch.cuda.empty_cache()
    return row
