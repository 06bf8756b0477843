"""Where a LoLCATs student's attention goes at the answer: per layer, the share of the normaliser its softmax window
holds (the rest is the linear part over every earlier key) and the share the needle's tokens get, on RULER NIAH
prompts with the needle inside the window (depth 1) at several lengths.

    python benchmarks/lolcats_window_share.py runs/retrofit/smollm2/students/lolcats/checkpoints/last.ckpt

Why: a LoLCATs layer (kernels/lolcats/naive.py) sums w * exp(s - m) over a 65-128-key window and phi(q).phi(k) over
every key before it in one normaliser, so the linear mass grows with the context while the window's cannot. This
measures how much of each answer's attention that leaves to the window at the lengths the NIAH grid uses.
Printed: one JSON line per length, then a table (median over heads of the last query's shares, per layer).
"""
from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from swax_lightning.evals.ruler import NIAHGenerator  # noqa: E402
from swax_lightning.kernels.lolcats.naive import head_factor, repeat_kv, terraced_masks  # noqa: E402
from swax_lightning.model import lolcats  # noqa: E402
from swax_lightning.training.checkpoints import load_model  # noqa: E402


def last_query_shares(q, k, phi_q, phi_k, window_factor, window: int, needle: range) -> tuple[list, list]:
    """Per head, for the last query: (window mass / total mass, needle tokens' weight / total mass), in the
    reference's terms (fp32)."""
    B, T, H, D = q.shape
    in_window, linear = (mask[-1] for mask in terraced_masks(T, window, q.device))
    q, k = q[0, -1].float(), repeat_kv(k, H)[0].float()                             # [H, D], [T, H, D]
    s = torch.einsum("hd,thd->ht", q, k) / math.sqrt(D)
    s = s.masked_fill(~in_window, float("-inf"))
    soft = head_factor(window_factor, H, s)[:, None] * torch.exp(s - s.amax(-1, keepdim=True))
    lin = torch.einsum("hf,thf->ht", phi_q[0, -1].float(), phi_k[0].float()) * linear
    weight = soft + lin
    total = weight.sum(-1)
    needle_weight = weight[:, needle.start:needle.stop].sum(-1)
    return (soft.sum(-1) / total).tolist(), (needle_weight / total).tolist()


def measure(ckpt: str, lengths: list[int], task: str) -> list[dict]:
    model, tokenizer = load_model(ckpt)
    generator = NIAHGenerator(tokenizer, max_new_tokens=12)
    rows, layer_shares, needle = [], [], range(0)
    chunked = lolcats.lolcats_chunked

    def recording(q, k, v, phi_q, phi_k, window_factor, window):
        layer_shares.append(last_query_shares(q, k, phi_q, phi_k, window_factor, window, needle))
        return chunked(q, k, v, phi_q, phi_k, window_factor, window)

    lolcats.lolcats_chunked = recording
    try:
        for length in lengths:
            sample = generator.sample(task, length, 1.0)
            ids = tokenizer.encode(sample.input_text)
            needle_start = len(tokenizer.encode(sample.input_text[:sample.needle_char]))
            needle_end = len(tokenizer.encode(sample.input_text[:sample.input_text.index(sample.references[0],
                                                                                          sample.needle_char)]))
            needle = range(needle_start, needle_end + 1)
            layer_shares.clear()
            with torch.no_grad():
                model(torch.tensor([ids]))
            window = [torch.tensor(w).median().item() for w, _ in layer_shares]
            on_needle = [torch.tensor(n).median().item() for _, n in layer_shares]
            rows.append({"length": len(ids), "needle_back": len(ids) - needle_start, "window_share": window,
                         "needle_share": on_needle})
            print(json.dumps(rows[-1]), flush=True)
    finally:
        lolcats.lolcats_chunked = chunked
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("checkpoint")
    parser.add_argument("--lengths", type=int, nargs="+", default=[1024, 2048, 4096, 8192])
    parser.add_argument("--task", default="niah_single_2")
    args = parser.parse_args()
    rows = measure(args.checkpoint, args.lengths, args.task)
    print("\n| layer | " + " | ".join(f"window {r['length']} | needle {r['length']}" for r in rows) + " |")
    print("|---|" + "---|---|" * len(rows))
    for layer in range(len(rows[0]["window_share"])):
        cells = " | ".join(f"{r['window_share'][layer]:.3f} | {r['needle_share'][layer]:.3f}" for r in rows)
        print(f"| {layer} | {cells} |")
    for r in rows:
        window, needle = torch.tensor(r["window_share"]), torch.tensor(r["needle_share"])
        print(f"length {r['length']} (needle {r['needle_back']} tokens back): median over layers window share "
              f"{window.median():.3f} [{window.min():.3f}, {window.max():.3f}], needle share {needle.median():.4f}")


if __name__ == "__main__":
    main()
