"""NX-AI's TFLA mLSTM kernels (`mlstm: tfla`, mlstm_kernels' chunkwise--triton_xl_chunk) through the Triton
interpreter on CPU against this project's reference forms: outputs, final states, gradients after the per-head norm,
carried state, lengths their kernels do not take as they are (padded), the dispatch and the config check; and how
far their backward is from exact at the soft cap. Skipped where mlstm_kernels is not installed (bash setup.sh tfla)."""
import pytest
import torch
import torch.nn.functional as F

from swax_lightning.core.errors import ConfigError
from swax_lightning.kernels import backends, mlstm_chunkwise, mlstm_parallel, mlstm_recurrent
from swax_lightning.model.config import ModelConfig
from tests.kernels.test_mlstm_triton import saturated_grad_errors

pytest.importorskip("mlstm_kernels")
from swax_lightning.kernels.mlstm.tfla import mlstm_chunkwise_tfla, padded_length  # noqa: E402


def _inputs(T, H=2, dqk=16, dv=32, seed=0):
    g = torch.Generator().manual_seed(seed)
    q, k, v = torch.randn(2, T, H, dqk, generator=g), torch.randn(2, T, H, dqk, generator=g), torch.randn(2, T, H, dv,
                                                                                                         generator=g)
    i_pre, f_pre = 2 * torch.randn(2, T, H, generator=g), 2 * torch.randn(2, T, H, generator=g) + 2
    return [x.requires_grad_() for x in (q, k, v, i_pre, f_pre)]


@pytest.mark.parametrize("T,chunk", [(50, 16), (130, 64)])  # padded to 64 (a power of two) and 192 (chunks)
def test_matches_reference_forward_backward_and_states(T, chunk):
    args = _inputs(T, seed=T)
    h, state = mlstm_chunkwise_tfla(*args, chunk_size=chunk)
    ref_args = [x.detach().double().requires_grad_() for x in args]
    h_ref, _ = mlstm_parallel(*ref_args)
    _, state_ref = mlstm_recurrent(*[x.detach().double() for x in args])
    assert h.shape == h_ref.shape and h.dtype == torch.float32
    torch.testing.assert_close(h.double(), h_ref, atol=1e-4, rtol=1e-4)
    for got, want in zip(state, state_ref):
        torch.testing.assert_close(got.double(), want, atol=1e-4, rtol=1e-4)
    weight = torch.randn(h.shape, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    loss = lambda h: (F.rms_norm(h.double(), (h.shape[-1],)) * weight).sum()
    for name, got, want in zip("qkvif", torch.autograd.grad(loss(h), args), torch.autograd.grad(loss(h_ref), ref_args)):
        torch.testing.assert_close(got.double(), want, atol=1e-4, rtol=1e-4, msg=lambda m: f"d{name}: {m}")


def test_carried_state_equals_one_pass():
    q, k, v, i_pre, f_pre = (x.detach() for x in _inputs(40))
    h_full, s_full = mlstm_chunkwise_tfla(q, k, v, i_pre, f_pre, chunk_size=16)
    h1, s1 = mlstm_chunkwise_tfla(q[:, :23], k[:, :23], v[:, :23], i_pre[:, :23], f_pre[:, :23], chunk_size=16)
    h2, s2 = mlstm_chunkwise_tfla(q[:, 23:], k[:, 23:], v[:, 23:], i_pre[:, 23:], f_pre[:, 23:], s1, chunk_size=16)
    torch.testing.assert_close(torch.cat([h1, h2], 1), h_full, atol=1e-4, rtol=1e-4)
    for a, b in zip(s2, s_full):
        torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-4)


def test_padded_lengths():
    assert [padded_length(T, 64) for T in (1, 16, 17, 100, 128, 129, 200)] == [16, 16, 32, 128, 128, 192, 256]


def test_dispatch_and_config():
    q, k, v, i_pre, f_pre = (x.detach() for x in _inputs(20))
    h, _ = mlstm_chunkwise(q, k, v, i_pre, f_pre, chunk_size=16, kernel="tfla")
    torch.testing.assert_close(h, mlstm_parallel(q, k, v, i_pre, f_pre)[0], atol=1e-4, rtol=1e-4)
    ModelConfig(d_model=64, mlstm_heads=2, chunk_size=32, kernels={"mlstm": "tfla"})
    with pytest.raises(ConfigError, match=r"ModelConfig.kernels.mlstm: tfla takes .* chunk_size in"):
        ModelConfig(d_model=64, mlstm_heads=2, chunk_size=24, kernels={"mlstm": "tfla"})


def test_auto_on_cuda_picks_the_measured_backend(monkeypatch):
    pick = lambda dqk, dv, chunk=64: backends.mlstm_backend("auto", is_cuda=True, qk_head_dim=dqk, v_head_dim=dv,
                                                            chunk_size=chunk)
    assert pick(128, 128) == "triton" and pick(64, 64) == "triton" and pick(64, 64, chunk=24) == "torch"
    monkeypatch.setitem(backends.MLSTM_AUTO_MEASURED, (64, 64), "tfla")
    monkeypatch.setitem(backends.MLSTM_AUTO_MEASURED, (24, 24), "tfla")
    assert pick(64, 64) == "tfla" and pick(24, 24) == "triton"  # head dims TFLA cannot take: the own kernel
    assert backends.mlstm_backend("auto", is_cuda=False, qk_head_dim=64, v_head_dim=64, chunk_size=64) == "torch"


def test_backward_at_independent_saturated_gates_matches_fp64():
    errors = saturated_grad_errors("independent", 0, kernel=mlstm_chunkwise_tfla)
    assert max(errors["triton"].values()) < 1e-3, errors


@pytest.mark.xfail(strict=True, reason="known: TFLA's backward holds the normaliser and the stabiliser constant, "
                   "exact only where the per-head norm cancels them; at i = -f near the soft cap (issue 31's case) "
                   "it is off by 7e-3 (dq, dk) and 2e-2 (di, df) against fp64, as the own kernel was before it took "
                   "their terms (tests/kernels/test_mlstm_triton.py). Strict: fails once TFLA is exact there.")
def test_backward_at_the_soft_cap_with_i_equal_minus_f_is_exact():
    errors = saturated_grad_errors("i=-f", 0, kernel=mlstm_chunkwise_tfla)
    assert max(errors["triton"][n] for n in "vif") < 1e-3, errors
