#!/usr/bin/env bash
# The GPU check, for one H200 (or any CUDA GPU), in under 8 minutes from a bare machine:
#   bash benchmarks/gpu_check.sh [summary.json]   run it (summary default: gpu_check.json in the repository root)
#   bash benchmarks/gpu_check.sh --dry-run        print every stage, its time limit and its basis, and the wheels
#   bash benchmarks/gpu_check.sh --wheels         download those wheels into benchmarks/wheels/ (a networked machine)
#   bash benchmarks/gpu_check.sh --study [summary.json]   the GPU window study instead (issue 26 item 5): install,
#                                                 then the six arms of configs/study_gpu, seed 0, in 7 minutes
#                                                 (418 s on one H200, 2026-12-04; limits 570 s: one device call)
#   bash benchmarks/gpu_check.sh --carry MODEL    here (networked, `bash setup.sh pretrained` done): the wheels the
#                                                 retrofit needs and MODEL's GGUF in parts under benchmarks/.carry/, and
#                                                 the device calls that carry them to one warm machine (gpu_carry.py)
#   bash benchmarks/gpu_check.sh --retrofit MODEL [summary.json]   there, in the last of those calls (issue 36): the
#                                                 GGUF joined, then configs/retrofit/MODEL_gpu.yaml (LoLCATs' student
#                                                 at LoLCATs' budget) under 530 s; run again on the same machine, it
#                                                 resumes. Its run's files but checkpoints, import and data are copied
#                                                 to $GPU_CHECK_LOGS/MODEL_gpu. Not yet run on a GPU.
#                                                 GPU_CHECK_RETROFIT_CONFIG and GPU_CHECK_CARRY name another config
#                                                 and parts folder (tests/test_gpu_carry.py rehearses it on CPU).
# The stages (STAGES below is the one list; limits in seconds, 420 in all: 60 s of margin):
# - install: .venv if its torch sees a GPU; else the machine's python3 if its torch does (a CUDA image without
#   network: what it lacks comes from benchmarks/wheels/, made beforehand with --wheels and carried along, pytest
#   included); else bash setup.sh. flash-attn only from a prebuilt wheel (optional).
# - tests: the GPU tests (TRITON_INTERPRET=0 pytest -m gpu) in groups run side by side, so that each group compiles
#   its kernels on its own CPU core (the GPU work is small); the phase's limit is its slowest group's. Groups that
#   have never run on a GPU come first in the list: the mLSTM backends and the exact backward, the fp32 chunk-128
#   mLSTM (the slowest compile), the chunked loss and fla; then attention and FlexAttention, which ran in part.
# - timings, one at a time (never two processes on the GPU while timing), never-measured first: the mLSTM (own
#   Triton against TFLA; forward + backward at 4 x 256 x 512 and 16 x 128 x 128, T 4k / 16k / 64k, bf16), SWA (own
#   Triton against FlexAttention and flash-attn where installed; T 4k / 16k / 64k, W 128 / 2048, 16 x 128, bf16), the
#   1.4B step at T 16k with W 128 and W 2048 (bf16 autocast, activation checkpointing) and its MFU; the quick start
#   through main.py fit for 50 steps on the GPU.
# - study (only with --study, after install, in a budget of its own):
#   `python -m swax_lightning study run configs/study_gpu --seeds 0 --jobs 2` (two runs share the GPU: a 26M model
#   leaves it idle between kernels); its report ends the stage log, its runs go under $GPU_CHECK_LOGS/runs.
# The summary JSON is rewritten (atomically) after every stage, so a stage that fails or times out, or the whole
# check stopped from outside, leaves every stage done so far: rc (124: timed out), seconds, pytest's counts and
# failures, the benchmarks' rows, and the issue 31 targets they measure (own mLSTM / TFLA >= 1.0 at 4 x 256 x 512,
# own SWA at >= 0.9x FlexAttention's speed at every (T, W), MFU >= 0.40). Stage logs go to $GPU_CHECK_LOGS (default:
# a new temporary folder). Compiled kernels go to $GPU_CHECK_CACHE (default benchmarks/.cache, git-ignored): Triton's
# and TorchInductor's caches, reused by every stage and by a later run that carries the folder along (same GPU kind
# and versions). On a machine without network every later pip call looks only in benchmarks/wheels/.
# Extra timings outside the 8-minute budget (torch.compile'd blocks, TFLA inside the 1.4B step): GPU_CHECK_EXTRA=1.
set -uo pipefail
cd "$(dirname "$0")/.."
# What a CUDA image with torch, triton, lightning, torchmetrics, tensorboard, numpy and PyYAML may lack, taken without
# their declared dependencies (litdata's would pull a CUDA torch stack). boto3 and its kin: litdata imports them at
# start-up; tokenizers: the BPE tokenizers of data.tokenizer (it imports without huggingface-hub); pytest and its own dependencies run the
# tests; pytest-timeout gives each test a limit.
OFFLINE_WHEELS="jsonargparse==4.53.0 docstring-parser==0.18.0 typeshed-client==2.15.0 litdata==0.2.76 obstore==0.12.1
  boto3==1.44.8 botocore==1.44.8 s3transfer==0.19.3 jmespath==1.1.0 fla-core==0.6.0 einops==0.8.2 mlstm_kernels==2.0.6
  tokenizers==0.23.3 pytest==9.2.0 pluggy==1.7.0 iniconfig==2.3.1 pygments==2.21.0 packaging==26.4 pytest-timeout==2.4.0"
STUDY_CONFIGS=configs/study_gpu
# What `swax_lightning retrofit run` imports that the CUDA image lacks: litdata and its start-up imports, and gguf
# (transformers' GGUF reader); the image's transformers, accelerate and tokenizers serve.
RETROFIT_WHEELS="litdata==0.2.76 obstore==0.12.1 boto3==1.44.8 botocore==1.44.8 s3transfer==0.19.3 jmespath==1.1.0
  gguf==0.19.0"
CARRY=${GPU_CHECK_CARRY:-benchmarks/.carry}
GPU_TESTS="-m gpu tests/test_gpu.py"
# name | phase (tests: side by side; -: alone, in order; study, retrofit: only with --study, --retrofit) | limit s |
# basis of the limit
# The last run (2026-11-30, one H200; README "Measured on one H200") recorded the totals (325 s, 333 s) and which
# stages ran out, not each stage's seconds: a limit is 2 x the last measured time where one is known, else the
# basis says what it rests on.
STAGES="install|-|30|last: not recorded, done within its 30 s limit; wheels only
tests_mlstm|tests|170|never run on a GPU: fp32 kernels compile in 10-30 s each (kernel_shared_memory.py, 2 CPU cores)
tests_mlstm_chunk128|tests|170|never run on a GPU: its fp32 dq/dk kernel compiled in 496 s on 2 shared CPU cores
tests_loss_fla|tests|90|never run on a GPU: fla autotunes; the loss runs 3 matmuls over a 50k vocabulary
tests_attention|tests|170|last: ran out at 100 s compiling per shape; one compilation per dtype and head dim now
tests_flex|tests|110|last: ran out at 55 s: 2 x 55; FlexAttention compiles per shape
mlstm|-|60|own vs TFLA never timed; the last mlstm stage (own + PyTorch path) done within its 70 s; no PyTorch path now
swa|-|60|last: done within its 75 s with 5 implementations; 2-3 now (own, FlexAttention, flash-attn)
train_1.4b_w128|-|35|never run at W 128; at W 2048: 0.767 s a step, done within its 40 s with 5 steps, 4 now
train_1.4b_w2048|-|35|last: 0.767 s a step, done within its 40 s with 5 steps, 4 now
fit_tiny|-|30|last: 200 steps in 30 s with start-up (README); 50 steps now
study|study|540|last (2026-12-04, one H200): 418 s for six arms of 600 steps of 64 x 512 tokens (26M parameters), two at a time, with their evaluations at both windows; 1.3 x that
retrofit|retrofit|530|never run on a GPU: what a 600 s device call leaves after install; the run resumes in the next call"

stage_install() {
  if [ "$MODE" = retrofit ]; then  # the image's python3 gets the carried wheels; a venv needs the pretrained group
    if [ "$PY" = python3 ]; then python3 -m pip install -q --no-deps $RETROFIT_WHEELS; return; fi
    "$PY" -c "import gguf, litdata, transformers" || { echo "bash setup.sh pretrained first"; return 1; }
    return
  fi
  if [ -x .venv/bin/python ] && sees_gpu .venv/bin/python; then
    .venv/bin/python -m pip install -q -r requirements-tfla.txt
  elif [ "$PY" = python3 ]; then
    python3 -m pip install -q --no-deps $OFFLINE_WHEELS
  else
    bash setup.sh tfla
  fi
  "$PY" -m pip install -q --only-binary=:all: flash-attn || echo "flash-attn: no prebuilt wheel (optional)"
}
stage_tests_mlstm() { "$PY" -m pytest -v -rs $GPU_TESTS -k "mlstm and not fp32_chunk128" $(per_test 150); }
stage_tests_mlstm_chunk128() { "$PY" -m pytest -v -rs $GPU_TESTS -k "fp32_chunk128" $(per_test 165); }
stage_tests_loss_fla() { "$PY" -m pytest -v -rs $GPU_TESTS -k "chunked_loss or deltanet" $(per_test 80); }
stage_tests_attention() {
  "$PY" -m pytest -v -rs $GPU_TESTS -k "(attention or head_dim) and not flex" $(per_test 100)
}
stage_tests_flex() { "$PY" -m pytest -v -rs $GPU_TESTS -k flex $(per_test 100); }
stage_mlstm() {
  "$PY" benchmarks/mlstm_kernel.py --lengths 4096 16384 65536 --shapes 4x256x512 16x128x128 \
    --impls "triton (ours)" "tfla (NX-AI)"
}
stage_swa() {
  "$PY" benchmarks/swa_kernel.py --lengths 4096 16384 65536 --windows 128 2048 --n_sink 0 --heads 16 --head_dim 128 \
    --impls "triton (ours)" "flex attention" "flash-attn"
}
train_14b() { "$PY" benchmarks/train_step.py --config configs/base/model_1.4b.yaml --seq 16384 --warmup 1 --steps 3 "$@"; }
stage_train_1.4b_w128() { train_14b --window 128; }
stage_train_1.4b_w2048() { train_14b --window 2048; }
stage_fit_tiny() {
  "$PY" main.py fit --config configs/tiny.yaml --trainer.accelerator gpu --trainer.precision bf16-mixed \
    --trainer.max_steps 50 --trainer.val_check_interval 25 --trainer.logger.init_args.save_dir "$LOG/runs"
}
stage_study() {
  "$PY" -m swax_lightning.study.sweep run "$STUDY_CONFIGS" --seeds 0 --jobs 2 --threads 4 --save_dir "$LOG/runs"
}
stage_retrofit() {  # join the carried GGUF, then the experiment (it resumes); its results copied to $LOG either way
  local config=${GPU_CHECK_RETROFIT_CONFIG:-configs/retrofit/${RETROFIT_MODEL}_gpu.yaml} out rc
  "$PY" benchmarks/gpu_carry.py join "$CARRY/$RETROFIT_MODEL.carry.json" || return
  out=$("$PY" -c "import sys; from swax_lightning.pretrained.experiment import read_config
print(read_config(sys.argv[1]).out)" "$config") || return
  timeout $(( $(field retrofit 3) - 15 )) "$PY" -m swax_lightning retrofit run "$config"
  rc=$?
  mkdir -p "$LOG/$(basename "$out")"
  tar cf - --exclude=checkpoints --exclude=import --exclude=data -C "$out" . | tar xf - -C "$LOG/$(basename "$out")"
  return $rc
}
EXTRA="train_1.4b_compile: train_14b --window 2048 --compile
train_1.4b_tfla: train_14b --window 2048 --kernels mlstm=tfla"

stages_of_mode() {  # the stages this mode runs, in order
  if [ "$MODE" = check ]; then echo "$STAGES" | awk -F'|' '$2 != "study" && $2 != "retrofit" {print $1}'
  else printf 'install\n%s\n' "$MODE"; fi
}
sees_gpu() { "$1" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" 2>/dev/null; }
per_test() {  # a per-test limit where the pytest-timeout plugin is there
  "$PY" -c "import pytest_timeout" 2>/dev/null && echo "--timeout $1"
}
field() { echo "$STAGES" | awk -F'|' -v n="$1" -v f="$2" '$1 == n {print $f}'; }
names() { echo "$STAGES" | awk -F'|' -v p="$1" '$2 == p {print $1}'; }

if [ "${1:-}" = "--wheels" ]; then
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --platform manylinux2014_x86_64 \
    -d benchmarks/wheels $OFFLINE_WHEELS && ls benchmarks/wheels
  exit
fi
if [ "${1:-}" = "--carry" ]; then
  model=${2:?"--carry MODEL: smollm2 or gemma3"}
  rm -rf "$CARRY/wheels"
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --platform manylinux2014_x86_64 \
    -d "$CARRY/wheels" $RETROFIT_WHEELS || exit
  exec .venv/bin/python benchmarks/gpu_carry.py pack "$model" --out "$CARRY" --wheels "$CARRY/wheels"
fi
if [ "${1:-}" = "--dry-run" ]; then
  echo "stage | phase | limit s | basis"
  echo "$STAGES" | awk -F'|' '{phase = $2 == "-" ? "alone" : ($2 == "tests" ? "side by side" : "--" $2 " only")
                               printf "%s | %s | %s | %s\n", $1, phase, $3, $4}'
  total=$(echo "$STAGES" | awk -F'|' '$2 == "tests" {if ($3 > t) t = $3; next} $2 == "-" {s += $3}
                                       END {print s + t}')
  echo "total of the limits: $total s of 480 (the side-by-side tests count once: their slowest group's limit)"
  study=$(( $(field install 3) + $(field study 3) ))
  echo "--study: install and study, $study s of 600, one device call (the study's arms: $(ls $STUDY_CONFIGS | grep -v '^_' | paste -sd' '))"
  echo "--retrofit MODEL: install and retrofit, $(( $(field install 3) + $(field retrofit 3) )) s of 600 a device call; wheels: $(echo $RETROFIT_WHEELS)"
  echo "extra with GPU_CHECK_EXTRA=1 (outside the budget): $(echo "$EXTRA" | cut -d: -f1 | paste -sd' ')"
  echo "wheels for a CUDA image without network (benchmarks/wheels/, from --wheels):"
  for wheel in $OFFLINE_WHEELS; do
    name=${wheel%%==*}
    found=$(ls benchmarks/wheels 2>/dev/null | grep -i "^${name//-/[-_]}-${wheel##*==}-" | head -1)
    if [ -n "$found" ]; then echo "  $wheel (there: $found)"
    else echo "  $wheel (missing: run --wheels on a networked machine)"; fi
  done
  for stage in $(echo "$STAGES" | cut -d'|' -f1); do
    echo "--- $stage:"; declare -f "stage_$stage" | sed '1,2d;$d'
  done
  exit 0
fi

MODE=check RETROFIT_MODEL=
if [ "${1:-}" = "--study" ]; then
  MODE=study
  shift
elif [ "${1:-}" = "--retrofit" ]; then
  MODE=retrofit
  RETROFIT_MODEL=${2:?"--retrofit MODEL: smollm2 or gemma3"}
  shift 2
fi
SUMMARY=${1:-gpu_$MODE.json}
LOG=${GPU_CHECK_LOGS:-$(mktemp -d)}
CACHE=${GPU_CHECK_CACHE:-benchmarks/.cache}
mkdir -p "$LOG" "$CACHE"
export TRITON_CACHE_DIR=$PWD/$CACHE/triton TORCHINDUCTOR_CACHE_DIR=$PWD/$CACHE/inductor
start=$(date +%s)
if [ -x .venv/bin/python ] && sees_gpu .venv/bin/python; then
  PY=.venv/bin/python
elif sees_gpu python3; then
  PY=python3
  export PIP_NO_INDEX=1 PIP_FIND_LINKS=$([ "$MODE" = retrofit ] && echo "$CARRY/wheels" || echo benchmarks/wheels)
else
  PY=.venv/bin/python
fi
# The interpreter off: tests/conftest.py switches it on for the CPU tests unless told otherwise.
export TRITON_INTERPRET=0
export -f sees_gpu per_test field train_14b $(echo "$STAGES" | cut -d'|' -f1 | sed 's/^/stage_/')
export PY LOG GPU_TESTS STUDY_CONFIGS OFFLINE_WHEELS MODE RETROFIT_WHEELS CARRY RETROFIT_MODEL STAGES

summarise() {  # rewrite the summary from the stage logs so far (atomically)
  "$PY" benchmarks/gpu_check_summary.py "$LOG" "$SUMMARY" "$start" "$(stages_of_mode | paste -sd,)"
}
run_stage() {  # run_stage NAME [COMMAND...]: under its limit, stdout+stderr to $LOG/NAME.log, then rc and seconds
  local name=$1 limit t0
  limit=${LIMIT:-$(field "$1" 3)}
  shift
  t0=$(date +%s)
  if [ $# -gt 0 ]; then timeout "$limit" bash -c "$*" >"$LOG/$name.log" 2>&1
  else timeout "$limit" bash -c "stage_$name" >"$LOG/$name.log" 2>&1; fi
  echo "$?" >"$LOG/$name.rc"
  echo "$(( $(date +%s) - t0 ))" >"$LOG/$name.s"
  echo "[gpu_check] $name: rc $(cat "$LOG/$name.rc") in $(cat "$LOG/$name.s") s (limit $limit s)" >&2
}

summarise
run_stage install
summarise
if [ "$MODE" != check ]; then
  run_stage "$MODE"
  summarise >/dev/null
  echo "[gpu_check] $MODE summary: $SUMMARY; logs and runs: $LOG" >&2
  exit 0
fi
for name in $(names tests); do run_stage "$name" & done
wait
summarise
for name in $(names - | grep -v install); do
  run_stage "$name"
  summarise
done
if [ "${GPU_CHECK_EXTRA:-0}" = 1 ]; then
  echo "$EXTRA" | while IFS=: read -r name command; do LIMIT=120 run_stage "$name" "$command"; summarise; done
fi
summarise >/dev/null
"$PY" -c "import json, sys; s = json.load(open(sys.argv[1])); print(json.dumps({k: {'rc': v.get('rc'), 's': v.get('seconds')} for k, v in s['stages'].items()}))" "$SUMMARY"
echo "[gpu_check] summary: $SUMMARY; logs: $LOG; kernel cache: $CACHE ($(du -sh "$CACHE" | cut -f1))" >&2
