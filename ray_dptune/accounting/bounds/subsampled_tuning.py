"""Tune on a Poisson sample of the data, then train once on all of it: the whole procedure's (ε, δ).

The procedure: draw a Poisson sample of rate ``p`` of the private records (secretly), run
the tuning T on it (any search whose own (ε, δ) profile is known, e.g. a random-count
search of DP-SGD trials), then run one final DP-SGD training B on all the records with
hyperparameters chosen from T's output, B's plan (σ, q, steps) fixed in advance. The bound
follows from three results:

1. **Amplification by Poisson subsampling** (Li, Qardaji & Su 2012, Thm 1; Balle, Barthe &
   Gaboardi 2018, Thm 8; Steinke 2022, Thm 29): if T is (ε, δ)-DP under add/remove, T on a
   Poisson sample of rate p is (log(1 + p(e^ε − 1)), pδ)-DP, at every point of T's profile
   (:func:`amplified`).
2. **Domination by randomized response** (Kairouz, Oh & Viswanath 2015, Thm 2.1): for a fixed
   pair of neighbours, every (ε, δ)-DP mechanism is a post-processing of the (ε, δ)
   randomized-response pair, whose privacy loss distribution dp_accounting builds exactly
   (``from_privacy_parameters``). Privacy loss distributions of dominating pairs compose
   adaptively (Zhu, Dong & Wang 2022, Thm 10), so the amplified pair composed with B's
   pessimistic PLD bounds the whole procedure, B chosen from T's output.
3. Each point of the amplified profile gives a valid bound; the least of them is one
   (:func:`subsampled_tuning_epsilon`).

What the procedure must be for the bound to hold (no searcher runs it yet): the sample is true
Poisson sampling of rate ``p`` with secret randomness; the tuning's plan (q, steps, the law of K)
is fixed before it from public sizes, never from the realised sample; the tuning's curve is its
account's whole curve (retries and interrupted attempts included); any private validation data it
scores on lies inside the sample; the final run is one run, with (σ, q, steps) fixed in advance,
and uses the sample only through the tuning's output. No Ray, no torch.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from ray_dptune import validate
from ray_dptune.accounting.bookkeeping.spend import TrialSpend
from ray_dptune.accounting.curves.profiles import subsampled_gaussian_pld
from ray_dptune.accounting.curves.rdp import RDPCurve

__all__ = [
    "PLD_DISCRETIZATION",
    "TUNING_DELTAS",
    "amplified",
    "dpsgd_run_pld",
    "profile_points",
    "subsampled_search_epsilon",
    "subsampled_tuning_epsilon",
]

PLD_DISCRETIZATION = 1e-4
"""The privacy-loss grid of the composed distributions (pessimistic rounding: any value is valid)."""
TUNING_DELTAS = tuple(float(d) for d in np.geomspace(1e-14, 1e-2, 49))
"""The δ at which the tuning's profile is read (each a valid point; the bound takes the least)."""


def amplified(*, epsilon: float, delta: float, sample_rate: float) -> tuple[float, float]:
    """(ε', δ') of an (ε, δ)-DP mechanism run on a Poisson sample of rate ``sample_rate`` (add/remove).

    ε' = log(1 + p(e^ε − 1)), δ' = pδ (Li, Qardaji & Su 2012, Thm 1; Balle, Barthe & Gaboardi
    2018, Thm 8). For an event E, with A = P[M(S) ∈ E], B = P[M(S ∪ {x}) ∈ E]: adding x gives
    (1 − p)A + pB ≤ (1 − p)A + p(e^ε A + δ) = e^{ε'} A + pδ; removing it needs
    A ≤ e^{ε'}((1 − p)A + pB) + pδ, which follows from B ≥ e^{−ε}(A − δ) since
    e^{ε'}(1 − p + p e^{−ε}) ≥ 1 and e^{ε'−ε} ≤ 1. Both values are rounded up.
    """
    p = validate.in_range("sample_rate", sample_rate, 0.0, 1.0)
    epsilon = validate.non_negative("epsilon", epsilon)
    delta = validate.in_range("delta", delta, 0.0, 1.0)
    if math.isinf(epsilon):
        return math.inf, min(delta, _up(p * delta))
    if p == 0.0:
        return 0.0, 0.0
    if epsilon < 700.0:
        epsilon_amplified = math.log1p(p * math.expm1(epsilon))
    else:  # log(p e^ε + 1 − p) = ε + log p + log1p((1 − p) e^{−ε} / p) <= ε + log p + e^{−ε} / p
        epsilon_amplified = epsilon + math.log(p) + math.exp(-epsilon) / p
    return min(epsilon, _up(_up(epsilon_amplified))), min(delta, _up(p * delta))


def profile_points(curve: RDPCurve, *, deltas: Iterable[float] = TUNING_DELTAS) -> list[tuple[float, float]]:
    """(ε, δ) points of the profile an RDP curve implies, one per δ (CKS 2020, Prop. 12: each is valid)."""
    return [(curve.epsilon(delta=delta), float(delta)) for delta in deltas]


def subsampled_tuning_epsilon(
    tuning: Sequence[tuple[float, float]],
    *,
    sample_rate: float,
    final_run: Any,
    delta: float,
    discretization: float = PLD_DISCRETIZATION,
) -> float:
    """ε at ``delta`` of tuning on a Poisson sample of rate ``sample_rate``, then the final run on all the data.

    Args:
        tuning: (ε, δ) points of the tuning's profile on its sample (every one valid, e.g.
            :func:`profile_points` of its RDP curve).
        sample_rate: p, the Poisson sampling rate of the tuning's sample (fixed in advance).
        final_run: a dp_accounting ``PrivacyLossDistribution`` dominating the final run for every
            choice of its hyperparameters (a pessimistic one; discretised at ``discretization``).
        delta: δ of the whole procedure.
        discretization: the privacy-loss grid of the pairs (the final run's; any value gives a valid bound).

    Returns:
        The least ε over the points (inf when none leaves room for ``delta``).
    """
    from dp_accounting.pld import privacy_loss_distribution
    from dp_accounting.pld.common import DifferentialPrivacyParameters

    delta = validate.in_range("delta", delta, 0.0, 1.0)
    best = math.inf
    for epsilon_tuning, delta_tuning in tuning:
        epsilon_amplified, delta_amplified = amplified(
            epsilon=epsilon_tuning, delta=delta_tuning, sample_rate=sample_rate
        )
        if delta_amplified >= delta or epsilon_amplified > 700.0:  # no room for δ, or e^ε' past a double
            continue
        pair = privacy_loss_distribution.from_privacy_parameters(
            DifferentialPrivacyParameters(epsilon_amplified, delta_amplified),
            value_discretization_interval=discretization,
        )
        with np.errstate(all="ignore"):
            epsilon = float(pair.compose(final_run).get_epsilon_for_delta(delta))
        best = min(best, _up(epsilon))
    return best


def dpsgd_run_pld(plan: TrialSpend, *, discretization: float = PLD_DISCRETIZATION) -> Any:
    """dp_accounting's pessimistic PLD of one DP-SGD run of ``plan`` (Poisson rate q, σ, steps >= 1; no score release).

    A coarser ``discretization`` is faster and still an upper bound (pessimistic rounding).
    """
    if plan.score_releases:
        raise ValueError("The final run releases its model only: plan it without score releases.")
    return subsampled_gaussian_pld(
        sample_rate=plan.sample_rate,
        noise_multiplier=plan.noise_multiplier,
        steps=plan.steps,
        discretization=discretization,
    )


def subsampled_search_epsilon(
    *, tuning_curve: RDPCurve, sample_rate: float, final_plan: TrialSpend, delta: float
) -> float:
    """ε at ``delta`` of a search on a Poisson sample (its RDP curve there), then ``final_plan`` on all the data."""
    return subsampled_tuning_epsilon(
        profile_points(tuning_curve), sample_rate=sample_rate, final_run=dpsgd_run_pld(final_plan), delta=delta
    )


def _up(value: float) -> float:
    """The next double up: a value rounded to nearest, moved to the safe side."""
    return math.nextafter(value, math.inf)
