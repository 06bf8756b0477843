"""Triton chunkwise mLSTM (through the Triton interpreter on CPU) against the PyTorch reference forms: outputs,
final states, gradients after the per-head norm, carried state, odd lengths, extreme gates, unwritten outputs."""
import pytest
import swax_lightning.kernels.mlstm.triton as mlstm_triton_module
import torch
import torch.nn.functional as F
from swax_lightning.kernels import mlstm_parallel, mlstm_recurrent
from swax_lightning.kernels.mlstm.triton import mlstm_chunkwise_triton

from swax_lightning import kernels

TOL = {torch.float32: dict(atol=1e-4, rtol=1e-4), torch.float16: dict(atol=2e-2, rtol=2e-2),
       torch.bfloat16: dict(atol=1e-1, rtol=5e-2)}


@pytest.fixture(autouse=True)
def nan_outputs(monkeypatch):
    monkeypatch.setattr(mlstm_triton_module, "new_like",
                        lambda x, dtype=None: torch.full_like(x, float("nan"), dtype=dtype))


def _inputs(T, H, dqk, dv, dtype, seed=0, gate_scale=2.0):
    g = torch.Generator().manual_seed(seed)
    rnd = lambda *s: torch.randn(*s, generator=g)
    q, k, v = rnd(2, T, H, dqk), rnd(2, T, H, dqk), rnd(2, T, H, dv)
    i_pre, f_pre = rnd(2, T, H) * gate_scale, rnd(2, T, H) * gate_scale + 2.0
    return [x.to(dtype).requires_grad_() for x in (q, k, v)] + [i_pre.requires_grad_(), f_pre.requires_grad_()]


def _normed_loss(h, weight):
    return (F.rms_norm(h.double(), (h.shape[-1],)) * weight).sum()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("T,H,dqk,dv,chunk", [
    (50, 2, 16, 32, 16),     # T not a multiple of the chunk
    (64, 1, 32, 16, 32),     # T a multiple
    (37, 1, 128, 128, 16),   # q/k and v head dims over two 64-wide tiles
    (9, 2, 16, 16, 16),      # shorter than one chunk
    (20, 1, 256, 512, 16),   # the xLSTM-7B head: q/k 256, v 512
])
def test_matches_reference_forward_backward_and_states(T, H, dqk, dv, chunk, dtype):
    args = _inputs(T, H, dqk, dv, dtype, seed=T)
    h, state = mlstm_chunkwise_triton(*args, chunk_size=chunk)
    ref_args = [x.detach().double().requires_grad_() for x in args]
    h_ref, _ = mlstm_parallel(*ref_args)
    _, state_ref = mlstm_recurrent(*[x.detach().double() for x in args])
    assert h.dtype == dtype and torch.isfinite(h).all()
    torch.testing.assert_close(h.double(), h_ref, **TOL[dtype])
    for got, want in zip(state, state_ref):
        torch.testing.assert_close(got.double(), want, **TOL[dtype])
    weight = torch.randn(h.shape, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    grads = torch.autograd.grad(_normed_loss(h, weight), args)
    ref_grads = torch.autograd.grad(_normed_loss(h_ref, weight), ref_args)
    for name, got, want in zip(["q", "k", "v", "i", "f"], grads, ref_grads):
        assert torch.isfinite(got).all(), name
        torch.testing.assert_close(got.double(), want, **TOL[dtype], msg=lambda m: f"d{name}: {m}")


@pytest.mark.parametrize("split", [7, 16, 30])
def test_carried_state_equals_one_pass(split):
    q, k, v, i_pre, f_pre = (x.detach() for x in _inputs(45, 2, 16, 16, torch.float32))
    h_full, s_full = mlstm_chunkwise_triton(q, k, v, i_pre, f_pre, chunk_size=16)
    h1, s1 = mlstm_chunkwise_triton(q[:, :split], k[:, :split], v[:, :split], i_pre[:, :split], f_pre[:, :split],
                                    chunk_size=16)
    h2, s2 = mlstm_chunkwise_triton(q[:, split:], k[:, split:], v[:, split:], i_pre[:, split:], f_pre[:, split:],
                                    s1, chunk_size=16)
    torch.testing.assert_close(torch.cat([h1, h2], 1), h_full, atol=1e-4, rtol=1e-4)
    for a, b in zip(s2, s_full):
        torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("gate", [30.0, -30.0])
def test_extreme_gates_are_finite(gate):
    q, k, v, _, _ = _inputs(40, 1, 16, 16, torch.float32)
    sign = torch.where(torch.rand(2, 40, 1, generator=torch.Generator().manual_seed(2)) > 0.5, 1.0, -1.0)
    i_pre, f_pre = (gate * sign).requires_grad_(), (-gate * sign).requires_grad_()
    h, state = mlstm_chunkwise_triton(q, k, v, i_pre, f_pre, chunk_size=16)
    h_ref, _ = mlstm_parallel(q.detach(), k.detach(), v.detach(), i_pre.detach(), f_pre.detach())
    assert torch.isfinite(h).all() and all(torch.isfinite(s).all() for s in state)
    torch.testing.assert_close(h, h_ref, atol=1e-3, rtol=1e-3)
    grads = torch.autograd.grad(_normed_loss(h, torch.ones(h.shape, dtype=torch.float64)), (q, k, v, i_pre, f_pre))
    assert all(torch.isfinite(g).all() for g in grads)


def test_dispatch_and_bad_shapes(monkeypatch):
    q, k, v, i_pre, f_pre = (x.detach() for x in _inputs(20, 1, 16, 16, torch.float32))
    monkeypatch.setenv("SWAX_KERNELS", "triton")
    h, _ = kernels.mlstm_chunkwise(q, k, v, i_pre, f_pre, chunk_size=16)
    torch.testing.assert_close(h, mlstm_parallel(q, k, v, i_pre, f_pre)[0], atol=1e-4, rtol=1e-4)
    with pytest.raises(ValueError, match="chunk_size"):
        mlstm_chunkwise_triton(q, k, v, i_pre, f_pre, chunk_size=24)
    with pytest.raises(ValueError, match="head dim"):
        mlstm_chunkwise_triton(q[..., :8], k[..., :8], v, i_pre, f_pre)


def _saturated_grad_errors(i_pre, f_pre, T=48, H=2, D=32):
    """Relative (norm-wise) gradient errors of the Triton kernel against fp64 autograd of the parallel form, after
    the model's per-head LayerNorm (eps 1e-6), at the given gate pre-activations; the cell's eps is the model's 1e-6."""
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, T, H, D, generator=g) for _ in range(3))
    args = [x.requires_grad_() for x in (q, k, v, i_pre(T, H, g), f_pre(T, H, g))]
    h, _ = mlstm_chunkwise_triton(*args, chunk_size=16)
    ref = [x.detach().double().requires_grad_() for x in args]
    h_ref, _ = mlstm_parallel(*ref)
    w = torch.randn(h.shape, generator=g, dtype=torch.float64)
    loss = lambda h: (F.layer_norm(h.double(), (D,), eps=1e-6) * w).sum()
    got, want = torch.autograd.grad(loss(h), args), torch.autograd.grad(loss(h_ref), ref)
    return {n: float((a.double() - b).norm() / b.norm()) for n, a, b in zip("qkvif", got, want)}


def test_saturated_gates_at_the_soft_cap_have_bounded_gradient_error():
    # Gates as the layer makes them at the soft cap (15 tanh(x / 15) of large x, both signs, random per step):
    # measured 2e-6 (q, k), 6e-6 (i), 2e-5 (f) relative error; the bound leaves a 50x margin.
    cap = lambda T, H, g: 15 * torch.tanh(100 * torch.randn(2, T, H, generator=g) / 15)
    errors = _saturated_grad_errors(cap, cap)
    assert max(errors.values()) < 1e-3, errors


@pytest.mark.xfail(strict=True, reason="known: at i = +15, f = -15 on every step (write everything, forget "
                   "everything) the Triton backward is off by 4% (dq, dk) and 26% (di) against fp64; the PyTorch "
                   "chunkwise path in fp32 is off by 0.7% (dq, dk) and 1e-5 (di) there, the output being nearly "
                   "sign(q.k) v. Strict: this fails once the kernel is fixed, to tighten the bound above.")
def test_write_all_forget_all_gates_gradient_error():
    errors = _saturated_grad_errors(lambda T, H, g: torch.full((2, T, H), 14.99),
                                    lambda T, H, g: torch.full((2, T, H), -14.99))
    assert max(errors[n] for n in "qki") < 1e-2, errors


@pytest.mark.parametrize("with_initial_state", [False, True])
def test_recomputed_chunk_states_give_identical_gradients_and_save_less(with_initial_state):
    # recompute_states runs the states kernel again in the backward: the gradients must be bit-identical to saving
    # the states, and the saved set must lose the [B*H, NC, DQK, DV] fp32 states.
    T, H, dqk, dv, chunk = 50, 2, 16, 32, 16
    initial = None
    if with_initial_state:
        _, initial = mlstm_chunkwise_triton(*[x.detach() for x in _inputs(20, H, dqk, dv, torch.float32, seed=1)],
                                            chunk_size=chunk)
    results = {}
    for recompute in (False, True):
        args = _inputs(T, H, dqk, dv, torch.float32)
        saved = []
        with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t.numel() * t.element_size()) or t,
                                                      lambda t: t):
            h, _ = mlstm_chunkwise_triton(*args, initial_state=initial, chunk_size=chunk, recompute_states=recompute)
        grads = torch.autograd.grad(_normed_loss(h, torch.ones_like(h, dtype=torch.float64)), args)
        results[recompute] = h, grads, sum(saved)
    (h0, g0, bytes0), (h1, g1, bytes1) = results[False], results[True]
    assert torch.equal(h0, h1) and all(torch.equal(a, b) for a, b in zip(g0, g1))
    chunks = -(-T // chunk)
    chunk_states = 2 * H * chunks * (dqk * dv + 1) * 4  # (C, m) entering each chunk, fp32
    kept_initial = 2 * H * (dqk * dv + dqk + 1) * 4 if with_initial_state else 0  # recomputing needs (C0, n0, m0)
    assert bytes0 - bytes1 == chunk_states - kept_initial, (bytes0, bytes1, chunk_states, kept_initial)
