"""Analytic FLOPs: the attention pair count against the mask, the matmul part against torch's FLOP counter, and the
count Lightning reads each step following the window that step trained with."""
from types import SimpleNamespace

import pytest
import torch
from lightning.pytorch.callbacks import ThroughputMonitor
from torch.utils.flop_counter import FlopCounterMode

from swax_lightning.kernels import sliding_window_mask
from swax_lightning.model.config import ModelConfig
from swax_lightning.model.layers import visible_pairs
from swax_lightning.model.model import SWAXModel
from swax_lightning.training.throughput import TokenThroughput, analytic_flops, h200_peak_flops

CFG = dict(d_model=64, n_heads=2, mlstm_heads=2, chunk_size=16, n_layers=2)


@pytest.mark.parametrize("T,W,n_sink", [(50, 7, 0), (50, 7, 3), (50, 1, 60), (50, 49, 4), (50, None, 0),
                                        (50, 80, 2), (10, 3, 10)])
def test_visible_pairs_counts_the_mask(T, W, n_sink):
    assert visible_pairs(T, W, n_sink) == int(sliding_window_mask(T, W, n_sink).sum())


def test_linear_part_matches_torch_flop_counter():
    # torch's counter sees the matmuls (aten.mm) but not the CPU attention kernel: compare without attention.
    cfg = ModelConfig(**CFG, pattern="A")
    T, B = 32, 3
    model = SWAXModel(cfg)
    with FlopCounterMode(display=False) as counter:
        model(torch.zeros(B, T, dtype=torch.long)).sum().backward()
    assert set(map(str, counter.get_flop_counts()["Global"])) == {"aten.mm"}
    attention = 3 * 4 * cfg.attn_head_dim * cfg.n_heads * visible_pairs(T, None, 0) * B * cfg.n_layers
    assert analytic_flops(cfg, B, T) - attention == counter.get_total_flops()


def test_count_grows_with_window_and_follows_the_step(monkeypatch):
    cfg = ModelConfig(**CFG, pattern="SX", window=512)
    short, long = analytic_flops(cfg, 2, 1024, 128), analytic_flops(cfg, 2, 1024, 512)
    assert short < long == analytic_flops(cfg, 2, 1024)
    seen = []  # what Lightning's monitor reads from the module when the step ends
    monkeypatch.setattr(ThroughputMonitor, "on_train_batch_end",
                        lambda self, trainer, module, *args: seen.append(module.flops_per_batch))
    monitor = TokenThroughput()
    module = SimpleNamespace(arch=cfg, model=SWAXModel(cfg), flops_per_batch=None)
    batch = torch.zeros(2, 1025, dtype=torch.long)
    for window in (128, 512, 128):
        module.model.set_window(window)
        monitor.on_train_batch_end(None, module, None, batch, 0)
    assert seen == [short, long, short]


def test_h200_gets_the_peak_lightning_lacks():
    # Lightning's own lookup returns None for the name an H200 SXM reports; the fill-in gives its dense peaks by
    # precision and stays out of the way for every other device.
    from lightning.fabric.utilities.throughput import get_available_flops

    assert h200_peak_flops("NVIDIA H200", "bf16-mixed") == 989.4e12
    assert h200_peak_flops("NVIDIA H200", "32-true") == 66.9e12
    assert h200_peak_flops("NVIDIA H100 80GB HBM3", "bf16-mixed") is None
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA H200")
        assert get_available_flops(torch.device("cuda", 0), torch.bfloat16) is None  # what made MFU disappear
