"""Constant-overhead DP tuning (Ding et al., Algorithm 1): the SVT math and the Tune searcher.

Oracles: hand-worked step sequences and Lemma 1's count in the non-randomised world
(Definition 5); brute-force maxima of that count; the exact output law of one round,
integrated numerically over the threshold noise with closed-form Laplace CDFs inside,
against e^ε (Dwork & Roth Thm 3.23) and against the code by Monte Carlo; the closed
form T·min(ε, αε²/2) + plan of the search's RDP curve; a real Tune run for the callback.
"""

import itertools
import json
import math
import os
import pickle

import numpy as np
import pytest
from ray import tune
from scipy import integrate

from ray_dptune import PrivacyAccountantCallback, PrivacyError, TrialSpend, UnsupportedBoundError
from ray_dptune.accounting.bounds.svt import (
    NON_RANDOMIZED,
    SVTParams,
    default_max_rounds,
    noiseless_rounds,
    run_svt,
    svt_curve,
    svt_round,
    worst_case_noiseless_rounds,
)
from ray_dptune.accounting.curves.rdp import RDPCurve
from ray_dptune.result_keys import PARTITION_KEY
from ray_dptune.search.constant_overhead import ConstantOverheadSearcher
from ray_dptune.search.space import expand_candidates

DYADIC_G = 1.0 / 1024  # exact in binary: levels u0 + g·L compare without rounding


def trace(utilities, params, *, rounds=10_000):
    """(step tested, candidate that passed or None) of every round without noise."""
    level, step, steps = 0, 1, []
    while step and len(steps) < rounds:
        outcome = svt_round(np.asarray(utilities, dtype=float), level, step, params, NON_RANDOMIZED)
        steps.append((step, outcome.chosen))
        level, step = outcome.level, outcome.step
    return steps, level


def brute_noiseless(target):
    """Rounds of Definition 5's loop when a round passes iff level + step <= target."""
    level, step, rounds = 0, 1, 0
    while step:
        rounds += 1
        if level + step <= target:
            level, step = level + step, 2 * step
        else:
            step //= 2
    return rounds


# ---------------------------------------------------------------------- the non-randomised world (Lemma 1)


def test_hand_worked_sequence_u0_0_g_01():
    # u = [0.35, 0.8], g = 0.1: candidate 0 passes at 0.1 and 0.3, candidate 1 at 0.7 and 0.8.
    params = SVTParams(partitions=1, epsilon=1.0, granularity=0.1)
    steps, level = trace([0.35, 0.8], params)
    assert steps == [(1, 0), (2, 0), (4, 1), (8, None), (4, None), (2, None), (1, 1), (2, None), (1, None)]
    assert level == 8  # u = 0.8 = max u_s
    result = run_svt([0.35, 0.8], params, max_rounds=100, rng=NON_RANDOMIZED)
    assert (result.chosen, result.rounds, result.cap_hit, result.level, result.step) == (1, 9, False, 8, 0)
    assert noiseless_rounds(8) == 9  # 8 = 2^3 - 1 + 1: j = 3, m = 1


def test_binary_decomposition_case_of_lemma_1():
    # L* = 2^3 - 1 + n', n' = 5 = 0b101: j = 3 doubling passes, then per one-bit of n' a pass and a fail.
    params = SVTParams(partitions=1, epsilon=1.0, granularity=DYADIC_G)
    steps, level = trace([12.5 * DYADIC_G], params)
    assert [step for step, _ in steps] == [1, 2, 4, 8, 4, 8, 4, 2, 1, 2, 1]
    assert [chosen is not None for _, chosen in steps] == [1, 1, 1, 0, 1, 0, 0, 0, 1, 0, 0]
    assert level == 12
    # Lemma 1's proof counts 2m + 2k = 10; halving 2^k down to 0 takes k + 1 rounds, not k.
    assert len(steps) == 2 * 2 + 2 * 3 + 1 == noiseless_rounds(12)


@pytest.mark.parametrize("j", range(8))
def test_lemma_1_count_is_2m_plus_2k_plus_1(j):
    for remainder in range(2**j):
        target = 2**j - 1 + remainder
        expected = 2 * (remainder).bit_count() + 2 * j + 1
        assert noiseless_rounds(target) == brute_noiseless(target) == expected


def test_the_loop_matches_the_count_for_every_level():
    params = SVTParams(partitions=3, epsilon=1.0, granularity=DYADIC_G)
    for target in range(400):
        utilities = [0.1 * DYADIC_G, (target + 0.5) * DYADIC_G, 0.0]
        result = run_svt(utilities, params, max_rounds=1000, rng=NON_RANDOMIZED)
        assert (result.rounds, result.level, result.cap_hit) == (noiseless_rounds(target), target, False)
        assert result.chosen == (None if target == 0 else 1)


def test_worst_case_closed_form_is_the_brute_force_maximum():
    for n in [*range(2, 400), 1023, 1024, 5000]:
        params = SVTParams(partitions=1, epsilon=1.0, granularity=1.0 / n)  # grid size n (n + 1 if 1/(1/n) > n)
        assert worst_case_noiseless_rounds(params) == max(brute_noiseless(t) for t in range(params.grid_size + 1))


@pytest.mark.parametrize("u0", [0.0, 0.3, 0.5, 0.9, 0.99])
@pytest.mark.parametrize("g", [0.5, 0.1, 0.07, 0.01, 0.003])
def test_default_cap_covers_every_noiseless_run(u0, g):
    params = SVTParams(partitions=1, epsilon=1.0, granularity=g, initial_utility=u0)
    worst = worst_case_noiseless_rounds(params)
    assert default_max_rounds(params) == 2 * worst
    for best in np.append(np.linspace(u0, 1.0, 101), [1.0, u0 + g, u0 + 2 * g - 1e-12]):
        best = min(best, 1.0)
        result = run_svt([0.0, best], params, max_rounds=10**6, rng=NON_RANDOMIZED)
        assert result.rounds <= worst, (u0, g, best)


def test_default_cap_numbers_for_documented_settings():
    assert [
        worst_case_noiseless_rounds(SVTParams(partitions=1, epsilon=1.0, granularity=g))
        for g in (0.1, 0.05, 0.01, 0.001)
    ] == [11, 13, 23, 35]
    assert default_max_rounds(SVTParams(partitions=5, epsilon=0.2, granularity=0.01)) == 46


@pytest.mark.parametrize("bad", [[-0.1, 0.5], [0.5, 1.1], [0.5, 1.5], [0.5, math.nan], [], [[0.5]]])
def test_utilities_outside_the_unit_interval_are_refused(bad):
    """Lemma 2's sensitivity 1/k holds only for utilities in [0, 1]: anything else is refused."""
    params = SVTParams(partitions=2, epsilon=1.0, granularity=0.1)
    with pytest.raises(ValueError, match="utilities must"):
        run_svt(bad, params, max_rounds=5, rng=NON_RANDOMIZED)


def test_the_ends_of_the_unit_interval_and_the_levels_are_accepted():
    params = SVTParams(partitions=2, epsilon=1.0, granularity=DYADIC_G, initial_utility=0.5)
    assert run_svt([0.0, 1.0], params, max_rounds=50, rng=NON_RANDOMIZED).chosen == 1
    assert params.utility(2000) == 0.5 + 2000 * DYADIC_G  # a level past 1 is a finite utility
    assert params.utility(2**1100) == math.inf  # past any double
    with pytest.raises(ValueError, match="step"):
        svt_round(np.array([0.5]), 0, 0, params, NON_RANDOMIZED)  # step 0 ends the loop: no round


def test_the_cap_stops_the_loop():
    params = SVTParams(partitions=1, epsilon=1.0, granularity=DYADIC_G)
    full = run_svt([12.5 * DYADIC_G], params, max_rounds=100, rng=NON_RANDOMIZED)
    assert full.rounds == 11 and not full.cap_hit
    capped = run_svt([12.5 * DYADIC_G], params, max_rounds=5, rng=NON_RANDOMIZED)
    assert (capped.rounds, capped.cap_hit, capped.level, capped.step, capped.chosen) == (5, True, 11, 8, 0)
    exact = run_svt([12.5 * DYADIC_G], params, max_rounds=11, rng=NON_RANDOMIZED)
    assert exact.rounds == 11 and not exact.cap_hit


def test_noise_runs_past_the_noiseless_count_and_the_cap_holds():
    params = SVTParams(partitions=2, epsilon=0.2, granularity=0.01)  # kε = 0.4: very noisy
    rng = np.random.default_rng(0)
    rounds = [run_svt([0.5, 0.7], params, max_rounds=30, rng=rng).rounds for _ in range(200)]
    assert max(rounds) == 30  # the cap binds ...
    assert all(r <= 30 for r in rounds)  # ... and is never exceeded


def test_documented_rationale_same_choice_as_uncapped_in_most_runs():
    # default_max_rounds' docstring: with kε = 5 the capped loop ends on the uncapped s* in ≥ 97% of runs.
    params = SVTParams(partitions=5, epsilon=1.0, granularity=0.01)
    cap = default_max_rounds(params)
    rng = np.random.default_rng(12)
    agree = 0
    runs = 300
    for _ in range(runs):
        utilities = rng.uniform(0.0, 1.0, 6)
        state = rng.bit_generator.state
        uncapped = run_svt(utilities, params, max_rounds=10**6, rng=rng)
        rng.bit_generator.state = state  # the same noise, cut at the cap
        capped = run_svt(utilities, params, max_rounds=cap, rng=rng)
        rng.bit_generator.state = state
        run_svt(utilities, params, max_rounds=10**6, rng=rng)  # leave the stream after the uncapped run
        agree += capped.chosen == uncapped.chosen
    assert agree / runs >= 0.95


# ---------------------------------------------------------------------- privacy of one round, exactly


def _laplace_cdf(x, scale):
    return 0.5 * math.exp(x / scale) if x < 0 else 1.0 - 0.5 * math.exp(-x / scale)


def round_law(utilities, threshold, threshold_scale, query_scale):
    """P[candidate j passes first] for each j, then P[none passes]: one AboveThreshold round.

    P[j] = ∫ Lap(z; b1) ∏_{s<j} F(t + z - u_s) (1 - F(t + z - u_j)) dz, with F the CDF of
    Lap(b2) (a query passes when u_s + ν_s >= t + z); P[none] = ∫ Lap(z; b1) ∏_s F(t + z - u_s) dz.
    """
    kinks = sorted({0.0, *(u - threshold for u in utilities)})
    edges = [-math.inf, *kinks, math.inf]

    def density(z):
        return math.exp(-abs(z) / threshold_scale) / (2 * threshold_scale)

    def integrand(z, j):
        below = [_laplace_cdf(threshold + z - u, query_scale) for u in utilities]
        if j is None:
            return density(z) * math.prod(below)
        return density(z) * math.prod(below[:j]) * (1.0 - below[j])

    law = []
    for j in [*range(len(utilities)), None]:
        law.append(
            sum(
                integrate.quad(integrand, a, b, args=(j,), epsabs=0.0, epsrel=1e-11, limit=200)[0]
                for a, b in itertools.pairwise(edges)
            )
        )
    return np.array(law)


def worst_log_ratio(params, bases, thresholds, noise_factor=1.0):
    """max |log P_D[o] - log P_D'[o]| over outputs o and neighbours (each u_s moved by 0 or ±1/k)."""
    delta = params.sensitivity
    b1, b2 = noise_factor * params.threshold_scale, noise_factor * params.query_scale
    worst = 0.0
    for base in bases:
        for threshold in thresholds:
            law = round_law(base, threshold, b1, b2)
            assert law.sum() == pytest.approx(1.0, abs=1e-9)
            for shift in itertools.product([-delta, 0.0, delta], repeat=len(base)):
                other = round_law(list(np.add(base, shift)), threshold, b1, b2)
                worst = max(worst, float(np.max(np.abs(np.log(law) - np.log(other)))))
    return worst


ROUND = SVTParams(partitions=4, epsilon=1.0, granularity=0.1)
BASES = [[0.5, 0.5, 0.5], [0.3, 0.6]]
THRESHOLDS = [0.2, 0.6]


def test_one_round_is_epsilon_dp_exactly_and_not_loosely():
    worst = worst_log_ratio(ROUND, BASES, THRESHOLDS)
    assert worst <= ROUND.epsilon * (1 + 1e-7)  # Dwork & Roth Thm 3.23
    assert worst >= ROUND.epsilon / 2  # the adversarial pair gets close: the check can fail


def test_halving_the_noise_breaks_epsilon_dp():
    assert worst_log_ratio(ROUND, BASES[:1], THRESHOLDS[:1], noise_factor=0.5) > ROUND.epsilon


def test_the_code_draws_the_law_that_was_checked():
    params = SVTParams(partitions=4, epsilon=1.0, granularity=0.1)
    utilities, level, step = np.array([0.3, 0.6, 0.45]), 2, 3  # threshold u0 + g·(level + step) = 0.5
    law = round_law(list(utilities), 0.5, params.threshold_scale, params.query_scale)
    rng = np.random.default_rng(3)
    draws = 20_000
    counts = np.zeros(4)
    for _ in range(draws):
        outcome = svt_round(utilities, level, step, params, rng)
        counts[3 if outcome.chosen is None else outcome.chosen] += 1
        assert (outcome.level, outcome.step) == ((5, 6) if outcome.chosen is not None else (2, 1))
    sigma = np.sqrt(law * (1 - law) / draws)
    assert np.all(np.abs(counts / draws - law) <= 5 * sigma)


# ---------------------------------------------------------------------- accounting


def test_the_mechanism_is_t_max_pure_rounds_plus_the_plan():
    plan = TrialSpend(sample_rate=0.05, noise_multiplier=1.5, steps=40).curve()
    searcher = ConstantOverheadSearcher(
        [{"lr": 0.1}, {"lr": 1.0}], partitions=5, epsilon_round=0.05, granularity=0.01, metric="acc", seed=0
    )
    assert searcher.max_rounds == 46
    curve = searcher.privacy_mechanism().selection_curve(plan)
    alpha, eps = plan.orders, 0.05
    np.testing.assert_allclose(curve.epsilons, 46 * np.minimum(eps, alpha * eps**2 / 2) + plan.epsilons, rtol=1e-15)
    assert np.array_equal(curve.orders, plan.orders)
    assert curve == svt_curve(epsilon=0.05, rounds=46, orders=plan.orders) + plan


def test_pure_rounds_convert_below_basic_composition():
    # The RDP route never loses much against basic composition T·ε (the D_∞ bound) ...
    for eps, rounds in [(0.05, 46), (0.5, 22), (1.0, 3)]:
        assert svt_curve(epsilon=eps, rounds=rounds).epsilon(delta=1e-6) <= rounds * eps * 1.001
    # ... and wins by advanced-composition-like savings for many small rounds.
    assert svt_curve(epsilon=0.01, rounds=1000).epsilon(delta=1e-6) < 0.5 * 1000 * 0.01


def test_accounting_uses_t_max_not_the_rounds_used():
    searcher = drive(ConstantOverheadSearcher(CANDIDATES, metric="acc", seed=1, **SETTINGS), ACCURACIES)
    details = searcher.privacy_details()
    assert details["rounds_used"] < details["max_rounds"]
    plan = RDPCurve.zero()
    assert searcher.privacy_mechanism().selection_curve(plan) == svt_curve(
        epsilon=SETTINGS["epsilon_round"], rounds=searcher.max_rounds
    )


# ---------------------------------------------------------------------- the searcher, without Ray

CANDIDATES = [{"lr": lr, "clip": clip} for lr in (0.1, 0.5, 2.0) for clip in (0.5, 2.0)]
SETTINGS = {"partitions": 3, "epsilon_round": 1e6, "granularity": DYADIC_G * 16}  # ε huge: ~noiseless


def accuracy_of(config):
    """A fake accuracy: best at lr = 0.5, clip = 2.0; the partitions differ a little."""
    base = {0.1: 0.3, 0.5: 0.7, 2.0: 0.5}[config["lr"]] + (0.05 if config["clip"] == 2.0 else 0.0)
    return base + 0.01 * config[PARTITION_KEY]["index"]


ACCURACIES = accuracy_of


def drive(searcher, accuracy=accuracy_of, *, stop_after=None, errors=()):
    """Suggests until the searcher waits or finishes, completing partition trials with fake results."""
    suggested = []
    while True:
        config = searcher.suggest(f"trial_{len(suggested)}")
        if config is None or config == ConstantOverheadSearcher.FINISHED:
            break
        suggested.append((f"trial_{len(suggested)}", config))
    for count, (trial_id, config) in enumerate(suggested):
        if stop_after is not None and count >= stop_after:
            break
        if PARTITION_KEY in config:
            if trial_id in errors:
                searcher.on_trial_complete(trial_id, error=True)
            else:
                searcher.on_trial_complete(trial_id, {"acc": accuracy(config), "epoch": 3})
    return searcher


def expected_choice(accuracy, failed=(), k=3):
    means = []
    for s, candidate in enumerate(CANDIDATES):
        values = [0.0 if (s, i) in failed else accuracy({**candidate, PARTITION_KEY: {"index": i}}) for i in range(k)]
        means.append(sum(values) / k)
    params = SVTParams(partitions=k, epsilon=1.0, granularity=SETTINGS["granularity"])
    return run_svt(means, params, max_rounds=1000, rng=NON_RANDOMIZED).chosen


def test_suggestions_wait_for_the_partitions_then_train_the_choice_once():
    searcher = ConstantOverheadSearcher(CANDIDATES, metric="acc", seed=0, **SETTINGS)
    assert searcher.num_trials == 6 * 3 + 1
    configs = [searcher.suggest(f"p{n}") for n in range(18)]
    for n, config in enumerate(configs):
        s, i = divmod(n, 3)
        assert config == {**CANDIDATES[s], PARTITION_KEY: {"index": i, "count": 3, "private": False}}
        assert not searcher.accounts_trial(config)
    assert searcher.suggest("early") is None  # waits for the partition trials
    for n, config in enumerate(configs[:-1]):
        searcher.on_trial_complete(f"p{n}", {"acc": accuracy_of(config)})
    assert searcher.suggest("early") is None
    assert searcher.privacy_details()["rounds_used"] is None
    searcher.on_trial_complete("p17", {"acc": accuracy_of(configs[17])})
    final = searcher.suggest("final")
    assert final == CANDIDATES[expected_choice(accuracy_of)] == {"lr": 0.5, "clip": 2.0}
    assert searcher.accounts_trial(final) and PARTITION_KEY not in final
    assert searcher.suggest("after") == ConstantOverheadSearcher.FINISHED
    searcher.on_trial_complete("final", {"acc": 0.9})
    details = searcher.privacy_details()
    assert details["released_trial_id"] == "final"
    assert details["selected_index"] == details["chosen_index"] == 3 and not details["fallback_used"]


def test_private_partitions_flag_reaches_the_trials():
    searcher = ConstantOverheadSearcher(CANDIDATES, metric="acc", private_partitions=True, **SETTINGS)
    assert searcher.suggest("a")[PARTITION_KEY]["private"] is True
    assert searcher.privacy_details()["partition_trials_private"] is True


def test_a_failed_partition_trial_counts_as_zero():
    # Candidate 3 is best; failing two of its three parts drops its mean below candidate 5's.
    searcher = ConstantOverheadSearcher(CANDIDATES, metric="acc", seed=0, **SETTINGS)
    drive(searcher, errors=("trial_9", "trial_10"))
    final = searcher.suggest("final")
    chosen = expected_choice(accuracy_of, failed={(3, 0), (3, 1)})
    assert chosen != 3 and final == CANDIDATES[chosen]


def test_no_candidate_passes_uses_the_fallback():
    searcher = ConstantOverheadSearcher(CANDIDATES, metric="acc", fallback=4, **SETTINGS)
    drive(searcher, lambda config: 0.0)
    assert searcher.suggest("final") == CANDIDATES[4]
    details = searcher.privacy_details()
    assert details["chosen_index"] is None and details["fallback_used"] and details["selected_index"] == 4


def test_repeated_and_foreign_events_change_nothing():
    searcher = ConstantOverheadSearcher(CANDIDATES, metric="acc", seed=0, **SETTINGS)
    config = searcher.suggest("a")
    searcher.on_trial_complete("a", None)  # removed before running: wait for the real completion
    searcher.on_trial_complete("unknown", {"acc": 0.5})
    searcher.on_trial_complete("a", {"acc": accuracy_of(config)})
    searcher.on_trial_complete("a", {"acc": 2.0})  # a repeated event is ignored, not checked
    assert searcher.get_state()["accuracies"] == {(0, 0): accuracy_of(config)}


def test_details_are_json_and_hold_no_utilities():
    searcher = drive(ConstantOverheadSearcher(CANDIDATES, metric="acc", seed=0, **SETTINGS), lambda c: 0.123456)
    searcher.suggest("final")
    text = json.dumps(searcher.privacy_details())
    assert "0.123456" not in text
    details = json.loads(text)
    assert details["max_rounds"] == default_max_rounds(
        SVTParams(partitions=3, epsilon=1e6, granularity=SETTINGS["granularity"])
    )
    assert details["max_rounds_source"].startswith("default: 2 ×")
    assert details["partition_trials"] == 18 and details["num_candidates"] == 6
    assert details["seed"] == 0


@pytest.mark.parametrize("seed", [None, 5])
def test_state_restores_mid_search_and_continues_exactly(tmp_path, seed):
    settings = {**SETTINGS, "epsilon_round": 2.0}  # real noise: the generator's state matters
    original = ConstantOverheadSearcher(CANDIDATES, metric="acc", seed=seed, **settings)
    drive(original, stop_after=10)
    path = os.path.join(tmp_path, "searcher.pkl")
    original.save(path)
    restored = ConstantOverheadSearcher([{"other": 1}], partitions=1, epsilon_round=1.0, granularity=0.5)
    restored.restore(path)
    assert pickle.loads(pickle.dumps(original.get_state())) == restored.get_state()
    assert restored.num_trials == original.num_trials
    for searcher in (original, restored):  # the same remaining trials, completions and noise
        for n in range(10, 18):
            config = searcher.get_state()["suggested"][f"trial_{n}"]
            s, i = config
            searcher.on_trial_complete(
                f"trial_{n}", {"acc": accuracy_of({**CANDIDATES[s], PARTITION_KEY: {"index": i}})}
            )
    assert original.suggest("final") == restored.suggest("final")
    assert original.privacy_details() == restored.privacy_details()


def test_space_expands_to_a_deterministic_cartesian_product():
    space = {"lr": tune.grid_search([0.1, 1.0]), "model": {"width": tune.choice([8, 16, 32])}, "epochs": 3}
    assert expand_candidates(space) == [
        {"epochs": 3, "lr": lr, "model": {"width": width}} for lr in (0.1, 1.0) for width in (8, 16, 32)
    ]
    searcher = ConstantOverheadSearcher(space, partitions=2, epsilon_round=0.1, granularity=0.05)
    assert searcher.num_trials == 6 * 2 + 1


@pytest.mark.parametrize(
    "space", [{"lr": tune.loguniform(1e-3, 1)}, {"lr": tune.randint(1, 4)}, {"x": tune.sample_from(lambda _: 1)}]
)
def test_a_space_that_is_not_finite_is_refused(space):
    with pytest.raises(ValueError, match="finite candidate set"):
        ConstantOverheadSearcher(space, partitions=2, epsilon_round=0.1, granularity=0.05)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"partitions": 0}, "partitions"),
        ({"partitions": 2.5}, "partitions"),
        ({"epsilon_round": 0.0}, "epsilon"),
        ({"epsilon_round": -1.0}, "epsilon"),
        ({"epsilon_round": math.inf}, "epsilon"),
        ({"granularity": 0.0}, "granularity"),
        ({"granularity": 1.0}, "granularity"),
        ({"initial_utility": 1.0}, "initial_utility"),
        ({"initial_utility": -0.1}, "initial_utility"),
        ({"max_rounds": 0}, "max_rounds"),
        ({"mode": "min"}, "mode must be 'max'"),
        ({"fallback": 6}, "fallback"),
    ],
    ids=lambda value: str(value),
)
def test_bad_settings_are_refused(kwargs, match):
    with pytest.raises(ValueError, match=match):
        ConstantOverheadSearcher(CANDIDATES, **{**SETTINGS, **kwargs})


def test_bad_candidates_are_refused():
    with pytest.raises(ValueError, match="empty"):
        ConstantOverheadSearcher([], **SETTINGS)
    with pytest.raises(ValueError, match="must not set 'dp_partition'"):
        ConstantOverheadSearcher([{"lr": 1, PARTITION_KEY: {}}], **SETTINGS)
    with pytest.raises(ValueError, match="finite"):
        ConstantOverheadSearcher([{"lr": tune.uniform(0, 1)}], **SETTINGS)
    with pytest.raises(TypeError, match="list of config dicts"):
        ConstantOverheadSearcher("lr", **SETTINGS)


def test_tune_settings_are_checked():
    searcher = ConstantOverheadSearcher(CANDIDATES, **SETTINGS)
    with pytest.raises(ValueError, match="mode must be 'max'"):
        searcher.set_search_properties("acc", "min", {})
    with pytest.raises(PrivacyError, match="num_samples=-1"):  # the accountant refuses before any trial
        PrivacyAccountantCallback(searcher, delta=1e-5, verbose=False).setup(num_samples=10)
    assert searcher.set_search_properties("acc", "max", {"epochs": 3}, num_samples=-1) is False
    assert searcher.metric == "acc"


@pytest.mark.parametrize("value", [1.5, -0.01, float("nan"), None, "0.5", True])
def test_a_metric_outside_0_1_stops_the_search(value):
    searcher = ConstantOverheadSearcher(CANDIDATES, metric="acc", **SETTINGS)
    searcher.suggest("a")
    searcher.suggest("b")
    with pytest.raises(UnsupportedBoundError, match=r"accuracy in \[0, 1\]"):
        searcher.on_trial_complete("a", {"acc": value})
    with pytest.raises(UnsupportedBoundError, match="Lemma 2"):  # Tune swallows the first: suggest repeats it
        searcher.suggest("c")
    searcher.on_trial_complete("b", {"acc": 0.5})  # ignored once refused
    assert isinstance(UnsupportedBoundError("x"), ValueError)


def test_a_missing_metric_name_is_explained():
    searcher = ConstantOverheadSearcher(CANDIDATES, **SETTINGS)
    searcher.suggest("a")
    with pytest.raises(UnsupportedBoundError, match="no metric"):
        searcher.on_trial_complete("a", {"acc": 0.5})


# ---------------------------------------------------------------------- a real Tune run

PLAN = TrialSpend(sample_rate=0.05, noise_multiplier=1.5, steps=40)
TUNE_CANDIDATES = [{"x": x} for x in (0.3, 0.8)]


def fake_constant_overhead_trainable(config):
    """Partition trials: two reports of an accuracy, no plan; the final trial: DP-SGD spend records."""
    partition = config.get(PARTITION_KEY)
    if partition is not None:
        for epoch in (1, 2):
            tune.report({"acc": config["x"] * epoch / 2 + 0.01 * partition["index"], "epoch": epoch})
        return
    for epoch in range(1, 5):
        spent = TrialSpend(sample_rate=PLAN.sample_rate, noise_multiplier=PLAN.noise_multiplier, steps=10 * epoch)
        tune.report({"acc": config["x"], "dp_plan": PLAN.to_dict(), "dp_spent": spent.to_dict()})


@pytest.mark.usefixtures("ray_session")
def test_end_to_end_in_tune(tmp_path):
    """Under private_tune_config's guard, screening trials (no plan) run to their last report."""
    from ray_dptune import private_tune_config, release_best
    from ray_dptune.records.report import REPORT_FILE

    delta = 1e-5
    searcher = ConstantOverheadSearcher(
        TUNE_CANDIDATES, partitions=2, epsilon_round=5.0, granularity=0.05, metric="acc", seed=3
    )
    callback = PrivacyAccountantCallback(searcher, delta=delta, plan=PLAN, verbose=False)
    tuner = tune.Tuner(
        fake_constant_overhead_trainable,
        tune_config=private_tune_config(searcher, max_concurrent_trials=2, reuse_actors=True),
        run_config=tune.RunConfig(name="co", storage_path=str(tmp_path), callbacks=[callback], verbose=0),
    )
    results = tuner.fit()
    assert len(results) == 2 * 2 + 1
    with open(os.path.join(results.experiment_path, REPORT_FILE)) as file:
        report = json.load(file)
    expected = (svt_curve(epsilon=5.0, rounds=searcher.max_rounds, orders=PLAN.curve().orders) + PLAN.curve()).epsilon(
        delta=delta
    )
    assert report["guarantee"]["epsilon"] == pytest.approx(expected, rel=1e-12)
    assert report["guarantee"]["charged_attempts"] == 0
    assert len(report["unaccounted_trials"]) == 4
    details = report["details"]
    assert details["rounds_used"] <= details["max_rounds"] == searcher.max_rounds
    # Each partition trial ran both of its reports: the searcher saw the last one (x, not x / 2).
    assert searcher.get_state()["accuracies"][(1, 1)] == pytest.approx(0.81)
    released = release_best(results)
    assert PARTITION_KEY not in released.config
    assert released.config["x"] == TUNE_CANDIDATES[searcher.selected_index]["x"]
    assert released.guarantee["epsilon"] == report["guarantee"]["epsilon"]
