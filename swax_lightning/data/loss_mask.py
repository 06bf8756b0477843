"""Context-only tokens: tokens a training document gives the model to read, not to predict.

An associative-recall document (mqar_episodes.py) is scored on its queried values only, as MQAR is trained
(Zoology, Arora et al. 2023): its keys, stated values and filler are random by design, and scoring them buries the
recall signal under noise that no model can learn. Measured here (docs/window-study.md): the stochastic arm on
such documents, scored on every token, was still at chance beyond the long window after 1,500 steps; scored on the
queried values, it answered 17-20% there (chance 3.8%) after 1,000.

The training shards mark a context-only token by adding CONTEXT_ONLY to its id (such shards are int32); the
training step reads the ids without the mark and leaves the marked targets out of the loss. Text documents carry no
mark, and validation and test splits hold no recall document, so their losses are the plain next-token loss.
"""
from __future__ import annotations

import torch

from swax_lightning.kernels.ce.chunked import IGNORE_INDEX

CONTEXT_ONLY = 1 << 30  # above every vocabulary; ids + CONTEXT_ONLY fit in int32


def mark(ids: list[int], scored: bool) -> list[int]:
    """The ids as stored in a shard: unchanged when scored, else marked context-only."""
    return ids if scored else [i + CONTEXT_ONLY for i in ids]


def unmarked(batch: torch.Tensor) -> torch.Tensor:
    """The token ids of a stored batch, context-only marks removed (int64)."""
    batch = batch.long()
    return torch.where(batch < CONTEXT_ONLY, batch, batch - CONTEXT_ONLY)


def inputs_and_targets(batch: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """A [B, T+1] block batch as (inputs [B, T], targets [B, T]): ids without marks, and the next ids with every
    context-only one replaced by IGNORE_INDEX."""
    ids, scored = unmarked(batch), batch.long() < CONTEXT_ONLY
    return ids[:, :-1], torch.where(scored[:, 1:], ids[:, 1:], IGNORE_INDEX)
