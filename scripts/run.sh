#!/usr/bin/env bash
# Sets up .venv if needed, then runs the main job: a private hyperparameter search of a
# DP-SGD model on a local Ray started on the spot (examples/quickstart.py), which prints
# the released trial and one (ε, δ) for the whole search.
# Extra args go to the example; see `.venv/bin/python examples/quickstart.py --help`.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/python examples/quickstart.py "$@"
