"""The memory estimate: its activation count against the peak resident memory of real CPU passes of small models
(within 15%), with and without activation checkpointing; the arithmetic parts; the command on a paper config.

Resident memory tracks live tensors only when freed memory goes back to the OS: glibc raises its mmap threshold
after the first large free, and from then on freed blocks stay resident and are reused, so the growth under-reads
by whatever the warm-up left behind. The measuring child therefore runs with a fixed mmap threshold (64 KiB) and no
trimming delay: every tensor above 64 KiB is its own mapping, returned when freed."""
import json
import os
import subprocess
import sys

import pytest
import torch

from swax_lightning.commands.memory import estimate, saved_activation_bytes
from swax_lightning.model.config import ModelConfig

SMALL = dict(vocab_size=257, d_model=256, n_layers=4, n_heads=4, mlstm_heads=2, chunk_size=64, window=128)
B, T = 4, 1024

CHILD = """
import json, sys, torch
from swax_lightning.model.config import ModelConfig
from swax_lightning.training.parallel import build_local
cfg = ModelConfig(**json.loads(sys.argv[1]))
model = build_local(cfg, seed=0, activation_checkpointing=sys.argv[2] == "1")
small = torch.zeros(1, 64, dtype=torch.long)
model(small, targets=small).backward()  # load every kernel and library once, outside the measurement
model.zero_grad(set_to_none=False)  # the gradients stay allocated: the growth below is activations only
idx = torch.randint(0, cfg.vocab_size, ({B}, {T}))
def status(field):  # bytes, from /proc/self/status
    line = next(l for l in open("/proc/self/status") if l.startswith(field + ":"))
    return int(line.split()[1]) * 1024
open("/proc/self/clear_refs", "w").write("5")  # reset the peak: a forked child starts with its parent's
before = status("VmRSS")
loss = model(idx, targets=idx)
forward = status("VmHWM") - before
loss.backward()
print(json.dumps({"forward_growth": forward, "training_growth": status("VmHWM") - before}))
""".replace("{B}", str(B)).replace("{T}", str(T))


def _measured_growth(cfg: dict, checkpointing: bool) -> dict:
    """Peak resident growth of one forward ("forward_growth") and of forward + backward ("training_growth")."""
    env = dict(os.environ, MALLOC_MMAP_THRESHOLD_="65536", MALLOC_TRIM_THRESHOLD_="0")
    out = subprocess.run([sys.executable, "-c", CHILD, json.dumps(cfg), "1" if checkpointing else "0"],
                         capture_output=True, text=True, check=True, env=env)
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("pattern", ["SX", "A"])
def test_activation_count_matches_measured_peak(pattern):
    cfg = dict(SMALL, pattern=pattern)
    outside, per_block = saved_activation_bytes(ModelConfig(**cfg), B, T, None, torch.float32, device="cpu")
    counted = outside + sum(per_block)
    measured = _measured_growth(cfg, checkpointing=False)["forward_growth"]
    assert counted == pytest.approx(measured, rel=0.15), (counted / 2**20, measured / 2**20)


def test_checkpointed_count_matches_measured_peak():
    cfg = dict(SMALL, pattern="SX")
    outside, per_block = saved_activation_bytes(ModelConfig(**cfg), B, T, None, torch.float32, device="cpu")
    # Each block keeps its input only, and the backward recomputes one block's activations at a time: the
    # estimate's checkpointed figure is the peak of the backward, so it is measured over forward + backward.
    kept = outside + len(per_block) * B * T * SMALL["d_model"] * 4 + max(per_block)
    measured = _measured_growth(cfg, checkpointing=True)["training_growth"]
    assert kept == pytest.approx(measured, rel=0.15), (kept / 2**20, measured / 2**20)


def test_arithmetic_parts_and_sharding():
    cfg = ModelConfig(**SMALL)
    one, eight = estimate(cfg, 2, 256, shards=1), estimate(cfg, 2, 256, shards=8)
    from swax_lightning.model.model import SWAXModel

    n = sum(p.numel() for p in SWAXModel(cfg).parameters())
    assert one.params == n and one.weights_gib == pytest.approx(4 * n / 2**30)
    assert one.optimizer_gib == pytest.approx(2 * one.grads_gib)
    assert eight.weights_gib == pytest.approx(one.weights_gib / 8)
    assert eight.activations_gib == one.activations_gib  # activations are per GPU, never sharded
    assert one.activations_checkpointed_gib < one.activations_gib


@pytest.mark.parametrize("config,params", [("7b_stochastic.yaml", "6.86B"), ("1.4b_SD.yaml", "1.42B")])
def test_command_on_the_paper_configs(config, params):
    # 1.4b_SD.yaml is `extends: 1.4b_w2048.yaml` plus the pattern: the estimate must follow it to the paper shape.
    out = subprocess.run([sys.executable, "-m", "swax_lightning", "memory", "--config", f"configs/{config}"],
                         capture_output=True, text=True, check=True).stdout
    assert f"{params} parameters, FSDP2 over 64 GPUs, 4 x 16384 tokens" in out
    assert "with activation checkpointing" in out


def test_recomputed_mlstm_states_leave_the_count():
    # With mlstm_recompute_states the Triton mLSTM's saved set loses the fp32 (C, m) entering every chunk, exactly.
    batch, seq = 2, 256
    counts = {flag: saved_activation_bytes(ModelConfig(**SMALL, mlstm_recompute_states=flag), batch, seq, None,
                                           torch.bfloat16)
              for flag in (False, True)}
    (out0, blocks0), (out1, blocks1) = counts[False], counts[True]
    heads = SMALL["mlstm_heads"]
    dqk, dv = SMALL["d_model"] // 2 // heads, SMALL["d_model"] // heads  # qk_factor 0.5, v_factor 1
    states = batch * heads * (seq // SMALL["chunk_size"]) * (dqk * dv + 1) * 4
    assert out0 == out1
    assert [a - b for a, b in zip(blocks0, blocks1)] == [0, states, 0, states]  # S X S X


def test_the_estimate_reaches_every_layer_kind_through_the_dispatch_hook(monkeypatch):
    """The meta-device count runs each layer's kernel as the GPU kernel's saved-set stand-in, through the dispatch's
    own hook (kernels.substituted), for attention, mLSTM and Gated DeltaNet layers alike (the DeltaNet layers were
    once missed: they ran the PyTorch path's saved set)."""
    import swax_lightning.commands.memory as memory

    calls = {"attention": 0, "mlstm": 0, "deltanet": 0}
    for op in calls:
        original = getattr(memory, f"_gpu_{op}")

        def counted(*args, op=op, original=original):
            calls[op] += 1
            return original(*args)

        monkeypatch.setattr(memory, f"_gpu_{op}", counted)
    cfg = ModelConfig(d_model=64, n_layers=6, pattern="SXD", n_heads=2, mlstm_heads=2, deltanet_heads=2, window=16)
    memory.saved_activation_bytes(cfg, 2, 128, None, torch.float32)
    assert calls == {"attention": 2, "mlstm": 2, "deltanet": 2}
