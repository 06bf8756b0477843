"""LanguageModule: the LightningModule that trains a SWAXModel on next-token prediction.

Decisions:
- The model is built in configure_model() from a ModelConfig (a YAML section), so that a sharded run can build it on
  the meta device and shard it (parallel.py); hyperparameters are saved in every checkpoint.
- Loss is mean next-token cross-entropy in fp32. Validation and test accumulate a token-weighted mean with
  torchmetrics (correct under DDP) and report loss, perplexity and bits per byte (the loss divided by ln 2 and by the
  bytes per token the data module measured on the held-out text).
- AdamW with linear warmup then cosine decay to min_lr_ratio * lr at max_steps; decay only on matrices (>= 2-D),
  not on norms, biases or gate biases. Gradient clipping is the Trainer's `gradient_clip_val`.
- Throughput (tokens/s) comes from Lightning's ThroughputMonitor (see throughput.py), not from this module.
"""
from __future__ import annotations

import math
import warnings
from dataclasses import asdict, dataclass, field

import lightning as L
from lightning.pytorch.strategies import ModelParallelStrategy
import torch
from torchmetrics.aggregation import MeanMetric

from swax_lightning.config import ModelConfig
from swax_lightning.inference import continue_texts, show_continuation
from swax_lightning.model import SWAXModel
from swax_lightning.parallel import build_local, build_sharded, fsdp_mesh, mixed_precision_policy


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
        if self.lr <= 0:
            raise ValueError(f"OptimConfig.lr must be > 0 (got {self.lr})")
        if not 0 <= self.min_lr_ratio <= 1:
            raise ValueError(f"OptimConfig.min_lr_ratio must be in [0, 1] (got {self.min_lr_ratio})")
        if self.warmup_steps < 0:
            raise ValueError(f"OptimConfig.warmup_steps must be >= 0 (got {self.warmup_steps})")

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


class LanguageModule(L.LightningModule):
    """Next-token language modelling with a SWAX model.

    Args:
        arch: The model architecture (ModelConfig fields).
        optim: Optimizer and learning-rate schedule (OptimConfig fields).
        activation_checkpointing: Recompute each block's activations in the backward pass (saves memory).
        compile: torch.compile each block.
        generation: Decoding settings of `main.py predict` (GenerationConfig fields).
    """

    def __init__(self, arch: ModelConfig | None = None, optim: OptimConfig | None = None,
                 activation_checkpointing: bool = False, compile: bool = False,
                 generation: GenerationConfig | None = None):
        super().__init__()
        arch = ModelConfig(**arch) if isinstance(arch, dict) else (arch or ModelConfig())
        optim = OptimConfig(**optim) if isinstance(optim, dict) else (optim or OptimConfig())
        self.arch, self.optim = arch, optim
        self.generation = GenerationConfig(**generation) if isinstance(generation, dict) else \
            (generation or GenerationConfig())
        self.activation_checkpointing, self.compile_blocks = activation_checkpointing, compile
        self.save_hyperparameters({"arch": asdict(arch), "optim": asdict(optim),
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
        """Refuses a checkpoint whose weights do not fit the configured model, naming the config fields that differ;
        fields that change no weight shape (window, eps, ...) only warn."""
        self.configure_model()  # load_from_checkpoint outside a Trainer never calls configure_model
        saved = checkpoint.get("hyper_parameters", {}).get("arch")
        saved = ModelConfig(**saved).__dict__ if saved is not None else {}
        diff = {k: (v, getattr(self.arch, k)) for k, v in saved.items() if getattr(self.arch, k) != v}
        ours = {k: v.shape for k, v in self.state_dict().items()}
        theirs = {k: v.shape for k, v in checkpoint.get("state_dict", {}).items()}
        if theirs and ours != theirs:
            wrong = sorted(set(ours) ^ set(theirs)) or [k for k in ours if ours[k] != theirs[k]]
            raise ValueError(f"the checkpoint does not fit the configured model (first differences: {wrong[:3]}); "
                             f"differing config fields (checkpoint, configured): {diff}")
        if diff:
            warnings.warn(f"checkpoint config differs in fields that keep the weight shapes (checkpoint, "
                          f"configured): {diff}", stacklevel=2)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        return self.model(idx)

    def loss(self, batch: torch.Tensor) -> tuple[torch.Tensor, int]:
        """Mean next-token cross-entropy of a [B, T+1] block batch, and the number of predicted tokens."""
        batch = batch.long()
        inputs, targets = batch[:, :-1], batch[:, 1:]
        loss = self.model(inputs, targets=targets)  # chunked soft-capped cross-entropy: no [B, T, vocab] logits
        return loss, targets.numel()

    def training_step(self, batch: torch.Tensor, batch_idx: int) -> torch.Tensor:
        loss, _ = self.loss(batch)
        self.log("train/loss", loss, prog_bar=True)
        return loss

    def validation_step(self, batch: torch.Tensor, batch_idx: int) -> None:
        loss, n = self.loss(batch)
        self.val_loss.update(loss, weight=n)

    def test_step(self, batch: torch.Tensor, batch_idx: int) -> None:
        loss, n = self.loss(batch)
        self.test_loss.update(loss, weight=n)

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
