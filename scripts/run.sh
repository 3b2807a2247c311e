#!/usr/bin/env bash
# Sets up .venv if needed, then plans a private search: the (ε, δ) of tuning a
# DP-SGD model (sample rate 0.045, σ = 2.49, 336 steps, δ = 1e-5) with a random
# number of trials, per law of that number, beside plain composition.
# Extra args go to `ray-dptune plan`; see `.venv/bin/ray-dptune plan --help`.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
if [ "$#" -eq 0 ]; then
  set -- --dpsgd 0.045 2.49 336 --delta 1e-5 --mean 8 --plot privacy_plan.png
fi
exec .venv/bin/ray-dptune plan "$@"
