"""Streaming prefill on CPU: peak memory and time against context length, SWAX (S X) and SWA + Gated DeltaNet (S D) next
to full attention (A) and full attention converted to SWA with 4 sinks without training (A->SWA).

    python benchmarks/inference_memory.py                 # the table of the README (a few minutes on 2 cores)
    python benchmarks/inference_memory.py --lengths 8192 32768 --patterns SX

Each (pattern, length) runs in its own process, so the peak resident memory (VmHWM) is that run's alone. Printed per
run as one JSON line, then a table, the SWAX memory ratio 131k / 8k, and the log-log slope of time against length.
The model: 4 layers, d_model 256, window 512 (S layers), byte vocabulary, random weights (speed and memory do not
depend on what was learned); prefill in chunks of 2048 tokens.
"""
from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _status_mb(field: str) -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"{field} not in /proc/self/status")


def run_one(pattern: str, length: int, chunk_len: int, window: int) -> dict:
    import torch

    sys.path.insert(0, str(ROOT))
    from swax_lightning.model.config import ModelConfig
    from swax_lightning.model.inference import prefill
    from swax_lightning.model.model import SWAXModel

    torch.manual_seed(0)
    converted = pattern.endswith("->SWA")  # a full-attention model run as SWA(window, 4 sinks), no training
    cfg = ModelConfig(vocab_size=257, d_model=256, n_layers=4, pattern=pattern.removesuffix("->SWA"), n_heads=4,
                      mlstm_heads=2, deltanet_heads=2, window=window, chunk_size=64)
    model = SWAXModel(cfg).eval()
    if converted:
        model.convert_full_attention(window, n_sink=4)
    idx = torch.randint(0, 257, (1, length))
    positions = torch.arange(length)[None]
    caches = model.new_caches(1)
    prefill(model, idx[:, :chunk_len], positions[:, :chunk_len], model.new_caches(1), chunk_len)  # warm-up
    base = _status_mb("VmRSS")
    start = time.perf_counter()
    logits = prefill(model, idx, positions, caches, chunk_len)
    seconds = time.perf_counter() - start
    assert torch.isfinite(logits).all()
    return {"pattern": pattern, "length": length, "seconds": round(seconds, 3),
            "tokens_per_s": round(length / seconds), "peak_rss_mb": round(_status_mb("VmHWM"), 1),
            "peak_above_start_mb": round(_status_mb("VmHWM") - base, 1),
            "state_mb": round(sum(c.nbytes() for c in caches) / 2**20, 2)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--patterns", nargs="+", default=["SX", "SD", "A", "A->SWA"],
                        help="layer patterns; A->SWA = pattern A converted to SWA(window, 4 sinks) at inference")
    parser.add_argument("--lengths", nargs="+", type=int, default=[8192, 32768, 131072])
    parser.add_argument("--full_attention_max", type=int, default=32768, help="longest length run for pattern A")
    parser.add_argument("--chunk_len", type=int, default=2048)
    parser.add_argument("--window", type=int, default=512)
    parser.add_argument("--one", nargs=2, metavar=("PATTERN", "LENGTH"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        print(json.dumps(run_one(args.one[0], int(args.one[1]), args.chunk_len, args.window)))
        return
    results = []
    for pattern in args.patterns:
        for length in args.lengths:
            if pattern == "A" and length > args.full_attention_max:
                continue
            out = subprocess.run([sys.executable, __file__, "--one", pattern, str(length), "--chunk_len",
                                  str(args.chunk_len), "--window", str(args.window)],
                                 capture_output=True, text=True, check=True)
            results.append(json.loads(out.stdout.strip().splitlines()[-1]))
            print(json.dumps(results[-1]), flush=True)
    print("\n| pattern | tokens | time (s) | tokens/s | peak RSS (MB) | peak above start (MB) | state (MB) |")
    print("|---|---|---|---|---|---|---|")
    for r in results:
        print(f"| {r['pattern']} | {r['length']:,} | {r['seconds']} | {r['tokens_per_s']:,} | {r['peak_rss_mb']} "
              f"| {r['peak_above_start_mb']} | {r['state_mb']} |")
    for pattern in args.patterns:
        rows = [r for r in results if r["pattern"] == pattern]
        if len(rows) >= 2:
            first, last = rows[0], rows[-1]
            slope = math.log(last["seconds"] / first["seconds"]) / math.log(last["length"] / first["length"])
            print(f"{pattern}: peak RSS {last['length']:,} / {first['length']:,} = "
                  f"{last['peak_rss_mb'] / first['peak_rss_mb']:.3f}; log-log time slope {slope:.3f}")


if __name__ == "__main__":
    main()
