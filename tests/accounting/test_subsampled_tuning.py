"""Tuning on a Poisson sample, then one final run on all the data: the bound against the exact truth.

The truth is enumerated on small finite mechanisms: a tuning T whose output depends on the
number of ones in its Poisson sample (an exponential mechanism, the best of two draws), and a
final run B chosen from T's output (randomized response on a threshold T picked). For each
case, δ(ε) of the whole procedure is the exact hockey-stick divergence between neighbouring
data sets D and D ∪ {x}, both directions, worst over D; its ε at δ must never exceed the bound.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from ray_dptune import Poisson, TrialSpend, repeat_and_select
from ray_dptune.accounting.bounds import subsampled_tuning
from ray_dptune.accounting.bounds.subsampled_tuning import (
    PLD_DISCRETIZATION,
    amplified,
    subsampled_search_epsilon,
    subsampled_tuning_epsilon,
)


def hockey_stick(first: np.ndarray, second: np.ndarray, epsilon: float) -> float:
    return float(np.maximum(first - math.exp(epsilon) * second, 0.0).sum())


def both_ways(first: np.ndarray, second: np.ndarray, epsilon: float) -> float:
    return max(hockey_stick(first, second, epsilon), hockey_stick(second, first, epsilon))


def epsilon_at(deltas_of, delta: float) -> float:
    """The least ε with δ(ε) <= delta, by bisection on a non-increasing δ(ε) (to 1e-9)."""
    low, high = 0.0, 1.0
    while deltas_of(high) > delta:
        low, high = high, 2.0 * high
    while high - low > 1e-9:
        middle = 0.5 * (low + high)
        low, high = (middle, high) if deltas_of(middle) > delta else (low, middle)
    return high


class Case:
    """n records, the tuning's exponential mechanism at ε0 (best of ``draws``), the final run's RR at ε_B."""

    def __init__(self, rng: np.random.Generator):
        self.n = int(rng.integers(2, 6))
        self.p = float(rng.uniform(0.05, 0.7))
        self.epsilon_base = float(rng.uniform(0.3, 3.0))
        self.epsilon_final = float(rng.uniform(0.2, 2.0))
        self.draws = int(rng.integers(1, 3))
        self.outputs = int(rng.integers(2, 4))
        self.thresholds = rng.integers(0, self.n + 2, size=self.outputs)
        self.delta = float(rng.choice([1e-2, 1e-3, 1e-5]))
        self.tuning = np.array([self._tuning_law(k) for k in range(self.n + 2)])  # by the ones in the sample

    def _tuning_law(self, ones: int) -> np.ndarray:
        """Best of ``draws`` exponential-mechanism draws by their (data-dependent) utility −|t − ones|, ties to the
        lowest t: the best of several runs, as a random-count search releases."""
        weights = np.exp(-self.epsilon_base / 2.0 * np.abs(np.arange(self.outputs) - ones))
        base = weights / weights.sum()
        score = -np.abs(np.arange(self.outputs) - ones)
        order = np.lexsort((np.arange(self.outputs), -score))  # best first
        law = np.zeros(self.outputs)
        below = 0.0  # P(a draw is worse than t)
        for t in order[::-1]:
            law[t] = (below + base[t]) ** self.draws - below**self.draws
            below += base[t]
        return law

    def tuning_profile(self) -> list[tuple[float, float]]:
        """(ε, δ_T(ε)) of the tuning on its sample, exact: worst over neighbouring samples (k vs k + 1 ones)."""
        ratios = np.log(self.tuning[:-1]) - np.log(self.tuning[1:])
        pure = float(np.abs(ratios).max()) * (1 + 1e-12)  # its δ is 0: the grid's last point
        points = []
        for epsilon in np.linspace(0.0, pure, 60):
            delta = max(both_ways(self.tuning[k], self.tuning[k + 1], epsilon) for k in range(self.n + 1))
            points.append((float(epsilon), min(1.0, delta * (1 + 1e-12) + 1e-15)))
        return points

    def procedure(self, ones: int) -> np.ndarray:
        """P(t, y) of the whole procedure on a data set with ``ones`` ones (zeros change nothing)."""
        sample = stats.binom.pmf(np.arange(ones + 1), ones, self.p)
        tuning = sample @ self.tuning[: ones + 1]
        keep = math.exp(self.epsilon_final) / (1.0 + math.exp(self.epsilon_final))
        joint = np.zeros((self.outputs, 2))
        for t in range(self.outputs):
            bit = int(ones >= self.thresholds[t])
            joint[t, bit] = tuning[t] * keep
            joint[t, 1 - bit] = tuning[t] * (1.0 - keep)
        return joint.ravel()

    def exact_delta(self, epsilon: float) -> float:
        return max(both_ways(self.procedure(c), self.procedure(c + 1), epsilon) for c in range(self.n + 1))

    def exact_epsilon(self) -> float:
        return epsilon_at(self.exact_delta, self.delta)

    def final_run(self):
        from dp_accounting.pld.common import DifferentialPrivacyParameters
        from dp_accounting.pld.privacy_loss_distribution import from_privacy_parameters

        return from_privacy_parameters(
            DifferentialPrivacyParameters(self.epsilon_final, 0.0), value_discretization_interval=PLD_DISCRETIZATION
        )

    def bound(self) -> float:
        return subsampled_tuning_epsilon(
            self.tuning_profile(), sample_rate=self.p, final_run=self.final_run(), delta=self.delta
        )


CASES = [Case(np.random.default_rng(seed)) for seed in range(60)]


def test_the_bound_is_never_below_the_exact_epsilon_of_the_whole_procedure():
    for case in CASES:
        exact, bound = case.exact_epsilon(), case.bound()
        assert bound >= exact, (vars(case), bound, exact)


def test_the_sample_s_amplification_is_what_the_bound_gains():
    """Without amplification (the tuning on all the data) the same route states more, in every case."""
    for case in CASES:
        unsampled = subsampled_tuning_epsilon(
            case.tuning_profile(), sample_rate=1.0, final_run=case.final_run(), delta=case.delta
        )
        assert case.bound() < unsampled


def mutant_falls_below(monkeypatch, mutant) -> bool:
    """True when the bound with ``amplified`` replaced by ``mutant`` is below the truth in some case."""
    monkeypatch.setattr(subsampled_tuning, "amplified", mutant)
    return any(case.bound() < case.exact_epsilon() * (1 - 1e-9) for case in CASES)


def test_an_amplification_that_understates_fails_the_truth(monkeypatch):
    linear = lambda *, epsilon, delta, sample_rate: (sample_rate * epsilon, sample_rate * delta)
    assert mutant_falls_below(monkeypatch, linear)


def test_delta_amplified_twice_fails_the_truth(monkeypatch):
    def squared(*, epsilon, delta, sample_rate):
        return amplified(epsilon=epsilon, delta=delta * sample_rate, sample_rate=sample_rate)

    assert mutant_falls_below(monkeypatch, squared)


def test_leaving_out_the_final_run_fails_the_truth():
    from dp_accounting.pld.common import DifferentialPrivacyParameters
    from dp_accounting.pld.privacy_loss_distribution import from_privacy_parameters

    nothing = from_privacy_parameters(DifferentialPrivacyParameters(0.0, 0.0), PLD_DISCRETIZATION)
    below = [
        subsampled_tuning_epsilon(case.tuning_profile(), sample_rate=case.p, final_run=nothing, delta=case.delta)
        < case.exact_epsilon() * (1 - 1e-9)
        for case in CASES
    ]
    assert any(below)


@pytest.mark.parametrize("epsilon", [0.0, 0.1, 1.0, 5.0, 50.0, 800.0])
@pytest.mark.parametrize("rate", [0.0, 1e-6, 0.1, 0.7, 1.0])
def test_amplification_rounds_up_and_never_exceeds_the_unsampled_mechanism(epsilon, rate):
    from mpmath import mp, mpf

    mp.dps = 50
    epsilon_amplified, delta_amplified = amplified(epsilon=epsilon, delta=1e-6, sample_rate=rate)
    truth = mp.log(1 + mpf(rate) * mp.expm1(mpf(epsilon)))
    assert epsilon_amplified >= truth and epsilon_amplified <= epsilon
    assert delta_amplified >= mpf(rate) * mpf(1e-6) and delta_amplified <= 1e-6
    if 0 < rate < 1 and 0 < epsilon < 700:
        assert epsilon_amplified <= truth * (1 + 1e-14)


def test_tuning_on_a_tenth_leaves_the_final_run_nearly_the_whole_budget():
    """Digits' plan (1 437 records, batch 64, 9 epochs): Poisson(8) on a 10 % sample at σ_T = 3, then one run."""
    steps = 9 * (1437 // 64)
    tuning = repeat_and_select(TrialSpend(sample_rate=64 / 1437, noise_multiplier=3.0, steps=steps).curve(), Poisson(8))
    final = TrialSpend(sample_rate=64 / 1437, noise_multiplier=1.26, steps=steps)
    whole = subsampled_search_epsilon(tuning_curve=tuning, sample_rate=0.1, final_plan=final, delta=1e-5)
    alone = final.curve().mechanism.epsilon(delta=1e-5)
    assert alone < whole <= 3.0 and whole - alone < 0.25


def test_a_point_past_what_a_double_holds_is_skipped_and_the_others_still_bound():
    from dp_accounting.pld.common import DifferentialPrivacyParameters
    from dp_accounting.pld.privacy_loss_distribution import from_privacy_parameters

    final = from_privacy_parameters(DifferentialPrivacyParameters(0.5, 0.0), PLD_DISCRETIZATION)
    with_huge = subsampled_tuning_epsilon([(720.0, 1e-14), (1.0, 1e-9)], sample_rate=1.0, final_run=final, delta=1e-5)
    alone = subsampled_tuning_epsilon([(1.0, 1e-9)], sample_rate=1.0, final_run=final, delta=1e-5)
    assert with_huge == alone and 1.49 < alone <= 1.5  # two pure pairs, ε 1 and 0.5, at δ = 1e-5
