"""GPU checks (`pytest -m gpu`, skipped without CUDA): every attention backend (own Triton, flash-attn, FlexAttention,
dense SDPA, the blocked PyTorch path, full causal SDPA), the mLSTM backends (own Triton, NX-AI's TFLA) and fla's gated
delta rule run on CUDA against the PyTorch / fp64 references, forward and backward, on odd shapes; `auto` resolves to
the backends it promises; the chunked loss on CUDA, its backward in bf16 under autocast. Kernels that are not
installed are skipped by name, never silently passed. benchmarks/gpu_check.sh runs these first, with the Triton
interpreter off: `TRITON_INTERPRET=0 pytest -m gpu`. Under the interpreter (tests/conftest.py switches it on for the
CPU tests) Triton kernels would run on the CPU, slowly and not as compiled: these tests then skip with that reason."""
import os

import pytest
import torch

from swax_lightning.kernels import backends, mlstm_chunkwise, sliding_window_attention, swa_reference

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
              pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") == "1",
                                 reason="the Triton interpreter is on: run TRITON_INTERPRET=0 pytest -m gpu")]

SHAPES = [  # T, W, n_sink, Hq, Hkv, D
    (1000, 1, 0, 4, 4, 64),      # W = 1
    (1000, 128, 0, 4, 2, 128),   # GQA, T not a multiple of 64
    (1000, 128, 4, 4, 4, 64),    # sinks
    (777, 2048, 0, 2, 2, 128),   # W >= T: full causal
    (4099, 512, 64, 2, 1, 128),  # the sink limit, multi-query
]


def _needs(kernel: str, n_sink: int):
    if kernel == "flash":
        if not backends.installed("flash_attn"):
            pytest.skip("flash-attn is not installed")
        if n_sink:
            pytest.skip("flash-attn has no sinks")


def _qkv(T, Hq, Hkv, D, dtype, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    return [torch.randn(2, T, h, D, device="cuda", dtype=dtype, generator=g).requires_grad_() for h in (Hq, Hkv, Hkv)]


def _check_against_fp64(kernel, T, W, n_sink, Hq, Hkv, D, dtype, tol):
    _needs(kernel, n_sink)
    q, k, v = _qkv(T, Hq, Hkv, D, dtype)
    out = sliding_window_attention(q, k, v, W, n_sink, kernel=kernel)
    q64, k64, v64 = (x.detach().double().requires_grad_() for x in (q, k, v))
    ref = swa_reference(q64, k64, v64, W, n_sink)
    torch.testing.assert_close(out.double(), ref, **tol)
    grad = torch.randn_like(ref)
    got = torch.autograd.grad(out, (q, k, v), grad.to(dtype))
    want = torch.autograd.grad(ref, (q64, k64, v64), grad)
    for a, b in zip(got, want):
        torch.testing.assert_close(a.double(), b, **tol)


@pytest.mark.parametrize("kernel", ["triton", "flex", "sdpa", "torch", "auto"])
@pytest.mark.parametrize("T,W,n_sink,Hq,Hkv,D", SHAPES)
def test_attention_fp32(kernel, T, W, n_sink, Hq, Hkv, D):
    _check_against_fp64(kernel, T, W, n_sink, Hq, Hkv, D, torch.float32, dict(atol=2e-3, rtol=2e-3))


@pytest.mark.parametrize("kernel", ["triton", "flash", "flex", "sdpa", "torch", "auto"])
@pytest.mark.parametrize("T,W,n_sink,Hq,Hkv,D", SHAPES)
def test_attention_bf16(kernel, T, W, n_sink, Hq, Hkv, D):
    _check_against_fp64(kernel, T, W, n_sink, Hq, Hkv, D, torch.bfloat16, dict(atol=6e-2, rtol=6e-2))


def test_head_dim_256_runs_in_bf16_and_is_refused_in_fp32():
    # bf16 at the largest head dim the kernel takes; fp32 there would overflow shared memory: one clear line
    _check_against_fp64("triton", 300, 64, 4, 2, 2, 256, torch.bfloat16, dict(atol=6e-2, rtol=6e-2))
    q, k, v = _qkv(300, 2, 2, 256, torch.float32)
    with pytest.raises(ValueError, match="fp32 takes head dims up to 128"):
        sliding_window_attention(q, k, v, 64, 4, kernel="triton")


def test_auto_resolves_as_documented():
    q = torch.zeros(1, 256, 2, 128, device="cuda", dtype=torch.bfloat16)
    pick = lambda **kw: backends.attention_backend("auto", is_cuda=True, dtype=q.dtype, head_dim=128, T=256, **kw)
    assert pick(window=None, n_sink=0) == "causal"
    assert pick(window=64, n_sink=4) == "triton"
    assert pick(window=64, n_sink=0) == ("flash" if backends.installed("flash_attn") else "triton")


MLSTM_SHAPES = [
    pytest.param(1000, 2, 64, 128, 64, "moderate", id="T1000_64x128"),
    pytest.param(300, 2, 256, 512, 64, "moderate", id="xlstm7b_head"),  # tiled head dims
    pytest.param(257, 2, 32, 32, 16, "saturated", id="saturated"),     # the largest gates the layer makes (cap 15)
    # fp32 at chunk 128: the largest shared-memory footprint, and the slowest compile (minutes): its own stage
    pytest.param(300, 2, 64, 128, 128, "moderate", id="fp32_chunk128"),
]


@pytest.mark.parametrize("kernel", ["triton", "tfla"])
@pytest.mark.parametrize("T,H,dqk,dv,chunk,gates", MLSTM_SHAPES)
def test_mlstm_kernel_matches_torch(kernel, T, H, dqk, dv, chunk, gates):
    if kernel == "tfla" and not backends.installed("mlstm_kernels"):
        pytest.skip("mlstm_kernels is not installed")
    g = torch.Generator(device="cuda").manual_seed(0)
    make = lambda *s: torch.randn(*s, device="cuda", generator=g)
    q, k, v = make(1, T, H, dqk), make(1, T, H, dqk), make(1, T, H, dv)
    scale = 15.0 if gates == "saturated" else 1.0
    i_pre = (scale * torch.tanh(3 * make(1, T, H))).requires_grad_()
    f_pre = (3 + scale * torch.tanh(3 * make(1, T, H))).requires_grad_()
    leaves = [x.requires_grad_() for x in (q, k, v)] + [i_pre, f_pre]
    norm = lambda h: torch.nn.functional.layer_norm(h, (h.shape[-1],), eps=1e-6)  # the layer's per-head norm
    outs = []
    for name in (kernel, "torch"):
        h, state = mlstm_chunkwise(*leaves, chunk_size=chunk, kernel=name)
        y = norm(h)
        outs.append((y, state, torch.autograd.grad(y.square().sum(), leaves)))
    (y_t, s_t, g_t), (y_r, s_r, g_r) = outs
    torch.testing.assert_close(y_t, y_r, atol=2e-3, rtol=2e-3)
    rescale = torch.exp(s_t.m - s_r.m)[..., None, None]  # the two forms may stabilise the state differently
    torch.testing.assert_close(s_t.C * rescale, s_r.C, atol=2e-3, rtol=2e-3)
    for a, b in zip(g_t, g_r):
        rel = (a - b).norm() / b.norm().clamp_min(1e-12)
        assert rel < 1e-2, float(rel)


@pytest.mark.parametrize("case,seed", [("i=-f", 0), ("i=-f", 1), ("write_all", 0)])
def test_mlstm_triton_gradients_at_the_soft_cap_match_fp64(case, seed):
    # The CPU test of the exact backward (tests/kernels/test_mlstm_triton.py), compiled: fp32 dots are exact there too.
    from tests.kernels.test_mlstm_triton import assert_exact_at_the_soft_cap, saturated_grad_errors

    assert_exact_at_the_soft_cap(saturated_grad_errors(case, seed, device="cuda"))


def test_mlstm_auto_is_triton_on_cuda():
    q = torch.zeros(1, 64, 2, 64, device="cuda")
    assert backends.mlstm_backend("auto", is_cuda=q.is_cuda, qk_head_dim=64, v_head_dim=64, chunk_size=64) == "triton"


@pytest.mark.parametrize("T", [64, 1000, 257])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_deltanet_fla_matches_torch(T, dtype):
    # fla's chunk_gated_delta_rule against the PyTorch chunkwise form: output, final state and gradients, with a
    # carried initial state, T not a multiple of the chunk.
    if not backends.installed("fla"):
        pytest.skip("flash-linear-attention is not installed")
    from swax_lightning.kernels import gated_delta_chunkwise

    g = torch.Generator(device="cuda").manual_seed(0)
    make = lambda *s: torch.randn(*s, device="cuda", generator=g)
    H, dk, dv = 2, 64, 128
    q = torch.nn.functional.normalize(make(2, T, H, dk), dim=-1)
    k = torch.nn.functional.normalize(make(2, T, H, dk), dim=-1)
    v, beta = make(2, T, H, dv).to(dtype), torch.sigmoid(make(2, T, H))
    decay = -torch.nn.functional.softplus(make(2, T, H)) * 0.3
    state0 = 0.1 * make(2, H, dk, dv)
    leaves = [x.requires_grad_() for x in (q, k, v, beta, decay)]
    outs = []
    for kernel in ("fla", "torch"):
        o, state = gated_delta_chunkwise(*leaves, state0, kernel=kernel)
        outs.append((o, state, torch.autograd.grad(o.float().square().sum(), leaves)))
    (o_f, s_f, g_f), (o_t, s_t, g_t) = outs
    tol = dict(atol=2e-3, rtol=2e-3) if dtype == torch.float32 else dict(atol=5e-2, rtol=5e-2)
    torch.testing.assert_close(o_f.float(), o_t.float(), **tol)
    torch.testing.assert_close(s_f.float(), s_t.float(), **tol)
    for a, b in zip(g_f, g_t):
        rel = (a.float() - b.float()).norm() / b.float().norm().clamp_min(1e-12)
        assert rel < (1e-2 if dtype == torch.float32 else 5e-2), float(rel)


def test_chunked_loss_backward_runs_in_bf16_under_autocast_on_cuda():
    from swax_lightning.kernels.ce.chunked import softcap_cross_entropy_chunked
    from tests.kernels.test_chunked_ce import MatmulDtypes

    g = torch.Generator(device="cuda").manual_seed(0)
    h = torch.randn(3000, 256, device="cuda", generator=g).requires_grad_()
    w = (0.05 * torch.randn(50304, 256, device="cuda", generator=g)).requires_grad_()
    t = torch.randint(0, 50304, (3000,), device="cuda", generator=g)
    with torch.autocast("cuda", dtype=torch.bfloat16):
        out = softcap_cross_entropy_chunked(h, w, t, 30.0)
    with MatmulDtypes() as backward:
        torch.autograd.grad(out, (h, w))
    assert backward.seen and all(dtypes == {torch.bfloat16} for dtypes in backward.seen), backward.seen


def test_chunked_loss_on_cuda():
    from swax_lightning.kernels.ce.chunked import softcap_cross_entropy_chunked
    from swax_lightning.kernels.ce.naive import softcap_cross_entropy_reference

    g = torch.Generator(device="cuda").manual_seed(0)
    h = torch.randn(3000, 256, device="cuda", generator=g).bfloat16().requires_grad_()
    w = (0.05 * torch.randn(50304, 256, device="cuda", generator=g)).bfloat16().requires_grad_()
    t = torch.randint(0, 50304, (3000,), device="cuda", generator=g)
    out, ref = softcap_cross_entropy_chunked(h, w, t, 30.0), softcap_cross_entropy_reference(h, w, t, 30.0)
    torch.testing.assert_close(out, ref, atol=1e-4, rtol=1e-4)
    for a, b in zip(torch.autograd.grad(out, (h, w)), torch.autograd.grad(ref, (h, w))):
        torch.testing.assert_close(a.float(), b.float(), atol=1e-2, rtol=5e-2)
