"""What a run ran on: the facts that can change its floating-point results, recorded beside its results.

A CPU run of this project repeats bit for bit on one machine with the same thread count. What can change its floats
elsewhere: the number of intra-op threads (a reduction split over more threads adds in another order), the CPU's
instruction set (PyTorch picks its vectorised kernels by `cpu_capability`: AVX2, AVX512...), the versions of torch
and of the packages that draw or order data (numpy draws the window schedule, litdata the stream order; tokenizers
a BPE's ids), the Python version (the embedded corpus is this Python's standard library: another version trains on
other text), and on a GPU the device and CUDA version. `describe` records all of them: `main.py fit` writes them to
the run folder's environment.json; the study pins the thread count (swax_lightning/study/sweep.py) and lists what its
runs ran on in its report.
"""
from __future__ import annotations

import platform
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

import torch

ENVIRONMENT_FILE = "environment.json"  # in a run folder: what its fit ran on (written by the CLI after fit)
PACKAGES = ("torch", "lightning", "litdata", "numpy", "tokenizers", "torchmetrics", "swax-lightning")


def _cpuinfo_field(name: str) -> str | None:
    """The first `name : value` line of /proc/cpuinfo (Linux), else None."""
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.is_file():
        for line in cpuinfo.read_text().splitlines():
            if line.startswith(name):
                return line.split(":", 1)[1].strip()
    return None


def cpu_model() -> str:
    """The CPU's model name from /proc/cpuinfo (Linux), else what `platform` says."""
    return _cpuinfo_field("model name") or platform.processor() or platform.machine()


def cpu_has_native_bf16() -> bool:
    """Whether the CPU multiplies bf16 in hardware (AVX-512 BF16 or AMX): without it PyTorch emulates bf16 matmuls,
    and a bf16-autocast training step ran 7x slower than fp32 (AMD EPYC without avx512_bf16, 2026-12-03)."""
    flags = (_cpuinfo_field("flags") or "").split()
    return "avx512_bf16" in flags or "amx_bf16" in flags


def package_version(name: str) -> str | None:
    try:
        return version(name)
    except PackageNotFoundError:
        return None


def describe() -> dict:
    """This process's machine, kernels, threads and package versions (plain JSON)."""
    return {"python": platform.python_version(), "platform": platform.platform(), "cpu": cpu_model(),
            "cpu_capability": torch.backends.cpu.get_cpu_capability(), "threads": torch.get_num_threads(),
            "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
            "cuda": torch.version.cuda, "packages": {name: package_version(name) for name in PACKAGES}}
