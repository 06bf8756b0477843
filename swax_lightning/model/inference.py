"""Streaming inference: chunked prefill and token-by-token generation in memory that does not grow with the context.

Each block keeps its own state (cache.py): a ring of the last W keys plus sinks for SWA, (C, n, m) for mLSTM, a
growing cache only for full attention. A prompt is processed `chunk_len` tokens at a time with the state carried
across chunks, then one token per step with the recurrent forms.

Decisions:
- Batched prompts of different lengths are left-padded to one length; every sequence keeps its own absolute
  positions (negative on the padding), so each continuation equals the one it would get alone.
- Greedy when temperature == 0; otherwise temperature, then top-k, then top-p (nucleus) filtering, sampled with a
  seeded generator, so a run is reproducible.
- Generation stops per sequence at a stop token (not included in the output), when `should_stop(b, tokens)` says
  so (e.g. a stop string has appeared; checked after each new token), or after max_new_tokens.
- The window and sink count used at inference are the model's current ones: `override_attention` (or
  `model.set_window(w)` / `model.set_sinks(s)`) before calling changes them (training-free SWA with sinks), with the
  window in either convention (model.swa_window).
- Text prompts start as the model was trained: the tokenizer's start-of-sequence ids first (`encode_prompt`: the BOS
  of a Llama-family tokenizer, nothing for the byte tokenizer), and generation stops at any of the tokenizer's
  end ids (`stop_ids`: end-of-text, and end-of-turn tokens such as <|im_end|> for chat models).
"""
from __future__ import annotations

import time
from collections.abc import Callable, Sequence

import torch

from swax_lightning.core.errors import ConfigError
from swax_lightning.model.model import SWAXModel, check_window, swa_window


def override_attention(model: SWAXModel, window: int | None = None, n_sink: int | None = None,
                       convert_full_attention: bool = False, window_includes_sinks: bool = False) -> None:
    """Inference-time attention settings: the sliding layers' window and sink count; or, with convert_full_attention,
    the full-attention layers run as SWA(window, n_sink) (training-free conversion; 4 sinks unless n_sink is given)
    while the model's own sliding layers keep the window and sinks they were trained with (Gemma 3's local layers).
    window_includes_sinks: `window` counts every key a query sees, sinks included, instead of the recent keys only
    (model.swa_window); it needs a window."""
    if window_includes_sinks and window is None:
        raise ConfigError("window_includes_sinks needs a window")
    if convert_full_attention:
        if window is None:
            raise ConfigError("convert_full_attention needs a window")
        model.convert_full_attention(window, 4 if n_sink is None else n_sink, window_includes_sinks)
        return
    if n_sink is not None:
        model.set_sinks(n_sink)
    if window is not None:
        check_window(model.cfg, window)
        model.set_window(swa_window(window, model.n_sink, window_includes_sinks))


def check_prompts(prompts: Sequence[Sequence[int]], vocab_size: int) -> None:
    if not prompts:
        raise ValueError("no prompts given")
    for i, prompt in enumerate(prompts):
        if len(prompt) == 0:
            raise ValueError(f"prompt {i} is empty: give at least one token")
        bad = [t for t in prompt if not 0 <= t < vocab_size]
        if bad:
            raise ValueError(f"prompt {i} has token ids outside the vocabulary [0, {vocab_size}): {bad[:5]}")


def left_pad(prompts: Sequence[Sequence[int]], device=None) -> tuple[torch.Tensor, torch.Tensor]:
    """Token ids [B, T] left-padded with 0, and absolute positions [B, T] (negative on padding)."""
    T = max(len(p) for p in prompts)
    idx = torch.zeros(len(prompts), T, dtype=torch.long, device=device)
    positions = torch.arange(T, device=device).repeat(len(prompts), 1)
    for b, prompt in enumerate(prompts):
        pad = T - len(prompt)
        idx[b, pad:] = torch.as_tensor(list(prompt), dtype=torch.long, device=device)
        positions[b] -= pad
    return idx, positions


@torch.no_grad()
def prefill(model: SWAXModel, idx: torch.Tensor, positions: torch.Tensor, caches: list, chunk_len: int,
            return_all: bool = False) -> torch.Tensor:
    """Feed idx [B, T] through the model chunk by chunk, updating `caches`. Returns the last logits [B, V], or all
    logits [B, T, V] when return_all (only for tests and short inputs: that is what grows with T)."""
    if chunk_len < 1:
        raise ValueError(f"chunk_len must be >= 1 (got {chunk_len})")
    outputs = []
    for start in range(0, idx.shape[1], chunk_len):
        outputs.append(model(idx[:, start:start + chunk_len], caches, positions[:, start:start + chunk_len],
                             last_only=not return_all))
    return torch.cat(outputs, 1) if return_all else outputs[-1][:, -1]


def sample(logits: torch.Tensor, temperature: float = 0.0, top_k: int = 0, top_p: float = 1.0,
           generator: torch.Generator | None = None) -> torch.Tensor:
    """Next token ids [B] from logits [B, V]."""
    if temperature <= 0:
        return logits.argmax(-1)
    logits = logits.float() / temperature
    if top_k > 0:
        kth = torch.topk(logits, min(top_k, logits.shape[-1]), dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p < 1.0:
        sorted_logits, order = logits.sort(dim=-1, descending=True)
        probs = sorted_logits.softmax(-1)
        drop = probs.cumsum(-1) - probs > top_p  # keep the smallest prefix whose mass reaches top_p
        logits = logits.scatter(-1, order, sorted_logits.masked_fill(drop, float("-inf")))
    return torch.multinomial(logits.softmax(-1), 1, generator=generator).squeeze(-1)


@torch.no_grad()
def generate(model: SWAXModel, prompts: Sequence[Sequence[int]], max_new_tokens: int = 128, temperature: float = 0.0,
             top_k: int = 0, top_p: float = 1.0, stop_tokens: Sequence[int] = (), chunk_len: int = 2048,
             seed: int = 0, should_stop: Callable[[int, list[int]], bool] | None = None,
             stats: dict | None = None) -> list[list[int]]:
    """Continuations of a batch of token-id prompts (any lengths). `stats`, a dict, receives what the call cost
    (decode_stats)."""
    check_prompts(prompts, model.cfg.vocab_size)
    device = model.embed.weight.device
    idx, positions = left_pad(prompts, device)
    caches = model.new_caches(len(prompts), dtype=model.embed.weight.dtype)
    started = time.perf_counter()
    logits = prefill(model, idx, positions, caches, chunk_len)
    prefilled, steps = time.perf_counter(), 0
    next_pos = positions[:, -1:] + 1
    generator = torch.Generator(device=device).manual_seed(seed)
    stop = torch.tensor(list(stop_tokens), dtype=torch.long, device=device)
    outputs: list[list[int]] = [[] for _ in prompts]
    done = torch.zeros(len(prompts), dtype=torch.bool, device=device)
    for _ in range(max_new_tokens):
        token = sample(logits, temperature, top_k, top_p, generator)
        done |= torch.isin(token, stop)
        for b in (~done).nonzero().flatten().tolist():
            outputs[b].append(int(token[b]))
            if should_stop is not None and should_stop(b, outputs[b]):
                done[b] = True
        if done.all():
            break
        logits = model(token[:, None], caches, next_pos)[:, -1]
        next_pos, steps = next_pos + 1, steps + 1
    if stats is not None:
        stats.update(decode_stats(caches, idx.shape, prefilled - started, time.perf_counter() - prefilled, steps))
    return outputs


def decode_stats(caches: list, shape: torch.Size, prefill_seconds: float, decode_seconds: float,
                 decode_steps: int) -> dict:
    """What one generate call of a batch of prompts left-padded to `shape` [batch, prompt tokens] cost: the seconds
    of its prefill and of its decode steps (one model call per generated token after the first, for the whole
    batch), and the bytes its inference state holds at the end (caches' nbytes, all sequences: the window ring and
    sinks, the recurrent states, or a full-attention cache that grew with the context)."""
    batch, prompt_tokens = shape
    return {"batch": batch, "prompt_tokens": prompt_tokens, "prefill_seconds": prefill_seconds,
            "decode_seconds": decode_seconds, "decode_steps": decode_steps,
            "cache_bytes": sum(cache.nbytes() for cache in caches)}


def continue_texts(model: SWAXModel, tokenizer, texts: Sequence[str], max_new_tokens: int = 128,
                   **decoding) -> list[str]:
    """Text continuations of text prompts (encoded with the tokenizer's start-of-sequence ids), stopping at any of
    its end ids; `decoding`: generate's temperature, top_k, top_p, chunk_len, seed, stats."""
    outputs = generate(model, [tokenizer.encode_prompt(t) for t in texts], max_new_tokens,
                       stop_tokens=tokenizer.stop_ids, **decoding)
    return [tokenizer.decode(o) for o in outputs]


def show_continuation(prompt: str, continuation: str) -> str:
    """How the predict and generate commands print a result."""
    return f"--- prompt: {prompt!r}\n{prompt}{continuation}\n"
