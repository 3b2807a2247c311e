#!/usr/bin/env bash
# Creates .venv next to this repository and installs ray_dptune with every extra
# (training, the GP searchers, plots, examples), its test tools and its linters.
# Safe to run again: it only installs what is missing.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
# The CPU build of torch goes first: a looser requirement pulls several GB of CUDA
# wheels. On a GPU machine, set TORCH_SPEC to the build you want (e.g. TORCH_SPEC=torch).
TORCH_SPEC=${TORCH_SPEC:-torch==2.13.0}

[ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
.venv/bin/python -c "import torch" 2>/dev/null || .venv/bin/python -m pip install -q "$TORCH_SPEC"
.venv/bin/python -m pip install -q -e ".[all,test,lint]"
