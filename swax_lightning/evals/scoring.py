"""Scoring given text: the log-probability of each token after everything before it, and whether it is the model's
greedy choice, for one text at a time: the scorer behind loss by position (perplexity.py), answer loss by recall
distance (recall_loss.py) and lm-evaluation-harness log-likelihoods (lm_eval_adapter.py). MQAR (mqar.py) scores
on its own: it batches many left-padded episodes and keeps only the logits at their queries.

Decision: the text goes through the streaming inference chunk by chunk with the per-layer state carried
(inference.py), so only one chunk's logits exist at a time and a text of any length fits in bounded memory; the
result is the same as one whole-sequence forward (tested there).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from swax_lightning.kernels.util import fp32


@torch.no_grad()
def token_scores(model, idx: torch.Tensor, positions: torch.Tensor, targets: torch.Tensor, chunk_len: int,
                 scored: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(log p(targets[b, t] | idx[b, :t+1]) as fp64 [B, T], whether each target is the arg-max [B, T]) for inputs
    idx [B, T] at absolute positions [B, T] (a batch left-padded by inference.left_pad, or one text). scored [B, T]
    bool: the positions wanted, None = all; the LM head runs only there (SWAXModel.forward's logits_at), and the
    others read log p 0 and greedy True."""
    caches = model.new_caches(idx.shape[0], dtype=next(model.parameters()).dtype)
    wanted = torch.ones_like(targets, dtype=torch.bool) if scored is None else scored
    logprob = torch.zeros(targets.shape, dtype=torch.float64, device=idx.device)
    greedy = torch.ones(targets.shape, dtype=torch.bool, device=idx.device)
    for start in range(0, idx.shape[1], chunk_len):
        span = slice(start, start + chunk_len)
        want, chosen = wanted[:, span], targets[:, span][wanted[:, span]]
        logprobs = F.log_softmax(fp32(model(idx[:, span], caches, positions[:, span], logits_at=want)), -1)
        logprob[:, span][want] = logprobs.gather(-1, chosen[:, None])[:, 0].double()
        greedy[:, span][want] = logprobs.argmax(-1) == chosen
    return logprob, greedy
