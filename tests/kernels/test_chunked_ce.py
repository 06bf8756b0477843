"""Chunked soft-capped cross-entropy against the plain loss (full logits), forward and backward, with ignored targets
and under bf16 autocast (its backward's matmuls in bf16), the frozen head's road (dh in the forward, two matmuls per
chunk, the same dh bit for bit), and the model's training loss through it equal to cross-entropy on the model's
logits."""
import pytest
import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

from swax_lightning.kernels.ce.chunked import softcap_cross_entropy_chunked
from swax_lightning.kernels.ce.naive import softcap_cross_entropy_reference
from swax_lightning.model.config import ModelConfig
from swax_lightning.model.model import SWAXModel


@pytest.mark.parametrize("N,V,rows,cap", [
    (37, 11, 8, 30.0),     # N not a multiple of rows
    (37, 11, 37, 30.0),    # one chunk
    (37, 11, 1, 30.0),     # a row per chunk
    (64, 300, 16, 0.0),    # no cap
    (20, 50, 7, 2.0),      # a tight cap: tanh saturates, its derivative matters
])
def test_chunked_equals_plain_fwd_bwd(N, V, rows, cap):
    g = torch.Generator().manual_seed(0)
    h = (3 * torch.randn(N, 16, generator=g, dtype=torch.float64)).requires_grad_()
    w = torch.randn(V, 16, generator=g, dtype=torch.float64).requires_grad_()
    t = torch.randint(0, V, (N,), generator=g)
    out = softcap_cross_entropy_chunked(h, w, t, cap, rows)
    ref = softcap_cross_entropy_reference(h, w, t, cap)
    torch.testing.assert_close(out, ref, atol=1e-12, rtol=1e-12)
    for a, b in zip(torch.autograd.grad(2.5 * out, (h, w)), torch.autograd.grad(2.5 * ref, (h, w))):
        torch.testing.assert_close(a, b, atol=1e-12, rtol=1e-12)


@pytest.mark.parametrize("N,V,rows,cap", [(37, 11, 8, 30.0), (64, 300, 16, 0.0), (20, 50, 7, 2.0)])
def test_frozen_head_equals_plain_fwd_bwd(N, V, rows, cap):
    # The head frozen (a retrofit's LoRA stage): dh is computed in the forward and scaled by the upstream gradient.
    g = torch.Generator().manual_seed(0)
    h = (3 * torch.randn(N, 16, generator=g, dtype=torch.float64)).requires_grad_()
    w = torch.randn(V, 16, generator=g, dtype=torch.float64)
    t = torch.randint(0, V, (N,), generator=g)
    t[::5] = -100
    out = softcap_cross_entropy_chunked(h, w, t, cap, rows)
    ref = softcap_cross_entropy_reference(h, w, t, cap)
    torch.testing.assert_close(out, ref, atol=1e-12, rtol=1e-12)
    (got,), (want,) = torch.autograd.grad(2.5 * out, h), torch.autograd.grad(2.5 * ref, h)
    torch.testing.assert_close(got, want, atol=1e-12, rtol=1e-12)


def test_frozen_head_gives_the_trainable_heads_dh_bit_for_bit():
    # Runs trained before the frozen head's road (the retrofits' LoRA) are reproduced exactly by it.
    g = torch.Generator().manual_seed(4)
    h = torch.randn(45, 32, generator=g).requires_grad_()
    w = 0.3 * torch.randn(70, 32, generator=g)
    t = torch.randint(0, 70, (45,), generator=g)
    frozen = softcap_cross_entropy_chunked(h, w, t, 30.0, 16)
    (dh_frozen,) = torch.autograd.grad(frozen, h)
    trainable = softcap_cross_entropy_chunked(h, w.clone().requires_grad_(), t, 30.0, 16)
    (dh_trainable,) = torch.autograd.grad(trainable, h)
    assert torch.equal(frozen, trainable) and torch.equal(dh_frozen, dh_trainable)


@pytest.mark.parametrize("head,grad_enabled,forward_matmuls,backward_matmuls", [
    ("trainable", True, 1, 3),   # logits; then recomputed logits, dh and dW
    ("frozen", True, 2, 0),      # logits and dh, both in the forward
    ("frozen", False, 1, 0),     # a loss only (evaluation under no_grad): no dh
])
def test_matmuls_per_chunk(head, grad_enabled, forward_matmuls, backward_matmuls):
    g = torch.Generator().manual_seed(5)
    h = torch.randn(50, 32, generator=g).requires_grad_()
    w = torch.randn(70, 32, generator=g).requires_grad_(head == "trainable")
    t = torch.randint(0, 70, (50,), generator=g)
    with MatmulDtypes() as forward, torch.set_grad_enabled(grad_enabled):
        out = softcap_cross_entropy_chunked(h, w, t, 30.0, 16)  # 4 chunks
    assert len(forward.seen) == 4 * forward_matmuls
    if grad_enabled:
        with MatmulDtypes() as backward:
            out.backward()
        assert len(backward.seen) == 4 * backward_matmuls


def test_bf16_inputs_match_the_plain_loss():
    g = torch.Generator().manual_seed(1)
    h = torch.randn(50, 32, generator=g).bfloat16().requires_grad_()
    w = torch.randn(70, 32, generator=g).bfloat16().requires_grad_()
    t = torch.randint(0, 70, (50,), generator=g)
    out, ref = softcap_cross_entropy_chunked(h, w, t, 30.0, 16), softcap_cross_entropy_reference(h, w, t, 30.0)
    assert out.dtype == torch.float32
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)
    for a, b in zip(torch.autograd.grad(out, (h, w)), torch.autograd.grad(ref, (h, w))):
        assert a.dtype == torch.bfloat16
        torch.testing.assert_close(a.float(), b.float(), atol=2e-2, rtol=2e-2)


@pytest.mark.parametrize("ignore_index", [-100, 3])
def test_ignored_targets_equal_torch_cross_entropy(ignore_index):
    g = torch.Generator().manual_seed(2)
    h = torch.randn(37, 16, generator=g, dtype=torch.float64).requires_grad_()
    w = torch.randn(11, 16, generator=g, dtype=torch.float64).requires_grad_()
    t = torch.randint(0, 11, (37,), generator=g)
    t[::3] = ignore_index                                      # a third of the rows, in every chunk of 8
    t[16:24] = ignore_index                                    # and one whole chunk
    out = softcap_cross_entropy_chunked(h, w, t, 30.0, 8, ignore_index=ignore_index)
    ref = softcap_cross_entropy_reference(h, w, t, 30.0, ignore_index=ignore_index)
    torch.testing.assert_close(out, ref, atol=1e-12, rtol=1e-12)
    grads = torch.autograd.grad(out, (h, w))
    for a, b in zip(grads, torch.autograd.grad(ref, (h, w))):
        torch.testing.assert_close(a, b, atol=1e-12, rtol=1e-12)
    assert grads[0][::3].abs().max() == 0  # ignored rows get no gradient
    everything_ignored = torch.full_like(t, ignore_index)
    assert softcap_cross_entropy_chunked(h, w, everything_ignored, 30.0, 8, ignore_index=ignore_index).isnan()
    assert softcap_cross_entropy_reference(h, w, everything_ignored, 30.0, ignore_index=ignore_index).isnan()


class MatmulDtypes(TorchDispatchMode):
    """Records the input dtypes of every matrix multiplication run inside it."""

    MATMULS = (torch.ops.aten.mm.default, torch.ops.aten.addmm.default, torch.ops.aten.bmm.default)

    def __init__(self):
        super().__init__()
        self.seen = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func in self.MATMULS:
            self.seen.append({a.dtype for a in args if isinstance(a, torch.Tensor)})
        return func(*args, **(kwargs or {}))


def test_bf16_autocast_frozen_head_runs_its_matmuls_in_bf16():
    g = torch.Generator().manual_seed(6)
    h = torch.randn(50, 32, generator=g).requires_grad_()
    w = 0.3 * torch.randn(70, 32, generator=g)
    t = torch.randint(0, 70, (50,), generator=g)
    with MatmulDtypes() as forward, torch.autocast("cpu", dtype=torch.bfloat16):
        out = softcap_cross_entropy_chunked(h, w, t, 30.0, 16)
        ref = softcap_cross_entropy_reference(h, w, t, 30.0)
    assert len(forward.seen) >= 2 * 4 and all(dtypes == {torch.bfloat16} for dtypes in forward.seen[:8])
    (got,), (want,) = torch.autograd.grad(out, h), torch.autograd.grad(ref, h)
    assert got.dtype == torch.float32
    torch.testing.assert_close(got, want, atol=1e-3, rtol=2e-2)


def test_bf16_autocast_runs_the_backward_matmuls_in_bf16():
    # fp32 weights under bf16 autocast (mixed precision): the backward's two gradient matmuls and its recomputed
    # logits in bf16, as the forward's, and the result as the plain loss's under the same autocast.
    g = torch.Generator().manual_seed(3)
    h = torch.randn(50, 32, generator=g).requires_grad_()
    w = (0.3 * torch.randn(70, 32, generator=g)).requires_grad_()
    t = torch.randint(0, 70, (50,), generator=g)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = softcap_cross_entropy_chunked(h, w, t, 30.0, 16)
        ref = softcap_cross_entropy_reference(h, w, t, 30.0)
    with MatmulDtypes() as backward:
        grads = torch.autograd.grad(out, (h, w))
    assert len(backward.seen) == 3 * 4 and all(dtypes == {torch.bfloat16} for dtypes in backward.seen), backward.seen
    assert [x.dtype for x in grads] == [torch.float32, torch.float32]
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)
    for a, b in zip(grads, torch.autograd.grad(ref, (h, w))):
        torch.testing.assert_close(a, b, atol=1e-3, rtol=2e-2)


def test_model_training_loss_is_cross_entropy_of_its_logits():
    torch.manual_seed(0)
    model = SWAXModel(ModelConfig(d_model=32, n_heads=2, mlstm_heads=2, window=8, chunk_size=8)).double()
    idx = torch.randint(0, 257, (2, 21))
    inputs, targets = idx[:, :-1], idx[:, 1:]
    loss = model(inputs, targets=targets)
    logits = model(inputs)
    ref = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))
    torch.testing.assert_close(loss, ref, atol=1e-12, rtol=1e-12)
    params = list(model.parameters())
    for a, b in zip(torch.autograd.grad(loss, params), torch.autograd.grad(ref, params)):
        torch.testing.assert_close(a, b, atol=1e-10, rtol=1e-10)


def test_bad_rows_is_named():
    with pytest.raises(ValueError, match="rows"):
        softcap_cross_entropy_chunked(torch.zeros(2, 2), torch.zeros(3, 2), torch.zeros(2, dtype=torch.long), 1.0, 0)
