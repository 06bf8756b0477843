#!/usr/bin/env bash
# Creates .venv and installs swax-lightning's dependencies; the README and .ci/run both call this.
#   bash setup.sh        the core: training, inference, RULER / BABILong / perplexity evaluations (2.0 GB venv)
#   bash setup.sh eval   also the optional lm-evaluation-harness group (requirements-eval.txt, +0.6 GB)
#   bash setup.sh hf     also Hugging Face transformers, for swax-export's load-back and its test (requirements-hf.txt)
#   bash setup.sh wandb  also Weights & Biases, for a WandbLogger (requirements-wandb.txt)
#   bash setup.sh tfla   also NX-AI's TFLA mLSTM kernels, `mlstm: tfla` (requirements-tfla.txt; tested on CPU in the
#                        Triton interpreter)
# requirements.txt resolves normally (torch pinned), then requirements-nodeps.txt goes in with --no-deps so that
# litdata's unpinned torchvision is never resolved (docs/design.md section 6).
set -euo pipefail
cd "$(dirname "$0")"
PYTHON=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q -r requirements.txt
.venv/bin/python -m pip install -q --no-deps -r requirements-nodeps.txt
for group in "$@"; do
  [ -f "requirements-$group.txt" ] || { echo "setup.sh: unknown group '$group' (no requirements-$group.txt)" >&2; exit 2; }
  .venv/bin/python -m pip install -q -r "requirements-$group.txt"
done
# The package itself, editable and without dependencies (all installed above): the console scripts swax,
# swax-generate, swax-compare, swax-export, and `python -m swax_lightning.<tool>` from any folder.
.venv/bin/python -m pip install -q --no-deps -e .
.venv/bin/python -c "import torch, triton, lightning, litdata; print('torch', torch.__version__, 'cuda', torch.cuda.is_available(), '| triton', triton.__version__, '| lightning', lightning.__version__, '| litdata', litdata.__version__)"
