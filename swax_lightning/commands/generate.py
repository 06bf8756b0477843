"""Generate text from a checkpoint with constant-memory streaming inference.

    python -m swax_lightning generate --ckpt_path runs/tiny/w64/checkpoints/last.ckpt --prompt "def main(" \\
        --prompt "import " --max_new_tokens 200 --temperature 0.8 --top_p 0.95
    python -m swax_lightning generate --ckpt_path last.ckpt --prompts_file prompts.txt   # one prompt per line

The model config and the tokenizer come from the checkpoint (a single-file checkpoint; make one of a distributed
checkpoint with `python -m swax_lightning consolidate <folder>`). `--window` and `--n_sink` override the
sliding-window layers' window and sink count at inference; with `--convert_full_attention` they apply to the
full-attention layers instead, which become SWA(window, n_sink) (paper 2's training-free SWA with sinks, e.g. on a
model imported with swax import; a Gemma 3's own local layers keep their 512-key window). `--window` counts the
recent keys, the sinks come on top; with `--window_includes_sinks true` it counts every key a query sees, the sinks
among them. A window larger than a pretrained model's positions is refused.

`--prompt` may be repeated, and each value is taken exactly as typed: the command line pulls the prompts out before
jsonargparse parses the rest (it would read `--prompt X` as a list to parse, and a prompt such as "[1, 2]" as YAML).
Errors in what was asked (a missing file, a bad option) are one line `error: ...` with exit code 2
(swax_lightning.core.errors.usage_errors_reported).
"""
from __future__ import annotations

import sys

from jsonargparse import ArgumentParser

from swax_lightning.core.errors import ConfigError, usage_errors_reported
from swax_lightning.data.prompts import read_prompts
from swax_lightning.model.inference import continue_texts, override_attention, show_continuation
from swax_lightning.training.checkpoints import load_model


def generate_texts(ckpt_path: str, prompt: list[str] | None = None, prompts_file: str | None = None,
         max_new_tokens: int = 128, temperature: float = 0.0, top_k: int = 0, top_p: float = 1.0,
         window: int | None = None, n_sink: int | None = None, convert_full_attention: bool = False,
         window_includes_sinks: bool = False, chunk_len: int = 2048, seed: int = 0, device: str = "cpu") -> list[str]:
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
        convert_full_attention: Run the full-attention (A) layers as SWA(window, n_sink) instead: the training-free
            conversion of arXiv 2608.28444 (needs --window; --n_sink defaults to 4); the model's own sliding layers
            keep their trained window and sinks.
        window_includes_sinks: --window counts every key a query sees, the sinks among them (default: the recent
            keys, current token included, with the sinks on top).
        chunk_len: Prefill chunk length (memory per chunk, not per context).
        seed: Sampling seed.
        device: cpu or cuda.
    """
    texts = read_prompts(prompt, prompts_file)
    if not texts:
        raise ConfigError("give --prompt TEXT or --prompts_file FILE")
    model, tokenizer = load_model(ckpt_path, device)
    override_attention(model, window, n_sink, convert_full_attention, window_includes_sinks)
    continuations = continue_texts(model, tokenizer, texts, max_new_tokens, temperature=temperature, top_k=top_k,
                                   top_p=top_p, chunk_len=chunk_len, seed=seed)
    for text, cont in zip(texts, continuations, strict=True):
        print(show_continuation(text, cont))
    return continuations


PROMPT = "--prompt"


def main(argv: list[str] | None = None) -> None:
    """`swax generate ...`: generate_texts() with the command line's options."""
    prompts, rest = _take_prompts(sys.argv[1:] if argv is None else argv)
    parser = ArgumentParser(prog="swax generate", description=__doc__.split("\n")[0],
                            exit_on_error=False)
    parser.add_function_arguments(generate_texts, as_group=False)
    with usage_errors_reported(FileNotFoundError):
        options = parser.parse_args(rest).as_dict()
        generate_texts(**options | {"prompt": prompts or options["prompt"]})


def _take_prompts(argv: list[str]) -> tuple[list[str], list[str]]:
    """The values of every `--prompt X` / `--prompt=X`, as typed, and the other arguments."""
    prompts, rest, args = [], [], iter(argv)
    for arg in args:
        if arg == PROMPT:
            prompts.append(next(args, ""))
        elif arg.startswith(PROMPT + "="):
            prompts.append(arg[len(PROMPT) + 1:])
        else:
            rest.append(arg)
    return prompts, rest


if __name__ == "__main__":
    main()
