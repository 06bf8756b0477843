"""Triton chunkwise mLSTM (through the Triton interpreter on CPU) against the PyTorch reference forms: outputs,
final states, gradients after the per-head norm, carried state, odd lengths, extreme gates, unwritten outputs."""
import pytest
import torch
import torch.nn.functional as F

import swax_lightning.kernels.mlstm.triton as mlstm_triton_module
from swax_lightning import kernels
from swax_lightning.kernels import mlstm_chunkwise, mlstm_parallel, mlstm_recurrent
from swax_lightning.kernels.mlstm.triton import mlstm_chunkwise_triton
from swax_lightning.kernels.util import soft_cap
from swax_lightning.model.building_blocks import MultiHeadLayerNorm
from swax_lightning.model.config import ModelConfig

TOL = {torch.float32: dict(atol=1e-4, rtol=1e-4), torch.float16: dict(atol=2e-2, rtol=2e-2),
       torch.bfloat16: dict(atol=1e-1, rtol=5e-2)}
# Half-precision gradients, norm-wise relative to fp64: 4x the dtype's unit roundoff. dh arrives rounded to the half
# dtype, and the normaliser's term of the backward (dh_t.h_t) inherits that rounding, so single small elements move
# by more than an elementwise bound while the whole gradient stays at the dtype's rounding (measured <= 9e-4 fp16,
# <= 8e-3 bf16).
HALF_GRAD_TOL = {torch.float16: 2e-3, torch.bfloat16: 1.6e-2}


@pytest.fixture(autouse=True)
def nan_outputs(monkeypatch):
    monkeypatch.setattr(mlstm_triton_module, "new_like", lambda x, dtype=None, shape=None: torch.full(
        shape or x.shape, float("nan"), dtype=dtype or x.dtype))


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
        if dtype == torch.float32:
            torch.testing.assert_close(got.double(), want, **TOL[dtype], msg=lambda m: f"d{name}: {m}")
        else:  # norm-wise: see HALF_GRAD_TOL
            assert (got.double() - want).norm() / want.norm() < HALF_GRAD_TOL[dtype], name


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


def _at_the_cap(x: torch.Tensor) -> torch.Tensor:
    return soft_cap(x, ModelConfig().gate_soft_cap)


def _independent(g, shape):
    return [_at_the_cap(100 * torch.randn(shape, generator=g)) for _ in range(2)]


def _i_minus_f(g, shape):
    i_pre = (torch.randint(0, 2, shape, generator=g) * 2.0 - 1) * _at_the_cap(40 + torch.randn(shape, generator=g))
    return [i_pre, -i_pre]


def _write_all(g, shape):
    return [_at_the_cap(torch.full(shape, 100.0)), _at_the_cap(torch.full(shape, -100.0))]


# Gate pre-activations (i~, f~) as the layer makes them at the soft cap 15, from a seeded generator: independent
# large gates of either sign; i~ = -f~ with random signs per step (issue 31: write and forget everything, or keep
# everything and write nothing); write and forget everything on every step.
SATURATED = {"independent": _independent, "i=-f": _i_minus_f, "write_all": _write_all}


def saturated_grad_errors(case, seed, device="cpu", kernel=mlstm_chunkwise_triton, T=48, H=2, D=32):
    """Norm-wise relative gradient errors, against fp64 autograd of the parallel form, of a kernel (the own Triton
    one unless given; same contract) and of the PyTorch chunkwise form in fp32 (autograd), after the model's per-head
    LayerNorm with its eps; the cell's eps is the model's 1e-6. Chunks of 16 over 48 steps: state carried across
    chunk boundaries. Inputs drawn on the CPU (the same on every device); tests/test_gpu.py runs it on CUDA."""
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(2, T, H, D, generator=g) for _ in range(3))
    inputs = [x.to(device) for x in (q, k, v, *SATURATED[case](g, (2, T, H)))]
    norm = MultiHeadLayerNorm(H, D, ModelConfig().norm_eps).double().to(device)
    w = torch.randn(2, T, H, D, generator=g, dtype=torch.float64).to(device)

    def grads(form, dtype):
        args = [x.to(dtype).requires_grad_() for x in inputs]
        return torch.autograd.grad((norm(form(*args)[0].double()) * w).sum(), args)

    want = grads(mlstm_parallel, torch.float64)
    forms = {"triton": lambda *a: kernel(*a, chunk_size=16),
             "torch": lambda *a: mlstm_chunkwise(*a, chunk_size=16)}
    return {name: {n: float((a.double() - b).norm() / b.norm()) for n, a, b in zip("qkvif", grads(form, torch.float32),
                                                                                  want)}
            for name, form in forms.items()}


def assert_exact_at_the_soft_cap(errors: dict) -> None:
    """dv, di, df of both forms within 1e-3 of fp64; dq, dk of the kernel within 5x of the PyTorch form's (the fp32
    floor here: see the test below) or 1e-3."""
    for form in ("triton", "torch"):
        assert max(errors[form][n] for n in "vif") < 1e-3, errors
    for n in "qk":
        assert errors["triton"][n] < max(1e-3, 5 * errors["torch"][n]), errors


@pytest.mark.parametrize("case,seed", [("independent", 0), ("i=-f", 0), ("i=-f", 1), ("i=-f", 2), ("write_all", 0)])
def test_gradients_at_the_soft_cap_match_fp64(case, seed):
    # The backward includes the normaliser's and the stabiliser's terms (the norm's eps makes them matter) and takes
    # each dominant log-weight gradient as an exact sum minus the others: dv, di, df within 1e-3 of fp64 (measured
    # 1e-7, <= 2e-5, <= 4e-5). dq and dk cannot be within 1e-3 in fp32 here: after the norm they are differences of
    # nearly equal terms (h_t is nearly the dominant key's v), and fp32 autograd through the PyTorch chunkwise form
    # is off by 3e-4 .. 3e-1 over seeds 0-9 (the parallel form by 3e-4 .. 8e-3); the kernel stays within 5x of the
    # former (measured <= 3.7x). The old backward (normaliser and stabiliser held constant, gate gradients from
    # q.dq - k.dk) was off by 6e-3 .. 7e-2 (dq, dk), 2e-2 .. 5e-2 (di) at i = -f.
    assert_exact_at_the_soft_cap(saturated_grad_errors(case, seed))


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
    chunk_states = 2 * H * chunks * (dqk * dv + dqk + 1) * 4  # (C, n, m) entering each chunk, fp32
    kept_initial = 2 * H * (dqk * dv + dqk + 1) * 4 if with_initial_state else 0  # recomputing needs (C0, n0, m0)
    assert bytes0 - bytes1 == chunk_states - kept_initial, (bytes0, bytes1, chunk_states, kept_initial)
