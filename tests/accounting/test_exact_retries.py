"""Exact ground truth for a random-count search whose failed trials are retried: why it is refused.

The base mechanism has three ordered outputs, [failed, low, high], with laws P on a
dataset and P' on a neighbour. K ~ Poisson(μ) trials run; Tune re-runs a trial whose
attempt failed, at most ``max_failures`` times, and a retry past the search's
``reserved`` retries is refused (the search then releases nothing). The best last
attempt is released; 'failed' ranks last and is never released; with ``count_shown``
the number of retries is published too (as a receipt that lists attempts does).
Its exact output law is enumerated at 50 digits (K up to where the Poisson tail is below
1e-45) and its exact ε(δ) compared with:

- the rule a retry would need without this refusal: the selection bound plus every
  reserved retry composed at the plan, which is *below* the truth (the cases below:
  4.025 and 5.591 against 3.995);
- the search with no retry, which the selection bound covers (and which is what
  :func:`ray_dptune.tune.guard.check_retries` leaves: ``max_failures=0``).
"""

from __future__ import annotations

import pytest
from test_exact_audit import LAWS, MP, ORDERS, Pair, base_curve, best_of_k_law, symmetric_renyi, true_epsilon

from ray_dptune import RandomCountSearcher
from ray_dptune.accounting import RDPCurve, repeat_and_select
from ray_dptune.accounting.bookkeeping.search_mechanism import SearchMechanism
from ray_dptune.accounting.bounds.distributions import PointMass, Poisson

DELTA = 1e-5
TAIL = MP.mpf("1e-45")

REFUSED = ("refused",)


def poisson_weights(mean: float) -> list:
    """P[K = k] for k = 0.. until the remaining tail is below TAIL."""
    mu, weights, total, k = MP.mpf(mean), [], MP.zero, 0
    while 1 - total > TAIL:
        weights.append(MP.exp(-mu) * mu**k / MP.factorial(k))
        total += weights[-1]
        k += 1
    return weights


def one_trial(p: tuple, max_failures: int) -> dict:
    """(retries used, last attempt's output) -> probability, for a trial re-run while it fails."""
    fail, outcomes = p[0], {}
    for retries in range(max_failures + 1):
        for output in (1, 2):
            outcomes[(retries, output)] = fail**retries * p[output]
    outcomes[(max_failures, 0)] = fail ** (max_failures + 1)
    return outcomes


def released_law(p: tuple, *, mean: float, max_failures: int, reserved: int, count_shown: bool) -> dict:
    """The exact law of what an observer sees: the released output (None: nothing) and, if shown, the retries."""
    trial = one_trial(p, max_failures)
    state = {(0, 0): MP.one}  # (retries so far, capped at reserved + 1; best output so far) -> probability
    seen: dict = {}
    for weight in poisson_weights(mean):
        for (retries, best), mass in state.items():
            if retries > reserved:
                key = REFUSED
            else:
                key = (best if best else None, retries if count_shown else None)
            seen[key] = seen.get(key, MP.zero) + weight * mass
        following: dict = {}
        for (retries, best), mass in state.items():
            for (used, output), chance in trial.items():
                key = (min(retries + used, reserved + 1), max(best, output))
                following[key] = following.get(key, MP.zero) + mass * chance
        state = following
    return seen


def exact_epsilon(p: tuple, q: tuple, **procedure) -> float:
    a, b = released_law(p, **procedure), released_law(q, **procedure)
    keys = sorted(set(a) | set(b), key=repr)
    return true_epsilon([a.get(k, MP.zero) for k in keys], [b.get(k, MP.zero) for k in keys], DELTA)


def pair_of(p: list, q: list) -> Pair:
    return Pair("retry-base", tuple(MP.mpf(str(x)) for x in p), tuple(MP.mpf(str(x)) for x in q))


def randomized_response_on_failure(epsilon0: float) -> Pair:
    """'failed' with probability e^ε0 / (1 + e^ε0) on one dataset and 1 / (1 + e^ε0) on the other."""
    t = MP.exp(MP.mpf(epsilon0))
    return Pair("rr-failure", (t / (1 + t), MP.zero, 1 / (1 + t)), (1 / (1 + t), MP.zero, t / (1 + t)))


CASES = {
    # base on x / on x', Poisson mean, max_failures a trial, retries reserved for the search
    "default-reservation": (pair_of([0.1, 0.1, 0.8], [0.25, 0.25, 0.5]), 1.0, 3, 3),
    "one-retry-three-reserved": (pair_of([0.1, 0.1, 0.8], [0.25, 0.25, 0.5]), 1.0, 1, 3),
    "randomized-response": (randomized_response_on_failure(0.5), 1.0, 1, 2),
}


def selection_plus_reserved(pair: Pair, mean: float, reserved: int) -> float:
    """What composing each reserved retry at the plan beside the selection bound would state."""
    plan = base_curve(pair)
    return (repeat_and_select(plan, Poisson(mean=mean)) + reserved * plan).epsilon(delta=DELTA)


def test_the_enumeration_is_a_probability_law_and_matches_best_of_k_without_retries():
    pair = CASES["default-reservation"][0]
    law = released_law(pair.p, mean=1.0, max_failures=2, reserved=4, count_shown=True)
    assert abs(MP.fsum(law.values()) - 1) < MP.mpf("1e-40")
    plain = released_law(pair.p, mean=1.0, max_failures=0, reserved=0, count_shown=True)
    # no retry: released high iff some run is high: 1 - f(P[not high]) with f the Poisson PGF
    high = 1 - MP.exp(MP.mpf(1.0) * (1 - pair.p[2] - 1))
    assert abs(plain[(2, 0)] - high) < MP.mpf("1e-40")


@pytest.mark.parametrize("case", list(CASES))
def test_retries_reveal_more_than_the_selection_bound_plus_the_reserved_retries_states(case):
    """The teeth: composing the reserved retries beside the selection bound is optimistic, count shown."""
    pair, mean, max_failures, reserved = CASES[case]
    truth = exact_epsilon(pair.p, pair.q, mean=mean, max_failures=max_failures, reserved=reserved, count_shown=True)
    stated = selection_plus_reserved(pair, mean, reserved)
    assert truth > stated, (case, truth, stated)


def test_the_exact_figures_of_the_first_cases():
    pair, mean, _, reserved = CASES["default-reservation"]
    shown = exact_epsilon(pair.p, pair.q, mean=mean, max_failures=3, reserved=reserved, count_shown=True)
    assert shown == pytest.approx(4.025, abs=5e-4)
    shown = exact_epsilon(pair.p, pair.q, mean=mean, max_failures=1, reserved=3, count_shown=True)
    assert shown == pytest.approx(5.591, abs=5e-4)
    assert selection_plus_reserved(pair, mean, reserved) == pytest.approx(3.995, abs=1e-3)


@pytest.mark.parametrize("case", list(CASES))
def test_without_retries_the_selection_bound_covers_the_release(case):
    """max_failures = 0, what a random-count search now requires: a failure is an output, ranked last."""
    pair, mean, _, _ = CASES[case]
    truth = exact_epsilon(pair.p, pair.q, mean=mean, max_failures=0, reserved=0, count_shown=True)
    stated = repeat_and_select(base_curve(pair), Poisson(mean=mean)).epsilon(delta=DELTA)
    assert truth <= stated


@pytest.mark.parametrize("case", list(CASES))
def test_up_to_m_plus_1_runs_a_trial_inside_the_selection_covers_the_release_with_the_count_hidden(case):
    """A sound price for retries, not offered yet: each trial as one run of 'retry while it fails, m + 1 at most'.

    That run is an adaptive composition of at most m + 1 attempts post-processed to the last one's
    output, so it satisfies (m + 1)·plan, and the selection bound over it covers the best of K with the
    retries and K hidden (no reservation: every trial may retry m times).
    """
    pair, mean, max_failures, _ = CASES[case]
    truth = exact_epsilon(pair.p, pair.q, mean=mean, max_failures=max_failures, reserved=10**6, count_shown=False)
    stated = repeat_and_select((max_failures + 1) * base_curve(pair), Poisson(mean=mean)).epsilon(delta=DELTA)
    assert truth <= stated, (case, truth, stated)


def test_a_random_count_search_refuses_retries_and_composed_searches_state_every_retry_they_allow():
    law = Poisson(mean=1.0)
    assert not SearchMechanism.random_count(law=law, num_trials=3).allows_retries
    assert SearchMechanism.composition().allows_retries
    overhead = SearchMechanism.constant_overhead(epsilon_round=0.1, max_rounds=3)
    assert overhead.allows_retries
    assert [overhead.retry_reserve(m) for m in (0, 1, 3, -1)] == [0, 1, 3, None]  # the final training's retries
    assert SearchMechanism.composition().retry_reserve(2) is None  # any number of trials: no fixed reserve
    assert SearchMechanism.halving(budget_units=3, max_t=3).retry_reserve(2) == 0  # units pay for them


def test_the_callback_states_tune_s_retries_from_the_start():
    from ray_dptune import ConstantOverheadSearcher, PrivacyAccountantCallback, PrivacyError, TrialSpend

    plan = TrialSpend(sample_rate=0.05, noise_multiplier=1.5, steps=40)
    searcher = ConstantOverheadSearcher([{"lr": 0.1}, {"lr": 0.2}], partitions=2, epsilon_round=0.1, granularity=0.05)
    accountant = PrivacyAccountantCallback(searcher, delta=DELTA, plan=plan, verbose=False)
    before = accountant.account.guarantee().epsilon
    accountant._reserve_tune_retries(2)  # what setup does with the experiment's FailureConfig(max_failures=2)
    assert accountant.account.reserved_reruns == 2
    assert accountant.account.guarantee().epsilon == accountant.account.guarantee(extra_charges=2).epsilon > before
    accountant.account.apply({"type": "started", "trial_id": "final", "accounted": True})
    accountant.account.apply({"type": "failed", "trial_id": "final", "retry": True})  # a retry: charged
    assert accountant.account.guarantee().epsilon == accountant.account.guarantee(extra_charges=1).epsilon
    random_count = PrivacyAccountantCallback(RandomCountSearcher(PointMass(2), seed=0), delta=DELTA, plan=plan)
    with pytest.raises(PrivacyError, match="Leave max_failures at 0"):
        random_count._reserve_tune_retries(1)


def test_the_retried_trial_s_exact_rdp_is_within_m_plus_1_plans():
    """The per-trial run 'retry while it fails' itself: its exact divergence against (m + 1)·plan."""
    pair = CASES["default-reservation"][0]
    for max_failures in (1, 2, 3):
        p = [MP.fsum(v for (_, o), v in one_trial(pair.p, max_failures).items() if o == out) for out in range(3)]
        q = [MP.fsum(v for (_, o), v in one_trial(pair.q, max_failures).items() if o == out) for out in range(3)]
        exact = RDPCurve(ORDERS, symmetric_renyi(p, q))
        assert all(exact.epsilons <= (max_failures + 1) * base_curve(pair).epsilons)


def retried_run(p: tuple, max_failures: int) -> tuple:
    """The law of one trial's last output when it is re-run while it fails, m + 1 times at most."""
    outcomes = one_trial(p, max_failures)
    return tuple(MP.fsum(v for (_, output), v in outcomes.items() if output == wanted) for wanted in range(3))


@pytest.mark.parametrize(
    "law_name", ["poisson-0.5", "poisson-10", "tnb-eta-0.5-mean2", "tnb-eta0-mean10", "tnb-eta1-mean2", "pointmass-4"]
)
def test_m_plus_1_runs_inside_the_selection_cover_every_law_family(law_name):
    """Each law family, 0-2 retries a trial, K and the retries hidden: best of K retried runs ('failed'
    ranked last, the K = 0 atom kept apart: a finer view than what is released) within the selection
    bound over (m + 1)·plan."""
    law = LAWS[law_name]
    for case, (pair, _, _, _) in CASES.items():
        for max_failures in (0, 1, 2):
            a = best_of_k_law(retried_run(pair.p, max_failures), law)
            b = best_of_k_law(retried_run(pair.q, max_failures), law)
            truth = true_epsilon(a, b, DELTA)
            stated = repeat_and_select((max_failures + 1) * base_curve(pair), law).epsilon(delta=DELTA)
            assert truth <= stated, (law_name, case, max_failures, truth, stated)


@pytest.mark.parametrize("law_name", ["poisson-0.5", "tnb-eta0-mean10", "pointmass-4"])
def test_the_bound_over_one_plan_ignoring_the_retries_is_below_the_truth(law_name):
    """The teeth of the test above: a selection bound that forgets the retries fails it."""
    law, pair = LAWS[law_name], CASES["randomized-response"][0]
    a, b = (best_of_k_law(retried_run(p, 2), law) for p in (pair.p, pair.q))
    assert true_epsilon(a, b, DELTA) > repeat_and_select(base_curve(pair), law).epsilon(delta=DELTA)
