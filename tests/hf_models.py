"""Random small pretrained models of every family swax import supports, saved by transformers as folders (safetensors,
config, a byte tokenizer), for the import tests and the retrofit tests. Needs transformers."""
import json
from pathlib import Path

import torch
import transformers

from swax_lightning.commands.export import byte_tokenizer_json

VOCAB = 320  # > the 258 ids of the test tokenizer (bytes, end-of-text, BOS): the rest is padding, as in real models
SIZES = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, max_position_embeddings=256, rms_norm_eps=1e-5)
FAMILIES = {  # name: (transformers config class, its settings); every supported model_type and rope scaling
    "llama_llama3_tied": ("LlamaConfig", dict(tie_word_embeddings=True, rope_parameters=dict(
        rope_type="llama3", rope_theta=10000.0, factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
        original_max_position_embeddings=64))),
    "llama_linear": ("LlamaConfig", dict(rope_parameters=dict(rope_type="linear", rope_theta=10000.0, factor=4.0))),
    "llama_dynamic": ("LlamaConfig", dict(max_position_embeddings=32, rope_parameters=dict(
        rope_type="dynamic", rope_theta=10000.0, factor=2.0))),  # 48 tokens > 32 positions: the scaling is active
    "mistral_window": ("MistralConfig", dict(sliding_window=16, rope_parameters=dict(rope_theta=1e6))),
    "mistral_full_tied": ("MistralConfig", dict(sliding_window=None, tie_word_embeddings=True)),
    "qwen2_biases": ("Qwen2Config", dict()),
    "qwen3_qk_norm_tied": ("Qwen3Config", dict(head_dim=24, tie_word_embeddings=True)),
    # a local (sliding, 16 keys, its own RoPE base) then a global layer, GeGLU, post-norms, scaled embeddings
    "gemma3_local_global": ("Gemma3TextConfig", dict(
        head_dim=16, query_pre_attn_scalar=16, sliding_window=16, layer_types=["sliding_attention", "full_attention"],
        rope_parameters={"full_attention": dict(rope_type="default", rope_theta=1e6),
                         "sliding_attention": dict(rope_type="default", rope_theta=1e4)})),
}


def randomize(model: torch.nn.Module, seed: int) -> None:
    """Every weight drawn from a seeded generator (transformers' init leaves norms at 1 and biases at 0, which
    would hide a misplaced norm or bias): matrices N(0, 0.08), norm weights 1 + N(0, 0.1), biases N(0, 0.1)."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in sorted(model.named_parameters()):
            noise = torch.randn(p.shape, generator=generator)
            p.copy_(noise * 0.08 if p.dim() > 1 else (1 + 0.1 * noise if "norm" in name else 0.1 * noise))


def write_tokenizer(folder: Path, bos: bool) -> None:
    """The byte tokenizer (export's tokenizer.json), with a Llama-style "<s>" put first by its template when bos."""
    from tokenizers.processors import TemplateProcessing

    tok = byte_tokenizer_json()
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": "<|endoftext|>"}
    if bos:
        tok.add_special_tokens(["<s>"])
        tok.post_processor = TemplateProcessing(single="<s> $A", pair="<s> $A <s> $B",
                                                special_tokens=[("<s>", tok.token_to_id("<s>"))])
        config["bos_token"] = "<s>"
    tok.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps(config))


def make_pretrained(folder: Path, family: str, seed: int = 0, **changes):
    """A randomly initialised transformers model of one family (config `changes` applied) saved to `folder`
    (safetensors, config, tokenizer); returns the model in fp32 eval mode."""
    class_name, settings = FAMILIES[family]
    config = getattr(transformers, class_name)(**{**SIZES, **settings, **changes})
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    randomize(model, seed)
    model.save_pretrained(folder)
    write_tokenizer(folder, bos=class_name in ("LlamaConfig", "MistralConfig", "Gemma3TextConfig"))
    return model.eval()
