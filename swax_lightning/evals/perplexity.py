"""Perplexity and bits per byte on held-out shards, by token position: does the loss keep falling beyond the window
and beyond the training length?

Sequences of `length` tokens are read from the validation shards (litdata, TokensLoader with a longer block than in
training) and streamed through the model in chunks with the inference state carried (bounded memory at any length).
The next-token loss is accumulated per position bucket [0, 64), [64, 128), [128, 256), ... (powers of two).

Decision: bits per byte uses the bytes per token measured on the same held-out text (the data module's meta.json).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch
from litdata import StreamingDataset
from tqdm import tqdm

from swax_lightning.core.errors import require
from swax_lightning.data.loss_mask import unmarked
from swax_lightning.evals.registry import Evaluation, register
from swax_lightning.evals.reports import section_table
from swax_lightning.evals.scoring import token_scores
from swax_lightning.model.model import SWAXModel


def bucket_edges(length: int, first: int = 64) -> list[int]:
    edges = [0, first]
    while edges[-1] < length:
        edges.append(min(2 * edges[-1], length))
    return edges


@torch.no_grad()
def position_losses(model: SWAXModel, dataset: StreamingDataset, n_blocks: int, length: int, samples: int,
                    chunk_len: int = 2048, bytes_per_token: float = 1.0) -> list[dict]:
    """Mean loss (nats), perplexity and bits per byte per position bucket over the first `samples` sequences of
    `length` (`dataset`: blocks of length + 1 tokens, e.g. TextDataModule.blocks("val", length + 1); `n_blocks`: how
    many the whole split holds, TextDataModule.block_count: under a process group len(dataset) is one rank's share,
    while dataset[i] is block i of the whole split)."""
    if n_blocks == 0:
        raise ValueError(f"no sequence of {length + 1} tokens in {dataset.input_dir.url or dataset.input_dir.path}: "
                         f"lower eval.perplexity.length")
    edges = bucket_edges(length)
    total, count = torch.zeros(len(edges) - 1, dtype=torch.float64), torch.zeros(len(edges) - 1)
    bucket_of = torch.bucketize(torch.arange(length), torch.tensor(edges[1:]), right=True)
    device = model.embed.weight.device
    for i in tqdm(range(min(samples, n_blocks)), desc=f"perplexity@{length}", leave=False):
        tokens = unmarked(torch.as_tensor(np.asarray(dataset[i], dtype=np.int64), device=device)[None])
        logprob, _ = token_scores(model, tokens[:, :length], torch.arange(length, device=device)[None],
                                  tokens[:, 1:length + 1], chunk_len)
        loss = -logprob[0].cpu()
        total.index_add_(0, bucket_of, loss)
        count.index_add_(0, bucket_of, torch.ones(length))
    rows = []
    for b in range(len(edges) - 1):
        mean = float(total[b] / count[b])
        rows.append({"from": edges[b], "to": edges[b + 1], "loss": mean, "ppl": math.exp(mean),
                     "bpb": mean / math.log(2) / bytes_per_token})
    return rows


@dataclass
class PerplexitySettings:
    """Loss by position on the held-out shards.

    Args:
        length: Sequence length (tokens) read from the validation split, e.g. 8x the training length.
        samples: Sequences.
    """

    length: int = 8192
    samples: int = 8

    def __post_init__(self) -> None:
        require(self.length >= 1, "eval.perplexity.length", "must be >= 1", self.length)
        require(self.samples >= 1, "eval.perplexity.samples", "must be >= 1", self.samples)


@register
class Perplexity(Evaluation):
    name, title, order, Settings = "perplexity", "perplexity by position", 30, PerplexitySettings
    scalar_rows = (None, "eval/ppl_by_position/{from}-{to}", {"loss": "loss", "bpb": "bpb"})

    def workload(self) -> tuple[int, int, int]:
        return self.settings.samples, self.settings.samples * self.settings.length, 0

    def run(self, model, data, samples: list) -> list[dict]:
        block = self.settings.length + 1
        return position_losses(model, data.blocks("val", block), data.block_count("val", block), self.settings.length,
                               self.settings.samples, self.context.chunk_len, data.meta.get("bytes_per_token", 1.0))

    @classmethod
    def report(cls, section: list[dict]) -> list[str]:
        rows = [[f"{r['from']}-{r['to']}", f"{r['loss']:.4f}", f"{r['ppl']:.3f}", f"{r['bpb']:.4f}"] for r in section]
        return section_table("Loss by position", "", ["positions", "loss", "ppl", "bits/byte"], rows)
