"""TrialSpend records and noise calibration for a whole search."""

import numpy as np
import pytest

from ray_dptune import PointMass, Poisson, PrivacyError, TrialSpend, TruncatedNegativeBinomial
from ray_dptune.accounting import RDPCurve
from ray_dptune.accounting.bookkeeping.calibrate import calibrate_noise_multiplier, search_epsilon
from ray_dptune.accounting.bookkeeping.search_mechanism import SearchMechanism
from ray_dptune.accounting.bookkeeping.spend import covering_curve, curve_from_report, report_covers
from ray_dptune.accounting.curves.profiles import subsampled_gaussian_profile


def test_spend_curve_composes_training_and_noisy_scores():
    spend = TrialSpend(sample_rate=0.02, noise_multiplier=1.1, steps=300, score_noise_multiplier=5.0, score_releases=3)
    expected = RDPCurve.subsampled_gaussian(sample_rate=0.02, noise_multiplier=1.1, steps=300) + 3 * RDPCurve.gaussian(
        noise_multiplier=5.0
    )
    np.testing.assert_allclose(spend.curve().epsilons, expected.epsilons)
    assert TrialSpend.from_dict(spend.to_dict()) == spend
    assert curve_from_report(spend.to_dict()) == spend.curve()
    assert curve_from_report(RDPCurve.gaussian(noise_multiplier=2.0).to_dict()) == RDPCurve.gaussian(
        noise_multiplier=2.0
    )


def test_repeated_runs_compose_every_part_of_a_spend():
    """``repeated(k)``: k runs one after another, their training steps and their score releases (a halving unit)."""
    one = TrialSpend(sample_rate=0.02, noise_multiplier=1.1, steps=30, score_noise_multiplier=4.0, score_releases=2)
    three = one.repeated(3)
    assert (three.steps, three.score_releases) == (90, 6)
    composed = (3 * one.curve()).epsilon(delta=1e-5)  # RDP composition; the 90-step curve is read separately
    assert three.curve().epsilon(delta=1e-5) == pytest.approx(composed, rel=1e-3)


def test_covers_compares_what_a_trial_may_spend():
    plan = TrialSpend(sample_rate=0.02, noise_multiplier=1.1, steps=300, score_noise_multiplier=5.0, score_releases=3)
    assert plan.covers(
        TrialSpend(sample_rate=0.02, noise_multiplier=1.1, steps=120, score_noise_multiplier=5.0, score_releases=1)
    )
    assert not plan.covers(
        TrialSpend(sample_rate=0.02, noise_multiplier=1.1, steps=301, score_noise_multiplier=5.0, score_releases=3)
    )
    assert not plan.covers(
        TrialSpend(sample_rate=0.02, noise_multiplier=1.1, steps=300, score_noise_multiplier=5.0, score_releases=4)
    )
    assert plan.covers(
        TrialSpend(sample_rate=0.02, noise_multiplier=2.0, steps=300)
    )  # more noise, no scores: fewer ε at every order
    assert not TrialSpend(sample_rate=0.02, noise_multiplier=2.0, steps=300).covers(
        TrialSpend(sample_rate=0.02, noise_multiplier=1.1, steps=300)
    )


@pytest.mark.parametrize(
    "record, message",
    [
        ({"kind": "dpsgd", "sample_rate": 2.0, "noise_multiplier": 1.0, "steps": 1}, "sample_rate"),
        ({"kind": "dpsgd", "sample_rate": 0.1, "noise_multiplier": 1.0, "steps": -1}, "steps"),
        (
            {"kind": "dpsgd", "sample_rate": 0.1, "noise_multiplier": 1.0, "steps": 1, "score_releases": 2},
            "score_noise",
        ),
        ({"kind": "dpsgd", "sample_rate": 0.1}, "Malformed"),
        ({"kind": "other"}, "kind='dpsgd'"),
        ("text", "kind='dpsgd'"),
    ],
)
def test_malformed_spend_records_raise(record, message):
    with pytest.raises(ValueError, match=message):
        TrialSpend.from_dict(record)


def dpsgd(q: float, steps: int, **scores):
    """The plan factory of a DP-SGD trial with sample rate q and ``steps`` steps."""
    return lambda sigma: TrialSpend(sample_rate=q, noise_multiplier=sigma, steps=steps, **scores)


def test_calibration_of_a_short_plan_meets_the_target_and_no_less_noise_does():
    """The fast tier's check (mutation runs use it): the bracket and bisection end on the safe side, close."""
    target, delta, plan_for = 2.0, 1e-5, dpsgd(0.05, 10)
    sigma = calibrate_noise_multiplier(plan_for, epsilon=target, delta=delta, law=PointMass(1), generic=False)
    assert search_epsilon(plan_for(sigma), law=PointMass(1), delta=delta, generic=False) <= target
    assert search_epsilon(plan_for(sigma * (1 - 2e-3)), law=PointMass(1), delta=delta, generic=False) > target


@pytest.mark.slow
@pytest.mark.parametrize("law", [Poisson(8.0), TruncatedNegativeBinomial.from_mean(0.5, 8.0), PointMass(1)], ids=repr)
def test_calibration_meets_the_target_on_the_safe_side(law):
    target, delta, plan_for = 3.0, 1e-5, dpsgd(64 / 1437, 336)
    sigma = calibrate_noise_multiplier(plan_for, epsilon=target, delta=delta, law=law, rtol=1e-3)
    assert search_epsilon(plan_for(sigma), law=law, delta=delta) <= target
    assert search_epsilon(plan_for(sigma * (1 - 2e-3)), law=law, delta=delta) > target


@pytest.mark.slow
def test_calibration_with_a_mechanism_equals_the_law_it_declares():
    law, plan_for = TruncatedNegativeBinomial.from_mean(1.0, 8.0), dpsgd(0.02, 200)
    mechanism = SearchMechanism.random_count(law=law, num_trials=5, density_ratio=2.0)
    by_mechanism = calibrate_noise_multiplier(plan_for, epsilon=4.0, delta=1e-6, mechanism=mechanism)
    by_law = calibrate_noise_multiplier(plan_for, epsilon=4.0, delta=1e-6, law=law, density_ratio=2.0)
    assert by_mechanism == by_law
    assert by_law > calibrate_noise_multiplier(plan_for, epsilon=4.0, delta=1e-6, law=law)  # adaptivity costs noise


@pytest.mark.slow
def test_calibration_matches_the_anchor_and_opacus_for_one_run():
    """ANCHORS: total ε = 3 over Poisson(8) trials needs σ ≈ 2.49 (dp_accounting's bound)."""
    sigma = calibrate_noise_multiplier(dpsgd(64 / 1437, 336), epsilon=3.0, delta=1e-5, law=Poisson(8.0))
    assert sigma <= 2.49 * 1.01
    get_noise_multiplier = pytest.importorskip("opacus.accountants.utils").get_noise_multiplier
    theirs = get_noise_multiplier(
        target_epsilon=3.0, target_delta=1e-5, sample_rate=64 / 1437, steps=336, accountant="rdp"
    )
    ours = calibrate_noise_multiplier(dpsgd(64 / 1437, 336), epsilon=3.0, delta=1e-5, law=PointMass(1))
    assert ours <= theirs * 1.01  # at least as tight as Opacus for one run (denser orders)
    assert ours == pytest.approx(theirs, rel=0.05)


@pytest.mark.slow
def test_unreachable_target_or_bad_input_raises_before_any_search():
    noisy_scores = dpsgd(0.01, 100, score_noise_multiplier=0.5, score_releases=10)
    with pytest.raises(PrivacyError, match="score releases"):
        calibrate_noise_multiplier(noisy_scores, epsilon=0.1, delta=1e-5, law=Poisson(8.0))
    with pytest.raises(ValueError, match="epsilon must be a finite number > 0"):
        calibrate_noise_multiplier(dpsgd(0.01, 100), epsilon=-1.0, delta=1e-5, law=Poisson(8.0))
    with pytest.raises(ValueError, match="delta must be > 0 and < 1"):
        calibrate_noise_multiplier(dpsgd(0.01, 100), epsilon=1.0, delta=1.0, law=Poisson(8.0))
    with pytest.raises(ValueError, match="exactly one of law= .* and mechanism="):
        calibrate_noise_multiplier(dpsgd(0.01, 100), epsilon=1.0, delta=1e-5)
    with pytest.raises(TypeError, match="plan_for"):
        calibrate_noise_multiplier(2.0, epsilon=1.0, delta=1e-5, law=Poisson(8.0))


@pytest.mark.slow
def test_a_dpsgd_plan_covers_only_what_its_exact_tradeoff_provably_bounds():
    """The bounds use the plan's exact profile; RDP domination alone does not imply it."""
    plan = TrialSpend(sample_rate=0.01, noise_multiplier=1.0, steps=100)
    assert plan.covers(TrialSpend(sample_rate=0.005, noise_multiplier=1.5, steps=60))  # a post-processing
    larger_rate = TrialSpend(sample_rate=0.02, noise_multiplier=2.0, steps=100)
    assert plan.curve().dominates(larger_rate.curve()) and not plan.covers(larger_rate)
    # A pure-DP trial (randomized response) whose RDP the plan dominates, yet whose δ(0) is larger.
    curve = plan.curve()  # computed once: the plan's RDP curve is a value
    pure = max(
        e for e in np.linspace(1e-3, 1.0, 1000) if curve.dominates(RDPCurve.pure(epsilon=e, orders=curve.orders))
    )
    response = RDPCurve.pure(epsilon=pure, orders=curve.orders)
    plan_delta_at_zero = float(
        subsampled_gaussian_profile(sample_rate=0.01, noise_multiplier=1.0, steps=100)(np.array([0.0]))[0]
    )
    assert np.tanh(pure / 2) > plan_delta_at_zero  # randomized response's exact δ(0) = (e^ε − 1)/(e^ε + 1)
    assert not report_covers(plan.to_dict(), response.to_dict())
    with_scores = TrialSpend(
        sample_rate=0.01, noise_multiplier=1.0, steps=100, score_noise_multiplier=5.0, score_releases=2
    )
    assert report_covers(with_scores.to_dict(), response.to_dict())  # that plan is bounded by its RDP alone


def test_the_covering_curve_of_a_plan_and_a_longer_run_is_the_longer_run_with_its_mechanism():
    plan = TrialSpend(sample_rate=0.02, noise_multiplier=1.2, steps=100)
    longer = TrialSpend(sample_rate=0.02, noise_multiplier=1.2, steps=150)
    covering = covering_curve([plan.to_dict(), longer.to_dict()])
    assert covering == longer.curve() and covering.mechanism == longer.curve().mechanism


def test_the_covering_curve_of_runs_neither_covers_bounds_both_at_every_order_and_drops_the_mechanism():
    plan = TrialSpend(sample_rate=0.02, noise_multiplier=1.2, steps=100)
    other = TrialSpend(sample_rate=0.05, noise_multiplier=2.0, steps=60)  # larger q, more noise
    covering = covering_curve([plan.to_dict(), other.to_dict()])
    assert covering.mechanism is None
    for record in (plan, other):
        assert covering.dominates(record.curve())
    at = covering.orders
    assert np.all(covering.epsilons == np.maximum(plan.curve().at(at), other.curve().at(at)))
