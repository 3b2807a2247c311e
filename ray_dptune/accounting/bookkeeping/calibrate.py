"""Noise multiplier that meets a target (ε, δ) for a whole search, not one run."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ray_dptune import validate
from ray_dptune.accounting.bookkeeping.account import SearchAccount
from ray_dptune.accounting.bookkeeping.search_mechanism import SearchMechanism
from ray_dptune.accounting.bookkeeping.spend import TrialSpend
from ray_dptune.accounting.bounds.distributions import RunCountDistribution
from ray_dptune.errors import PrivacyError

__all__ = [
    "CALIBRATION_DISCRETIZATION",
    "MAX_NOISE_MULTIPLIER",
    "calibrate_noise_multiplier",
    "calibrate_subsampled_tuning",
    "one_run_noise_multiplier",
    "search_epsilon",
]

MAX_NOISE_MULTIPLIER = 1e4
"""The largest σ the calibration tries before it declares the budget out of reach."""
CALIBRATION_DISCRETIZATION = 1e-3
"""The privacy-loss grid a subsampled tuning's calibration reads the final run on (coarser: faster, still an upper bound)."""


def search_epsilon(
    plan: TrialSpend,
    *,
    delta: float,
    law: RunCountDistribution | None = None,
    density_ratio: float = 1.0,
    mechanism: SearchMechanism | None = None,
    generic: bool = True,
    retries: int = 0,
) -> float:
    """ε at ``delta`` of a search whose every trial spends at most ``plan``, before it runs: the account's.

    The search is ``law`` (a random-count search, DP-HyPO with ``density_ratio`` = C/c) or
    any searcher's ``mechanism``; ``retries`` more attempts are composed at the plan. This is
    :class:`~ray_dptune.accounting.bookkeeping.account.SearchAccount`'s guarantee with no attempt charged
    yet, the one place a plan's search ε is computed (calibration, ``private_tuner``, the CLI).
    """
    if (law is None) == (mechanism is None):
        raise ValueError("Give exactly one of law= (a random-count search) and mechanism= (any searcher's).")
    if mechanism is None:
        assert law is not None  # exactly one of the two, checked above
        mechanism = SearchMechanism.random_count(law=law, num_trials=1, density_ratio=density_ratio)
    account = SearchAccount(mechanism, delta=delta, plan=plan.to_dict(), generic=generic)
    epsilon = account.guarantee(extra_charges=retries).epsilon
    assert epsilon is not None  # None only while an account has no plan; this one has
    return epsilon


def calibrate_noise_multiplier(
    plan_for: Callable[[float], TrialSpend],
    *,
    epsilon: float,
    delta: float,
    law: RunCountDistribution | None = None,
    density_ratio: float = 1.0,
    mechanism: SearchMechanism | None = None,
    generic: bool = True,
    retries: int = 0,
    rtol: float = 1e-3,
) -> float:
    """The smallest noise multiplier σ (to ``rtol``) whose whole search meets (``epsilon``, ``delta``).

    ``plan_for(σ)`` is any trial plan as a function of σ: a DP-SGD trainable's
    (``lambda s: trainable.privacy_plan({**space, "noise_multiplier": s})``), a hand-made
    ``lambda s: TrialSpend(sample_rate=q, noise_multiplier=s, steps=T)``, a custom one.
    The search is ``law`` (a random-count search, DP-HyPO with ``density_ratio`` = C/c)
    or any searcher's ``mechanism`` (``searcher.privacy_mechanism()``); its ε is what
    :class:`~ray_dptune.accounting.bookkeeping.account.SearchAccount` gives with that plan, no
    attempt charged. ε is non-increasing in σ, so σ is bracketed geometrically and
    bisected; the upper end of the bracket is returned, so the search never exceeds
    the target (as Opacus's ``get_noise_multiplier`` does for one run).

    ``retries`` reserves headroom: the search with that many more attempts composed at
    the plan (re-runs after an interrupted driver or a preempted node; Tune's retries of
    failed trials in a search whose bound composes every attempt — a random-count search
    allows none, see ``SearchMechanism.allows_retries``) still meets the target, so a
    search with a hard cap can pay for them.

    Raises:
        PrivacyError: no σ up to MAX_NOISE_MULTIPLIER meets the target (e.g. the score
            releases or the adaptivity cost alone exceed it).
        ValueError: invalid arguments.
    """
    epsilon = validate.finite_positive("epsilon", epsilon)
    validate.probability("delta", delta, open_left=True, open_right=True)
    rtol = validate.in_range("rtol", rtol, 0.0, 1.0, open_left=True, open_right=True)
    if not callable(plan_for):
        raise TypeError(f"plan_for must be a function σ -> TrialSpend, got {type(plan_for).__name__}.")
    retries = validate.integer("retries", retries, minimum=0)

    def spent(sigma: float) -> float:
        return search_epsilon(
            plan_for(sigma),
            delta=delta,
            retries=retries,
            law=law,
            density_ratio=density_ratio,
            mechanism=mechanism,
            generic=generic,
        )

    return _least_noise(
        spent,
        epsilon=epsilon,
        rtol=rtol,
        out_of_reach=(
            f"No noise multiplier up to {MAX_NOISE_MULTIPLIER:g} meets ε = {epsilon} at δ = {delta} for this "
            "search: the score releases or the adaptivity cost log(C/c) alone exceed it. Raise the target, "
            "add noise to the score, or lower density_ratio."
        ),
    )


def calibrate_subsampled_tuning(
    tuning_plan_for: Callable[[float], TrialSpend],
    final_plan_for: Callable[[float], TrialSpend],
    *,
    epsilon: float,
    delta: float,
    law: RunCountDistribution,
    sample_rate: float,
    final_noise_overhead: float = 0.1,
    retries: int = 0,
    generic: bool = True,
    rtol: float = 1e-3,
) -> tuple[float, float]:
    """(σ_T, σ_B) of a subsampled tuning that meets (``epsilon``, ``delta``): the split of the budget.

    σ_B, the final run's noise, is held at (1 + ``final_noise_overhead``) times the σ one
    untuned run alone needs for the budget; σ_T, the tuning trials' noise on the sample, is the
    smallest that leaves it (to 1 %); then σ_B is lowered as far as that σ_T allows. Each
    evaluation reads a few points of the tuning's profile near the best one (any subset of
    valid points is a valid bound, :func:`~ray_dptune.accounting.bounds.subsampled_tuning.subsampled_tuning_epsilon`),
    so the account's bound over all of them is at most the target.

    The search reads the final run's privacy loss distribution on a coarser grid
    (:data:`CALIBRATION_DISCRETIZATION`): still an upper bound (pessimistic rounding), twenty times
    faster to build, and within 1e-4 of the finer one on digits' plans.

    Raises:
        PrivacyError: no split meets the target (the final run alone needs more than it).
    """
    from ray_dptune.accounting.bounds.selection import repeat_and_select
    from ray_dptune.accounting.bounds.subsampled_tuning import (
        TUNING_DELTAS,
        dpsgd_run_pld,
        profile_points,
        subsampled_tuning_epsilon,
    )

    epsilon = validate.finite_positive("epsilon", epsilon)
    validate.probability("delta", delta, open_left=True, open_right=True)
    final_noise_overhead = validate.non_negative("final_noise_overhead", final_noise_overhead)
    retries = validate.integer("retries", retries, minimum=0)
    nearest = [0]  # the index of the best δ point so far: evaluations read its neighbours

    def tuning_points(sigma_tuning: float) -> list[tuple[float, float]]:
        plan = tuning_plan_for(sigma_tuning).curve()
        curve = repeat_and_select(plan, law, generic=generic)
        return profile_points(curve + retries * plan if retries else curve)

    def final_pld(sigma: float) -> Any:
        return dpsgd_run_pld(final_plan_for(sigma), discretization=CALIBRATION_DISCRETIZATION)

    def at_point(point: tuple[float, float], final: Any) -> float:
        return subsampled_tuning_epsilon(
            [point], sample_rate=sample_rate, final_run=final, delta=delta, discretization=CALIBRATION_DISCRETIZATION
        )

    def whole(points: list[tuple[float, float]], final: Any) -> float:
        around = points[max(0, nearest[0] - 2) : nearest[0] + 3]
        values = [at_point(point, final) for point in around]
        best = min(range(len(values)), key=values.__getitem__)
        nearest[0] = points.index(around[best])
        return values[best]

    reach = f"No final run σ meets ε = {epsilon} at δ = {delta} beside this tuning."
    alone = _least_noise(  # the yardstick: one untuned run alone
        lambda sigma: float(final_pld(sigma).get_epsilon_for_delta(delta)),
        epsilon=epsilon,
        rtol=1e-2,
        out_of_reach=reach,
    )
    sigma_final = (1.0 + final_noise_overhead) * alone
    final = final_pld(sigma_final)
    first = tuning_points(1.0)
    nearest[0] = min(range(len(TUNING_DELTAS)), key=lambda i: at_point(first[i], final))
    sigma_tuning = _least_noise(
        lambda sigma: whole(tuning_points(sigma), final),
        epsilon=epsilon,
        rtol=1e-2,
        out_of_reach=f"No tuning noise up to {MAX_NOISE_MULTIPLIER:g} leaves the final run σ = {sigma_final:.4g}.",
    )
    points = tuning_points(sigma_tuning)
    sigma_final = _least_noise(  # between one run alone (too little) and the held σ_B (enough, up to rounding)
        lambda sigma: whole(points, final_pld(sigma)),
        epsilon=epsilon,
        rtol=rtol,
        out_of_reach=reach,
        start=(alone, sigma_final),
    )
    return sigma_tuning, sigma_final


def one_run_noise_multiplier(
    plan_for: Callable[[float], TrialSpend], *, epsilon: float, delta: float, rtol: float = 1e-3
) -> float:
    """The smallest σ (to ``rtol``) at which one DP-SGD run of ``plan_for(σ)``, untuned, meets (``epsilon``, ``delta``).

    Read from the run's pessimistic privacy loss distribution (dp_accounting), the yardstick of
    :func:`calibrate_subsampled_tuning`'s split.

    Raises:
        PrivacyError: no σ up to MAX_NOISE_MULTIPLIER meets it.
    """
    from ray_dptune.accounting.bounds.subsampled_tuning import dpsgd_run_pld

    def alone(sigma: float) -> float:
        return float(dpsgd_run_pld(plan_for(sigma)).get_epsilon_for_delta(delta))

    return _least_noise(
        alone,
        epsilon=epsilon,
        rtol=rtol,
        out_of_reach=f"One run alone cannot meet ε = {epsilon} at δ = {delta} with σ up to {MAX_NOISE_MULTIPLIER:g}.",
    )


def _least_noise(
    spent: Callable[[float], float],
    *,
    epsilon: float,
    rtol: float,
    out_of_reach: str,
    start: tuple[float, float] = (0.5, 1.0),
) -> float:
    """The smallest σ (to ``rtol``, the safe end) with ``spent(σ) <= epsilon``; ``spent`` non-increasing in σ.

    ``start`` is the first bracket tried (a guess: it is widened until its ends fail and meet).

    Raises:
        PrivacyError: ``out_of_reach``, when no σ up to MAX_NOISE_MULTIPLIER meets it.
    """
    low, high = start
    while spent(high) > epsilon:
        low, high = high, high * 2.0
        if high > MAX_NOISE_MULTIPLIER:
            raise PrivacyError(out_of_reach)
    while spent(low) <= epsilon and low > 1e-3:
        low, high = low / 2.0, low
    while high - low > rtol * high:
        middle = 0.5 * (low + high)
        if spent(middle) <= epsilon:
            high = middle
        else:
            low = middle
    return high
