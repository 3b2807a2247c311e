"""σ that meets a whole search's (ε, δ): our default (tightest) bound against dp_accounting's.

Digits' DP-SGD trial (ANCHORS.md: 1 437 images, batch 64, 15 epochs = 336 steps),
δ = 1e-5, K ~ Poisson(8) and logarithmic / geometric K of mean 8. For each target
ε, the smallest σ (to 0.1 %) is found by bisection with (a) ``calibrate_noise_multiplier``
(default bound: min of closed form and certified Lemma 7, PLD profile of the DP-SGD base)
and (b) dp_accounting's ``RdpAccountant`` on ``RepeatAndSelectDpEvent``. Writes
``benchmarks/results/calibration.md``.

Usage::

    .venv/bin/python benchmarks/calibration.py
"""

from __future__ import annotations

import math
import time
from pathlib import Path

from dp_accounting import dp_event
from dp_accounting.rdp import rdp_privacy_accountant

from ray_dptune.accounting.bookkeeping.calibrate import calibrate_noise_multiplier
from ray_dptune.accounting.bookkeeping.spend import TrialSpend
from ray_dptune.accounting.bounds.distributions import Poisson, TruncatedNegativeBinomial

SAMPLE_RATE, STEPS, DELTA, MEAN = 64 / 1437, 336, 1e-5, 8.0
RESULTS = Path(__file__).resolve().parent / "results" / "calibration.md"


def dp_accounting_sigma(
    epsilon: float,
    shape: float,
    *,
    sample_rate: float = SAMPLE_RATE,
    steps: int = STEPS,
    mean: float = MEAN,
    rtol: float = 1e-3,
) -> float:
    """Bisection on σ with dp_accounting's RDP accountant (``RepeatAndSelectDpEvent``); the upper (safe) end."""

    def spent(sigma: float) -> float:
        inner = dp_event.PoissonSampledDpEvent(sample_rate, dp_event.GaussianDpEvent(sigma))
        accountant = rdp_privacy_accountant.RdpAccountant()
        accountant.compose(dp_event.RepeatAndSelectDpEvent(dp_event.SelfComposedDpEvent(inner, steps), mean, shape))
        return accountant.get_epsilon(DELTA)

    low, high = 0.3, 20.0
    while high - low > rtol * high:
        middle = 0.5 * (low + high)
        low, high = (low, middle) if spent(middle) <= epsilon else (middle, high)
    return high


def main() -> None:
    rows = []
    laws = [("Poisson", math.inf, Poisson(MEAN)), ("logarithmic", 0.0, TruncatedNegativeBinomial.from_mean(0.0, MEAN))]
    for epsilon in (3.0, 8.0):
        for name, shape, law in laws:
            start = time.perf_counter()
            ours = calibrate_noise_multiplier(
                lambda s: TrialSpend(sample_rate=SAMPLE_RATE, noise_multiplier=s, steps=STEPS),
                epsilon=epsilon,
                delta=DELTA,
                law=law,
            )
            ours_s = time.perf_counter() - start
            start = time.perf_counter()
            theirs = dp_accounting_sigma(epsilon, shape)
            theirs_s = time.perf_counter() - start
            rows.append((epsilon, name, ours, theirs, 1 - ours / theirs, ours_s, theirs_s))
            print(rows[-1], flush=True)
    lines = [
        "# Calibration: σ for a whole search's (ε, δ = 1e-5), digits DP-SGD trial (q = 64/1437, T = 336), E[K] = 8",
        "",
        "Command: `.venv/bin/python benchmarks/calibration.py` (one process; times include PLD builds).",
        "",
        "| target ε | law | σ ours (default bound) | σ dp_accounting | σ reduction | time ours (s) | time dp (s) |",
        "|--:|---|--:|--:|--:|--:|--:|",
    ]
    lines += [f"| {e:g} | {n} | {o:.4f} | {t:.4f} | {r:.1%} | {a:.1f} | {b:.1f} |" for e, n, o, t, r, a, b in rows]
    lines += [
        "",
        (
            "What the smaller σ buys on digits (released trial's held-out accuracy, paired searches): "
            "`benchmarks/calibration_utility.py`, results in `calibration_utility.md`."
        ),
    ]
    RESULTS.write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
