"""Noise multiplier that meets a target (ε, δ) for a whole search, not one run."""

from __future__ import annotations

import math
from collections.abc import Callable

from ray_dptune.accounting.account import Mechanism, SearchAccount
from ray_dptune.accounting.spend import TrialSpend
from ray_dptune.distributions import RunCountDistribution
from ray_dptune.errors import PrivacyError

__all__ = ["calibrate", "calibrate_noise_multiplier", "search_epsilon"]


def search_epsilon(
    plan: TrialSpend,
    distribution: RunCountDistribution,
    delta: float,
    *,
    density_ratio: float = 1.0,
    generic: bool = False,
) -> float:
    """ε at ``delta`` of a random-count search whose every trial spends at most ``plan`` (the account's)."""
    mechanism = Mechanism.random_count(law=distribution, num_trials=1, density_ratio=density_ratio)
    return SearchAccount(mechanism, delta=delta, plan=plan.to_dict(), generic=generic).guarantee().epsilon


def calibrate(
    plan_for: Callable[[float], TrialSpend],
    *,
    epsilon: float,
    delta: float,
    mechanism: Mechanism,
    generic: bool = False,
    rtol: float = 1e-3,
) -> float:
    """The smallest noise multiplier σ (to ``rtol``) whose whole search meets (``epsilon``, ``delta``).

    ``plan_for(σ)`` is any trial plan as a function of σ (a DP-SGD trainable's, a custom
    one); the search's ε is what :class:`~ray_dptune.accounting.account.SearchAccount`
    gives ``mechanism`` with that plan, no attempt charged. ε is non-increasing in σ, so
    σ is bracketed geometrically and bisected; the upper end of the bracket is returned,
    so the search never exceeds the target (as Opacus's ``get_noise_multiplier`` does
    for one run).

    Raises:
        PrivacyError: no σ up to 1e4 meets the target (e.g. the score releases alone exceed it).
        ValueError: invalid arguments.
    """
    epsilon = float(epsilon)
    if not epsilon > 0 or math.isinf(epsilon):
        raise ValueError(f"epsilon must be a finite number > 0, got {epsilon}.")
    if not 0.0 < float(rtol) < 1.0:
        raise ValueError(f"rtol must lie in (0, 1), got {rtol}.")

    def spent(sigma: float) -> float:
        plan = plan_for(sigma).to_dict()
        return SearchAccount(mechanism, delta=delta, plan=plan, generic=generic).guarantee().epsilon

    low, high = 0.5, 1.0
    while spent(high) > epsilon:
        low, high = high, high * 2.0
        if high > 1e4:
            raise PrivacyError(
                f"No noise multiplier up to 1e4 meets ε = {epsilon} at δ = {delta} for this search: "
                "the score releases or the adaptivity cost log(C/c) alone exceed it. Raise the target, "
                "add noise to the score, or lower density_ratio."
            )
    while spent(low) <= epsilon and low > 1e-3:
        low, high = low / 2.0, low
    while high - low > rtol * high:
        middle = 0.5 * (low + high)
        if spent(middle) <= epsilon:
            high = middle
        else:
            low = middle
    return high


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
    mechanism = Mechanism.random_count(law=distribution, num_trials=1, density_ratio=density_ratio)

    def plan_for(sigma: float) -> TrialSpend:
        return TrialSpend(sample_rate, sigma, steps, score_noise_multiplier, score_releases)

    return calibrate(plan_for, epsilon=target_epsilon, delta=delta, mechanism=mechanism, generic=generic, rtol=rtol)
