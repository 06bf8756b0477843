"""LoLCATs attention (kernels/lolcats): the block form against the dense reference, forward and backward, at odd
lengths and windows with GQA; the reference against a hand computation of one query; causality; the window-factor
extremes; the state a call hands on equals the continued sequence; the one-block decode read."""
import math

import pytest
import torch

from swax_lightning.kernels import LinearState, lolcats_chunked, lolcats_one_block, lolcats_reference
from swax_lightning.kernels.lolcats.naive import terraced_masks

H, HKV, D, F = 6, 2, 8, 4


def _inputs(T, B=2, seed=0, scale=1.5, dtype=torch.float32):
    """q, k, v and feature-map pre-activations zq, zk (features cat(softmax(z), softmax(-z)), as Hedgehog's) and the
    window-factor logits, all leaves."""
    g = torch.Generator().manual_seed(seed)
    rnd = lambda *s: torch.randn(*s, generator=g).to(dtype)
    leaves = [rnd(B, T, H, D) * scale, rnd(B, T, HKV, D) * scale, rnd(B, T, HKV, D), rnd(B, T, H, F), rnd(B, T, H, F),
              rnd(H)]
    return [x.requires_grad_() for x in leaves]


def _features(z):
    return torch.cat([z.softmax(-1), (-z).softmax(-1)], -1)


def _run(fn, q, k, v, zq, zk, logits, window, **kw):
    out = fn(q, k, v, _features(zq), _features(zk), torch.sigmoid(logits), window, **kw)
    return out[0] if isinstance(out, tuple) else out


CASES = [(64, T) for T in (1, 7, 63, 64, 65, 127, 200)] + [(1, 7), (3, 20), (4, 10), (4, 13), (8, 8), (8, 37),
                                                           (4, 41)]


@pytest.mark.parametrize("window,T", CASES)
def test_chunked_equals_the_reference_forward_and_backward(window, T):
    # in fp64, so that the two forms' different orders of summation leave no rounding to tolerate: a window-factor
    # gradient is a sum over every position and, in fp32, differed by 1.2e-5 on a value of 3e-6 (T = 127)
    leaves = _inputs(T, seed=T + window, dtype=torch.float64)
    y_ref = _run(lolcats_reference, *leaves, window)
    y_chk = _run(lolcats_chunked, *leaves, window)
    torch.testing.assert_close(y_chk, y_ref, atol=1e-12, rtol=1e-10)
    r = torch.randn(y_ref.shape, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    g_ref = torch.autograd.grad((y_ref * r).sum(), leaves)
    g_chk = torch.autograd.grad((y_chk * r).sum(), leaves)
    for name, a, b in zip(["q", "k", "v", "zq", "zk", "window_factors"], g_chk, g_ref):
        torch.testing.assert_close(a, b, atol=1e-10, rtol=1e-9, msg=lambda m: f"d{name}: {m}")


def test_the_reference_by_hand():
    """T = 10, window 4, query 9 (block 2): softmax over keys 4 .. 9 (blocks 1 and 2) shifted by their max, weighted
    w; linear over keys 0 .. 3 (block 0) with weight 1; no epsilon."""
    q, k, v, zq, zk, logits = (x.detach() for x in _inputs(10, B=1, seed=3))
    k, v = k[:, :, :1].expand(-1, -1, H, -1), v[:, :, :1].expand(-1, -1, H, -1)  # plain multi-head for the sums
    y = _run(lolcats_reference, q, k, v, zq, zk, logits, 4)[0, 9, 0]
    w = torch.sigmoid(logits[0]).item()
    Q, K, V = q[0, :, 0].tolist(), k[0, :, 0].tolist(), v[0, :, 0].tolist()

    def phi(z):
        pos, neg = [math.exp(a) for a in z], [math.exp(-a) for a in z]
        return [p / sum(pos) for p in pos] + [n / sum(neg) for n in neg]

    scores = {j: sum(a * b for a, b in zip(Q[9], K[j])) / math.sqrt(D) for j in range(4, 10)}
    top = max(scores.values())
    weights = {j: w * math.exp(s - top) for j, s in scores.items()}
    phi_q = phi(zq[0, 9, 0].tolist())
    weights.update({j: sum(a * b for a, b in zip(phi_q, phi(zk[0, j, 0].tolist()))) for j in range(4)})
    expected = [sum(weights[j] * V[j][d] for j in weights) / sum(weights.values()) for d in range(D)]
    torch.testing.assert_close(y, torch.tensor(expected), atol=1e-6, rtol=1e-6)


def test_the_terraced_masks_by_hand():
    window, linear = terraced_masks(7, 3)
    assert window[4].tolist() == [True] * 5 + [False] * 2  # block 1: all of block 0 and its own block so far
    assert window[6].tolist() == [False] * 3 + [True] * 4 and linear[6].tolist() == [True] * 3 + [False] * 4
    assert window[2].tolist() == [True] * 3 + [False] * 4 and not linear[:6].any()


@pytest.mark.parametrize("fn", [lolcats_reference, lolcats_chunked])
def test_causality(fn):
    q, k, v, zq, zk, logits = (x.detach() for x in _inputs(23, seed=5))
    y = _run(fn, q, k, v, zq, zk, logits, 4)
    for t in (0, 3, 4, 9, 22):
        changed = [x.clone() for x in (q, k, v, zq, zk)]
        for x in changed:
            x[:, t] += 1.0
        y2 = _run(fn, *changed, logits, 4)
        assert torch.equal(y2[:, :t], y[:, :t]) and not torch.allclose(y2[:, t], y[:, t])


def _softmax_causal(q, k, v):
    k, v = k.repeat_interleave(H // HKV, 2), v.repeat_interleave(H // HKV, 2)
    T = q.shape[1]
    s = torch.einsum("bthd,bjhd->bhtj", q, k) / math.sqrt(D)
    s = s.masked_fill(~torch.ones(T, T, dtype=torch.bool).tril(), float("-inf"))
    return torch.einsum("bhtj,bjhd->bthd", s.softmax(-1), v)


def _linear_only(q, k, v, zq, zk, window):
    """Linear attention over the keys before each query's terrace (what w -> 0 leaves beyond two blocks)."""
    v = v.repeat_interleave(H // HKV, 2)
    a = torch.einsum("bthf,bjhf->bhtj", _features(zq), _features(zk)) * terraced_masks(q.shape[1], window)[1]
    return torch.einsum("bhtj,bjhd->bthd", a, v) / a.sum(-1).transpose(1, 2)[..., None]


@pytest.mark.parametrize("fn", [lolcats_reference, lolcats_chunked])
def test_the_window_factor_extremes(fn):
    W, T = 4, 21
    q, k, v, zq, zk, _ = (x.detach() for x in _inputs(T, seed=7))
    full = _softmax_causal(q, k, v)
    for logit in (30.0, -30.0):
        y = _run(fn, q, k, v, zq, zk, torch.full((H,), logit), W)
        # Within two blocks every earlier key is in the terrace: causal softmax attention whatever w.
        torch.testing.assert_close(y[:, :2 * W], full[:, :2 * W], atol=1e-5, rtol=1e-5)
    # w -> 1 keeps the linear terms at weight 1 (no 1 - w, as LoLCATs' configs): not softmax beyond two blocks...
    y_hi = _run(fn, q, k, v, zq, zk, torch.full((H,), 30.0), W)
    assert (y_hi[:, 2 * W:] - full[:, 2 * W:]).abs().amin(-1).amin(-1).min() > 1e-4
    # ... and w -> 0 leaves the linear attention alone there.
    y_lo = _run(fn, q, k, v, zq, zk, torch.full((H,), -30.0), W)
    torch.testing.assert_close(y_lo[:, 2 * W:], _linear_only(q, k, v, zq, zk, W)[:, 2 * W:], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("window,n,T", [(4, 3, 11), (4, 8, 21), (4, 10, 23), (8, 17, 40), (3, 12, 13)])
def test_the_handed_on_state_continues_the_sequence(window, n, T):
    """The state after n tokens, fed to a call that starts at the previous block (where a cache starts it), gives
    the outputs of positions n .. T-1 of one pass; the state is the linear sums of the keys before that block."""
    q, k, v, zq, zk, logits = (x.detach() for x in _inputs(T, seed=n))
    whole = _run(lolcats_chunked, q, k, v, zq, zk, logits, window)
    _, state = lolcats_chunked(q[:, :n], k[:, :n], v[:, :n], _features(zq[:, :n]), _features(zk[:, :n]),
                               torch.sigmoid(logits), window)
    s0 = max(0, (n // window - 1) * window)
    fk = _features(zk[:, :s0])
    torch.testing.assert_close(state.kv, torch.einsum("bthf,bthd->bhfd", fk, v[:, :s0].repeat_interleave(3, 2)))
    torch.testing.assert_close(state.k, fk.sum(1))
    cut = lambda x: x[:, s0:]
    rest, _ = lolcats_chunked(cut(q), cut(k), cut(v), _features(cut(zq)), _features(cut(zk)), torch.sigmoid(logits),
                              window, state)
    torch.testing.assert_close(rest[:, n - s0:], whole[:, n:], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("n,C", [(0, 1), (0, 3), (5, 1), (5, 2), (9, 2)])
def test_the_one_block_read_equals_the_block_form(n, C):
    """Queries n .. n+C-1 of one block (window 4) against the keys from the previous block's start and the state of
    every key before it."""
    window, T = 4, n + C
    q, k, v, zq, zk, logits = (x.detach() for x in _inputs(T, seed=11))
    whole = _run(lolcats_chunked, q, k, v, zq, zk, logits, window)
    s0 = max(0, (n // window - 1) * window)
    fk = _features(zk[:, :s0])
    state = LinearState(torch.einsum("bthf,bthd->bhfd", fk, v[:, :s0].repeat_interleave(3, 2)), fk.sum(1))
    y = lolcats_one_block(q[:, n:], k[:, s0:], v[:, s0:], _features(zq[:, n:]), torch.sigmoid(logits), state)
    torch.testing.assert_close(y, whole[:, n:], atol=1e-5, rtol=1e-5)


def test_bf16_autocast_keeps_fp32_arithmetic():
    q, k, v, zq, zk, logits = (x.detach() for x in _inputs(19, seed=2))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y, state = lolcats_chunked(q, k, v, _features(zq), _features(zk), torch.sigmoid(logits), 4)
    assert state.kv.dtype == torch.float32 and y.dtype == torch.float32
    torch.testing.assert_close(y, _run(lolcats_reference, q, k, v, zq, zk, logits, 4), atol=1e-5, rtol=1e-5)
