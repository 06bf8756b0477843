#!/usr/bin/env bash
# Creates .venv and installs swax-lightning's dependencies; the README and .ci/run both call this.
# Two steps: requirements.txt resolves normally (torch pinned), then requirements-nodeps.txt goes in with --no-deps
# so that litdata's unpinned torchvision is never resolved (../shared/DESIGN.md section 6).
set -euo pipefail
cd "$(dirname "$0")"
PYTHON=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q -r requirements.txt
.venv/bin/python -m pip install -q --no-deps -r requirements-nodeps.txt
.venv/bin/python -c "import torch, triton, lightning, litdata; print('torch', torch.__version__, 'cuda', torch.cuda.is_available(), '| triton', triton.__version__, '| lightning', lightning.__version__, '| litdata', litdata.__version__)"
