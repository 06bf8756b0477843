#!/usr/bin/env bash
# The GPU check, ready to run on one H200 (or any CUDA GPU) in about 8 minutes from a bare machine:
#   bash benchmarks/gpu_check.sh [summary.json]        (default: gpu_check.json in the repository root)
# 1. picks the Python: .venv if it sees a GPU; else the machine's own python3 if its torch sees one (a CUDA image
#    without network: the packages it lacks come from benchmarks/wheels/, made beforehand on a networked machine with
#    `bash benchmarks/gpu_check.sh --wheels`); else installs per the README (bash setup.sh). flash-attn only if a
#    prebuilt wheel can be had: it is an optional extra.
# 2. runs the GPU tests (TRITON_INTERPRET=0 pytest -m gpu: every Triton kernel and attention backend, and fla's gated
#    delta rule, against the PyTorch paths; FlexAttention's last),
# 3. times SWA (own Triton, flash-attn, FlexAttention, SDPA with a dense mask, blocked PyTorch) and the mLSTM (own
#    Triton, PyTorch chunkwise), forward + backward, T 4k / 16k / 64k, W 128 / 2048, head dim 128, bf16,
# 4. times one 1.4B training step at T 16k (window 2048, activation checkpointing) and its MFU,
# 5. trains the tiny quick-start run (configs/tiny.yaml) for 200 steps through main.py on the GPU in bf16-mixed,
# and writes one JSON summary. Each stage has its own time limit (480 s in all), and a stage that fails or times out is
# recorded as such in the summary without stopping the later ones. Stage logs go to $GPU_CHECK_LOGS (default: a new
# temporary folder). On a machine without network every later pip call looks only in benchmarks/wheels/, so a missing
# optional package (flash-attn has no prebuilt wheel on PyPI) fails at once instead of waiting on the network.
set -uo pipefail
cd "$(dirname "$0")/.."
# What a CUDA image with torch, triton, lightning, torchmetrics and tensorboard may lack, taken without their declared
# dependencies (litdata's would pull a CUDA torch stack): carry benchmarks/wheels/ (git-ignored) to the GPU machine.
# boto3 and its kin: litdata imports them at start-up.
OFFLINE_WHEELS="jsonargparse==4.53.0 docstring-parser==0.18.0 typeshed-client==2.15.0 litdata==0.2.76 obstore==0.12.1
  boto3==1.44.8 botocore==1.44.8 s3transfer==0.19.3 jmespath==1.1.0 fla-core==0.6.0 einops==0.8.2"
if [ "${1:-}" = "--wheels" ]; then
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --platform manylinux2014_x86_64 \
    -d benchmarks/wheels $OFFLINE_WHEELS && ls benchmarks/wheels
  exit
fi
SUMMARY=${1:-gpu_check.json}
LOG=${GPU_CHECK_LOGS:-$(mktemp -d)}
mkdir -p "$LOG"
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
  export PIP_NO_INDEX=1 PIP_FIND_LINKS=benchmarks/wheels
  stage install 30 "$PY" -m pip install -q --no-deps $OFFLINE_WHEELS
else
  PY=.venv/bin/python; stage install 150 bash setup.sh
fi
stage flash_attn 10 "$PY" -m pip install -q --only-binary=:all: flash-attn
stage fla 10 "$PY" -m pip install -q fla-core==0.6.0 einops==0.8.2  # a no-op when the wheels put it there
# One line per test, so a stage stopped at its limit still says which tests passed; a per-test limit where the
# pytest-timeout plugin is there. The first fp32 call of an own kernel compiles for up to half a minute, so the
# tests run in stages with their own limits: mLSTM, fla, loss and backend choice; attention; FlexAttention (which
# compiles per shape) last.
PER_TEST=$("$PY" -c "import pytest_timeout" 2>/dev/null && echo "--timeout 60")
# The interpreter off: tests/conftest.py switches it on for the CPU tests unless told otherwise.
export TRITON_INTERPRET=0
stage gpu_tests 80 "$PY" -m pytest -v -rs -m gpu tests/test_gpu.py -k "not attention and not head_dim" $PER_TEST
stage gpu_tests_attention 100 "$PY" -m pytest -v -rs -m gpu tests/test_gpu.py -k "(attention or head_dim) and not flex" \
  $PER_TEST
stage swa 70 "$PY" benchmarks/swa_kernel.py --lengths 4096 16384 65536 --windows 128 2048 --n_sink 0 \
  --heads 16 --head_dim 128
stage mlstm 70 "$PY" benchmarks/mlstm_kernel.py --lengths 4096 16384 65536 --shapes 16x128x128 4x256x512
stage train_1.4b 35 "$PY" benchmarks/train_step.py --config configs/base/model_1.4b.yaml --seq 16384 \
  --window 2048 --warmup 2 --steps 3

stage fit_tiny 35 "$PY" main.py fit --config configs/tiny.yaml --trainer.accelerator gpu \
  --trainer.precision bf16-mixed --trainer.max_steps 200 --trainer.logger.init_args.save_dir "$LOG/runs"
stage gpu_tests_flex 35 "$PY" -m pytest -v -rs -m gpu tests/test_gpu.py -k flex $PER_TEST

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
for name in ("install", "flash_attn", "fla", "gpu_tests", "gpu_tests_attention", "swa", "mlstm", "train_1.4b", "fit_tiny",
             "gpu_tests_flex"):
    text = (log / f"{name}.log").read_text(errors="replace")
    stage = {"rc": int((log / f"{name}.rc").read_text()), "seconds": int((log / f"{name}.s").read_text())}
    if name in ("install", "gpu_tests", "gpu_tests_attention", "gpu_tests_flex", "flash_attn", "fla", "fit_tiny"):
        stage["tail"] = text.strip().splitlines()[-3:]
    else:
        stage["rows"] = rows(name)
    result["stages"][name] = stage
pathlib.Path(summary).write_text(json.dumps(result, indent=1))
print(json.dumps({k: {"rc": v["rc"], "s": v["seconds"]} for k, v in result["stages"].items()}))
PYEOF
echo "[gpu_check] summary: $SUMMARY; logs: $LOG" >&2
