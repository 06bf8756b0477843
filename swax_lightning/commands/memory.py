"""Training-memory estimate per GPU: parameters, gradients, optimizer state and activations, with and without
activation checkpointing, for a run config.

    python -m swax_lightning memory --config configs/7b_stochastic.yaml
    python -m swax_lightning memory --config configs/1.4b_stochastic.yaml --window 2048 --batch 4

Decisions:
- Weights, gradients and AdamW state are arithmetic: fp32 master weights, fp32 gradients and two fp32 moments, each
  sharded by FSDP2 over num_nodes x devices ranks (the trainer file), plus the bf16 weights of two blocks gathered at
  a time (the one computing and the one prefetched).
- Activations are counted, not modelled: the model's forward runs on the meta device (no memory, no compute) at the
  real batch and length, and every tensor autograd saves for the backward is added up once per storage (parameters
  excluded). The GPU kernels' saved sets stand in for the PyTorch paths there: attention saves q, k, v, the output
  and a fp32 log-sum-exp per query (flash-attn, FlexAttention and the own Triton kernel alike, any window); the
  Triton mLSTM saves q, k, v, its fp32 gate rows and the fp32 state entering every chunk (unless
  `mlstm_recompute_states` is on); fla's gated delta rule saves q, k, v, its fp32 gates and intra-chunk matrix. The
  stand-ins enter through the kernel dispatch's own hook (`kernels.substituted`), not by patching the layers.
  Under bf16-mixed the activations are bf16 where the model computes in bf16.
- With activation checkpointing each block keeps only its input, and one block at a time is recomputed in the
  backward: outside-block activations + n_layers x block input + the largest block's activations.
- `measured=True` (device cpu) traces the real CPU kernels instead, for the test that checks the count against the
  peak resident memory of a real forward pass.
"""
from __future__ import annotations

import argparse
import contextlib
from dataclasses import dataclass
from pathlib import Path

import torch

from swax_lightning import kernels
from swax_lightning.commands.cli import read_run_config
from swax_lightning.model.config import ModelConfig
from swax_lightning.model.model import SWAXModel

GIB = 2**30


class _FlashLikeAttention(torch.autograd.Function):
    """What a fused attention kernel keeps for its backward: q, k, v, the output and a fp32 LSE per query."""

    @staticmethod
    def forward(ctx, q, k, v):
        out = torch.empty_like(q)
        lse = q.new_empty(q.shape[:3], dtype=torch.float32)
        ctx.save_for_backward(q, k, v, out, lse)
        return out

    @staticmethod
    def backward(ctx, grad):
        q, k, v, *_ = ctx.saved_tensors
        return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)


class _TritonLikeMLSTM(torch.autograd.Function):
    """What kernels/mlstm/triton.py keeps: q, k, v, fp32 gate rows (3 x [B, H, T] + m and n per step) and, unless
    the config recomputes them (mlstm_recompute_states), the fp32 state (C, m) entering every chunk."""

    @staticmethod
    def forward(ctx, q, k, v, i_pre, f_pre, chunk_size, recompute_states):
        B, T, H, DQK = q.shape
        chunks = -(-T // chunk_size)
        f32 = dict(dtype=torch.float32, device=q.device)
        saved = [torch.empty(B, H, T, **f32) for _ in range(4)]
        if not recompute_states:
            saved += [torch.empty(B, H, chunks, DQK, v.shape[-1], **f32), torch.empty(B, H, chunks, **f32)]
        ctx.save_for_backward(q, k, v, f_pre, *saved)
        return torch.empty_like(v)

    @staticmethod
    def backward(ctx, grad):
        q, k, v, f_pre = ctx.saved_tensors[:4]
        return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v), torch.empty_like(f_pre), \
            torch.empty_like(f_pre), None, None


class _FlaLikeDeltaNet(torch.autograd.Function):
    """What fla's chunk_gated_delta_rule keeps: q, k, v, the fp32 gates (beta, cumulative g) and its fp32 intra-chunk
    matrix A [B, T, H, 64]; it recomputes the chunk states in its backward."""

    @staticmethod
    def forward(ctx, q, k, v, beta, g):
        B, T, H, _ = q.shape
        f32 = dict(dtype=torch.float32, device=q.device)
        ctx.save_for_backward(q, k, v, beta.float(), g.float(), torch.empty(B, T, H, 64, **f32))
        return torch.empty_like(v)

    @staticmethod
    def backward(ctx, grad):
        q, k, v, beta, g, _ = ctx.saved_tensors
        return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v), torch.empty_like(beta), \
            torch.empty_like(g)


def _gpu_attention(q, k, v, window, n_sink, scale):
    return _FlashLikeAttention.apply(q, k, v)


def _gpu_mlstm(q, k, v, i_pre, f_pre, initial_state, chunk_size, recompute_states):
    return _TritonLikeMLSTM.apply(q, k, v, i_pre, f_pre, chunk_size, recompute_states), None


def _gpu_deltanet(q, k, v, beta, g, initial_state, chunk_size):
    return _FlaLikeDeltaNet.apply(q, k, v, beta, g), None


def _gpu_kernels():
    """The layers' kernels replaced, through the dispatch's own hook, by the GPU kernels' saved-tensor stand-ins."""
    return kernels.substituted(attention=_gpu_attention, mlstm=_gpu_mlstm, deltanet=_gpu_deltanet)


def _storage_key(t: torch.Tensor):
    return t.untyped_storage()._cdata


def saved_activation_bytes(cfg: ModelConfig, batch: int, seq_len: int, window: int | None, dtype: torch.dtype,
                           device: str = "meta") -> tuple[int, list[int]]:
    """(bytes saved outside the blocks, [bytes saved inside each block]) for one training forward with the loss."""
    with torch.device(device):
        model = SWAXModel(cfg).to(dtype)
    if window is not None:
        model.set_window(window)
    params = {_storage_key(p) for p in model.parameters()}
    seen: dict = {}  # storage key -> the tensor, held so that no counted storage is freed and its key reused
    current = [None]
    per_block = [0] * len(model.blocks)
    outside = [0]

    def pack(t: torch.Tensor):
        key = _storage_key(t)
        if key not in params and key not in seen:
            seen[key] = t
            size = t.untyped_storage().nbytes()
            if current[0] is None:
                outside[0] += size
            else:
                per_block[current[0]] += size
        return t

    hooks = []
    for i, block in enumerate(model.blocks):
        hooks.append(block.register_forward_pre_hook(lambda m, a, i=i: current.__setitem__(0, i)))
        hooks.append(block.register_forward_hook(lambda m, a, o: current.__setitem__(0, None)))
    idx = torch.zeros(batch, seq_len, dtype=torch.long, device=device)
    kernels = _gpu_kernels() if device == "meta" else contextlib.nullcontext()
    with kernels, torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss = model(idx, targets=idx)
    for h in hooks:
        h.remove()
    del loss
    return outside[0], per_block


@dataclass
class Estimate:
    params: int
    shards: int
    weights_gib: float
    grads_gib: float
    optimizer_gib: float
    gathered_gib: float
    activations_gib: float
    activations_checkpointed_gib: float

    def total(self, checkpointing: bool) -> float:
        act = self.activations_checkpointed_gib if checkpointing else self.activations_gib
        return self.weights_gib + self.grads_gib + self.optimizer_gib + self.gathered_gib + act


def estimate(cfg: ModelConfig, batch: int, seq_len: int, shards: int = 1, window: int | None = None,
             compute_dtype: torch.dtype = torch.bfloat16) -> Estimate:
    with torch.device("meta"):
        model = SWAXModel(cfg)
    n = sum(p.numel() for p in model.parameters())
    block_params = max(sum(p.numel() for p in b.parameters()) for b in model.blocks)
    outside, per_block = saved_activation_bytes(cfg, batch, seq_len, window, compute_dtype)
    block_input = batch * seq_len * cfg.d_model * torch.empty((), dtype=compute_dtype).element_size()
    checkpointed = outside + len(per_block) * block_input + max(per_block)
    return Estimate(params=n, shards=shards, weights_gib=4 * n / shards / GIB, grads_gib=4 * n / shards / GIB,
                    optimizer_gib=8 * n / shards / GIB,
                    gathered_gib=(2 * 2 * block_params / GIB) if shards > 1 else 0.0,
                    activations_gib=(outside + sum(per_block)) / GIB, activations_checkpointed_gib=checkpointed / GIB)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", required=True, type=Path)
    parser.add_argument("--batch", type=int, help="sequences per GPU (default: the data section's batch_size)")
    parser.add_argument("--seq_len", type=int, help="default: the data section's seq_len")
    parser.add_argument("--window", type=int, help="training window (default: the config's; the memory of a GPU "
                                                   "attention kernel does not depend on it)")
    args = parser.parse_args(argv)
    run = read_run_config(args.config)
    model, data, trainer = run["model"], run["data"], run["trainer"]
    cfg = ModelConfig(**model["arch"])
    shards = int(trainer.get("num_nodes", 1)) * int(trainer.get("devices", 1))
    batch, seq_len = args.batch or data.get("batch_size", 1), args.seq_len or data.get("seq_len", 2048)
    dtype = torch.bfloat16 if "bf16" in str(trainer.get("precision", "bf16-mixed")) else torch.float32
    e = estimate(cfg, batch, seq_len, shards, args.window, dtype)
    rows = [("parameters (fp32 master, sharded)", e.weights_gib), ("gradients (fp32, sharded)", e.grads_gib),
            ("optimizer state (AdamW, 2 x fp32, sharded)", e.optimizer_gib),
            ("gathered weights (2 blocks, bf16)", e.gathered_gib),
            ("activations, no checkpointing", e.activations_gib),
            ("activations, with activation checkpointing", e.activations_checkpointed_gib)]
    print(f"{args.config}: {e.params / 1e9:.2f}B parameters, FSDP2 over {shards} GPUs, {batch} x {seq_len} tokens "
          f"per GPU, {str(dtype).removeprefix('torch.')} activations")
    for name, gib in rows:
        print(f"  {name:<45} {gib:8.2f} GiB")
    print(f"  {'total per GPU, no checkpointing':<45} {e.total(False):8.2f} GiB")
    print(f"  {'total per GPU, with activation checkpointing':<45} {e.total(True):8.2f} GiB"
          f"{'   (the config has it on)' if model.get('activation_checkpointing') else ''}")


if __name__ == "__main__":
    main()
