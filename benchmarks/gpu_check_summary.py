"""The GPU check's summary JSON, from its stage logs so far; benchmarks/gpu_check.sh runs it after every stage.

    python benchmarks/gpu_check_summary.py LOG_DIR SUMMARY.json START_EPOCH_S stage1,stage2,...

Each stage is pending (no log yet), running (a log, no exit code: stopped from outside while it ran) or done: its
exit code (124: its time limit), seconds, and what it measured: pytest's counts and the failing tests' names for the
test stages (from `pytest -v` lines, so a stage stopped at its limit still counts what ran), the JSON rows of the
benchmarks, the last lines of the others. `targets` compares the rows with issue 31's: the own mLSTM at >= 1.0x
TFLA's forward + backward tokens/s at 4 x 256 x 512, the own SWA at >= 0.9x FlexAttention's speed at every (T, W),
and the 1.4B step's MFU >= 0.40; a target whose rows are missing is absent. Written to a temporary file and renamed,
so the summary is never half-written.
"""
from __future__ import annotations

import json
import os
import re
import sys
import time
from pathlib import Path

PYTEST_LINE = re.compile(r"^(tests/\S+::\S+) (PASSED|FAILED|SKIPPED|ERROR|XFAIL|XPASS)")
MLSTM_TARGET_SHAPE = "4x256x512"


def json_rows(text: str) -> list[dict]:
    rows = []
    for line in text.splitlines():
        if line.startswith("{"):
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError:
                pass
    return rows


def stage_entry(log: Path, name: str) -> dict:
    path = log / f"{name}.log"
    if not path.exists():
        return {"status": "pending"}
    text = path.read_text(errors="replace")
    rc_file, seconds_file = log / f"{name}.rc", log / f"{name}.s"
    entry = {"status": "running"} if not rc_file.exists() else {
        "status": "timed out" if rc_file.read_text().strip() == "124" else "done",
        "rc": int(rc_file.read_text()), "seconds": int(seconds_file.read_text())}
    outcomes = [m.groups() for m in map(PYTEST_LINE.match, text.splitlines()) if m]
    if outcomes:
        entry["counts"] = {kind: sum(1 for _, k in outcomes if k == kind) for kind in sorted({k for _, k in outcomes})}
        entry["failed"] = [test for test, kind in outcomes if kind in ("FAILED", "ERROR")]
    rows = json_rows(text)
    if rows:
        entry["rows"] = rows
    if not outcomes and not rows:
        entry["tail"] = text.strip().splitlines()[-3:]
    return entry


def targets(stages: dict) -> dict:
    out = {}
    mlstm = [r for r in stages.get("mlstm", {}).get("rows", []) if r.get("shape") == MLSTM_TARGET_SHAPE]
    for T in sorted({r["T"] for r in mlstm}):
        speed = {r["impl"]: r.get("fwd_bwd_tokens_per_s") for r in mlstm if r["T"] == T}
        own, tfla = speed.get("triton (ours)"), speed.get("tfla (NX-AI)")
        if own and tfla:
            out[f"mlstm_{MLSTM_TARGET_SHAPE}_T{T}_own_over_tfla"] = {"ratio": round(own / tfla, 3), "target": 1.0,
                                                                      "met": own / tfla >= 1.0}
    swa = stages.get("swa", {}).get("rows", [])
    for T, W in sorted({(r["T"], r["W"]) for r in swa}):
        ms = {r["impl"]: r.get("fwd_bwd_ms") for r in swa if (r["T"], r["W"]) == (T, W)}
        own, flex = ms.get("triton (ours)"), ms.get("flex attention")
        if own and flex:
            out[f"swa_T{T}_W{W}_speed_over_flex"] = {"ratio": round(flex / own, 3), "target": 0.9,
                                                     "met": flex / own >= 0.9}
    for name, stage in stages.items():
        for row in stage.get("rows", []):
            if "mfu" in row:
                out[f"{name}_mfu"] = {"mfu": row["mfu"], "target": 0.40, "met": row["mfu"] >= 0.40}
    return out


def main() -> None:
    log, summary, start, names = Path(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3]), sys.argv[4].split(",")
    extra = sorted(p.stem for p in log.glob("*.log") if p.stem not in names)
    stages = {name: stage_entry(log, name) for name in [*names, *extra]}
    result = {"total_s": int(time.time()) - start, "stages": stages, "targets": targets(stages)}
    tmp = summary.with_name(summary.name + ".tmp")
    tmp.write_text(json.dumps(result, indent=1))
    os.replace(tmp, summary)


if __name__ == "__main__":
    main()
