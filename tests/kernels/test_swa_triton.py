"""Triton sliding-window attention (through the Triton interpreter on CPU) against the dense PyTorch reference,
forward and backward, on odd shapes; every output element must be written (buffers start as NaN)."""
import pytest
import torch

import swax_lightning.kernels.swa.triton as swa_triton_module
from swax_lightning.kernels import sliding_window_attention, swa_reference
from swax_lightning.kernels.swa.triton import swa_triton

CASES = [  # T, W, n_sink, Hq, Hkv, D
    (100, 1, 0, 2, 2, 32),     # W = 1
    (100, 1, 4, 2, 1, 32),     # W = 1 with sinks, multi-query
    (130, 17, 0, 4, 2, 32),    # W < T, T not a multiple of the block, GQA
    (130, 17, 4, 4, 2, 64),    # the same with sinks, head dim 64
    (70, 33, 4, 2, 2, 128),    # head dim 128
    (200, 70, 4, 2, 2, 32),    # window spanning more than one key block
    (64, 64, 4, 2, 2, 64),     # W = T = one block
    (90, 500, 4, 2, 2, 32),    # W > T: full causal
]
# fp32: dots in fp32. fp16: tensor-core path (operands and probabilities in fp16). bf16: upcast to fp32 after loading
# (the interpreter cannot compute in bf16); its error is the bf16 rounding of inputs and outputs.
TOL = {torch.float32: dict(atol=2e-5, rtol=2e-5), torch.float16: dict(atol=3e-3, rtol=3e-3),
       torch.bfloat16: dict(atol=1.5e-1, rtol=3e-2)}


@pytest.fixture(autouse=True)
def nan_outputs(monkeypatch):
    monkeypatch.setattr(swa_triton_module, "new_like", lambda x: torch.full_like(x, float("nan")))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("T,W,n_sink,Hq,Hkv,D", CASES)
def test_forward_and_backward_match_reference(T, W, n_sink, Hq, Hkv, D, dtype):
    g = torch.Generator().manual_seed(T + W + n_sink)
    make = lambda h: torch.randn(2, T, h, D, generator=g).to(dtype).requires_grad_()
    q, k, v = make(Hq), make(Hkv), make(Hkv)
    out = swa_triton(q, k, v, W, n_sink)
    grad = torch.randn(out.shape, generator=g).to(dtype)
    grads = torch.autograd.grad(out, (q, k, v), grad)
    q64, k64, v64 = (x.detach().double().requires_grad_() for x in (q, k, v))
    ref = swa_reference(q64, k64, v64, W, n_sink)
    ref_grads = torch.autograd.grad(ref, (q64, k64, v64), grad.double())
    assert out.dtype == dtype and torch.isfinite(out).all()
    torch.testing.assert_close(out.double(), ref, **TOL[dtype])
    for name, a, b in zip("qkv", grads, ref_grads):
        assert torch.isfinite(a).all(), name
        torch.testing.assert_close(a.double(), b, **TOL[dtype], msg=lambda m: f"d{name}: {m}")


def test_dispatch_switch(monkeypatch):
    q = k = v = torch.randn(1, 40, 2, 16)
    calls = []
    monkeypatch.setattr(swa_triton_module, "swa_triton", lambda *a: calls.append("triton") or swa_reference(*a[:4]))
    monkeypatch.setenv("SWAX_KERNELS", "triton")
    sliding_window_attention(q, k, v, 8)
    monkeypatch.setenv("SWAX_KERNELS", "auto")  # CPU tensors: the PyTorch path
    sliding_window_attention(q, k, v, 8)
    assert calls == ["triton"]
    monkeypatch.setenv("SWAX_KERNELS", "torch")
    sliding_window_attention(q, k, v, 8)
    assert calls == ["triton"]


@pytest.mark.parametrize("bad,match", [(dict(D=24), "power of two"), (dict(n_sink=65), "sink")])
def test_unsupported_shapes_are_named(bad, match):
    D = bad.get("D", 32)
    q = torch.randn(1, 80, 2, D)
    with pytest.raises(ValueError, match=match):
        swa_triton(q, q, q, 4, bad.get("n_sink", 0))


def test_sinks_are_clamped_to_the_sequence_before_the_limit():
    q = torch.randn(1, 8, 2, 16)  # 65 sinks asked, 8 exist: every key is a sink
    torch.testing.assert_close(swa_triton(q, q, q, 4, 65), swa_reference(q, q, q, 4, 8), atol=1e-5, rtol=1e-5)
