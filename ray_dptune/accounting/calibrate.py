"""Noise multiplier that meets a target (ε, δ) for a whole search, not one run."""

from __future__ import annotations

import math

from ray_dptune.accounting.selection import repeat_and_select
from ray_dptune.accounting.spend import TrialSpend
from ray_dptune.distributions import RunCountDistribution
from ray_dptune.errors import PrivacyError

__all__ = ["calibrate_noise_multiplier", "search_epsilon"]


def search_epsilon(
    plan: TrialSpend,
    distribution: RunCountDistribution,
    delta: float,
    *,
    density_ratio: float = 1.0,
    generic: bool = False,
) -> float:
    """ε at ``delta`` of a search whose every trial spends at most ``plan``."""
    curve = repeat_and_select(plan.curve(), distribution, density_ratio=density_ratio, generic=generic)
    return curve.epsilon(delta)


def calibrate_noise_multiplier(
    target_epsilon: float,
    delta: float,
    distribution: RunCountDistribution,
    sample_rate: float,
    steps: int,
    *,
    density_ratio: float = 1.0,
    score_noise_multiplier: float | None = None,
    score_releases: int = 0,
    generic: bool = False,
    rtol: float = 1e-3,
) -> float:
    """The smallest σ (to ``rtol``) whose whole search meets (target_epsilon, delta).

    ε is non-increasing in σ, so σ is bracketed geometrically and bisected; the
    upper end of the bracket is returned, so the search never exceeds the target
    (as Opacus's ``get_noise_multiplier`` does for one run).

    Args:
        target_epsilon: ε of the whole search.
        delta: δ of the whole search.
        distribution: law of the number of trials K.
        sample_rate: DP-SGD's Poisson sampling rate.
        steps: DP-SGD steps of one trial.
        density_ratio: C/c of an adaptive searcher (DP-HyPO), 1 otherwise.
        score_noise_multiplier: σ of each noisy score release, if the score is private.
        score_releases: number of noisy scores each trial releases.
        generic: also use the numeric P&S Lemma 7 bound (tighter, slower).
        rtol: relative precision of σ.

    Raises:
        PrivacyError: the target cannot be met at any σ (the score releases alone exceed it).
        ValueError: invalid arguments.
    """
    target_epsilon = float(target_epsilon)
    if not target_epsilon > 0 or math.isinf(target_epsilon):
        raise ValueError(f"target_epsilon must be a finite number > 0, got {target_epsilon}.")

    def epsilon(sigma: float) -> float:
        plan = TrialSpend(sample_rate, sigma, steps, score_noise_multiplier, score_releases)
        return search_epsilon(plan, distribution, delta, density_ratio=density_ratio, generic=generic)

    low, high = 0.5, 1.0
    while epsilon(high) > target_epsilon:
        low, high = high, high * 2.0
        if high > 1e4:
            raise PrivacyError(
                f"No noise multiplier up to 1e4 meets ε = {target_epsilon} at δ = {delta} for this search: "
                "the score releases or the adaptivity cost log(C/c) alone exceed it. Raise the target, "
                "add noise to the score, or lower density_ratio."
            )
    while epsilon(low) <= target_epsilon and low > 1e-3:
        low, high = low / 2.0, low
    while high - low > rtol * high:
        middle = 0.5 * (low + high)
        if epsilon(middle) <= target_epsilon:
            high = middle
        else:
            low = middle
    return high
