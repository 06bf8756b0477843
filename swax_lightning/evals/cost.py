"""What an evaluation suite will cost, said before it starts: prompts and tokens per evaluation, and a time estimate
from this machine's measured speed on this model.

Decisions:
- Tokens are counted from the settings alone, by each evaluation's `workload` (a NIAH or BABILong prompt is as long
  as its length; perplexity reads its samples; the recall buckets read about their upper edge; an MQAR episode is
  as long as its text in bytes), so the count is exact up to the prompts' tails (and, for MQAR, the tokenizer's
  compression).
- Speed is measured, not assumed: one prefill chunk and a few decode steps of the model itself, on random ids, a
  second or so. Attention layers cost more per token at longer contexts and a full-attention layer's cache grows, so
  the estimate is a lower bound for full attention and close for SWA and recurrent layers.
- An evaluation without a workload (lm-evaluation-harness tasks: their size is the harness's business) is listed
  as not estimated.
"""
from __future__ import annotations

import time

import torch

from swax_lightning.model.inference import prefill

DECODE_STEPS = 8


def workload(suite) -> dict[str, tuple[int, int, int] | None]:
    """{evaluation title: (prompts, prompt tokens, generated tokens at most), or None where not estimated} of an
    EvalSuite's evaluations."""
    return {evaluation.title: evaluation.workload() for evaluation in suite.evaluations}


@torch.no_grad()
def measured_speed(model, chunk_len: int) -> tuple[float, float]:
    """(prefill tokens/s, decode tokens/s) of `model` here: one chunk of min(chunk_len, 2048) random ids, then
    DECODE_STEPS single-token steps, after a short warm-up (the first calls pay one-time costs)."""
    n = min(chunk_len, 2048)
    device = model.embed.weight.device
    ids = torch.randint(0, model.cfg.vocab_size, (1, n), device=device)
    for length in (64, 1):  # warm-up: one chunk and one decode step
        prefill(model, ids[:, :length], torch.arange(length, device=device)[None],
                model.new_caches(1, dtype=model.embed.weight.dtype), chunk_len)
    caches = model.new_caches(1, dtype=model.embed.weight.dtype)
    start = time.perf_counter()
    prefill(model, ids, torch.arange(n, device=device)[None], caches, chunk_len)
    prefill_speed = n / (time.perf_counter() - start)
    start = time.perf_counter()
    for step in range(DECODE_STEPS):
        model(ids[:, :1], caches, torch.tensor([[n + step]], device=device))
    return prefill_speed, DECODE_STEPS / (time.perf_counter() - start)


def estimate(suite, model) -> str:
    """The lines printed before a suite runs: each evaluation's prompts and tokens, and the time they should take."""
    jobs = workload(suite)
    if not jobs:
        return ""
    prefill_speed, decode_speed = measured_speed(model, suite.chunk_len)
    lines, total = [f"evaluation cost (this machine: {prefill_speed:,.0f} prompt tokens/s, "
                    f"{decode_speed:,.1f} generated tokens/s on this model):"], 0.0
    for name, job in jobs.items():
        if job is None:
            lines.append(f"  {name}: not estimated")
            continue
        prompts, tokens, generated = job
        seconds = tokens / prefill_speed + generated / decode_speed
        total += seconds
        lines.append(f"  {name}: {prompts:,} prompts, {tokens / 1e6:,.2f}M tokens, about {_duration(seconds)}")
    lines.append(f"  total: about {_duration(total)} (at least, with full-attention layers)")
    return "\n".join(lines)


def _duration(seconds: float) -> str:
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"
