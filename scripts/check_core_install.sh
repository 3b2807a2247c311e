#!/usr/bin/env bash
# The core install, for real: a throwaway venv gets `pip install <this repo>` with no extras,
# then this checks that torch and the other optional packages are absent, that the accounting
# API imports and computes, that `ray-dptune plan` and `ray-dptune calibrate` run, and that
# `import ray_dptune.training` names the extra to install. pip uses the machine's configured
# index (pip config list). Prints the time it took; exits non-zero on the first failure.
set -euo pipefail
cd "$(dirname "$0")/.."
REPO=$(pwd)
PYTHON=${PYTHON:-python3}
START=$(date +%s)
WORK=$(mktemp -d "${TMPDIR:-/tmp}/ray_dptune_core.XXXXXX")
trap 'rm -rf "$WORK"' EXIT

"$PYTHON" -m venv "$WORK/venv"
PY="$WORK/venv/bin/python"
"$PY" -m pip install -q "$REPO" 2>"$WORK/pip.log" || { cat "$WORK/pip.log"; exit 1; }
cd "$WORK"  # away from the repository, so that the installed package is the one imported

echo "installed in $(($(date +%s) - START)) s: $("$PY" -m pip list --format=freeze 2>/dev/null | tr '\n' ' ')"

"$PY" - <<'EOF'
import importlib.util

present = [m for m in ("torch", "opacus", "botorch", "gpytorch", "matplotlib", "sklearn") if importlib.util.find_spec(m)]
assert not present, f"the core install pulled optional packages: {present}"

from ray_dptune import Poisson, RDPCurve, TrialSpend, calibrate_noise_multiplier, repeat_and_select

base = RDPCurve.subsampled_gaussian(sample_rate=0.045, noise_multiplier=2.49, steps=336)
epsilon = repeat_and_select(base, Poisson(mean=8)).epsilon(delta=1e-5)
sigma = calibrate_noise_multiplier(
    lambda s: TrialSpend(sample_rate=0.045, noise_multiplier=s, steps=336), epsilon=3.0, delta=1e-5, law=Poisson(mean=8)
)
print(f"accounting API: search epsilon {epsilon:.4f}, calibrated sigma {sigma:.4f} (no torch, no opacus)")

try:
    import ray_dptune.training  # noqa: F401
except ImportError as error:
    expected = "ray_dptune.training needs torch and Opacus: pip install 'ray_dptune[train]'"
    assert str(error) == expected and isinstance(error.__cause__, ModuleNotFoundError), repr(error)
    print(f"import ray_dptune.training: {error}")
else:
    raise AssertionError("ray_dptune.training imported without torch")
EOF

"$WORK/venv/bin/ray-dptune" plan --dpsgd 0.045 2.49 336 --delta 1e-5 --mean 8
"$WORK/venv/bin/ray-dptune" calibrate --epsilon 3 --delta 1e-5 --mean 8 --dataset-size 1437 --batch-size 64 --epochs 9
echo "core install check passed in $(($(date +%s) - START)) s"
