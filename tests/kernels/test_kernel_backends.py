"""Kernel backends chosen in the config: validation at config time (one line naming the field), what `auto` resolves
to, the SWAX_KERNELS override, the choice recorded in hparams, and every CPU-runnable backend against the fp64
reference through the dispatch point."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from swax_lightning.core.errors import ConfigError
from swax_lightning.kernels import backends, mlstm_chunkwise, mlstm_parallel, sliding_window_attention, swa_reference
from swax_lightning.model.config import ModelConfig


@pytest.fixture(autouse=True)
def _no_env_override(monkeypatch):
    monkeypatch.delenv("SWAX_KERNELS", raising=False)


def test_defaults_and_partial_choices():
    assert ModelConfig().kernels == {"attention": "auto", "mlstm": "auto", "deltanet": "auto"}
    assert ModelConfig(kernels={"attention": "torch"}).kernels == {"attention": "torch", "mlstm": "auto",
                                                                    "deltanet": "auto"}


@pytest.mark.parametrize("kwargs,match", [
    (dict(kernels={"attention": "cudnn"}), r"kernels\.attention: must be one of"),
    (dict(kernels={"mlstm": "flash"}), r"kernels\.mlstm: must be one of"),
    (dict(kernels={"conv": "torch"}), r"kernels\.conv: unknown operation"),
    (dict(kernels={"attention": "triton"}, d_model=96, n_heads=4), r"kernels\.attention: triton takes head dims"),
    (dict(kernels={"attention": "triton"}, n_sink=65), r"kernels\.attention: triton takes .* at most 64 sinks"),
    (dict(kernels={"mlstm": "triton"}, chunk_size=48), r"kernels\.mlstm: triton takes .*chunk_size"),
    (dict(kernels={"mlstm": "triton"}, d_model=32, mlstm_heads=2), r"kernels\.mlstm: triton takes head dims >= 16"),
    (dict(kernels={"attention": "flash"}, d_model=80, n_heads=4), r"kernels\.attention: .*flash"),
])
def test_bad_choices_are_one_line_naming_the_field(kwargs, match):
    with pytest.raises(ConfigError, match=match) as err:
        ModelConfig(**kwargs)
    assert "\n" not in str(err.value)


def test_uninstalled_backend_is_refused(monkeypatch):
    monkeypatch.setattr(backends, "installed", lambda module: module != "flash_attn")
    with pytest.raises(ConfigError, match=r"kernels\.attention: flash needs the package flash-attn"):
        ModelConfig(kernels={"attention": "flash"})
    monkeypatch.setattr(backends, "installed", lambda module: True)
    with pytest.raises(ConfigError, match=r"kernels\.attention: flash has no sink tokens"):
        ModelConfig(kernels={"attention": "flash"}, n_sink=4)
    ModelConfig(kernels={"attention": "flash"})  # installed, head dim 64, no sinks: fine


def test_constraints_only_for_the_layers_the_pattern_uses():
    ModelConfig(pattern="X", kernels={"attention": "triton"}, n_sink=100)  # no attention layer
    ModelConfig(pattern="S", kernels={"mlstm": "triton"}, chunk_size=48)  # no mLSTM layer
    with pytest.raises(ConfigError, match="kernels.attention"):
        ModelConfig(pattern="X", kernels={"attention": "nonsense"})  # names are checked regardless


def test_auto_resolution():
    pick = lambda **kw: backends.attention_backend("auto", **{**dict(is_cuda=True, dtype=torch.bfloat16,
                                                                   head_dim=128, T=4096, window=512, n_sink=0), **kw})
    assert pick(window=None) == "causal" and pick(window=4096) == "causal" and pick(is_cuda=False, window=None) == \
        "causal"
    assert pick(is_cuda=False) == "torch"
    assert pick(n_sink=4) == "triton"  # sinks on CUDA: the own kernel
    assert pick(n_sink=4, head_dim=96) == "torch"  # a head dim the kernel cannot take: the PyTorch path
    assert pick(n_sink=100, T=50, window=20) == "triton"  # sinks clamped to T first: 50 fit the 64-sink limit
    expected = "flash" if backends.installed("flash_attn") else "triton"
    assert pick() == expected
    assert pick(dtype=torch.float32) == "triton"  # flash-attn takes only fp16 / bf16
    # fp32 at head dim 256 would need more shared memory than a GPU block has: the PyTorch path; bf16 fits
    assert pick(dtype=torch.float32, head_dim=256, n_sink=4) == "torch"
    assert pick(dtype=torch.bfloat16, head_dim=256, n_sink=4) == "triton"
    assert backends.mlstm_backend("auto", is_cuda=True, qk_head_dim=64, v_head_dim=128, chunk_size=64) == "triton"
    assert backends.mlstm_backend("auto", is_cuda=True, qk_head_dim=8, v_head_dim=128, chunk_size=64) == "torch"
    assert backends.mlstm_backend("auto", is_cuda=False, qk_head_dim=64, v_head_dim=128, chunk_size=64) == "torch"


def test_env_override_beats_the_config(monkeypatch):
    monkeypatch.setenv("SWAX_KERNELS", "torch")
    assert backends.attention_backend("flash", is_cuda=True, dtype=torch.bfloat16, head_dim=128, T=64, window=8,
                                      n_sink=0) == "torch"
    monkeypatch.setenv("SWAX_KERNELS", "bogus")
    with pytest.raises(ValueError, match="SWAX_KERNELS"):
        backends.mlstm_backend("auto", is_cuda=False, qk_head_dim=16, v_head_dim=16, chunk_size=16)


def test_choice_recorded_in_hparams():
    from swax_lightning.training.module import LanguageModule

    module = LanguageModule(arch=dict(kernels={"attention": "sdpa"}))
    assert module.hparams["arch"]["kernels"] == {"attention": "sdpa", "mlstm": "auto", "deltanet": "auto"}
    assert module.arch.kernels["attention"] == "sdpa"


@pytest.mark.parametrize("kernel", ["auto", "torch", "sdpa", "triton"])
@pytest.mark.parametrize("T,W,n_sink", [(77, 1, 0), (77, 20, 3), (77, 200, 2)])
def test_every_cpu_backend_matches_the_reference(kernel, T, W, n_sink):
    dtype = torch.float32 if kernel == "triton" else torch.float64  # the interpreter runs fp32
    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(2, T, h, 16, generator=g, dtype=dtype).requires_grad_() for h in (4, 2, 2))
    out = sliding_window_attention(q, k, v, W, n_sink, kernel=kernel)
    ref = swa_reference(q, k, v, W, n_sink)
    tol = dict(atol=2e-5, rtol=2e-5) if dtype == torch.float32 else dict(atol=1e-10, rtol=1e-10)
    torch.testing.assert_close(out, ref, **tol)
    grad = torch.randn_like(out)
    for a, b in zip(torch.autograd.grad(out, (q, k, v), grad), torch.autograd.grad(ref, (q, k, v), grad)):
        torch.testing.assert_close(a, b, **tol)


@pytest.mark.parametrize("kernel", ["auto", "torch", "triton"])
def test_every_cpu_mlstm_backend_matches_the_parallel_form(kernel):
    g = torch.Generator().manual_seed(2)
    B, T, H = 1, 40, 2
    q, k = (torch.randn(B, T, H, 16, generator=g) for _ in range(2))
    v = torch.randn(B, T, H, 16, generator=g)
    i_pre, f_pre = torch.randn(B, T, H, generator=g), 3 + torch.randn(B, T, H, generator=g)
    h, _ = mlstm_chunkwise(q, k, v, i_pre, f_pre, chunk_size=16, kernel=kernel)
    torch.testing.assert_close(h, mlstm_parallel(q, k, v, i_pre, f_pre)[0].to(h.dtype), atol=1e-4, rtol=1e-4)


def test_deltanet_backend_choice(monkeypatch):
    # fla is Gated DeltaNet's GPU kernel: refused at config time when not installed, picked by auto on CUDA only,
    # and what SWAX_KERNELS=triton asks for; the PyTorch forms everywhere else.
    monkeypatch.setattr(backends, "installed", lambda module: module != "fla")
    with pytest.raises(ConfigError, match=r"kernels\.deltanet: fla needs the package flash-linear-attention"):
        ModelConfig(pattern="SD", kernels={"deltanet": "fla"})
    ModelConfig(pattern="SX", kernels={"deltanet": "fla"})  # no D layer: only the name is checked
    assert backends.deltanet_backend("auto", is_cuda=True) == "torch"
    monkeypatch.setenv("SWAX_KERNELS", "triton")
    with pytest.raises(NotImplementedError, match="flash-linear-attention"):
        backends.deltanet_backend("auto", is_cuda=True)
    monkeypatch.setattr(backends, "installed", lambda module: True)
    assert backends.deltanet_backend("auto", is_cuda=True) == "fla"
    monkeypatch.delenv("SWAX_KERNELS")
    assert backends.deltanet_backend("auto", is_cuda=True) == "fla"
    assert backends.deltanet_backend("auto", is_cuda=False) == "torch"
    assert backends.deltanet_backend("torch", is_cuda=True) == "torch"


def test_own_kernels_compile_for_hopper_within_its_shared_memory():
    # benchmarks/kernel_shared_memory.py on its smallest configurations: the real wrappers' launches (forward and
    # backward), compiled for sm_90 without a GPU, each within the 227 KiB of shared memory a Hopper block may have.
    root = Path(__file__).resolve().parents[2]
    out = subprocess.run([sys.executable, "benchmarks/kernel_shared_memory.py", "--dtypes", "bfloat16",
                          "--head_dims", "32", "--chunks", "16"], cwd=root, capture_output=True, text=True,
                         env={**os.environ, "TRITON_INTERPRET": "0"}, timeout=600, check=True)
    rows = [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]
    assert {r["kernel"] for r in rows} == {"_fwd_kernel", "_bwd_dq_kernel", "_bwd_dkdv_kernel", "_fwd_states_kernel",
                                           "_fwd_output_kernel", "_bwd_dstates_kernel", "_bwd_dqdk_kernel",
                                           "_bwd_dv_kernel"}
    assert all(0 < r["shared_kib"] <= 227 and not r["over_limit"] for r in rows), rows


@pytest.mark.parametrize("kernels,device,precision,training,interpreter,refused", [
    ({"attention": "triton", "mlstm": "triton"}, "cpu", "32-true", True, "1", None),     # the interpreter: tests
    ({"attention": "triton"}, "cpu", "32-true", True, "0", "kernels.attention: triton needs a CUDA GPU"),
    ({"mlstm": "tfla"}, "cpu", "32-true", True, "0", "kernels.mlstm: tfla needs a CUDA GPU"),
    ({"attention": "flash"}, "cpu", "bf16-mixed", False, "1", "kernels.attention: flash needs a CUDA GPU"),
    ({"attention": "flex"}, "cpu", "32-true", False, "0", None),                        # inference: forward only
    ({"attention": "flex"}, "cpu", "32-true", True, "0", "kernels.attention: flex has no backward on the CPU"),
    ({"attention": "triton", "mlstm": "triton"}, "cuda", "32-true", True, "0", None),
])
def test_run_check_refuses_what_the_device_cannot_run(monkeypatch, kernels, device, precision, training, interpreter,
                                                      refused):
    monkeypatch.setattr(backends, "installed", lambda module: True)
    monkeypatch.setenv("TRITON_INTERPRET", interpreter)
    cfg = ModelConfig(kernels=kernels)
    if refused is None:
        cfg.check_run(device, precision, training)
    else:
        with pytest.raises(ConfigError, match=f"ModelConfig.{refused}"):
            cfg.check_run(device, precision, training)


@pytest.mark.parametrize("precision,refused", [("32-true", True), ("64-true", True), ("bf16-mixed", False),
                                               ("16-mixed", False)])
def test_run_check_refuses_fp32_triton_attention_above_head_dim_128(monkeypatch, precision, refused):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    cfg = ModelConfig(head_dim=256, kernels={"attention": "triton"})
    if refused:
        with pytest.raises(ConfigError, match="triton in fp32 takes head dims up to 128"):
            cfg.check_run("cuda", precision, training=True)
    else:
        cfg.check_run("cuda", precision, training=True)
    monkeypatch.setenv("SWAX_KERNELS", "torch")  # the override wins over the config's choice
    ModelConfig(head_dim=256, kernels={"attention": "triton"}).check_run("cuda", precision, training=True)
