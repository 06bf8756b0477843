"""The mLSTM layer against a hand-written xLSTM-7B-style layer with the same weights: the per-head LayerNorm output
norm (mean subtracted, fp32, weight, no bias) makes them equal; the RMSNorm option, kept for comparison, does not."""
import pytest
import torch

from swax_lightning.core.errors import ConfigError
from swax_lightning.kernels import mlstm_parallel
from swax_lightning.model.building_blocks import MultiHeadLayerNorm, MultiHeadRMSNorm
from swax_lightning.model.config import ModelConfig
from swax_lightning.model.mlstm import MLSTMLayer

CFG = dict(d_model=64, mlstm_heads=4, chunk_size=16, gate_soft_cap=15.0, norm_eps=1e-6)


def xlstm7b_layer(layer: MLSTMLayer, x: torch.Tensor) -> torch.Tensor:
    """xLSTM-7B's mLSTM layer written out from its published form, reading the weights of `layer`."""
    B, T, _ = x.shape
    H = layer.heads
    cap = lambda z: 15.0 * torch.tanh(z / 15.0)
    q, k, v = (x @ p.weight.T for p in (layer.q_proj, layer.k_proj, layer.v_proj))
    o = x @ layer.ogate.weight.T
    i_pre = cap(x @ layer.igate.weight.T + layer.igate.bias)
    f_pre = cap(x @ layer.fgate.weight.T + layer.fgate.bias)
    h, _ = mlstm_parallel(q.view(B, T, H, -1), k.view(B, T, H, -1), v.view(B, T, H, -1), i_pre, f_pre)
    h32 = h if h.dtype == torch.float64 else h.float()  # per-head layer norm in fp32 (fp64 stays), cast, weight
    centred = h32 - h32.mean(-1, keepdim=True)
    normed = (centred * torch.rsqrt(h32.var(-1, keepdim=True, unbiased=False) + 1e-6)).to(h.dtype)
    h_norm = normed.reshape(B, T, -1) * layer.norm.weight
    return (torch.sigmoid(o) * h_norm) @ layer.out_proj.weight.T


def _layer(norm: str, seed: int = 0) -> MLSTMLayer:
    torch.manual_seed(seed)
    layer = MLSTMLayer(ModelConfig(**CFG, mlstm_norm=norm)).double()
    with torch.no_grad():  # non-trivial weights everywhere, the gates included, so every term is exercised
        for p in layer.parameters():
            p.copy_(torch.randn_like(p) * (0.3 if p.dim() > 1 else 1.0))
        layer.norm.weight.add_(1.0)
    return layer


def test_layernorm_layer_equals_the_xlstm7b_reference():
    layer = _layer("layernorm")
    assert isinstance(layer.norm, MultiHeadLayerNorm)
    x = torch.randn(2, 37, CFG["d_model"], dtype=torch.float64, requires_grad=True)
    out, ref = layer(x), xlstm7b_layer(layer, x)
    torch.testing.assert_close(out, ref, atol=1e-10, rtol=1e-10)
    grad = torch.randn_like(out)
    params = list(layer.parameters())
    for a, b in zip(torch.autograd.grad(out, [x, *params], grad), torch.autograd.grad(ref, [x, *params], grad)):
        torch.testing.assert_close(a, b, atol=1e-9, rtol=1e-9)


def test_rmsnorm_option_differs_from_xlstm7b():
    layer = _layer("rmsnorm")
    assert isinstance(layer.norm, MultiHeadRMSNorm)
    x = torch.randn(2, 37, CFG["d_model"], dtype=torch.float64)
    diff = (layer(x) - xlstm7b_layer(layer, x)).norm() / xlstm7b_layer(layer, x).norm()
    assert diff > 1e-3  # the mean of each head's output is not zero, so the two norms disagree


def test_layernorm_by_hand_and_in_bf16():
    norm = MultiHeadLayerNorm(2, 4, eps=1e-6)
    with torch.no_grad():
        norm.weight.copy_(torch.arange(1.0, 9.0))
    x = torch.tensor([[1.0, 2.0, 3.0, 4.0], [10.0, 10.0, 10.0, 14.0]])
    z = (x - x.mean(-1, keepdim=True)) / (x.var(-1, unbiased=False, keepdim=True) + 1e-6).sqrt()
    torch.testing.assert_close(norm(x), z * torch.arange(1.0, 9.0).view(2, 4))
    xb = (x * 100).bfloat16()  # statistics taken in fp32: a bf16 input gives the fp32 answer rounded once
    torch.testing.assert_close(norm(xb).float(), norm(x).bfloat16().float(), atol=0.05, rtol=0.02)
    assert norm(xb).dtype == torch.bfloat16


def test_unknown_norm_is_named():
    with pytest.raises(ConfigError, match="mlstm_norm"):
        ModelConfig(mlstm_norm="batchnorm")
