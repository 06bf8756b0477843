"""Print the prompt of one generated evaluation sample, exactly as the evaluation built it.

    python -m swax_lightning regenerate --tokenizer byte --seed 0 niah niah_single_2 4096 0.5 3
    python -m swax_lightning regenerate --tokenizer tok.json --seed 0 babilong qa3 16384 7
    python -m swax_lightning regenerate --seed 0 mqar 6x2 256 5     # PAIRSxKEY_LENGTH GAP INDEX: the text
    python -m swax_lightning regenerate --seed 0 copy span 32 5     # span LENGTH INDEX: the text

results.json does not store 131k-token prompts: its settings hold this command's options (`regenerate`) and each
sample its arguments (the sample's `regenerate`), since every generated sample is a pure function of them.
"""
from __future__ import annotations

import argparse
import re
from pathlib import Path

from swax_lightning.data.mqar_episodes import eval_copy_episode, eval_episode
from swax_lightning.data.tokenizer import load_tokenizer
from swax_lightning.evals import babilong, ruler


def prompt(kind: str, task: str, length: int, index: int, depth: float | None, tokenizer, seed: int,
           niah_max_new_tokens: int = 128, babilong_answer_chars: int = babilong.ANSWER_CHARS,
           essay: str | None = None) -> str:
    if kind == "mqar":  # task: PAIRSxKEY_LENGTH, length: the gap; the whole episode, queried values included
        pairs, _, key_length = task.partition("x")
        return eval_episode(length, index, int(pairs), int(key_length), seed).text
    if kind == "copy":  # task: span, length: the span's; the whole episode, the copy included
        return eval_copy_episode(length, index, seed).text
    if kind == "niah":
        return ruler.NIAHGenerator(tokenizer, niah_max_new_tokens, essay, seed).sample(task, length, depth,
                                                                                         index).input_text
    return babilong.BabiLongGenerator(tokenizer, babilong_answer_chars, essay, seed).sample(task, length,
                                                                                            index).input_text


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokenizer", default="byte", help="'byte' or a tokenizer.json (the run's data.tokenizer)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--niah_max_new_tokens", type=int, default=128)
    parser.add_argument("--babilong_answer_chars", type=int, default=babilong.ANSWER_CHARS)
    parser.add_argument("--essay_file", type=Path, help="the run's eval.essay_file, if it had one")
    parser.add_argument("kind", choices=["niah", "babilong", "mqar", "copy"])
    parser.add_argument("task", help="niah, babilong: the task; mqar: PAIRSxKEY_LENGTH, e.g. 6x2; copy: span")
    parser.add_argument("length", type=int, help="niah, babilong: the length; mqar: the gap; copy: the span's")
    parser.add_argument("rest", nargs="+", help="niah: DEPTH INDEX; babilong, mqar, copy: INDEX")
    args = parser.parse_args(argv)
    expected = 2 if args.kind == "niah" else 1
    if len(args.rest) != expected:
        parser.error(f"{args.kind} takes {'DEPTH INDEX' if expected == 2 else 'INDEX'} after the length")
    depth = float(args.rest[0]) if args.kind == "niah" else None
    essay = args.essay_file.read_text() if args.essay_file else None
    if args.kind == "mqar" and not re.fullmatch(r"\d+x\d+", args.task):
        parser.error(f"mqar takes PAIRSxKEY_LENGTH as its task, e.g. 6x2 (got {args.task!r})")
    if args.kind == "copy" and args.task != "span":
        parser.error(f"copy takes 'span' as its task (got {args.task!r})")
    print(prompt(args.kind, args.task, args.length, int(args.rest[-1]), depth, load_tokenizer(args.tokenizer),
                 args.seed, args.niah_max_new_tokens, args.babilong_answer_chars, essay))


if __name__ == "__main__":
    main()
