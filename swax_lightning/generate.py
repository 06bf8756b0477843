"""Generate text from a checkpoint with constant-memory streaming inference.

    python -m swax_lightning.generate --ckpt_path runs/tiny/w64/checkpoints/last.ckpt --prompt "def main(" \\
        --max_new_tokens 200 --temperature 0.8 --top_p 0.95
    python -m swax_lightning.generate --ckpt_path last.ckpt --prompts_file prompts.txt   # one prompt per line

The model config and the tokenizer come from the checkpoint (a single-file checkpoint; consolidate a distributed
one first with `python -m lightning.pytorch.utilities.consolidate_checkpoint <folder>`). `--window` and `--n_sink`
override the sliding-window layers' window and sink count at inference; with `--convert_full_attention` the
full-attention layers become SWA(window, n_sink) too (paper 2's training-free SWA with sinks).
"""
from __future__ import annotations

from pathlib import Path

import torch
from jsonargparse import CLI

from swax_lightning.inference import continue_texts, override_attention, read_prompts, show_continuation
from swax_lightning.module import LanguageModule
from swax_lightning.tokenizer import load_tokenizer


def load_model(ckpt_path: str | Path, device: str = "cpu"):
    """(model in eval mode, tokenizer) from a Lightning checkpoint written by main.py fit."""
    path = Path(ckpt_path)
    if not path.is_file():
        raise FileNotFoundError(f"checkpoint not found (or a distributed checkpoint folder; consolidate it): {path}")
    try:
        checkpoint = torch.load(path, map_location=device, weights_only=False)
    except Exception as err:  # truncated or not a torch file
        raise ValueError(f"cannot read checkpoint {path}: {err}") from err
    module = LanguageModule(**checkpoint.get("hyper_parameters", {}))
    module.on_load_checkpoint(checkpoint)
    module.load_state_dict(checkpoint["state_dict"])
    tokenizer_spec = checkpoint.get("datamodule_hyper_parameters", {}).get("tokenizer", "byte")
    return module.model.eval(), load_tokenizer(tokenizer_spec)


def main(ckpt_path: str, prompt: list[str] | None = None, prompts_file: str | None = None,
         max_new_tokens: int = 128, temperature: float = 0.0, top_k: int = 0, top_p: float = 1.0,
         window: int | None = None, n_sink: int | None = None, convert_full_attention: bool = False,
         chunk_len: int = 2048, seed: int = 0, device: str = "cpu") -> list[str]:
    """Print the continuation of each prompt.

    Args:
        ckpt_path: Checkpoint file written by `main.py fit`.
        prompt: Prompt text (repeat the flag for several).
        prompts_file: A text file with one prompt per line.
        max_new_tokens: Tokens to generate per prompt.
        temperature: 0 = greedy; otherwise the sampling temperature.
        top_k: Keep the k most likely tokens (0 = all).
        top_p: Nucleus sampling mass (1 = all).
        window: Override the sliding-window size at inference.
        n_sink: Override the number of sink tokens at inference.
        convert_full_attention: Also run the full-attention (A) layers as SWA(window, n_sink): the training-free
            conversion of arXiv 2608.28444 (needs --window; --n_sink defaults to 4).
        chunk_len: Prefill chunk length (memory per chunk, not per context).
        seed: Sampling seed.
        device: cpu or cuda.
    """
    texts = read_prompts(prompt, prompts_file)
    if not texts:
        raise ValueError("give --prompt TEXT or --prompts_file FILE")
    model, tokenizer = load_model(ckpt_path, device)
    override_attention(model, window, n_sink, convert_full_attention)
    continuations = continue_texts(model, tokenizer, texts, max_new_tokens, temperature=temperature, top_k=top_k,
                                   top_p=top_p, chunk_len=chunk_len, seed=seed)
    for text, cont in zip(texts, continuations):
        print(show_continuation(text, cont))
    return continuations


def cli() -> None:
    """The `swax-generate` console script."""
    CLI(main, as_positional=False)


if __name__ == "__main__":
    cli()
