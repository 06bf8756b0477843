"""TokenThroughput: Lightning's ThroughputMonitor counting tokens, so it can be named in a YAML config.

ThroughputMonitor needs two functions (batch -> sequences, batch -> items), which a YAML file cannot hold. This
subclass fixes them for [B, T+1] token blocks: it logs train/device/items_per_sec (tokens/s per device),
train/items_per_sec (all devices) and samples_per_sec, every `log_every_n_steps`.
"""
from __future__ import annotations

from lightning.pytorch.callbacks import ThroughputMonitor


def _sequences(batch) -> int:
    return batch.shape[0]


def _tokens(batch) -> int:
    return batch.shape[0] * (batch.shape[1] - 1)


class TokenThroughput(ThroughputMonitor):
    """Args: window_size: number of batches the rate is averaged over."""

    def __init__(self, window_size: int = 20):
        super().__init__(batch_size_fn=_sequences, length_fn=_tokens, window_size=window_size)
