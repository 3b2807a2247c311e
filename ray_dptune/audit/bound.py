"""The one-run audit's lower bound on ε (Steinke, Nasr & Jagielski 2023, Theorem 3).

m canaries are each included in the training data independently with probability ½; an
auditor who sees only the trained output guesses "in" or "out" for r of them and abstains
on the rest. If the training is (ε, δ)-DP with respect to each canary, Theorem 3 bounds the
number W of correct guesses: for every v,

    P[W ≥ v] ≤ f(v) + 2mδ · max_{1≤i≤m} (f(v − i) − f(v)) / i,

where f(v) = P[Binomial(r, e^ε / (1 + e^ε)) ≥ v] (f is 1 at v ≤ 0, so the maximum is
reached at some i ≤ v). Observing v correct guesses therefore rejects "(ε, δ)-DP" at
level p(ε); the audit's ε_lower is the largest ε rejected at ``1 − confidence``. The
bound is a *lower* bound: its safe side is the smaller ε, so the root is taken from below.
"""

from __future__ import annotations

import math

import numpy as np
from scipy import optimize, stats

__all__ = ["DEFAULT_CONFIDENCE", "one_run_epsilon_lower", "one_run_p_value"]

DEFAULT_CONFIDENCE = 0.95
_EPSILON_CEILING = 50.0  # beyond any ε a DP search reports; p(ε) is monotone in ε up to it
_ROOT_TOLERANCE = 1e-12


def one_run_p_value(*, canaries: int, guesses: int, correct: int, epsilon: float, delta: float) -> float:
    """P[W ≥ ``correct``] bounded under (``epsilon``, ``delta``)-DP: Theorem 3's right side, capped at 1.

    Args:
        canaries: m, the canaries each included with probability ½.
        guesses: r ≤ m, the canaries the auditor guessed on (the rest abstained).
        correct: v ≤ r, the correct guesses.
        epsilon: ε ≥ 0 of the null hypothesis.
        delta: δ ∈ [0, 1] of the null hypothesis.

    Raises:
        ValueError: counts not 0 ≤ v ≤ r ≤ m, or ε, δ out of range.
    """
    _check_counts(canaries, guesses, correct)
    if not (math.isfinite(epsilon) and epsilon >= 0):
        raise ValueError(f"epsilon must be a finite number >= 0, got {epsilon!r}.")
    if not 0 <= delta <= 1:
        raise ValueError(f"delta must lie in [0, 1], got {delta!r}.")
    accuracy = 1.0 / (1.0 + math.exp(-epsilon))  # ε-DP randomized response's accuracy
    tail = float(stats.binom.sf(correct - 1, guesses, accuracy))  # f(v)
    if delta == 0 or correct == 0:
        return min(tail, 1.0)
    # f(v − i) − f(v) = P[v − i ≤ Binomial < v], summed from the top for i = 1..v.
    below = stats.binom.pmf(np.arange(correct - 1, -1, -1), guesses, accuracy)
    steps = np.cumsum(below) / np.arange(1, correct + 1)
    return min(tail + 2.0 * canaries * delta * float(steps.max()), 1.0)


def one_run_epsilon_lower(
    *, canaries: int, guesses: int, correct: int, delta: float, confidence: float = DEFAULT_CONFIDENCE
) -> float:
    """The largest ε that ``correct`` of ``guesses`` rejects at level ``1 − confidence`` (0 when none is).

    With probability at least ``confidence`` over the canaries' inclusion, an (ε, δ)-DP
    training gives a value at most ε (Theorem 3 of Steinke, Nasr & Jagielski 2023).

    Raises:
        ValueError: invalid counts, δ or confidence.
    """
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must lie strictly between 0 and 1, got {confidence!r}.")
    level = 1.0 - confidence

    def excess(epsilon: float) -> float:
        return (
            one_run_p_value(canaries=canaries, guesses=guesses, correct=correct, epsilon=epsilon, delta=delta) - level
        )

    if excess(0.0) > 0:
        return 0.0
    if excess(_EPSILON_CEILING) <= 0:
        return _EPSILON_CEILING
    root = optimize.brentq(excess, 0.0, _EPSILON_CEILING, xtol=_ROOT_TOLERANCE)
    while root > 0 and excess(root) > 0:  # the lower side of the root: never above what is rejected
        root = max(root - _ROOT_TOLERANCE * max(root, 1.0), 0.0)
    return float(root)


def _check_counts(canaries: int, guesses: int, correct: int) -> None:
    for name, value in (("canaries", canaries), ("guesses", guesses), ("correct", correct)):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 0:
            raise ValueError(f"{name} must be an int >= 0, got {value!r}.")
    if not correct <= guesses <= canaries:
        raise ValueError(
            f"The counts need 0 <= correct <= guesses <= canaries, got correct={correct}, guesses={guesses}, "
            f"canaries={canaries}."
        )
