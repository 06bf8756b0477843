"""Time full training steps of a model config on one GPU and print its MFU (one JSON line).

    python benchmarks/train_step.py --config configs/base/model_1.4b.yaml --seq 16384 --window 2048
    python benchmarks/train_step.py --device cpu --dtype float32 --seq 256 --batch 1 \\
        --config configs/base/tiny_model.yaml        # smoke test of the script itself

One step = forward with the chunked loss + backward + AdamW, bf16 autocast with fp32 weights (what bf16-mixed
training does), activation checkpointing on every block (--no_checkpointing to switch it off), kernels as the config
chooses them (auto) unless --kernels names some (e.g. mlstm=tfla), every block compiled with torch.compile under
--compile (the Triton kernels inside stay as they are). The figure is the median of --steps timed steps after
--warmup untimed ones. MFU = analytic FLOPs of the step at the window used (training/throughput.py) / time /
--peak_tflops (H200 / H100 SXM dense bf16: 989). Peak memory is torch.cuda.max_memory_allocated.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from swax_lightning.model.config import ModelConfig  # noqa: E402
from swax_lightning.training.parallel import build_local  # noqa: E402
from swax_lightning.training.throughput import analytic_flops  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default="configs/base/model_1.4b.yaml", help="a model YAML with an arch: section")
    parser.add_argument("--seq", type=int, default=16384)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--window", type=int, default=None, help="training window (default: the config's)")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--no_checkpointing", action="store_true")
    parser.add_argument("--peak_tflops", type=float, default=989.0)
    parser.add_argument("--kernels", nargs="+", default=[], metavar="OP=BACKEND",
                        help="backends over the config's, e.g. mlstm=tfla")
    parser.add_argument("--compile", action="store_true", help="torch.compile every block")
    args = parser.parse_args()
    arch = yaml.safe_load(Path(args.config).read_text())["arch"]
    arch["kernels"] = {**arch.get("kernels", {}), **dict(choice.split("=", 1) for choice in args.kernels)}
    cfg = ModelConfig(**arch)
    window = args.window or cfg.window
    with torch.device(args.device):
        model = build_local(cfg, seed=0, activation_checkpointing=not args.no_checkpointing)
    model.set_window(window)
    if args.compile:
        for block in model.blocks:
            block.compile()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=args.device == "cuda")
    data = torch.randint(0, cfg.vocab_size, (args.batch, args.seq + 1), device=args.device)
    dtype = getattr(torch, args.dtype)
    sync = torch.cuda.synchronize if args.device == "cuda" else (lambda: None)

    def step() -> float:
        sync()
        start = time.perf_counter()
        with torch.autocast(args.device, dtype=dtype, enabled=dtype != torch.float32):
            loss = model(data[:, :-1], targets=data[:, 1:])
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        sync()
        return time.perf_counter() - start

    for _ in range(args.warmup):
        step()
    if args.device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    seconds = statistics.median(step() for _ in range(args.steps))
    flops = analytic_flops(cfg, args.batch, args.seq, window)
    print(json.dumps({
        "config": args.config, "params": sum(p.numel() for p in model.parameters()), "batch": args.batch,
        "seq": args.seq, "window": window, "activation_checkpointing": not args.no_checkpointing,
        "kernels": cfg.kernels, "compile": args.compile, "step_s": round(seconds, 4),
        "tokens_per_s": round(args.batch * args.seq / seconds),
        "tflops_per_s": round(flops / seconds / 1e12, 1), "mfu": round(flops / seconds / 1e12 / args.peak_tflops, 4),
        "peak_memory_gib": round(torch.cuda.max_memory_allocated() / 2**30, 2) if args.device == "cuda" else None}))


if __name__ == "__main__":
    main()
