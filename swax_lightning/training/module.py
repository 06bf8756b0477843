"""LanguageModule: the LightningModule that trains a SWAXModel on next-token prediction.

Decisions:
- The model is built in configure_model() from a ModelConfig (a YAML section), so that a sharded run can build it on
  the meta device and shard it (parallel.py); hyperparameters are saved in every checkpoint.
- Loss is mean next-token cross-entropy in fp32 over the scored targets: the context-only tokens of associative recall
  documents are read, not scored (loss_mask.py). Validation and test accumulate a token-weighted mean with torchmetrics
  (summed over the ranks) and report loss, perplexity and bits per byte (the loss divided by ln 2 and by the bytes per
  token the data module measured on the held-out text). Their batches carry a weight (data/datamodule.py): a padding
  batch, which only keeps the ranks' batch counts equal, runs the forward and adds nothing to the mean.
- AdamW with linear warmup then cosine decay to min_lr_ratio * lr at max_steps; decay only on matrices (>= 2-D),
  not on norms, biases or gate biases. Gradient clipping is the Trainer's `gradient_clip_val`.
- Throughput (tokens/s) comes from Lightning's ThroughputMonitor (see throughput.py), not from this module.
- The three config sections (arch, optim, generation) are typed as their dataclasses, not `X | None`: the command
  line then lists every field (`main.py fit --help`) and a bad value raises the dataclass's ConfigError, which names
  the field, instead of a union-matching report. Dicts are accepted too (checkpoint hyperparameters are dicts).
- A checkpoint is loaded only into the architecture it was trained with: every ModelConfig field must match, or the
  load is refused with the differing fields named (check_architecture). The window a model is evaluated at is a
  run-time setting (window.eval_window, eval.window, generate --window), so no field needs to differ.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, replace

import lightning as L
import torch
from lightning.pytorch.strategies import ModelParallelStrategy
from torchmetrics.aggregation import MeanMetric

from swax_lightning.core.errors import ConfigError, require
from swax_lightning.data.loss_mask import inputs_and_targets
from swax_lightning.kernels.ce.chunked import IGNORE_INDEX
from swax_lightning.model.config import ModelConfig
from swax_lightning.model.inference import continue_texts, show_continuation
from swax_lightning.model.model import SWAXModel
from swax_lightning.training.parallel import build_local, build_sharded, fsdp_mesh, mixed_precision_policy


@dataclass
class OptimConfig:
    """AdamW with linear warmup and cosine decay.

    Args:
        lr: Peak learning rate.
        min_lr_ratio: Final learning rate as a fraction of lr (reached at max_steps).
        warmup_steps: Linear warmup from 0 to lr.
        weight_decay: Decoupled weight decay on matrices (not on norms and biases).
        betas: AdamW betas.
        eps: AdamW epsilon.
    """

    lr: float = 3e-4
    min_lr_ratio: float = 0.1
    warmup_steps: int = 100
    weight_decay: float = 0.1
    betas: tuple[float, float] = field(default=(0.9, 0.95))
    eps: float = 1e-8

    def __post_init__(self) -> None:
        self.betas = tuple(self.betas)
        require(self.lr > 0, "OptimConfig.lr", "must be > 0", self.lr)
        require(0 <= self.min_lr_ratio <= 1, "OptimConfig.min_lr_ratio", "must be in [0, 1]", self.min_lr_ratio)
        require(self.warmup_steps >= 0, "OptimConfig.warmup_steps", "must be >= 0", self.warmup_steps)

    def lr_factor(self, step: int, total_steps: int) -> float:
        """Multiplier of lr at an optimizer step: warmup, then cosine from 1 to min_lr_ratio."""
        if step < self.warmup_steps:
            return (step + 1) / (self.warmup_steps + 1)
        progress = min(1.0, (step - self.warmup_steps) / max(1, total_steps - self.warmup_steps))
        return self.min_lr_ratio + (1 - self.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress))


@dataclass
class GenerationConfig:
    """Decoding for `main.py predict`.

    Args:
        max_new_tokens: Tokens generated per prompt.
        temperature: 0 = greedy; otherwise the sampling temperature.
        top_k: Keep the k most likely tokens (0 = all).
        top_p: Nucleus sampling mass (1 = all).
        chunk_len: Prefill chunk length.
        seed: Sampling seed.
    """

    max_new_tokens: int = 128
    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    chunk_len: int = 2048
    seed: int = 0

    def __post_init__(self) -> None:
        require(self.max_new_tokens >= 0, "GenerationConfig.max_new_tokens", "must be >= 0", self.max_new_tokens)
        require(self.temperature >= 0, "GenerationConfig.temperature", "must be >= 0 (0 = greedy)", self.temperature)
        require(self.top_k >= 0, "GenerationConfig.top_k", "must be >= 0 (0 = all)", self.top_k)
        require(0 < self.top_p <= 1, "GenerationConfig.top_p", "must be in (0, 1]", self.top_p)
        require(self.chunk_len >= 1, "GenerationConfig.chunk_len", "must be >= 1", self.chunk_len)


def _as_config(value, config_class):
    """A config dataclass from a dict (checkpoint hyperparameters) or a validated copy of an instance (a default
    instance is shared between calls, so it is never kept itself)."""
    return config_class(**value) if isinstance(value, dict) else replace(value)


# ModelConfig fields that choose how the same weights are computed, not what they are: free to differ from the
# checkpoint's (e.g. train with Triton kernels on GPU, evaluate with the PyTorch ones on CPU).
NOT_ARCHITECTURE = ("kernels",)


def check_architecture(saved_arch: dict, configured: ModelConfig, source: str) -> None:
    """Raises ConfigError naming every ModelConfig field where a checkpoint's architecture (its hyperparameters'
    `arch`) differs from the configured one (NOT_ARCHITECTURE fields aside)."""
    saved, ours = asdict(ModelConfig(**saved_arch)), asdict(configured)
    differences = [f"{name} (checkpoint {saved[name]!r}, configured {ours[name]!r})" for name in ours
                   if saved[name] != ours[name] and name not in NOT_ARCHITECTURE]
    if differences:
        raise ConfigError(f"{source} was trained with another architecture than configured: model.arch."
                          + "; model.arch.".join(differences)
                          + ". Use the run's own config (config.yaml beside its checkpoints); evaluate at another "
                            "window with window.eval_window or eval.window")


# The defaults of LanguageModule's config sections (copied on use by _as_config, never modified).
DEFAULT_ARCH, DEFAULT_OPTIM, DEFAULT_GENERATION = ModelConfig(), OptimConfig(), GenerationConfig()


class LanguageModule(L.LightningModule):
    """Next-token language modelling with a SWAX model.

    Args:
        arch: The model architecture (ModelConfig fields).
        optim: Optimizer and learning-rate schedule (OptimConfig fields).
        activation_checkpointing: Recompute each block's activations in the backward pass (saves memory).
        compile: torch.compile each block.
        generation: Decoding settings of `main.py predict` (GenerationConfig fields).
    """

    def __init__(self, arch: ModelConfig = DEFAULT_ARCH, optim: OptimConfig = DEFAULT_OPTIM,
                 activation_checkpointing: bool = False, compile: bool = False,
                 generation: GenerationConfig = DEFAULT_GENERATION):
        super().__init__()
        self.arch, self.optim = _as_config(arch, ModelConfig), _as_config(optim, OptimConfig)
        self.generation = _as_config(generation, GenerationConfig)
        self.activation_checkpointing, self.compile_blocks = activation_checkpointing, compile
        self.save_hyperparameters({"arch": asdict(self.arch), "optim": asdict(self.optim),
                                   "activation_checkpointing": activation_checkpointing, "compile": compile})
        self.model: SWAXModel | None = None
        self.val_loss, self.test_loss = MeanMetric(), MeanMetric()
        # The weights' seed is drawn now, right after seed_everything (not from whatever data preparation left in the
        # RNG by the time configure_model runs): same seed, same initial model, on every rank and in every layout.
        with torch.random.fork_rng(devices=[]):
            self._init_seed = int(torch.randint(0, 2**62, ()))

    def configure_model(self) -> None:
        """Builds the model (once): sharded with FSDP2 under ModelParallelStrategy, whole otherwise."""
        if self.model is not None:
            return
        strategy = self._trainer.strategy if self._trainer is not None else None
        wrappers = dict(activation_checkpointing=self.activation_checkpointing, compile_blocks=self.compile_blocks)
        if isinstance(strategy, ModelParallelStrategy):
            self.model = build_sharded(self.arch, fsdp_mesh(strategy), strategy.root_device, self._init_seed,
                                       **wrappers, mp_policy=mixed_precision_policy(self._trainer.precision))
        else:
            self.model = build_local(self.arch, self._init_seed, **wrappers)

    def on_load_checkpoint(self, checkpoint: dict) -> None:
        """Refuses a checkpoint trained with another architecture (check_architecture), then builds the model to load
        the weights into (load_from_checkpoint outside a Trainer never calls configure_model)."""
        saved = checkpoint.get("hyper_parameters", {}).get("arch")
        if saved is not None:
            check_architecture(saved, self.arch, source="the checkpoint")
        self.configure_model()

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        return self.model(idx)

    def loss(self, batch: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Mean next-token cross-entropy of a [B, T+1] block batch over its scored targets (context-only tokens of
        recall documents are read, not scored: loss_mask.py), and their number."""
        inputs, targets = inputs_and_targets(batch)
        scored = (targets != IGNORE_INDEX).sum()
        loss = self.model(inputs, targets=targets)  # chunked soft-capped cross-entropy: no [B, T, vocab] logits
        return torch.where(scored > 0, loss, 0.0), scored  # a batch of context only (NaN mean) adds nothing

    def training_step(self, batch: torch.Tensor, batch_idx: int) -> torch.Tensor:
        loss, _ = self.loss(batch)
        self.log("train/loss", loss, prog_bar=True)
        return loss

    def validation_step(self, batch: dict, batch_idx: int) -> None:
        self._evaluate(batch, self.val_loss)

    def test_step(self, batch: dict, batch_idx: int) -> None:
        self._evaluate(batch, self.test_loss)

    def _evaluate(self, batch: dict, metric: MeanMetric) -> None:
        """A held-out batch ({"tokens", "weight"}, datamodule.HeldOutBatches) into the token-weighted mean."""
        loss, n = self.loss(batch["tokens"])
        metric.update(loss, weight=n * batch["weight"])

    def predict_step(self, batch: list[str], batch_idx: int) -> list[dict]:
        """Continue each prompt of the batch (streaming inference) and print it; returns prompt/continuation pairs."""
        decoding = asdict(self.generation) | {"seed": self.generation.seed + batch_idx}
        continuations = continue_texts(self.model, self.trainer.datamodule.tokenizer, batch, **decoding)
        for prompt, continuation in zip(batch, continuations):
            self.print(show_continuation(prompt, continuation))
        return [{"prompt": p, "continuation": c} for p, c in zip(batch, continuations)]

    def on_validation_epoch_end(self) -> None:
        self._log_eval("val", self.val_loss)

    def on_test_epoch_end(self) -> None:
        self._log_eval("test", self.test_loss)

    def _log_eval(self, stage: str, metric: MeanMetric) -> None:
        loss = metric.compute()
        metric.reset()
        self.log(f"{stage}/loss", loss, prog_bar=True, sync_dist=True)  # already reduced: silences the warning
        self.log(f"{stage}/ppl", torch.exp(loss), sync_dist=True)
        bytes_per_token = getattr(getattr(self.trainer, "datamodule", None), "meta", {}).get("bytes_per_token")
        if bytes_per_token:
            self.log(f"{stage}/bpb", loss / math.log(2) / bytes_per_token, sync_dist=True)

    def configure_optimizers(self):
        decay = [p for p in self.parameters() if p.requires_grad and p.dim() >= 2]
        no_decay = [p for p in self.parameters() if p.requires_grad and p.dim() < 2]
        opt = torch.optim.AdamW([{"params": decay, "weight_decay": self.optim.weight_decay},
                                 {"params": no_decay, "weight_decay": 0.0}],
                                lr=self.optim.lr, betas=self.optim.betas, eps=self.optim.eps)
        total = self.trainer.max_steps if self.trainer.max_steps > 0 else self.trainer.estimated_stepping_batches
        sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda step: self.optim.lr_factor(step, int(total)))
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}
