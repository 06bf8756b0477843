"""LoLCATs-style retrofit: a pretrained full-attention model (the teacher, frozen) converted into linear attention of
the framework's own kinds, Gated DeltaNet (D) or mLSTM (X), into LoLCATs' own student (L: Hedgehog linear
attention plus a 64-token softmax window, model/lolcats.py), or into a 64-token window plus D or X beside it (G, M:
model/window_linear.py), in two stages. The experiment around it, and its
command (`swax retrofit run configs/retrofit/smollm2.yaml`), is swax_lightning/pretrained/experiment.py.

1. Attention transfer (LoLCATs' stage 1). The converted model is the teacher with every attention mixer replaced
   by a student mixer (`student_config`: the pattern's letter per layer; A and S keep the teacher's layer, so
   Gemma 3's SSSSSL converts its global layers and keeps its local ones). Each student
   is trained to reproduce its teacher layer's output from that layer's input, both captured from the frozen
   teacher's forward (`mixer_io`: hooks on the mixers, one teacher forward per batch, no LM head), all layers at
   once, each with its own loss: the relative mean squared error |student(x) - y|^2 / |y|^2 (scale-free, so every
   layer counts alike whatever the size of its outputs).
2. LoRA (LoLCATs' stage 2): adapters on every linear layer of every mixer (q/k/v/o and the students' gate
   projections), next-token loss on the converted model; merged into the weights afterwards (lora.py).

What maps from the teacher (`init_from_attention`), and what is new. A D or X student has one head per teacher
query head, with the teacher's head width, so: q_proj = the teacher's q_proj; k_proj and v_proj = the teacher's,
each key/value head repeated for the query heads that share it (GQA); out_proj = the teacher's o_proj. New (no
counterpart, the framework's initialisation): Gated DeltaNet's beta (write strength) and decay projections, A_log
and dt_bias, its output gate and per-head output norm; the mLSTM's input, forget and output gates and its per-head
output norm. Not carried over to D or X: RoPE (a linear-attention state has no positions), q/k/v biases (Qwen2) and
q/k norms (Qwen3), which those students do not have. An L student is the teacher's attention layer plus what
LoLCATs adds: q/k/v/o (biases included), the q/k norms, RoPE (rope_theta, rope_scale, max_positions) and the GQA
layout (n_kv_heads, nothing repeated) are the teacher's; new are the Hedgehog feature maps of queries and keys
(identity or kaiming, ModelConfig.lolcats_feature_init) and the window factors (sigmoid 0.1 at the start). On a
sequence of at most two windows it sees every earlier key with softmax and nothing linearly, so there it is the
teacher exactly, whatever its window factors. Gated DeltaNet's short convolutions are off by default
(deltanet_conv 0): they would sit between the copied projections and the cell and turn their outputs into something
else at the start.
Embeddings, norms, feed-forward layers and the LM head are the teacher's, frozen in both stages.

Decisions:
- Stage 1 trains the new parameters only by default (`transfer.train: new`): LoLCATs' split, where attention
  transfer learns what the teacher lacks (its feature maps; for L exactly feature_map_q, feature_map_k and
  window_factors, as LoLCATs' stage 1) and LoRA then adapts q/k/v/o (for L exactly those four, as LoLCATs' stage 2);
  `all` trains every student parameter in stage 1.
- Output-scale calibration is for the D and X students, whose per-head output norms start at scale 1, and for the
  linear part of G and M, fitted to what their window leaves; an L student has no output norm and starts at the
  teacher's scale. A G or M layer's window part is the teacher's attention, kept as it is in stage 1 like q/k/v/o.
- Token budgets are config fields (transfer.tokens, lora.tokens): whole sequences of data.seq_len tokens, batches of
  data.batch_size, drawn in a seeded order from the training split of the data module's shards (the embedded
  corpus, or any source, tokenized with the teacher's own tokenizer, plus its generated recall documents), never
  from the evaluations' generators or haystack prose. The tokens actually used are recorded.
- Students of several kinds train in one loop (one teacher forward serves them all).
- Resumable: each stage saves its progress (trainable weights, optimizer, step, losses) every few steps, atomically,
  and continues from it; a finished stage leaves its outputs and is skipped.
- The result is a framework checkpoint (checkpoints.model_checkpoint) with the teacher's tokenizer: load_model,
  `main.py test`, generate and export read it as any other.
"""
from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator
from contextlib import nullcontext
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import torch
import torch.nn as nn

from swax_lightning.core import atomic
from swax_lightning.core.errors import ConfigError, require
from swax_lightning.core.safe_load import load_as_data
from swax_lightning.data.loss_mask import inputs_and_targets
from swax_lightning.model.attention import Attention
from swax_lightning.model.config import ModelConfig
from swax_lightning.model.lolcats import LolcatsAttention
from swax_lightning.model.model import SWAXModel
from swax_lightning.model.window_linear import WindowPlusLinear
from swax_lightning.pretrained.lora import add_lora, merge_lora

MAPPED = ("q_proj", "k_proj", "v_proj", "out_proj")  # the student projections initialised from the teacher's
FROM_TEACHER = (*MAPPED, "q_norm", "k_norm")  # every student part with a teacher counterpart (norms: L students)
STUDENT_KINDS = {"D": "Gated DeltaNet", "X": "mLSTM",
                 "L": "LoLCATs: Hedgehog linear attention + 64-token softmax window",
                 "G": "a 64-token softmax window + Gated DeltaNet", "M": "a 64-token softmax window + mLSTM",
                 "A": "the teacher's full attention, kept", "S": "the teacher's sliding-window attention, kept"}
KEPT = ("A", "S")  # letters that keep the teacher's layer (each only where the teacher has that kind)
WITH_TEACHER_ROPE = ("L", "G", "M")  # students holding the teacher's attention, with its full-attention RoPE
TRAIN_CHOICES = ("new", "all")
Batch = tuple[torch.Tensor, torch.Tensor]  # (inputs, targets) [B, T], as loss_mask.inputs_and_targets gives them
Measure = Callable[[int, SWAXModel], None]  # (steps done, model in eval mode): one held-out point of a stage's curve


@dataclass
class TransferConfig:
    """Stage 1, attention transfer.

    Args:
        tokens: Training tokens (rounded up to whole batches of data.batch_size x data.seq_len).
        lr: AdamW learning rate (constant).
        train: new = the student parameters that have no counterpart in the teacher (LoLCATs); all = every student
            parameter.
        calibrate: Before the first step, scale each student's output to the teacher's on the first batch
            (calibrate_output_scale).
        save_every: Steps between two saves of the progress (resume point).
    """

    tokens: int = 65536
    lr: float = 1e-3
    train: str = "new"
    calibrate: bool = True
    save_every: int = 16

    def __post_init__(self) -> None:
        require(self.tokens >= 1, "transfer.tokens", "must be >= 1", self.tokens)
        require(self.lr > 0, "transfer.lr", "must be > 0", self.lr)
        require(self.train in TRAIN_CHOICES, "transfer.train", f"must be one of {TRAIN_CHOICES}", self.train)
        require(self.save_every >= 1, "transfer.save_every", "must be >= 1", self.save_every)


@dataclass
class LoRAConfig:
    """Stage 2, LoRA on every mixer's linear layers with next-token loss.

    Args:
        tokens: Training tokens (rounded up to whole batches); 0 skips the stage.
        rank: Adapter rank.
        alpha: Adapter scale numerator (the update is alpha / rank * B A).
        lr: AdamW learning rate (constant).
        save_every: Steps between two saves of the progress.
    """

    tokens: int = 16384
    rank: int = 8
    alpha: float = 16.0
    lr: float = 1e-3
    save_every: int = 16

    def __post_init__(self) -> None:
        require(self.tokens >= 0, "lora.tokens", "must be >= 0", self.tokens)
        require(self.rank >= 1, "lora.rank", "must be >= 1", self.rank)
        require(self.lr > 0, "lora.lr", "must be > 0", self.lr)
        require(self.save_every >= 1, "lora.save_every", "must be >= 1", self.save_every)


# ---- the converted model ---------------------------------------------------------------------------------------------
def student_config(teacher: ModelConfig, pattern: str, **arch) -> ModelConfig:
    """The converted model's ModelConfig: the teacher's, with `pattern` (D, X, L, or A and S kept, per layer, tiled)
    and student mixers shaped like the teacher's attention (D, X: one head per query head, the teacher's head width;
    L: the teacher's heads, key/value heads, biases, q/k norms and RoPE, all kept from the teacher's config); `arch`:
    other ModelConfig fields (e.g. chunk_size, igate_bias_init, lolcats_window). The teacher is an attention model:
    full (A) layers, and sliding (S) ones such as Gemma 3's local layers, which a student keeps as they are (S where
    the teacher has S) or converts; an L layer takes the full-attention RoPE, so it may replace a local layer only
    when those share one (no sliding_rope_theta)."""
    if not pattern or set(pattern) - set(STUDENT_KINDS):
        raise ConfigError(f"student pattern {pattern!r}: letters must be from {STUDENT_KINDS}")
    if set(teacher.pattern) - set(KEPT):
        raise ConfigError(f"the teacher must be an attention model (patterns of A and S), not pattern "
                          f"{teacher.pattern!r}")
    layers = pattern * (teacher.n_layers // len(pattern)) if teacher.n_layers % len(pattern) == 0 else None
    if layers is None:
        raise ConfigError(f"student pattern {pattern!r} does not tile the teacher's {teacher.n_layers} layers")
    for i, (letter, kind) in enumerate(zip(layers, teacher.layer_kinds)):
        if letter in KEPT and letter != kind:
            raise ConfigError(f"student pattern {pattern!r} keeps layer {i} as {letter}, but the teacher's layer {i} "
                              f"is {kind} (keep it as {kind} or convert it)")
        if letter in WITH_TEACHER_ROPE and kind == "S" and teacher.sliding_rope_theta is not None:
            raise ConfigError(f"student pattern {pattern!r} makes the teacher's local layer {i} an {letter} layer, "
                              f"which would rotate with the global layers' RoPE base: keep it (S) or convert it to "
                              f"D or X")
    factor = teacher.n_heads * teacher.attn_head_dim / teacher.d_model
    shape = dict(deltanet_heads=teacher.n_heads, deltanet_qk_factor=factor, deltanet_v_factor=factor,
                 deltanet_conv=0, mlstm_heads=teacher.n_heads, mlstm_qk_factor=factor, mlstm_v_factor=factor)
    return replace(teacher, pattern=pattern, **{**shape, **arch})


def _repeat_kv(weight: torch.Tensor, attention: Attention) -> torch.Tensor:
    """A key or value projection [kv_heads * head_dim, d] -> [heads * head_dim, d]: each key/value head repeated for
    the query heads that share it (GQA: query head h reads key/value head h // (heads / kv_heads))."""
    groups = attention.n_heads // attention.n_kv_heads
    rows = weight.view(attention.n_kv_heads, attention.head_dim, -1).repeat_interleave(groups, dim=0)
    return rows.reshape(attention.n_heads * attention.head_dim, -1)


@torch.no_grad()
def init_from_attention(student: nn.Module, attention: Attention) -> None:
    """Copy the teacher's q/k/v/o into a student mixer (see the module docstring for what maps)."""
    if isinstance(student, LolcatsAttention):
        _copy_attention(student, attention)
        return
    if isinstance(student, WindowPlusLinear):
        _copy_attention(student.local, attention)
        init_from_attention(student.linear, attention)
        return
    sources = {"q_proj": attention.q_proj.weight, "k_proj": _repeat_kv(attention.k_proj.weight, attention),
               "v_proj": _repeat_kv(attention.v_proj.weight, attention), "out_proj": attention.out_proj.weight}
    for name, weight in sources.items():
        target = getattr(student, name).weight
        if target.shape != weight.shape:
            raise ConfigError(f"student {name} has shape {tuple(target.shape)}, the teacher's maps to "
                              f"{tuple(weight.shape)}: the student must have one head per query head of the "
                              f"teacher's width (student_config)")
        target.copy_(weight)


def _copy_attention(student: nn.Module, attention: Attention) -> None:
    """An L student, or the window of a G or M one, takes the teacher's q/k/v/o (weights and biases) and q/k norms
    as they are: it has the teacher's layout (student_config), key/value heads included."""
    for name in FROM_TEACHER:
        for key, tensor in getattr(attention, name).state_dict().items():
            getattr(student, name).state_dict()[key].copy_(tensor)


def converted_model(teacher: SWAXModel, pattern: str, seed: int = 0, **arch) -> SWAXModel:
    """The teacher with its attention mixers replaced by students initialised from them: every weight the teacher
    has a counterpart for is the teacher's, the rest is the framework's initialisation from `seed`."""
    cfg = student_config(teacher.cfg, pattern, **arch)
    model = SWAXModel(cfg).to(teacher.embed.weight.device)
    model.reset_parameters(seed)
    shared = {name: tensor for name, tensor in teacher.state_dict().items()
              if ".mixer." not in name or is_kept_attention(model, name)}
    missing, unexpected = model.load_state_dict(shared, strict=False)
    assert not unexpected and all(_in_student(model, name) for name in missing), (missing, unexpected)
    for block, teacher_block in zip(model.blocks, teacher.blocks):
        if block.kind not in KEPT:
            init_from_attention(block.mixer, teacher_block.mixer)
    return model.eval()


def is_kept_attention(model: SWAXModel, name: str) -> bool:
    """Whether parameter `name` belongs to an attention mixer the converted model keeps (letters A and S)."""
    parts = name.split(".")
    return parts[0] == "blocks" and parts[2] == "mixer" and model.blocks[int(parts[1])].kind in KEPT


def student_state(model: SWAXModel) -> dict:
    """The student mixers' weights (what stage 1 changed, plus their copied projections)."""
    return {name: tensor for name, tensor in model.state_dict().items() if _in_student(model, name)}


def _in_student(model: SWAXModel, name: str) -> bool:
    parts = name.split(".")
    return parts[0] == "blocks" and parts[2] == "mixer" and model.blocks[int(parts[1])].kind not in KEPT


def student_layers(model: SWAXModel) -> list[int]:
    """The blocks of a converted model whose mixer is a student."""
    return [i for i, block in enumerate(model.blocks) if block.kind not in KEPT]


def transfer_parameters(model: SWAXModel, train: str) -> list[nn.Parameter]:
    """What stage 1 trains: the students' new parameters (train "new") or all their parameters ("all")."""
    return [p for i in student_layers(model) for name, p in model.blocks[i].mixer.named_parameters()
            if train == "all" or not set(name.split(".")) & set(FROM_TEACHER)]


# ---- stage 1: attention transfer -------------------------------------------------------------------------------------
@torch.no_grad()
def mixer_io(teacher: SWAXModel, idx: torch.Tensor) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """Every mixer's input (after its norm) and output in the teacher's forward of idx [B, T]: hooks on the mixers,
    the blocks only (no final norm, no LM head)."""
    inputs, outputs = [], []

    def record(module, args, output):
        inputs.append(args[0])
        outputs.append(output)

    hooks = [block.mixer.register_forward_hook(record) for block in teacher.blocks]
    try:
        x = teacher.embed_tokens(idx)
        for block in teacher.blocks:
            x = block(x)
    finally:
        for hook in hooks:
            hook.remove()
    return inputs, outputs


def relative_mse(prediction: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """|prediction - target|^2 / |target|^2 over every element, in fp32: 1 for a student that outputs zeros."""
    target = target.float()
    return (prediction.float() - target).pow(2).mean() / target.pow(2).mean().clamp_min(1e-12)


@torch.no_grad()
def transfer_errors(model: SWAXModel, inputs: list, outputs: list) -> list[float]:
    """Each student layer's relative MSE against its teacher layer, on the teacher's mixer_io of some text (e.g. the
    held-out sequences, captured once for every point of a curve)."""
    return [float(relative_mse(model.blocks[i].mixer(inputs[i]), outputs[i])) for i in student_layers(model)]


def measured_steps(steps: int) -> list[int]:
    """The steps after which a stage's held-out curve is measured: 0 (the start), every power of two below `steps`,
    and `steps`: evenly spaced on a log axis of tokens, so the improvement per doubling reads off the last two."""
    return [0] + [2**i for i in range(steps.bit_length()) if 2**i < steps] + ([steps] if steps else [])


@torch.no_grad()
def _measure(measure: Measure | None, points: list[int], step: int, model: SWAXModel) -> None:
    if measure is not None and step in points:
        model.eval()
        measure(step, model)
        model.train()


@torch.no_grad()
def calibrate_output_scale(model: SWAXModel, inputs: list, outputs: list) -> list[float]:
    """Scale each student's output norm weight by the least-squares factor a = <s, y> / <s, s> between its output s
    and the teacher's y on one batch, so every layer starts at the teacher's scale (relative MSE 1 - cos^2(s, y) <= 1):
    the students' per-head output norms forget the scale that attention outputs have, and a learning rate that
    moves a weight by about lr per step would need thousands of steps to find it. Returns the factors."""
    factors = []
    for i in student_layers(model):
        mixer = model.blocks[i].mixer
        if isinstance(mixer, LolcatsAttention):  # no output norm: the teacher's own scale from the start
            factors.append(1.0)
            continue
        y = outputs[i].float()
        if isinstance(mixer, WindowPlusLinear):  # the linear part fits what the window leaves
            y, mixer = y - mixer.local(inputs[i]).float(), mixer.linear
        s = mixer(inputs[i]).float()
        factor = float((s * y).sum() / (s * s).sum().clamp_min(1e-12))
        mixer.norm.weight.mul_(factor)
        factors.append(factor)
    return factors


def forward_precision(device: torch.device, bf16: bool):
    """The context a training forward runs in: bf16 autocast (fp32 weights and optimizer, bf16 matmuls: several
    times faster on GPUs and on CPUs with AVX-512 BF16), or nothing (fp32)."""
    return torch.autocast(device.type, dtype=torch.bfloat16) if bf16 else nullcontext()


def transfer_step(model: SWAXModel, inputs: list, outputs: list, optimizer: torch.optim.Optimizer,
                  bf16: bool = False) -> float:
    """One optimizer step of every student layer on the teacher's captured inputs/outputs; returns the mean relative
    MSE. Layers are independent, so each loss is back-propagated on its own (one layer's graph alive at a time)."""
    layers = student_layers(model)
    total = 0.0
    for i in layers:
        with forward_precision(inputs[i].device, bf16):
            loss = relative_mse(model.blocks[i].mixer(inputs[i]), outputs[i]) / len(layers)
        loss.backward()
        total += loss.item()
    torch.nn.utils.clip_grad_norm_([p for g in optimizer.param_groups for p in g["params"]], 1.0)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return total


def attention_transfer(teacher: SWAXModel, students: dict[str, SWAXModel], batches: Iterator[Batch], steps: int,
                       cfg: TransferConfig, progress: Path, log: Callable[[str, int, float], None],
                       bf16: bool = False, measure: dict[str, Measure] | None = None) -> dict[str, list[float]]:
    """Stage 1 for every student at once, `steps` batches, resuming from and saving to `progress`; returns each
    student's loss per step. log(student, step, loss) after every step. bf16: forwards under bf16 autocast.
    measure[student](steps done, model) at measured_steps (from the resume point on: a caller keeps its points)."""
    params = {name: transfer_parameters(model, cfg.train) for name, model in students.items()}
    optimizers = {name: torch.optim.AdamW(p, lr=cfg.lr, weight_decay=0.0) for name, p in params.items()}
    losses, start = _resume(progress, students, optimizers, {name: [] for name in students})
    batches = skip(batches, start)
    teacher.requires_grad_(False)
    for model in students.values():
        model.requires_grad_(False)
        model.train()
    for name in students:
        for p in params[name]:
            p.requires_grad_(True)
    points, measure = measured_steps(steps), measure or {}
    for step in range(start, steps):
        idx, _ = next(batches)  # attention transfer matches layer outputs: the targets are not needed
        with forward_precision(idx.device, bf16):
            inputs, outputs = mixer_io(teacher, idx)
        for name, model in students.items():
            if step == 0 and cfg.calibrate:
                calibrate_output_scale(model, inputs, outputs)
            if step == start:  # the curve's first point is the calibrated start (or the resume point)
                _measure(measure.get(name), points, step, model)
            losses[name].append(transfer_step(model, inputs, outputs, optimizers[name], bf16))
            log(name, step, losses[name][-1])
            _measure(measure.get(name), points, step + 1, model)
        if (step + 1) % cfg.save_every == 0 and step + 1 < steps:
            _save_progress(progress, step + 1, students, optimizers, losses)
    for model in students.values():
        model.requires_grad_(False)
        model.eval()
    atomic.remove(progress)
    return losses


# ---- stage 2: LoRA ---------------------------------------------------------------------------------------------------
def lora_finetune(model: SWAXModel, batches: Iterator[Batch], steps: int, cfg: LoRAConfig, progress: Path,
                  log: Callable[[int, float], None], seed: int = 0, bf16: bool = False,
                  measure: Measure | None = None) -> list[float]:
    """Stage 2: adapters on every mixer's linear layers, `steps` batches (inputs, targets) of next-token loss, then
    merged into the weights; resumes from and saves to `progress`. Returns the loss per step. bf16: forwards under
    bf16 autocast. measure(steps done, model with its adapters) at measured_steps, from the resume point on."""
    model.requires_grad_(False)
    for i, block in enumerate(model.blocks):
        add_lora(block.mixer, cfg.rank, cfg.alpha, seed=seed * 1_000_003 + i)
    adapters = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(adapters, lr=cfg.lr, weight_decay=0.0)
    losses, start = _resume(progress, {"model": model}, {"model": optimizer}, {"model": []})
    losses, batches = losses["model"], skip(batches, start)
    model.train()
    points = measured_steps(steps)
    _measure(measure, points, start, model)
    for step in range(start, steps):
        inputs, targets = next(batches)
        with forward_precision(inputs.device, bf16):
            loss = model(inputs, targets=targets)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(adapters, 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(loss.item())
        log(step, losses[-1])
        _measure(measure, points, step + 1, model)
        if (step + 1) % cfg.save_every == 0 and step + 1 < steps:
            _save_progress(progress, step + 1, {"model": model}, {"model": optimizer}, {"model": losses})
    merge_lora(model)
    model.requires_grad_(False)
    atomic.remove(progress)
    return losses.copy()


# ---- progress files --------------------------------------------------------------------------------------------------
def _trainable(model: nn.Module) -> dict:
    return {name: p.detach().clone() for name, p in model.named_parameters() if p.requires_grad}


def _save_progress(path: Path, step: int, models: dict, optimizers: dict, losses: dict) -> None:
    state = {"step": step, "losses": losses, "models": {name: _trainable(m) for name, m in models.items()},
             "optimizers": {name: opt.state_dict() for name, opt in optimizers.items()}}
    with atomic.written_atomically(path) as tmp:
        torch.save(state, tmp)


def _resume(path: Path, models: dict, optimizers: dict, losses: dict) -> tuple[dict, int]:
    """(losses so far, the step to start from): the saved progress loaded into models and optimizers, or nothing."""
    if not path.is_file():
        return losses, 0
    state = load_as_data(path)
    for name, model in models.items():
        own = dict(model.named_parameters())
        with torch.no_grad():
            for key, tensor in state["models"][name].items():
                own[key].copy_(tensor)
        optimizers[name].load_state_dict(state["optimizers"][name])
    print(f"resuming from {path} at step {state['step']}", flush=True)
    return state["losses"], state["step"]


# ---- training data ---------------------------------------------------------------------------------------------------
def token_batches(dataset, batch_size: int, seed: int, device) -> Iterator[Batch]:
    """(inputs, targets) [batch_size, T] of token blocks from `dataset` (e.g. TextDataModule.blocks("train", T + 1))
    in a seeded random order, endlessly (the order repeats, reshuffled, once exhausted): step s always gets the same
    blocks, so a resumed stage continues with the data it would have seen. The blocks go through
    loss_mask.inputs_and_targets, as in main.py fit: ids without context-only marks, marked targets ignored."""
    epoch = 0
    while True:
        order = torch.randperm(len(dataset), generator=torch.Generator().manual_seed(seed * 1_000_003 + epoch))
        for start in range(0, len(order) - batch_size + 1, batch_size):
            rows = [np.asarray(dataset[int(i)], dtype=np.int64) for i in order[start:start + batch_size]]
            yield inputs_and_targets(torch.as_tensor(np.stack(rows), device=device))
        epoch += 1


def skip(batches: Iterator, n: int) -> Iterator:
    """`batches` after its first n items (a resumed stage's data)."""
    for _ in range(n):
        next(batches)
    return batches


def steps_for(tokens: int, batch_size: int, seq_len: int) -> int:
    """Optimizer steps of a token budget: whole batches, rounded up."""
    return math.ceil(tokens / (batch_size * seq_len)) if tokens else 0


def seconds_since(start: float) -> float:
    return round(time.perf_counter() - start, 1)
