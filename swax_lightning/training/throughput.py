"""TokenThroughput: Lightning's ThroughputMonitor counting tokens and model FLOPs, nameable in a YAML config.

ThroughputMonitor needs two functions (batch -> sequences, batch -> items), which a YAML file cannot hold, and reads
`flops_per_batch` from the LightningModule on every step for FLOP/s and MFU. This subclass fixes the functions for
[B, T+1] token blocks and sets `flops_per_batch` before each step's update from an analytic count at the window that
step actually trained with (the stochastic arms train mostly at short windows, so one count at the config window
would overstate MFU). It logs train/device/items_per_sec (tokens/s per device), train/items_per_sec (all devices),
samples_per_sec and, on GPUs Lightning knows, flops/mfu. Lightning 2.6's table names the H200 only as "H200 SXM1" /
"NVL1", so a GPU that calls itself "NVIDIA H200" got no MFU: its dense peaks are filled in here (the H100 SXM's, the
same chip with more memory, per NVIDIA's datasheet). Prediction (prompt strings, generation) is not counted.

The count (`analytic_flops`): forward = 2 FLOPs per multiply-add of every weight matrix touched per token (all
linear layers and the LM head; the embedding is a lookup) plus the sequence mixers' own work; forward + backward =
3 x forward. Attention: 4 * head_dim FLOPs per query head per visible (query, key) pair, the pairs being those of the
causal window plus sinks (what an O(T * W) kernel computes, not the masked-out work of a dense path). mLSTM and Gated
DeltaNet chunkwise: per token and head 2 * chunk * (dqk + dv) for the intra-chunk products and 4 * dqk * dv for the
state read and update.
"""
from __future__ import annotations

import torch
from lightning.pytorch.callbacks import ThroughputMonitor

from swax_lightning.model.config import ModelConfig
from swax_lightning.model.layers import LAYERS
from swax_lightning.model.model import SWAXModel


def _blocks(batch) -> torch.Tensor:
    """The [B, T+1] token blocks of a training batch or of a held-out one ({"tokens", "weight"}, data/datamodule.py)."""
    return batch["tokens"] if isinstance(batch, dict) else batch


def _sequences(batch) -> int:
    return _blocks(batch).shape[0]


def _tokens(batch) -> int:
    blocks = _blocks(batch)
    return blocks.shape[0] * (blocks.shape[1] - 1)


def analytic_flops(cfg: ModelConfig, batch_size: int, seq_len: int, window: int | None = None) -> int:
    """Forward + backward FLOPs of one [batch_size, seq_len] batch with the sliding layers at `window` (default: the
    config's)."""
    window = cfg.window if window is None else window
    with torch.device("meta"):
        model = SWAXModel(cfg)
    matmul_params = sum(p.numel() for name, p in model.named_parameters() if p.dim() == 2 and name != "embed.weight")
    if cfg.tie_embeddings:
        matmul_params += model.lm_head.weight.numel()  # shared with the embedding, but still a matmul
    per_sequence = 2 * matmul_params * seq_len
    per_sequence += sum(LAYERS[letter].mixing_flops(cfg, seq_len, window) for letter in cfg.layer_kinds)
    return 3 * per_sequence * batch_size


# Dense peak FLOP/s of an H200 (SXM) by the precision's prefix ("bf16-mixed" -> "bf16"): the H100 SXM's figures.
H200_PEAK_FLOPS = {"bf16": 989.4e12, "16": 989.4e12, "32": 66.9e12, "64": 33.5e12}


def h200_peak_flops(device_name: str, precision: str) -> float | None:
    """The peak Lightning's table lacks for a device named like "NVIDIA H200"; None for any other device."""
    if "h200" not in device_name.lower():
        return None
    return H200_PEAK_FLOPS.get(str(precision).split("-")[0])


class TokenThroughput(ThroughputMonitor):
    """Args: window_size: number of batches the rates are averaged over."""

    def __init__(self, window_size: int = 20):
        super().__init__(batch_size_fn=_sequences, length_fn=_tokens, window_size=window_size)
        self._counts: dict[tuple, int] = {}  # (batch, seq_len, window) -> FLOPs: a stochastic arm cycles a few

    def on_predict_start(self, trainer, pl_module) -> None:
        """Prediction batches are prompt strings, not token blocks: nothing to count."""

    def on_predict_batch_end(self, *args, **kwargs) -> None:
        """See on_predict_start."""

    def setup(self, trainer, pl_module, stage: str) -> None:
        data = trainer.datamodule
        if getattr(pl_module, "flops_per_batch", None) is None and hasattr(data, "seq_len"):
            pl_module.flops_per_batch = analytic_flops(pl_module.arch, data.batch_size, data.seq_len)
        super().setup(trainer, pl_module, stage)
        device = trainer.strategy.root_device
        if self.available_flops is None and device.type == "cuda":
            self.available_flops = h200_peak_flops(torch.cuda.get_device_name(device), trainer.precision)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx: int) -> None:
        """Counts this step at the window it trained with (set by the window schedule at the step's start)."""
        key = (batch.shape[0], batch.shape[1] - 1, pl_module.model.window if pl_module.model is not None else None)
        if key not in self._counts:
            self._counts[key] = analytic_flops(pl_module.arch, *key)
        pl_module.flops_per_batch = self._counts[key]
        super().on_train_batch_end(trainer, pl_module, outputs, batch, batch_idx)
