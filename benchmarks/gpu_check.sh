#!/usr/bin/env bash
# The GPU check, ready to run on one H200 (or any CUDA GPU) in about 8 minutes from a bare machine:
#   bash benchmarks/gpu_check.sh [summary.json]        (default: gpu_check.json in the repository root)
# 1. picks the Python: .venv if it sees a GPU; else the machine's own python3 if its torch sees one (a CUDA image
#    without network: the packages it lacks come from benchmarks/wheels/, made beforehand on a networked machine with
#    `bash benchmarks/gpu_check.sh --wheels`); else installs per the README (bash setup.sh). flash-attn only if a
#    prebuilt wheel can be had: it is an optional extra.
# 2. runs the GPU tests (pytest -m gpu: every Triton kernel and attention backend, and fla's gated delta rule,
#    against the PyTorch paths),
# 3. times SWA (own Triton, flash-attn, FlexAttention, SDPA with a dense mask, blocked PyTorch) and the mLSTM (own
#    Triton, PyTorch chunkwise), forward + backward, T 4k / 16k / 64k, W 128 / 2048, head dim 128, bf16,
# 4. times one 1.4B training step at T 16k (window 2048, activation checkpointing) and its MFU,
# and writes one JSON summary. Each stage has its own time limit (480 s in all), and a stage that fails or times out is recorded as
# such in the summary without stopping the later ones.
set -uo pipefail
cd "$(dirname "$0")/.."
# What a CUDA image with torch, triton, lightning, torchmetrics and tensorboard may lack, taken without their declared
# dependencies (litdata's would pull a CUDA torch stack): carry benchmarks/wheels/ (git-ignored) to the GPU machine.
OFFLINE_WHEELS="jsonargparse==4.53.0 docstring-parser==0.18.0 typeshed-client==2.15.0 litdata==0.2.76 obstore==0.12.1
  fla-core==0.6.0 einops==0.8.2"
if [ "${1:-}" = "--wheels" ]; then
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --platform manylinux2014_x86_64 \
    -d benchmarks/wheels $OFFLINE_WHEELS && ls benchmarks/wheels
  exit
fi
SUMMARY=${1:-gpu_check.json}
LOG=$(mktemp -d)
start=$(date +%s)
sees_gpu() { "$1" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" 2>/dev/null; }

stage() {  # stage NAME SECONDS COMMAND...: runs COMMAND under a time limit, stdout+stderr to $LOG/NAME.log
  local name=$1 limit=$2; shift 2
  local t0=$(date +%s)
  timeout "$limit" "$@" >"$LOG/$name.log" 2>&1
  echo "$?" >"$LOG/$name.rc"
  echo "$(( $(date +%s) - t0 ))" >"$LOG/$name.s"
  echo "[gpu_check] $name: rc $(cat "$LOG/$name.rc") in $(cat "$LOG/$name.s") s" >&2
}

if [ -x .venv/bin/python ] && sees_gpu .venv/bin/python; then
  PY=.venv/bin/python; stage install 1 true
elif sees_gpu python3; then
  PY=python3
  stage install 60 "$PY" -m pip install -q --no-deps --no-index --find-links benchmarks/wheels $OFFLINE_WHEELS
else
  PY=.venv/bin/python; stage install 150 bash setup.sh
fi
stage flash_attn 30 "$PY" -m pip install -q --only-binary=:all: flash-attn
stage fla 30 "$PY" -m pip install -q fla-core==0.6.0 einops==0.8.2  # a no-op when the wheels put it there
stage gpu_tests 90 "$PY" -m pytest -q -m gpu tests/test_gpu.py
stage swa 90 "$PY" benchmarks/swa_kernel.py --lengths 4096 16384 65536 --windows 128 2048 --n_sink 0 \
  --heads 16 --head_dim 128
stage mlstm 60 "$PY" benchmarks/mlstm_kernel.py --lengths 4096 16384 65536 --shapes 16x128x128 4x256x512
stage train_1.4b 60 "$PY" benchmarks/train_step.py --config configs/base/model_1.4b.yaml --seq 16384 \
  --window 2048 --warmup 2 --steps 3

"$PY" - "$LOG" "$SUMMARY" "$start" <<'PYEOF'
import json, pathlib, sys, time
log, summary, start = pathlib.Path(sys.argv[1]), sys.argv[2], int(sys.argv[3])

def rows(name):
    out = []
    for line in (log / f"{name}.log").read_text(errors="replace").splitlines():
        if line.startswith("{"):
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError:
                pass
    return out

result = {"total_s": int(time.time()) - start, "stages": {}}
for name in ("install", "flash_attn", "fla", "gpu_tests", "swa", "mlstm", "train_1.4b"):
    text = (log / f"{name}.log").read_text(errors="replace")
    stage = {"rc": int((log / f"{name}.rc").read_text()), "seconds": int((log / f"{name}.s").read_text())}
    if name in ("install", "gpu_tests", "flash_attn", "fla"):
        stage["tail"] = text.strip().splitlines()[-3:]
    else:
        stage["rows"] = rows(name)
    result["stages"][name] = stage
pathlib.Path(summary).write_text(json.dumps(result, indent=1))
print(json.dumps({k: {"rc": v["rc"], "s": v["seconds"]} for k, v in result["stages"].items()}))
PYEOF
echo "[gpu_check] summary: $SUMMARY; logs: $LOG" >&2
