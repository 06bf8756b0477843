"""Time of a retrofit config's generated evaluations (its NIAH and BABILong sections) with their answers decoded one
prompt at a time and in batches (EvalSuite.batch_size), on an imported checkpoint, for full attention and
training-free SWA(w, s):

    swax import smollm2 --out runs/pretrained/smollm2
    python benchmarks/eval_batching.py --ckpt runs/pretrained/smollm2/checkpoints/last.ckpt \
        --config configs/retrofit/smollm2.yaml --batch_sizes 1 14

Every row in one process on the same prompts (the suite's own, the config's seed); prints one JSON line per
(variant, batch size) with the seconds of the NIAH and BABILong sections, their prefill and decode seconds, and
how many answers equal those of the first batch size listed (1: the reference) on the same variant.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from swax_lightning.evals.suite import EvalSuite  # noqa: E402
from swax_lightning.pretrained.experiment import read_config  # noqa: E402
from swax_lightning.training.checkpoints import load_model  # noqa: E402

GENERATED = ("niah", "babilong")


def run(model, tokenizer, sections: dict, window: int | None, n_sink: int | None, batch_size: int) -> dict:
    """Seconds, prefill and decode seconds, and the predictions of the config's generated evaluations."""
    swa = window is not None
    suite = EvalSuite(**sections, window=window, n_sink=n_sink, convert_full_attention=swa, batch_size=batch_size)
    generations, start = [], time.perf_counter()
    results = suite.evaluate(model, SimpleNamespace(tokenizer=tokenizer),
                             on_generation=lambda ev, n, stats: generations.append(stats))
    return {"seconds": round(time.perf_counter() - start, 1),
            "prefill_s": round(sum(g["prefill_seconds"] for g in generations), 1),
            "decode_s": round(sum(g["decode_seconds"] for g in generations), 1),
            "predictions": [s["prediction"] for s in results["samples"]]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ckpt", required=True, help="an imported checkpoint (swax import)")
    parser.add_argument("--config", required=True, help="a retrofit config: its evaluate.suite's niah and babilong")
    parser.add_argument("--batch_sizes", type=int, nargs="+", default=[1, 14])
    parser.add_argument("--variants", nargs="+", default=["full", "64,4"], help="full, or window,sinks")
    args = parser.parse_args()
    suite = read_config(args.config).evaluate.suite
    sections = {k: v for k, v in suite.items() if k in GENERATED or k in ("chunk_len", "seed")}
    model, tokenizer = load_model(args.ckpt)
    for variant in args.variants:
        window, n_sink = (None, None) if variant == "full" else map(int, variant.split(","))
        reference = None
        for batch_size in args.batch_sizes:
            row = run(model, tokenizer, sections, window, n_sink, batch_size)
            predictions = row.pop("predictions")
            reference = reference or predictions
            same = sum(a == b for a, b in zip(predictions, reference))
            print(json.dumps({"variant": variant, "batch_size": batch_size, "threads": torch.get_num_threads(), **row,
                              "answers_equal_to_first_row": f"{same}/{len(reference)}"}), flush=True)


if __name__ == "__main__":
    main()
