"""Streaming inference: chunked prefill and token-by-token decoding equal the full forward; bounded state; errors."""
import pytest
import torch

from swax_lightning.model import cache
from swax_lightning.model.cache import _attend as attend
from swax_lightning.model.config import ModelConfig
from swax_lightning.model.inference import generate, left_pad, prefill, sample
from swax_lightning.model.model import SWAXModel

# A larger init and open input gates make every mixer matter to the logits, so a wrong cache cannot hide.
BASE = dict(vocab_size=50, d_model=32, n_heads=4, mlstm_heads=2, deltanet_heads=2, chunk_size=8, window=5, init_std=0.2,
            igate_bias_init=0.0)


def _model(pattern, dtype=torch.float32, **overrides):
    torch.manual_seed(0)
    cfg = ModelConfig(**(BASE | dict(pattern=pattern, n_layers=2 * len(pattern)) | overrides))
    return SWAXModel(cfg).to(dtype).eval()


def _streamed_logits(model, idx, chunk_len):
    caches = model.new_caches(idx.shape[0], dtype=model.embed.weight.dtype)
    positions = torch.arange(idx.shape[1]).repeat(idx.shape[0], 1)
    return prefill(model, idx, positions, caches, chunk_len, return_all=True)


@pytest.mark.parametrize("pattern,n_sink", [("S", 0), ("S", 2), ("X", 0), ("A", 0), ("SX", 0), ("SX", 3), ("D", 0),
                                            ("SD", 2)])
@pytest.mark.parametrize("chunk_len", [1, 3, 16, 64])
def test_chunked_prefill_and_decode_equal_full_forward(pattern, n_sink, chunk_len):
    model = _model(pattern, n_sink=n_sink)
    idx = torch.randint(0, 50, (2, 41), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        full = model(idx)
    # chunk_len 1 is token-by-token decoding: every token through the recurrent step / the ring cache.
    torch.testing.assert_close(_streamed_logits(model, idx, chunk_len), full, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("pattern,n_sink", [("S", 0), ("S", 2), ("A", 0), ("SX", 3)])
def test_long_chunks_attend_in_blocks_and_equal_the_full_forward(pattern, n_sink, monkeypatch):
    # A chunk longer than the block goes through the caches' block loop (shrunk here to 4 queries; at least the
    # window, 5, for a sliding cache): every attention call sees at most a block of queries, and the logits, left
    # padding included, are the full forward's.
    monkeypatch.setattr(cache, "BLOCK", 4)
    calls = []
    monkeypatch.setattr(cache, "_attend", lambda q, *args: calls.append(q.shape[1]) or attend(q, *args))
    model = _model(pattern, n_sink=n_sink)
    idx = torch.randint(0, 50, (2, 41), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        full = model(idx)
    torch.testing.assert_close(_streamed_logits(model, idx, 16), full, atol=1e-4, rtol=1e-4)
    assert max(calls) == (5 if "S" in pattern else 4) and len(calls) > 41 // 4
    prompts = [idx[0, :n].tolist() for n in (7, 30)]
    assert generate(model, prompts, max_new_tokens=6, chunk_len=32) == \
        [generate(model, [p], max_new_tokens=6, chunk_len=1)[0] for p in prompts]


def test_parity_is_tight_in_fp64():
    model = _model("SX", dtype=torch.float64, n_sink=2)
    idx = torch.randint(0, 50, (1, 57), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        full = model(idx)
    for chunk_len in (1, 7, 20):
        torch.testing.assert_close(_streamed_logits(model, idx, chunk_len), full, atol=1e-10, rtol=1e-10)


def test_inference_window_and_sink_override_matches_full_forward():
    model = _model("SX")
    model.set_window(3)
    model.set_sinks(4)
    idx = torch.randint(0, 50, (1, 30), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        full = model(idx)
    torch.testing.assert_close(_streamed_logits(model, idx, 4), full, atol=1e-4, rtol=1e-4)


def test_greedy_generation_matches_recomputing_the_full_sequence():
    model = _model("SX", n_sink=1)
    prompt = torch.randint(0, 50, (13,), generator=torch.Generator().manual_seed(4)).tolist()
    out = generate(model, [prompt], max_new_tokens=12, chunk_len=5)[0]
    seq = list(prompt)
    with torch.no_grad():
        for _ in range(12):
            seq.append(int(model(torch.tensor([seq]))[0, -1].argmax()))
    assert out == seq[len(prompt):]


def test_batched_prompts_of_different_lengths_match_single_runs():
    model = _model("SX", n_sink=2)
    g = torch.Generator().manual_seed(5)
    prompts = [torch.randint(0, 50, (n,), generator=g).tolist() for n in (3, 17, 9)]
    batched = generate(model, prompts, max_new_tokens=8, chunk_len=4)
    assert batched == [generate(model, [p], max_new_tokens=8, chunk_len=4)[0] for p in prompts]
    sampled = generate(model, prompts, max_new_tokens=8, temperature=1.0, top_p=0.9, seed=3)
    assert sampled == generate(model, prompts, max_new_tokens=8, temperature=1.0, top_p=0.9, seed=3)


def test_left_padding_positions():
    idx, pos = left_pad([[7, 8], [1, 2, 3, 4]])
    assert idx.tolist() == [[0, 0, 7, 8], [1, 2, 3, 4]]
    assert pos.tolist() == [[-2, -1, 0, 1], [0, 1, 2, 3]]


def test_sampling_filters():
    logits = torch.tensor([[0.0, 3.0, 1.0, 2.0]])
    g = torch.Generator().manual_seed(0)
    assert sample(logits).item() == 1
    assert all(sample(logits, 1.0, top_k=1, generator=g).item() == 1 for _ in range(20))
    top_p = {sample(logits, 1.0, top_p=0.7, generator=g).item() for _ in range(200)}
    assert top_p == {1, 3}  # softmax mass: 0.64 for id 1, then id 3 brings it past 0.7


def test_stop_tokens_end_a_sequence():
    model = _model("SX")
    prompt = [1, 2, 3]
    free = generate(model, [prompt], max_new_tokens=10)[0]
    stopped = generate(model, [prompt], max_new_tokens=10, stop_tokens=[free[3]])[0]
    assert stopped == free[:free.index(free[3])]


def test_state_size_does_not_grow_with_context():
    model = _model("SX", n_sink=2)
    caches = model.new_caches(1)
    before = [c.nbytes() for c in caches]
    idx = torch.randint(0, 50, (1, 300))
    prefill(model, idx, torch.arange(300)[None], caches, chunk_len=64)
    assert [c.nbytes() for c in caches] == before
    full = _model("A")
    caches = full.new_caches(1)
    prefill(full, idx, torch.arange(300)[None], caches, chunk_len=64)
    assert caches[0].nbytes() > 0 and caches[0].k.shape[1] == 300  # full attention keeps everything


@pytest.mark.parametrize("prompts,match", [([[]], "empty"), ([[1, 2, 50]], "outside the vocabulary"),
                                           ([[-1]], "outside the vocabulary"), ([], "no prompts")])
def test_bad_prompts_are_named(prompts, match):
    with pytest.raises(ValueError, match=match):
        generate(_model("SX"), prompts, max_new_tokens=2)


def test_checkpoint_that_does_not_match_the_config(tmp_path):
    import lightning as L

    from swax_lightning.training.module import LanguageModule

    module = LanguageModule(arch=BASE | dict(pattern="SX", n_layers=2))
    module.configure_model()
    trainer = L.Trainer(logger=False, enable_checkpointing=False, enable_progress_bar=False)
    trainer.strategy.connect(module)
    trainer.save_checkpoint(tmp_path / "a.ckpt")
    other = LanguageModule(arch=BASE | dict(pattern="SX", n_layers=4))
    with pytest.raises(ValueError, match="n_layers"):
        other.on_load_checkpoint(torch.load(tmp_path / "a.ckpt", weights_only=False))
    shifted = LanguageModule(arch=BASE | dict(pattern="SX", n_layers=2, window=9))  # same weights, other window
    with pytest.raises(ValueError, match="window"):
        shifted.on_load_checkpoint(torch.load(tmp_path / "a.ckpt", weights_only=False))
    loaded = LanguageModule.load_from_checkpoint(tmp_path / "a.ckpt")  # config from the checkpoint itself
    assert loaded.model.cfg.n_layers == 2


def test_generate_command_from_a_checkpoint(tmp_path, capsys):
    import lightning as L

    from swax_lightning.commands.generate import generate_texts as main
    from swax_lightning.training.module import LanguageModule

    module = LanguageModule(arch=dict(vocab_size=257, d_model=32, n_layers=2, n_heads=2, mlstm_heads=2, window=8))
    module.configure_model()
    trainer = L.Trainer(logger=False, enable_checkpointing=False, enable_progress_bar=False)
    trainer.strategy.connect(module)
    trainer.save_checkpoint(tmp_path / "m.ckpt")
    (tmp_path / "prompts.txt").write_text("first prompt\n\nsecond\n")
    out = main(str(tmp_path / "m.ckpt"), prompt=["hello"], prompts_file=str(tmp_path / "prompts.txt"),
               max_new_tokens=5, window=4, n_sink=2)
    assert len(out) == 3
    assert "--- prompt: 'hello'" in capsys.readouterr().out
    with pytest.raises(FileNotFoundError, match="nope.ckpt"):
        main(str(tmp_path / "nope.ckpt"), prompt=["x"])
    (tmp_path / "bad.ckpt").write_bytes(b"not a checkpoint")
    with pytest.raises(ValueError, match="bad.ckpt"):
        main(str(tmp_path / "bad.ckpt"), prompt=["x"])


@pytest.mark.parametrize("chunk_len", [1, 3, 16])
@pytest.mark.parametrize("pattern,convs", [("SD", dict(deltanet_conv=4)), ("SA", dict(attention_conv=3, n_sink=2)),
                                           ("AX", dict(attention_conv=4))])
def test_short_convolutions_stream_exactly(chunk_len, pattern, convs):
    # Gated DeltaNet's and attention's short convolutions: the conv state in the cache must continue each chunk and
    # decode step exactly (the window's ring and the full cache alike), and left padding must leave a prompt's result
    # unchanged.
    model = _model(pattern, **convs)
    idx = torch.randint(0, 50, (2, 41), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        full = model(idx)
    torch.testing.assert_close(_streamed_logits(model, idx, chunk_len), full, atol=1e-4, rtol=1e-4)
    prompts = [idx[0, :5].tolist(), idx[1, :13].tolist()]
    assert generate(model, prompts, max_new_tokens=6, chunk_len=chunk_len) == \
        [generate(model, [p], max_new_tokens=6, chunk_len=chunk_len)[0] for p in prompts]
