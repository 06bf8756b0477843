"""mLSTM cell: parallel, chunkwise and recurrent forms agree; carried state equals one pass; extreme gates finite."""
import pytest
import torch
import torch.nn.functional as F

from swax_lightning.kernels import MLSTMState, mlstm_chunkwise, mlstm_parallel, mlstm_recurrent
from swax_lightning.model.config import ModelConfig
from swax_lightning.model.mlstm import MLSTMLayer


def _inputs(T, B=2, H=3, dqk=8, dv=16, dtype=torch.float64, seed=0, gate_scale=3.0):
    g = torch.Generator().manual_seed(seed)
    rnd = lambda *s: torch.randn(*s, generator=g, dtype=dtype)
    q, k, v = rnd(B, T, H, dqk), rnd(B, T, H, dqk), rnd(B, T, H, dv)
    i_pre = rnd(B, T, H) * gate_scale
    f_pre = rnd(B, T, H) * gate_scale + 2.0
    return q, k, v, i_pre, f_pre


def _assert_states_close(a: MLSTMState, b: MLSTMState, **tol):
    for x, y in zip(a, b):
        torch.testing.assert_close(x, y, **tol)


@pytest.mark.parametrize("T", [1, 7, 16, 64, 100])
@pytest.mark.parametrize("chunk", [4, 16])
def test_three_forms_agree_fp64(T, chunk):
    args = _inputs(T)
    h_par, s_par = mlstm_parallel(*args)
    h_rec, s_rec = mlstm_recurrent(*args)
    h_chk, s_chk = mlstm_chunkwise(*args, chunk_size=chunk)
    tol = dict(atol=1e-9, rtol=1e-9)
    torch.testing.assert_close(h_chk, h_par, **tol)
    torch.testing.assert_close(h_rec, h_par, **tol)
    _assert_states_close(s_chk, s_rec, **tol)
    _assert_states_close(s_par, s_rec, **tol)


def test_forms_agree_fp32():
    args = [x.float() for x in _inputs(100, gate_scale=1.0)]
    h_par, _ = mlstm_parallel(*args)
    h_chk, _ = mlstm_chunkwise(*args, chunk_size=16)
    h_rec, _ = mlstm_recurrent(*args)
    assert h_chk.dtype == torch.float32
    torch.testing.assert_close(h_chk, h_par, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(h_rec, h_par, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("split", [5, 16, 37, 63])
def test_carried_state_equals_one_pass(split):
    q, k, v, i_pre, f_pre = _inputs(80)
    h_full, s_full = mlstm_chunkwise(q, k, v, i_pre, f_pre, chunk_size=16)
    h1, s1 = mlstm_chunkwise(q[:, :split], k[:, :split], v[:, :split], i_pre[:, :split], f_pre[:, :split],
                             chunk_size=16)
    h2, s2 = mlstm_chunkwise(q[:, split:], k[:, split:], v[:, split:], i_pre[:, split:], f_pre[:, split:], s1,
                             chunk_size=16)
    torch.testing.assert_close(torch.cat([h1, h2], 1), h_full, atol=1e-9, rtol=1e-9)
    _assert_states_close(s2, s_full, atol=1e-9, rtol=1e-9)
    # The parallel form continues from the same carried state too.
    h2_par, s2_par = mlstm_parallel(q[:, split:], k[:, split:], v[:, split:], i_pre[:, split:], f_pre[:, split:], s1)
    torch.testing.assert_close(h2_par, h2, atol=1e-9, rtol=1e-9)
    _assert_states_close(s2_par, s2, atol=1e-9, rtol=1e-9)


@pytest.mark.parametrize("gate", [30.0, -30.0])
def test_extreme_gate_preactivations_are_finite(gate):
    q, k, v, _, _ = _inputs(50, dtype=torch.float32)
    sign = torch.where(torch.rand(2, 50, 3) > 0.5, 1.0, -1.0)
    for i_pre, f_pre in [(torch.full((2, 50, 3), gate), torch.full((2, 50, 3), gate)), (gate * sign, -gate * sign)]:
        for form in (mlstm_parallel, mlstm_recurrent, lambda *a: mlstm_chunkwise(*a, chunk_size=16)):
            h, state = form(q, k, v, i_pre, f_pre)
            assert torch.isfinite(h).all() and all(torch.isfinite(s).all() for s in state)
        torch.testing.assert_close(mlstm_chunkwise(q, k, v, i_pre, f_pre, chunk_size=16)[0],
                                   mlstm_parallel(q, k, v, i_pre, f_pre)[0], atol=1e-3, rtol=1e-3)


def test_layer_under_bf16_autocast_with_extreme_gates():
    cfg = ModelConfig(d_model=32, n_layers=2, n_heads=2, mlstm_heads=2, chunk_size=8)
    layer = MLSTMLayer(cfg)
    with torch.no_grad():  # drive the gate pre-activations to +-30 before the soft cap
        layer.igate.weight.zero_(), layer.fgate.weight.zero_()
        layer.igate.bias.copy_(torch.tensor([30.0, -30.0])), layer.fgate.bias.copy_(torch.tensor([-30.0, 30.0]))
    x = torch.randn(2, 21, 32, requires_grad=True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = layer(x)
    y.float().sum().backward()
    assert torch.isfinite(y).all() and torch.isfinite(x.grad).all()
    assert all(torch.isfinite(p.grad).all() for p in layer.parameters())


def test_gradients_agree_after_per_head_norm():
    q, k, v, i_pre, f_pre = (x.requires_grad_() for x in _inputs(45, gate_scale=2.0))
    weight = torch.randn(45, 3, 16, dtype=torch.float64)
    grads = []
    for form in (mlstm_parallel, mlstm_recurrent, lambda *a: mlstm_chunkwise(*a, chunk_size=8)):
        h, _ = form(q, k, v, i_pre, f_pre)
        loss = (F.rms_norm(h, (16,)) * weight).sum()
        grads.append(torch.autograd.grad(loss, (q, k, v, i_pre, f_pre)))
    for other in grads[1:]:
        for a, b in zip(other, grads[0]):
            torch.testing.assert_close(a, b, atol=1e-7, rtol=1e-7)


def test_steps_with_input_gate_zero_and_forget_gate_one_leave_the_state_unchanged():
    # Left padding in batched inference: whole chunks of such steps must be exact no-ops, with no nan.
    q, k, v, i_pre, f_pre = _inputs(40)
    _, state = mlstm_chunkwise(q[:, :9], k[:, :9], v[:, :9], i_pre[:, :9], f_pre[:, :9], chunk_size=4)
    pad_i, pad_f = torch.full_like(i_pre, float("-inf")), torch.full_like(f_pre, float("inf"))
    h, after = mlstm_chunkwise(q, k, v, pad_i, pad_f, state, chunk_size=4)
    assert torch.isfinite(h).all()
    _assert_states_close(after, state, atol=0, rtol=0)
