"""TokenThroughput: Lightning's ThroughputMonitor counting tokens and model FLOPs, nameable in a YAML config.

ThroughputMonitor needs two functions (batch -> sequences, batch -> items), which a YAML file cannot hold, and reads
`flops_per_batch` from the LightningModule for FLOP/s and MFU. This subclass fixes the functions for [B, T+1] token
blocks and measures the FLOPs of one training batch (forward + backward) with Lightning's `measure_flops` on a meta-
device copy of the model (no memory, no compute), at the configured window. It logs train/device/items_per_sec
(tokens/s per device), train/items_per_sec (all devices), samples_per_sec and, on GPUs Lightning knows, flops/mfu.
Prediction (prompt strings, generation) is not counted.
"""
from __future__ import annotations

import torch
from lightning.fabric.utilities.throughput import measure_flops
from lightning.pytorch.callbacks import ThroughputMonitor

from swax_lightning.config import ModelConfig
from swax_lightning.model import SWAXModel


def _sequences(batch) -> int:
    return batch.shape[0]


def _tokens(batch) -> int:
    return batch.shape[0] * (batch.shape[1] - 1)


def flops_per_batch(cfg: ModelConfig, batch_size: int, seq_len: int) -> int:
    """Forward + backward FLOPs of one [batch_size, seq_len] batch at the config's window, counted on meta."""
    with torch.device("meta"):
        meta = SWAXModel(cfg)
        idx = torch.zeros(batch_size, seq_len, dtype=torch.long)
    return measure_flops(meta, lambda: meta(idx), lambda logits: logits.sum())


class TokenThroughput(ThroughputMonitor):
    """Args: window_size: number of batches the rates are averaged over."""

    def __init__(self, window_size: int = 20):
        super().__init__(batch_size_fn=_sequences, length_fn=_tokens, window_size=window_size)

    def on_predict_start(self, trainer, pl_module) -> None:
        """Prediction batches are prompt strings, not token blocks: nothing to count."""

    def on_predict_batch_end(self, *args, **kwargs) -> None:
        """See on_predict_start."""

    def setup(self, trainer, pl_module, stage: str) -> None:
        data = trainer.datamodule
        if getattr(pl_module, "flops_per_batch", None) is None and hasattr(data, "seq_len"):
            pl_module.flops_per_batch = flops_per_batch(pl_module.arch, data.batch_size, data.seq_len)
        super().setup(trainer, pl_module, stage)
