"""Kernel backends: what each operation may run on, what each backend can take, and which one `auto` picks.

Choices per operation (the model config's `kernels` field; SWAX_KERNELS=auto|torch|triton overrides every op):
    attention  auto | torch | triton | flash | flex | sdpa
    mlstm      auto | torch | triton | tfla
    deltanet   auto | torch | fla
`auto` for attention: full causal (no window, or W >= T) -> SDPA is_causal (flash / cuDNN on GPU, the fused kernel
on CPU); a window on CPU -> the blocked PyTorch path; a window without sinks on CUDA -> flash-attn when installed
(fp16 / bf16), else the own Triton kernel; sinks on CUDA -> the own Triton kernel. Anything a kernel cannot take
(head dim, too many sinks, a chunk size) falls back to the PyTorch path under `auto`. `auto` for the gated delta
rule: fla's chunk_gated_delta_rule on CUDA when flash-linear-attention is installed, else the PyTorch forms;
SWAX_KERNELS=triton asks for fla there (its kernels are Triton). `auto` for the mLSTM: on CUDA the backend
MLSTM_AUTO_MEASURED names for the head shape (the fastest measured there), else the own Triton kernel where it fits;
the PyTorch chunkwise form on CPU. `tfla` is NX-AI's TFLA kernel (mlstm_kernels, kernels/mlstm/tfla.py).

Decisions:
- `check_choices` runs when the config is built (start-up), so a backend that is not installed, a head dim it cannot
  take or sinks it has none of is one line naming the field, not a failure at the first GPU forward. It returns (field,
  message) pairs and raises nothing, so ModelConfig raises them as a ConfigError (core/errors.py). `check_run` does the
  same once the trainer is built (the CLI's start-up), for what depends on its device and precision.
- Sink counts are clamped to the sequence length before the 64-sink limit of the Triton kernel is applied (at run
  time, where T is known); the config check can only use n_sink itself.
"""
from __future__ import annotations

import importlib.util
import os

CHOICES = {
    "attention": ("auto", "torch", "triton", "flash", "flex", "sdpa"),
    "mlstm": ("auto", "torch", "triton", "tfla"),
    "deltanet": ("auto", "torch", "fla"),
}
DEFAULTS = {op: "auto" for op in CHOICES}
ENV_CHOICES = ("auto", "torch", "triton")
TRITON_MAX_SINKS = 64  # the Triton SWA kernel's key block: sinks must fit in one
TRITON_SWA_HEAD_DIMS = (16, 256)  # powers of two in this range
TRITON_MLSTM_CHUNKS = (16, 32, 64, 128)
TRITON_MLSTM_MIN_HEAD_DIM = 16  # the smallest tl.dot tile
TFLA_CHUNKS = (16, 32, 64, 128, 256)  # mlstm_kernels' xl_chunk: powers of two from its 16-step minimum
TFLA_MIN_HEAD_DIM = 16
# `auto` for the mLSTM on CUDA: per (q/k head dim, v head dim), the backend measured fastest in forward + backward
# (benchmarks/mlstm_kernel.py, bf16, T 4k-64k, one H200, 2026-11-30). Only the own Triton kernel and the PyTorch path
# have been measured (the own kernel 43-99x faster); TFLA has not run on a GPU yet, so no shape picks it. A shape not
# listed takes the own Triton kernel where it fits: its backward is also the one exact with the norm's eps (TFLA's,
# like most mLSTM kernels', holds the normaliser and stabiliser constant: tests/kernels/test_mlstm_tfla.py).
MLSTM_AUTO_MEASURED = {(128, 128): "triton", (256, 512): "triton"}
# fp32 at head dim 256: the SWA dk/dv kernel needs 272 KiB of shared memory per block, more than any GPU has (Hopper:
# 227 KiB; figures from compiling the kernels for sm_90).
TRITON_FP32_MAX_HEAD_DIM = 128


def installed(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


def env_override() -> str | None:
    """SWAX_KERNELS when set (validated), else None."""
    choice = os.environ.get("SWAX_KERNELS", "").lower()
    if not choice:
        return None
    if choice not in ENV_CHOICES:
        raise ValueError(f"SWAX_KERNELS={choice!r}: expected one of {', '.join(ENV_CHOICES)}")
    return choice


def triton_attention_fits(head_dim: int, n_sink: int, dtype=None) -> bool:
    """dtype None: any the kernel takes at some precision (the config check, before the precision is known)."""
    fp32 = dtype is not None and dtype.itemsize >= 4
    low, high = TRITON_SWA_HEAD_DIMS
    return (low <= head_dim <= (TRITON_FP32_MAX_HEAD_DIM if fp32 else high) and head_dim & (head_dim - 1) == 0
            and n_sink <= TRITON_MAX_SINKS)


def triton_dot_precision(dtype) -> str:
    """tl.dot's input_precision in the own Triton kernels: fp32 inputs get exact fp32 dots ("ieee"), as PyTorch's
    matmul does by default (Triton's default would be TF32); bf16/fp16 inputs, which TF32 holds exactly, may take
    TF32 tensor cores where a kernel computes in fp32. The interpreter ignores it."""
    return "ieee" if dtype.itemsize >= 4 else "tf32"


def triton_mlstm_fits(qk_head_dim: int, v_head_dim: int, chunk_size: int) -> bool:
    return min(qk_head_dim, v_head_dim) >= TRITON_MLSTM_MIN_HEAD_DIM and chunk_size in TRITON_MLSTM_CHUNKS


def tfla_fits(qk_head_dim: int, v_head_dim: int, chunk_size: int) -> bool:
    return (min(qk_head_dim, v_head_dim) >= TFLA_MIN_HEAD_DIM and qk_head_dim % 16 == 0 and v_head_dim % 16 == 0
            and chunk_size in TFLA_CHUNKS)


def flash_fits(head_dim: int) -> bool:
    return head_dim <= 256 and head_dim % 8 == 0


def check_choices(kernels: dict, *, uses_attention: bool, uses_mlstm: bool, attn_head_dim: int, n_sink: int,
                  mlstm_qk_head_dim: int, mlstm_v_head_dim: int, chunk_size: int,
                  uses_deltanet: bool = False) -> list[tuple[str, str]]:
    """(field, message) for every backend constraint the config breaks; empty when all fit. Names are checked for
    every operation; constraints only for those the model uses (n_sink: that of its sliding layers, 0 if none)."""
    problems = []
    for op, choice in kernels.items():
        if op not in CHOICES:
            problems.append((f"kernels.{op}", f"unknown operation; expected {', '.join(CHOICES)}"))
        elif choice not in CHOICES[op]:
            problems.append((f"kernels.{op}", f"must be one of {', '.join(CHOICES[op])} (got {choice!r})"))
    if problems:
        return problems
    attention = kernels["attention"] if uses_attention else "auto"
    mlstm = kernels["mlstm"] if uses_mlstm else "auto"
    if attention in ("triton", "flex", "flash") and not installed(
            {"triton": "triton", "flex": "triton", "flash": "flash_attn"}[attention]):
        problems.append(("kernels.attention", f"{attention} needs the package "
                         f"{'flash-attn' if attention == 'flash' else 'triton'}, which is not installed"))
    if attention == "triton" and not triton_attention_fits(attn_head_dim, n_sink):
        problems.append(("kernels.attention", f"triton takes head dims that are powers of two in "
                         f"{list(TRITON_SWA_HEAD_DIMS)} and at most {TRITON_MAX_SINKS} sinks "
                         f"(head dim {attn_head_dim}, n_sink {n_sink})"))
    if attention == "flash" and not flash_fits(attn_head_dim):
        problems.append(("kernels.attention",
                         f"flash takes head dims <= 256 and a multiple of 8 (got {attn_head_dim})"))
    if attention == "flash" and n_sink:
        problems.append(("kernels.attention", f"flash has no sink tokens: set n_sink 0 or use triton / flex "
                         f"(n_sink {n_sink})"))
    if mlstm == "triton" and not installed("triton"):
        problems.append(("kernels.mlstm", "triton needs the package triton, which is not installed"))
    if mlstm == "triton" and not triton_mlstm_fits(mlstm_qk_head_dim, mlstm_v_head_dim, chunk_size):
        problems.append(("kernels.mlstm", f"triton takes head dims >= {TRITON_MLSTM_MIN_HEAD_DIM} and chunk_size in "
                         f"{TRITON_MLSTM_CHUNKS} (q/k head dim {mlstm_qk_head_dim}, v head dim {mlstm_v_head_dim}, "
                         f"chunk {chunk_size})"))
    if mlstm == "tfla" and not installed("mlstm_kernels"):
        problems.append(("kernels.mlstm", "tfla needs the package mlstm_kernels, which is not installed (bash "
                         "setup.sh tfla, or the gpu extra)"))
    if mlstm == "tfla" and not tfla_fits(mlstm_qk_head_dim, mlstm_v_head_dim, chunk_size):
        problems.append(("kernels.mlstm", f"tfla takes head dims that are multiples of 16 and chunk_size in "
                         f"{TFLA_CHUNKS} (q/k head dim {mlstm_qk_head_dim}, v head dim {mlstm_v_head_dim}, "
                         f"chunk {chunk_size})"))
    if uses_deltanet and kernels["deltanet"] == "fla" and not installed("fla"):
        problems.append(("kernels.deltanet", "fla needs the package flash-linear-attention, which is not installed"))
    return problems


def effective_choices(kernels: dict) -> dict:
    """The backend each operation will be asked for: SWAX_KERNELS when set (`triton` meaning fla's Triton kernels for
    the gated delta rule), else the config's choice."""
    env = env_override()
    if env is None:
        return dict(kernels)
    return {op: "fla" if op == "deltanet" and env == "triton" else env for op in kernels}


def check_run(kernels: dict, *, uses_attention: bool, uses_mlstm: bool, uses_deltanet: bool, attn_head_dim: int,
              on_cuda: bool, fp32: bool, training: bool) -> list[tuple[str, str]]:
    """(field, message) for every chosen backend the run cannot use on its device and precision (the trainer's,
    known at start-up): the GPU-only backends on a CPU trainer (the Triton kernels run there only through the
    interpreter, TRITON_INTERPRET=1, set for tests), FlexAttention's missing CPU backward in training, and the
    Triton SWA in fp32 above head dim 128 (refused by the kernel on every device)."""
    chosen = effective_choices(kernels)
    source = f" (SWAX_KERNELS={env_override()})" if env_override() else ""
    used = {"attention": uses_attention, "mlstm": uses_mlstm, "deltanet": uses_deltanet}
    interpreter = os.environ.get("TRITON_INTERPRET") == "1"
    problems = []
    for op, choice in chosen.items():
        if not used.get(op):
            continue
        needs_gpu = {"flash": "flash-attn's kernels",
                     "fla": "fla's kernels (they do not run in the Triton interpreter)",
                     "triton": None if interpreter else "the own Triton kernels (the CPU runs them only through the "
                                                        "interpreter, TRITON_INTERPRET=1, for tests)",
                     "tfla": None if interpreter else "TFLA's Triton kernels (the CPU runs them only through the "
                                                      "interpreter, TRITON_INTERPRET=1, for tests)"}.get(choice)
        if needs_gpu and not on_cuda:
            problems.append((f"kernels.{op}", f"{choice}{source} needs a CUDA GPU for {needs_gpu}, and the trainer "
                             f"runs on the CPU: use auto or torch, or --trainer.accelerator gpu"))
        if op == "attention" and choice == "flex" and training and not on_cuda:
            problems.append(("kernels.attention", f"flex{source} has no backward on the CPU (FlexAttention): fit on "
                             f"the CPU with auto, torch or sdpa"))
    if (uses_attention and chosen["attention"] == "triton" and fp32
            and attn_head_dim > TRITON_FP32_MAX_HEAD_DIM):
        problems.append(("kernels.attention", f"triton{source} in fp32 takes head dims up to "
                         f"{TRITON_FP32_MAX_HEAD_DIM} (got {attn_head_dim}; its backward would need more shared "
                         f"memory than a GPU has): train in bf16-mixed, or use auto, torch or flex"))
    return problems


def attention_backend(choice: str, *, is_cuda: bool, dtype, head_dim: int, T: int, window: int | None,
                      n_sink: int) -> str:
    """The concrete attention backend for one call: torch | triton | flash | flex | sdpa | causal."""
    choice = env_override() or choice
    full = window is None or window >= T
    if choice != "auto":
        return choice
    if full:
        return "causal"
    if not is_cuda:
        return "torch"
    import torch

    n_sink = min(n_sink, T)
    if n_sink == 0 and installed("flash_attn") and dtype in (torch.float16, torch.bfloat16) and flash_fits(head_dim):
        return "flash"
    return "triton" if triton_attention_fits(head_dim, n_sink, dtype) else "torch"


def mlstm_backend(choice: str, *, is_cuda: bool, qk_head_dim: int, v_head_dim: int, chunk_size: int) -> str:
    """The concrete mLSTM backend for one call: torch | triton | tfla."""
    choice = env_override() or choice
    if choice != "auto":
        return choice
    if not is_cuda:
        return "torch"
    fits = {"triton": triton_mlstm_fits(qk_head_dim, v_head_dim, chunk_size),
            "tfla": installed("mlstm_kernels") and tfla_fits(qk_head_dim, v_head_dim, chunk_size)}
    measured = MLSTM_AUTO_MEASURED.get((qk_head_dim, v_head_dim))
    if measured and fits[measured]:
        return measured
    return "triton" if fits["triton"] else "torch"


def deltanet_backend(choice: str, *, is_cuda: bool) -> str:
    """The concrete gated-delta backend for one call: torch | fla."""
    choice = env_override() or choice
    if choice == "triton":  # the override names Triton kernels: fla's
        if not installed("fla"):
            raise NotImplementedError("SWAX_KERNELS=triton: the gated delta rule's Triton kernels are fla's; install "
                                      "flash-linear-attention, or use auto or torch")
        return "fla"
    if choice == "auto":
        return "fla" if is_cuda and installed("fla") else "torch"
    return choice
