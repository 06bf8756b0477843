"""SWAX models in Hugging Face transformers: a config class and a causal-LM class around SWAXModel.

`python -m swax_lightning export` copies this file into every exported folder as `modeling_swax.py` and points
config.json's `auto_map` at it, so `AutoModelForCausalLM.from_pretrained(folder, trust_remote_code=True)` works the
way it does for fla's and other custom-architecture repositories. Like theirs, the shipped file holds only the
adapter: it imports the model itself from the installed `swax_lightning` package. `register()` offers the other
route: with it, `from_pretrained(folder)` needs no remote code.

Decisions:
- config.json holds exactly the fields of ModelConfig (validated on load, so a hand-edited config fails with the
  field named) plus transformers' own keys; the weights are SWAXModel's state dict under the prefix `model.`.
- The forward is the training forward (whole sequence, fp32 logits), so logits through transformers equal the
  Lightning model's. `generate()` works by re-running it on the growing sequence (no KV cache object: the
  constant-memory streaming decoder is swax_lightning.model.inference). A padded batch (attention_mask with zeros) is
  refused rather than silently mixed with its padding.
- Weights are never initialised by transformers: every tensor comes from the exported file.
"""
from __future__ import annotations

from dataclasses import asdict, fields

import torch
import torch.nn.functional as F
from transformers import AutoConfig, AutoModelForCausalLM, GenerationMixin, PretrainedConfig, PreTrainedModel
from transformers.modeling_outputs import CausalLMOutput

from swax_lightning.model.config import ModelConfig
from swax_lightning.model.model import SWAXModel

MODEL_TYPE = "swax"
ARCH_FIELDS = tuple(f.name for f in fields(ModelConfig))


class SwaxConfig(PretrainedConfig):
    """transformers config of a SWAX model: the ModelConfig fields, plus transformers' own settings."""

    model_type = MODEL_TYPE

    def __init__(self, **kwargs):
        arch = ModelConfig(**{name: kwargs.pop(name) for name in ARCH_FIELDS if name in kwargs})
        for name, value in asdict(arch).items():
            setattr(self, name, value)
        kwargs.setdefault("tie_word_embeddings", arch.tie_embeddings)
        super().__init__(**kwargs)

    def model_config(self) -> ModelConfig:
        return ModelConfig(**{name: getattr(self, name) for name in ARCH_FIELDS})


class SwaxForCausalLM(PreTrainedModel, GenerationMixin):
    """A SWAXModel behind transformers' causal-LM interface (logits, optional loss, generate)."""

    config_class = SwaxConfig
    base_model_prefix = "model"
    main_input_name = "input_ids"
    _no_split_modules = ["Block"]
    # With tie_embeddings the head is the embedding (SWAXModel ties them); transformers saves it once and re-ties it
    # on load. Applied only when config.tie_word_embeddings is true.
    _tied_weights_keys = {"model.lm_head.weight": "model.embed.weight"}

    def __init__(self, config: SwaxConfig):
        super().__init__(config)
        self.model = SWAXModel(config.model_config())
        self.post_init()
        self.generation_config.use_cache = False  # generate() re-runs the forward: no transformers cache object

    def _init_weights(self, module) -> None:
        """Nothing: SWAXModel initialises itself and from_pretrained overwrites every weight."""

    def get_input_embeddings(self):
        return self.model.embed

    def get_output_embeddings(self):
        return self.model.lm_head

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                labels: torch.Tensor | None = None, **kwargs) -> CausalLMOutput:
        if attention_mask is not None and not bool(attention_mask.all()):
            raise ValueError("SwaxForCausalLM does not take padded batches (attention_mask has zeros): pass one "
                             "sequence at a time, or use swax_lightning.model.inference.continue_texts for batches")
        logits = self.model(input_ids)
        loss = None
        if labels is not None:
            loss = F.cross_entropy(logits[:, :-1].flatten(0, 1), labels[:, 1:].flatten(), ignore_index=-100)
        return CausalLMOutput(loss=loss, logits=logits)

    def prepare_inputs_for_generation(self, input_ids: torch.Tensor, attention_mask=None, **kwargs) -> dict:
        return {"input_ids": input_ids, "attention_mask": attention_mask}


def register() -> None:
    """Make AutoConfig / AutoModelForCausalLM know "swax" without trust_remote_code (swax_lightning installed)."""
    AutoConfig.register(MODEL_TYPE, SwaxConfig, exist_ok=True)
    AutoModelForCausalLM.register(SwaxConfig, SwaxForCausalLM, exist_ok=True)
