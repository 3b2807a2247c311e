"""Noise multiplier that meets a target (ε, δ) for a whole search, not one run."""

from __future__ import annotations

from collections.abc import Callable

from ray_dptune import validate
from ray_dptune.accounting.bookkeeping.account import SearchAccount
from ray_dptune.accounting.bookkeeping.search_mechanism import SearchMechanism
from ray_dptune.accounting.bookkeeping.spend import TrialSpend
from ray_dptune.accounting.bounds.distributions import RunCountDistribution
from ray_dptune.errors import PrivacyError

__all__ = ["MAX_NOISE_MULTIPLIER", "calibrate_noise_multiplier", "search_epsilon"]

MAX_NOISE_MULTIPLIER = 1e4
"""The largest σ the calibration tries before it declares the budget out of reach."""


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

    low, high = 0.5, 1.0
    while spent(high) > epsilon:
        low, high = high, high * 2.0
        if high > MAX_NOISE_MULTIPLIER:
            raise PrivacyError(
                f"No noise multiplier up to {MAX_NOISE_MULTIPLIER:g} meets ε = {epsilon} at δ = {delta} for this "
                "search: the score releases or the adaptivity cost log(C/c) alone exceed it. Raise the target, "
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
