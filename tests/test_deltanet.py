"""Gated DeltaNet: recurrent and chunkwise forms agree forward and backward on odd lengths; carried state equals one
pass; the layer is finite at extreme gates; a full-attention model converted to SWA with sinks."""
import pytest
import torch
import torch.nn.functional as F

from swax_lightning.kernels import gated_delta_chunkwise, gated_delta_recurrent
from swax_lightning.model.config import ModelConfig
from swax_lightning.model.model import SWAXModel


def _inputs(T, B=2, H=3, dk=8, dv=16, seed=0):
    g = torch.Generator().manual_seed(seed)
    rnd = lambda *s: torch.randn(*s, generator=g, dtype=torch.float64)
    q, k = F.normalize(rnd(B, T, H, dk), dim=-1), F.normalize(rnd(B, T, H, dk), dim=-1)
    v = rnd(B, T, H, dv)
    beta = torch.sigmoid(rnd(B, T, H) * 2)
    decay = -F.softplus(rnd(B, T, H)) * 0.5
    return [x.requires_grad_() for x in (q, k, v, beta, decay)]


@pytest.mark.parametrize("T", [1, 7, 16, 45])
@pytest.mark.parametrize("chunk", [4, 16])
def test_recurrent_and_chunkwise_agree_forward_and_backward(T, chunk):
    args = _inputs(T)
    o_rec, s_rec = gated_delta_recurrent(*args)
    o_chk, s_chk = gated_delta_chunkwise(*args, chunk_size=chunk)
    torch.testing.assert_close(o_chk, o_rec, atol=1e-10, rtol=1e-10)
    torch.testing.assert_close(s_chk, s_rec, atol=1e-10, rtol=1e-10)
    weight = torch.randn(o_rec.shape, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    g_rec = torch.autograd.grad((o_rec * weight).sum() + s_rec.sum(), args)
    g_chk = torch.autograd.grad((o_chk * weight).sum() + s_chk.sum(), args)
    for name, a, b in zip(["q", "k", "v", "beta", "g"], g_chk, g_rec):
        torch.testing.assert_close(a, b, atol=1e-9, rtol=1e-9, msg=lambda m: f"d{name}: {m}")


@pytest.mark.parametrize("split", [3, 16, 29])
def test_carried_state_equals_one_pass(split):
    q, k, v, beta, g = (x.detach() for x in _inputs(40))
    o_full, s_full = gated_delta_chunkwise(q, k, v, beta, g, chunk_size=8)
    o1, s1 = gated_delta_chunkwise(q[:, :split], k[:, :split], v[:, :split], beta[:, :split], g[:, :split],
                                   chunk_size=8)
    o2, s2 = gated_delta_chunkwise(q[:, split:], k[:, split:], v[:, split:], beta[:, split:], g[:, split:], s1,
                                   chunk_size=8)
    torch.testing.assert_close(torch.cat([o1, o2], 1), o_full, atol=1e-10, rtol=1e-10)
    torch.testing.assert_close(s2, s_full, atol=1e-10, rtol=1e-10)
    o2_rec, _ = gated_delta_recurrent(q[:, split:], k[:, split:], v[:, split:], beta[:, split:], g[:, split:], s1)
    torch.testing.assert_close(o2_rec, o2, atol=1e-10, rtol=1e-10)


def test_padding_steps_leave_the_state_unchanged():
    q, k, v, beta, g = (x.detach() for x in _inputs(20))
    _, state = gated_delta_chunkwise(q, k, v, beta, g, chunk_size=8)
    o, after = gated_delta_chunkwise(q, k, v, torch.zeros_like(beta), torch.zeros_like(g), state, chunk_size=8)
    torch.testing.assert_close(after, state, atol=0, rtol=0)


def test_layer_is_finite_at_extreme_gates_under_bf16():
    torch.manual_seed(0)
    model = SWAXModel(ModelConfig(vocab_size=50, d_model=32, n_layers=2, pattern="SD", n_heads=2, deltanet_heads=2,
                                  chunk_size=8, window=4))
    layer = model.blocks[1].mixer
    with torch.no_grad():
        layer.beta_proj.weight.fill_(1.0), layer.decay_proj.weight.fill_(5.0)  # beta -> 1, decay -> strongly negative
    idx = torch.randint(0, 50, (2, 37))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        logits = model(idx)
    logits.logsumexp(-1).mean().backward()
    assert torch.isfinite(logits).all()
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)


def _full_attention_model():
    torch.manual_seed(0)
    return SWAXModel(ModelConfig(vocab_size=50, d_model=32, n_layers=2, pattern="A", n_heads=4, init_std=0.2)).eval()


def test_converted_full_attention_with_window_at_least_T_is_exact():
    model = _full_attention_model()
    idx = torch.randint(0, 50, (2, 30))
    with torch.no_grad():
        full = model(idx)
        model.convert_full_attention(window=30, n_sink=4)
        converted = model(idx)
    assert torch.equal(converted, full)


def test_converted_full_attention_with_short_window_streams_in_bounded_memory():
    from swax_lightning.model.inference import prefill

    model = _full_attention_model()
    model.convert_full_attention(window=8, n_sink=4)
    idx = torch.randint(0, 50, (1, 200))
    with torch.no_grad():
        reference = model(idx)  # the blocked SWA path
    caches = model.new_caches(1)
    before = [c.nbytes() for c in caches]
    streamed = prefill(model, idx, torch.arange(200)[None], caches, chunk_len=16, return_all=True)
    assert [c.nbytes() for c in caches] == before  # a ring of 8 keys + 4 sinks per layer, whatever the length
    torch.testing.assert_close(streamed, reference, atol=1e-4, rtol=1e-4)
    full = _full_attention_model()
    with torch.no_grad():
        assert (full(idx)[:, 20:] - reference[:, 20:]).abs().max() > 1e-3  # the conversion does change the model


def test_short_convolution_is_the_causal_sum_it_claims():
    # y_t = silu(sum_j w[c, j] x_{t-K+1+j}), zeros before the sequence; a later input never changes an earlier output.
    from swax_lightning.model.building_blocks import ShortConv
    conv = ShortConv(channels=3, kernel=4).double()
    torch.nn.init.normal_(conv.weight, generator=torch.Generator().manual_seed(0))
    x = torch.randn(2, 9, 3, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    y, state = conv(x)
    padded = F.pad(x, (0, 0, 3, 0))
    want = torch.stack([F.silu((padded[:, t:t + 4] * conv.weight[:, 0].T).sum(1)) for t in range(9)], 1)
    torch.testing.assert_close(y, want)
    assert torch.equal(state, x[:, -3:])
    x2 = x.clone()
    x2[:, 6:] += 1.0
    assert torch.equal(conv(x2)[0][:, :6], y[:, :6]) and not torch.equal(conv(x2)[0][:, 6:], y[:, 6:])


def test_short_convolutions_change_the_layer_and_init_deterministically():
    cfg = dict(vocab_size=50, d_model=32, n_layers=2, pattern="SD", deltanet_heads=2, window=4, chunk_size=8)
    idx = torch.randint(0, 50, (1, 20), generator=torch.Generator().manual_seed(0))
    plain, conv_a, conv_b = (SWAXModel(ModelConfig(**cfg, deltanet_conv=k)) for k in (0, 4, 4))
    for m in (plain, conv_a, conv_b):
        m.reset_parameters(seed=3)
    assert torch.equal(conv_a(idx), conv_b(idx)) and not torch.allclose(plain(idx), conv_a(idx))
    n = lambda model: sum(p.numel() for p in model.parameters())
    assert n(conv_a) - n(plain) == 4 * (16 + 16 + 32)
