"""Sliding-window attention: the blocked O(T*W) path against the dense masked reference, forward and backward."""
import pytest
import torch

from swax_lightning.kernels import sliding_window_attention, sliding_window_mask, swa_blocked, swa_reference
from swax_lightning.kernels.swa.blocked import swa_band

CASES = [  # T, W, n_sink, Hq, Hkv, D
    (37, 1, 0, 2, 2, 8),      # W = 1: each query sees only itself
    (37, 1, 4, 4, 2, 8),      # W = 1 with sinks, GQA
    (200, 17, 4, 4, 1, 16),   # W < T, T not a multiple of the block, multi-query
    (130, 64, 0, 2, 2, 8),    # W = block size, T not a multiple
    (130, 65, 2, 2, 2, 8),
    (300, 100, 4, 2, 2, 8),   # block = W > MIN_BLOCK
    (50, 50, 0, 2, 2, 8),     # W = T: full causal
    (50, 300, 4, 2, 2, 8),    # W > T
    (5, 3, 10, 2, 2, 8),      # more sinks than tokens
    (200, 33, 70, 4, 2, 8),   # more sinks than the window: the dense head is longer than the window
    (100, 99, 3, 2, 2, 8),    # W = T - 1: one tail query
    (257, 64, 1, 2, 2, 8),    # a single sink
]


def _inputs(T, Hq, Hkv, D, dtype=torch.float64, seed=0):
    g = torch.Generator().manual_seed(seed)
    make = lambda h: torch.randn(2, T, h, D, generator=g, dtype=dtype).requires_grad_()
    return make(Hq), make(Hkv), make(Hkv)


def test_mask_convention_by_hand():
    # W = 2 keys including the current one, 1 sink: query 4 sees keys 0 (sink), 3, 4.
    expected = torch.tensor([
        [1, 0, 0, 0, 0],
        [1, 1, 0, 0, 0],
        [1, 1, 1, 0, 0],
        [1, 0, 1, 1, 0],
        [1, 0, 0, 1, 1],
    ], dtype=torch.bool)
    assert torch.equal(sliding_window_mask(5, 2, 1), expected)
    assert torch.equal(sliding_window_mask(5, None), torch.ones(5, 5, dtype=torch.bool).tril())


@pytest.mark.parametrize("T,W,n_sink,Hq,Hkv,D", CASES)
@pytest.mark.parametrize("min_block", [1, 64])
@pytest.mark.parametrize("form", [swa_blocked, swa_band])
def test_blocked_equals_dense_reference(T, W, n_sink, Hq, Hkv, D, min_block, form):
    if form is swa_band and W >= T:
        pytest.skip("the banded form is for W < T")
    q, k, v = _inputs(T, Hq, Hkv, D)
    out = form(q, k, v, W, n_sink, min_block=min_block)
    ref = swa_reference(q, k, v, W, n_sink)
    torch.testing.assert_close(out, ref, atol=1e-10, rtol=1e-10)
    grad = torch.randn_like(out)
    for a, b in zip(torch.autograd.grad(out, (q, k, v), grad), torch.autograd.grad(ref, (q, k, v), grad)):
        torch.testing.assert_close(a, b, atol=1e-10, rtol=1e-10)


@pytest.mark.parametrize("W,n_sink", [(1, 0), (40, 0), (40, 4), (300, 2)])
def test_blocked_stays_on_the_fused_kernel(W, n_sink):
    # Only SDPA's flash kernel is allowed here: a per-block mask or a 5-D input would need the math kernel (which
    # materialises every score) and raise.
    from torch.nn.attention import SDPBackend, sdpa_kernel

    q, k, v = _inputs(150, 4, 2, 16, dtype=torch.float32)
    with sdpa_kernel([SDPBackend.FLASH_ATTENTION]):
        out = (swa_band if W < 150 else swa_blocked)(q, k, v, W, n_sink)
        grads = torch.autograd.grad(out.sum(), (q, k, v))
    ref = swa_reference(q, k, v, W, n_sink)
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)
    for a, b in zip(grads, torch.autograd.grad(ref.sum(), (q, k, v))):
        torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-4)


def test_long_sequences_take_the_band_and_stay_exact():
    # T past the dense threshold with a small window: swa_blocked routes to the banded form.
    q, k, v = _inputs(1100, 2, 1, 8)
    out = swa_blocked(q, k, v, 30, 3)
    torch.testing.assert_close(out, swa_reference(q, k, v, 30, 3), atol=1e-10, rtol=1e-10)
    torch.testing.assert_close(out, swa_band(q, k, v, 30, 3), atol=0, rtol=0)


def test_fp32_and_dispatch():
    q, k, v = _inputs(150, 4, 2, 16, dtype=torch.float32)
    out = sliding_window_attention(q, k, v, 40, 4)
    torch.testing.assert_close(out, swa_reference(q, k, v, 40, 4), atol=1e-5, rtol=1e-5)


def test_window_changes_result_and_sinks_matter():
    q, k, v = _inputs(100, 2, 2, 8)
    wide, narrow = swa_blocked(q, k, v, 100, 0), swa_blocked(q, k, v, 10, 0)
    torch.testing.assert_close(wide[:, :10], narrow[:, :10])  # the first W queries see the same keys
    assert not torch.allclose(wide[:, 10:], narrow[:, 10:])
    with_sink = swa_blocked(q, k, v, 10, 4)
    torch.testing.assert_close(with_sink[:, :10], narrow[:, :10])  # sinks are inside the window there
    assert not torch.allclose(with_sink[:, 14:], narrow[:, 14:])


def test_dispatch_rejects_unknown_backend(monkeypatch):
    monkeypatch.setenv("SWAX_KERNELS", "cuda-magic")
    q, k, v = _inputs(8, 2, 2, 8)
    with pytest.raises(ValueError, match="SWAX_KERNELS"):
        sliding_window_attention(q, k, v, 4)
    monkeypatch.setenv("SWAX_KERNELS", "torch")
    torch.testing.assert_close(sliding_window_attention(q, k, v, 4), swa_reference(q, k, v, 4))
