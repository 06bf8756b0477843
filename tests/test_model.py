"""Whole model: causality per pattern, configuration errors, window switching, parameter count."""
import pytest
import torch

from swax_lightning.core.errors import ConfigError
from swax_lightning.model.config import ModelConfig
from swax_lightning.model.model import SWAXModel

SMALL = dict(vocab_size=50, d_model=32, n_heads=4, mlstm_heads=2, deltanet_heads=2, chunk_size=8, window=5)


def _model(pattern, n_layers=None, seed=0, **overrides):
    torch.manual_seed(seed)
    cfg = ModelConfig(**(SMALL | dict(pattern=pattern, n_layers=n_layers or 2 * len(pattern)) | overrides))
    return SWAXModel(cfg).double().eval()


@pytest.mark.parametrize("pattern,n_sink,conv", [("S", 0, 0), ("S", 2, 0), ("X", 0, 0), ("A", 0, 0), ("SX", 0, 0),
                                                 ("SX", 2, 0), ("D", 0, 0), ("SD", 2, 0), ("SA", 0, 0), ("SA", 2, 3)])
def test_causality(pattern, n_sink, conv):
    model = _model(pattern, n_sink=n_sink, attention_conv=conv)
    idx = torch.randint(0, 50, (2, 29))
    changed = idx.clone()
    t = 17
    changed[:, t] = (changed[:, t] + 1) % 50
    with torch.no_grad():
        a, b = model(idx), model(changed)
    torch.testing.assert_close(a[:, :t], b[:, :t], atol=1e-12, rtol=0)
    assert (a[:, t:] - b[:, t:]).abs().amax() > 1e-6  # the change does reach the later positions


def test_window_reaches_only_what_it_should():
    # One SWA layer, W = 5: position t's output depends on tokens t-4 .. t only (no sinks).
    model = _model("S", n_layers=1)
    idx = torch.randint(0, 50, (1, 20))
    changed = idx.clone()
    changed[:, 3] = (changed[:, 3] + 1) % 50
    with torch.no_grad():
        a, b = model(idx), model(changed)
    diff = (a - b).abs().amax(-1)[0]
    assert (diff[3:8] > 0).all() and (diff[8:] == 0).all() and (diff[:3] == 0).all()
    model.set_window(6)
    with torch.no_grad():
        diff6 = (model(idx) - model(changed)).abs().amax(-1)[0]
    assert diff6[8] > 0 and model.window == 6


def test_attention_convolutions_widen_the_reach_by_kernel_minus_one():
    # One SWA layer, W = 5, short convolutions of K = 3 on q, k, v: position t reads tokens t-6 .. t (W + K - 1),
    # and the layer differs from the same weights without them.
    model = _model("S", n_layers=1, attention_conv=3)
    idx = torch.randint(0, 50, (1, 20))
    changed = idx.clone()
    changed[:, 3] = (changed[:, 3] + 1) % 50
    with torch.no_grad():
        diff = (model(idx) - model(changed)).abs().amax(-1)[0]
    assert (diff[3:10] > 0).all() and (diff[10:] == 0).all() and (diff[:3] == 0).all()
    plain = _model("S", n_layers=1)
    plain.load_state_dict(model.state_dict(), strict=False)
    assert sum(p.numel() for p in model.parameters()) - sum(p.numel() for p in plain.parameters()) == 3 * 3 * 32
    with torch.no_grad():
        assert not torch.allclose(plain(idx), model(idx))


def test_window_at_least_T_equals_full_attention():
    swa, full = _model("S", n_sink=3), _model("A")
    full.load_state_dict(swa.state_dict())
    idx = torch.randint(0, 50, (2, 24))
    swa.set_window(24)
    with torch.no_grad():
        torch.testing.assert_close(swa(idx), full(idx), atol=1e-12, rtol=0)
    full.set_window(3)  # full-attention layers ignore the window
    assert full.window is None


def test_param_count_and_tied_embeddings():
    model = _model("SX")
    assert model.num_params() == sum(p.numel() for p in model.parameters())
    tied = _model("SX", tie_embeddings=True)
    assert model.num_params() - tied.num_params() == 50 * 32
    assert model.num_params(exclude_embedding=True) == model.num_params() - 50 * 32
    assert "".join(b.kind for b in model.blocks) == "SXSX"


def test_bf16_autocast_forward_backward_finite():
    torch.manual_seed(0)
    model = SWAXModel(ModelConfig(**SMALL, pattern="SX", n_layers=2))
    idx = torch.randint(0, 50, (2, 19))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        logits = model(idx)
    assert logits.dtype == torch.float32 and torch.isfinite(logits).all()
    logits.logsumexp(-1).mean().backward()
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)


@pytest.mark.parametrize("field,value", [
    ("d_model", 30),          # not divisible by n_heads = 4
    ("pattern", "SXQ"),       # unknown letter
    ("pattern", ""),
    ("window", 0),
    ("n_sink", -1),
    ("n_layers", 3),          # not a multiple of len("SX")
    ("n_kv_heads", 3),        # does not divide n_heads
    ("mlstm_heads", 3),       # does not divide the q/k width
    ("deltanet_heads", 3),
    ("attention_conv", -1),
    ("norm_eps", 0.0),
    ("max_positions", 0),
    ("rope_scale", {"type": "yarn", "factor": 4.0}),
    ("rope_scale", {"type": "linear"}),                        # factor missing
    ("rope_scale", {"type": "llama3", "factor": 8.0, "low_freq_factor": 4.0, "high_freq_factor": 1.0,
                    "original_max_position_embeddings": 64}),  # high <= low
])
def test_bad_config_names_the_field(field, value):
    with pytest.raises(ConfigError, match=rf"ModelConfig\.{field}\b|{field}"):
        ModelConfig(**(SMALL | {"n_layers": 2, field: value}))


@pytest.mark.parametrize("changes, message", [
    ({"window": 300, "max_positions": 256}, r"ModelConfig\.window must be <= max_positions=256"),
    ({"rope_scale": {"type": "dynamic", "factor": 2.0}}, r"ModelConfig\.max_positions must be set for rope_scale"),
])
def test_pretrained_fields_are_checked_together(changes, message):
    with pytest.raises(ConfigError, match=message):
        ModelConfig(**(SMALL | {"n_layers": 2} | changes))


@pytest.mark.parametrize("includes_sinks, reached", [(False, range(5, 11)), (True, range(5, 9))])
def test_window_conventions_of_the_training_free_conversion(includes_sinks, reached):
    """One full-attention layer run as SWA(6, 2): token 5 reaches the 6 positions 5 .. 10 when the window counts the
    recent keys, the 4 positions 5 .. 8 when it counts the 2 sinks too; a sink (token 1) reaches every later one."""
    model = _model("A", n_layers=1)
    model.convert_full_attention(6, 2, window_includes_sinks=includes_sinks)
    idx = torch.randint(0, 50, (1, 20))
    with torch.no_grad():
        for token, expected in ((5, reached), (1, range(1, 20))):
            changed = idx.clone()
            changed[:, token] = (changed[:, token] + 1) % 50
            diff = (model(idx) - model(changed)).abs().amax(-1)[0]
            assert [t for t in range(20) if diff[t] > 0] == list(expected)
    with pytest.raises(ConfigError, match="leaves no recent key"):
        model.convert_full_attention(2, 2, window_includes_sinks=True)


def test_set_window_rejects_bad_value():
    with pytest.raises(ValueError, match="window"):
        _model("SX").set_window(0)
