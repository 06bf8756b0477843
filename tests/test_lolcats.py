"""The LoLCATs layer (letter L, model/lolcats.py) through SWAXModel: streaming decode token by token and in uneven
chunks equals the full forward with a bounded cache, generate with prompts of different lengths, its
initialisation, its config fields and FLOPs; and the retrofit of a random small Llama into L students (the teacher
exactly on two windows, the stage-1 parameters, LoRA on q/k/v/o, attention transfer lowering the held-out error)."""
import pytest
import torch

from swax_lightning.core.errors import ConfigError
from swax_lightning.kernels.lolcats.naive import terraced_masks
from swax_lightning.model import inference
from swax_lightning.model.config import ModelConfig
from swax_lightning.model.layers import LAYERS, terraced_pairs
from swax_lightning.model.lolcats import HedgehogFeatureMap, LolcatsAttention
from swax_lightning.model.model import SWAXModel

WINDOW = 4


def _model(pattern="SL", init="kaiming", seed=0, **kw):
    cfg = ModelConfig(vocab_size=61, d_model=48, n_layers=2, pattern=pattern, n_heads=6, n_kv_heads=2, window=8,
                      lolcats_window=WINDOW, lolcats_feature_dim=4, lolcats_feature_init=init, qk_norm=True,
                      qkv_bias=True, **kw)
    model = SWAXModel(cfg)
    model.reset_parameters(seed)
    with torch.no_grad():  # spread the window factors, so a wrong weighting shows
        for block in model.blocks:
            if block.kind == "L":
                block.mixer.window_factors.normal_(0, 1, generator=torch.Generator().manual_seed(seed))
                block.mixer.q_proj.bias.normal_(0, 0.1, generator=torch.Generator().manual_seed(seed))
    return model.eval()


def _stream(model, idx, chunks):
    """Logits of idx fed in `chunks` through the caches, and the L layer's cache size after each chunk."""
    caches = model.new_caches(idx.shape[0])
    outs, sizes, t = [], {}, 0
    for c in chunks:
        positions = torch.arange(t, t + c).repeat(idx.shape[0], 1)
        outs.append(model(idx[:, t:t + c], caches, positions))
        t += c
        sizes[t] = sum(cache.nbytes() for cache, block in zip(caches, model.blocks) if block.kind == "L")
    return torch.cat(outs, 1), sizes


@pytest.mark.parametrize("pattern", ["SL", "L"])
@pytest.mark.parametrize("chunks", [[1] * 29, [5, 1, 3, 4, 11, 1, 4], [29], [8, 8, 13]])
def test_streaming_equals_the_full_forward(pattern, chunks):
    model = _model(pattern)
    idx = torch.randint(0, 61, (2, sum(chunks)), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        full = model(idx)
        streamed, _ = _stream(model, idx, chunks)
    torch.testing.assert_close(streamed, full, atol=1e-4, rtol=1e-4)


def test_the_cache_is_bounded_beyond_two_windows():
    model = _model("L")
    idx = torch.randint(0, 61, (1, 40), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        _, sizes = _stream(model, idx, [1] * 40)
    token = 2 * 2 * 8 * 4  # a cached key and value: 2 kv heads of 8, fp32
    state = 6 * 8 * 8 * 4 + 6 * 8 * 4  # kv [H, 2F, D] and k [H, 2F] sums, fp32
    layers = 2
    assert max(sizes.values()) == layers * (state + (2 * WINDOW - 1) * token)  # previous block + 3 of the current
    assert all(sizes[n] == sizes[n + WINDOW] for n in range(WINDOW, 36))  # periodic in the block phase: no growth


def test_generate_with_prompts_of_different_lengths_equals_each_alone_and_the_full_forward():
    model = _model("SL")
    prompts = [[3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5], [2, 7, 1], [8, 2, 8, 1, 8, 2, 8, 4, 5]]
    with torch.no_grad():
        together = inference.generate(model, prompts, max_new_tokens=14, chunk_len=4)
        alone = [inference.generate(model, [p], max_new_tokens=14, chunk_len=5)[0] for p in prompts]
        assert together == alone
        for prompt, continuation in zip(prompts, alone):  # greedy: each token the argmax of a full forward
            sequence = torch.tensor([prompt + continuation])
            predicted = model(sequence)[0, len(prompt) - 1:-1].argmax(-1)
            assert predicted.tolist() == continuation


def test_a_stream_that_skips_positions_is_refused():
    model = _model("L")
    caches = model.new_caches(1)
    with torch.no_grad():
        model(torch.tensor([[1, 2, 3]]), caches, torch.tensor([[0, 1, 2]]))
        with pytest.raises(ValueError, match="continues at position 3"):
            model(torch.tensor([[4]]), caches, torch.tensor([[5]]))


def test_initialisation_and_fields():
    mixer = _model("L", init="identity").blocks[0].mixer
    mixer.reset_own_parameters()
    torch.testing.assert_close(mixer.window_factor(), torch.full((6,), 0.1))
    assert mixer.window_factors.shape == (1, 6, 1, 1)
    assert torch.equal(mixer.feature_map_q.layer, torch.eye(8, 4).expand(6, 8, 4))
    assert torch.equal(mixer.feature_map_k.layer, mixer.feature_map_q.layer)
    assert mixer.feature_map_k.layer is not mixer.feature_map_q.layer  # separate maps, the same start
    kaiming = HedgehogFeatureMap(2, 128, 64)
    kaiming.reset_parameters("kaiming")
    bound = (6 / (128 * 64)) ** 0.5  # torch's fan_in of an [H, D, F] tensor is D * F
    assert 0.9 * bound < kaiming.layer.abs().max() <= bound
    x = torch.randn(2, 5, 6, 8)
    y = mixer.feature_map_q(x)
    assert y.shape == (2, 5, 6, 8) and y.dtype == torch.float32
    torch.testing.assert_close(y, torch.cat([x[..., :4].softmax(-1), (-x[..., :4]).softmax(-1)], -1))
    defaults = ModelConfig()
    assert (defaults.lolcats_window, defaults.lolcats_feature_dim, defaults.lolcats_feature_init) == (64, 64,
                                                                                                       "identity")
    with pytest.raises(ConfigError, match="ModelConfig.lolcats_feature_init"):
        ModelConfig(pattern="L", lolcats_feature_init="zeros")
    with pytest.raises(ConfigError, match="ModelConfig.lolcats_window"):
        ModelConfig(pattern="L", lolcats_window=0)
    # q/k/v/o, their biases and the q/k norms are what Attention has, under the same names.
    assert {n for n, _ in mixer.named_parameters()} == {
        "q_proj.weight", "q_proj.bias", "k_proj.weight", "k_proj.bias", "v_proj.weight", "v_proj.bias",
        "out_proj.weight", "q_norm.weight", "k_norm.weight", "feature_map_q.layer", "feature_map_k.layer",
        "window_factors"}


def test_the_flops_count_the_terraced_pairs():
    for T, W in [(1, 4), (7, 4), (8, 4), (21, 4), (200, 64)]:
        window, _ = terraced_masks(T, W)
        assert terraced_pairs(T, W) == int(window.sum())
    cfg = _model("L").cfg
    D, F = 8, 4
    assert LAYERS["L"].mixing_flops(cfg, 21, 0) == 6 * (4 * D * terraced_pairs(21, WINDOW)
                                                         + 21 * (4 * D * F + 8 * F * (D + 1)))


# ---- the retrofit ----------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def teacher(tmp_path_factory):
    """A random Llama (llama3 RoPE, tied embeddings, 4/2 heads of 16, 2 layers) imported (tests/test_retrofit.py's)."""
    pytest.importorskip("transformers")
    from swax_lightning.pretrained import hf_import
    from swax_lightning.training.checkpoints import load_model
    from tests.hf_models import make_pretrained

    root = tmp_path_factory.mktemp("teacher")
    make_pretrained(root / "llama", "llama_llama3_tied", seed=2, max_position_embeddings=2048)
    return load_model(hf_import.import_pretrained(root / "llama", root / "import"))[0]


def _ids(length, seed=0):
    return torch.randint(0, 258, (1, length), generator=torch.Generator().manual_seed(seed))


def test_an_l_student_is_the_teacher_on_two_windows_and_not_beyond(teacher):
    from swax_lightning.pretrained import retrofit

    student = retrofit.converted_model(teacher, "L", lolcats_window=16)
    mixer, attention = student.blocks[0].mixer, teacher.blocks[0].mixer
    assert isinstance(mixer, LolcatsAttention) and mixer.k_proj.weight.shape == attention.k_proj.weight.shape
    for name in ("q_proj", "k_proj", "v_proj", "out_proj"):
        assert torch.equal(getattr(mixer, name).weight, getattr(attention, name).weight), name
    assert (mixer.rope_theta, mixer.rope_scale) == (attention.rope_theta, attention.rope_scale)
    with torch.no_grad():
        torch.testing.assert_close(student(_ids(32)), teacher(_ids(32)), atol=1e-4, rtol=1e-4)
        for block in student.blocks:  # the softmax weight saturated high: the linear terms still count, weight 1
            block.mixer.window_factors.fill_(30.0)
        longer, expected = student(_ids(48)), teacher(_ids(48))
    torch.testing.assert_close(longer[:, :32], expected[:, :32], atol=1e-4, rtol=1e-4)
    assert (longer[:, 32:] - expected[:, 32:]).abs().amax(-1).min() > 1e-3


def test_biases_and_qk_norms_of_a_teacher_are_kept():
    from swax_lightning.pretrained import retrofit

    cfg = ModelConfig(vocab_size=61, d_model=48, n_layers=1, pattern="A", n_heads=6, n_kv_heads=2, qkv_bias=True,
                      qk_norm=True, rope_scale={"type": "linear", "factor": 2.0}, lolcats_window=4)
    teacher = SWAXModel(cfg)
    with torch.no_grad():
        for p in teacher.blocks[0].mixer.parameters():
            p.normal_(0, 0.3, generator=torch.Generator().manual_seed(p.numel()))
    student = retrofit.converted_model(teacher, "L")
    mixer, attention = student.blocks[0].mixer, teacher.blocks[0].mixer
    assert mixer.rope_scale == {"type": "linear", "factor": 2.0}
    for name, tensor in attention.state_dict().items():
        assert torch.equal(mixer.state_dict()[name], tensor), name
    new = [mixer.feature_map_q.layer, mixer.feature_map_k.layer, mixer.window_factors]  # not the norms: the teacher's
    trained = retrofit.transfer_parameters(student, "new")
    assert len(trained) == 3 and {id(p) for p in trained} == {id(p) for p in new}
    idx = torch.randint(0, 61, (2, 8), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        torch.testing.assert_close(student(idx), teacher.eval()(idx), atol=1e-4, rtol=1e-4)


def test_stage_one_trains_exactly_the_feature_maps_and_window_factors_and_lora_covers_qkvo(teacher):
    from swax_lightning.pretrained import retrofit
    from swax_lightning.pretrained.lora import add_lora

    student = retrofit.converted_model(teacher, "LA")
    mixer = student.blocks[0].mixer
    expected = [mixer.feature_map_q.layer, mixer.feature_map_k.layer, mixer.window_factors]
    assert {id(p) for p in retrofit.transfer_parameters(student, "new")} == {id(p) for p in expected}
    assert len(retrofit.transfer_parameters(student, "new")) == 3
    assert set(add_lora(mixer, rank=8, alpha=16)) == {"q_proj", "k_proj", "v_proj", "out_proj"}


def test_attention_transfer_lowers_the_held_out_layer_error(teacher, tmp_path):
    from swax_lightning.pretrained import retrofit
    from tests.test_retrofit import text_batches

    students = {"lolcats": retrofit.converted_model(teacher, "L", lolcats_window=8)}
    held_out = next(text_batches(99))[0][:1]
    before = retrofit.transfer_errors(students["lolcats"], *retrofit.mixer_io(teacher, held_out))
    cfg = retrofit.TransferConfig(tokens=30 * 2 * 64, lr=1e-2)
    losses = retrofit.attention_transfer(teacher, students, text_batches(0), 30, cfg, tmp_path / "p.pt",
                                         lambda *_: None)
    after = retrofit.transfer_errors(students["lolcats"], *retrofit.mixer_io(teacher, held_out))
    print(f"held-out relative MSE per layer {before} -> {after}; train {losses['lolcats'][0]:.4f} -> "
          f"{losses['lolcats'][-1]:.4f}")
    assert all(a < 0.75 * b for a, b in zip(after, before))
