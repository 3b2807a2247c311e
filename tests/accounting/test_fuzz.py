"""Fuzzing the math's public entry points with edge values (0, -1, ±inf, nan, 1e-300, 1e300, ...).

Every call either returns values with no NaN (an RDP curve's ε(α) included) or raises
a ValueError or PrivacyError whose message names one of the call's arguments. Never an
OverflowError, ZeroDivisionError, AssertionError, FloatingPointError, a TypeError from
inside numpy, nor a RuntimeWarning (turned into an error here).

Under CI (``CI`` set) the examples are the same every run, so that a failure there can be
reproduced; elsewhere each run draws new ones (how the overflow at (α − 1)ε ≈ 1e308 was found).
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
import warnings
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ray_dptune.accounting import (
    RDPCurve,
    gaussian_profile,
    generic_repeat_and_select,
    repeat_and_select,
    subsampled_gaussian_profile,
)
from ray_dptune.accounting.bookkeeping.spend import TrialSpend
from ray_dptune.accounting.bounds import dpbo_bounds as vr
from ray_dptune.accounting.bounds import information_gain as ig
from ray_dptune.accounting.bounds import svt
from ray_dptune.accounting.bounds.distributions import (
    Geometric,
    Logarithmic,
    PointMass,
    Poisson,
    TruncatedNegativeBinomial,
    distribution_from_dict,
    secure_rng,
)
from ray_dptune.accounting.bounds.lemma7.generic import add_no_run_atom
from ray_dptune.accounting.bounds.selection import poisson_bound, truncated_negative_binomial_bound
from ray_dptune.errors import PrivacyError

EDGES = (0, 0.0, -1, -1.0, math.inf, -math.inf, math.nan, 1e-300, 1e300)
EDGE = st.sampled_from(EDGES)
REAL = st.one_of(EDGE, st.floats(), st.floats(1e-3, 1e3))
UNIT = st.one_of(EDGE, st.floats(0.0, 1.0))
COUNT = st.one_of(EDGE, st.integers(-3, 100), st.integers(), st.just(10**400))
INT = st.one_of(st.integers(-3, 100), st.integers(), st.just(10**400))
SMALL_COUNT = st.one_of(EDGE, st.integers(-3, 30), st.just(10**400))
VECTOR = st.lists(REAL, min_size=0, max_size=4)

LAWS = (
    Poisson(3.0),
    Poisson(1e-300),
    TruncatedNegativeBinomial(0.5, 0.1),
    TruncatedNegativeBinomial.from_mean(-0.9, 10.0),
    TruncatedNegativeBinomial.from_mean(1000.0, 1e6),
    Logarithmic(0.2),
    Geometric(0.1),
    Geometric.from_mean(1e6),
    PointMass(3),
)
LAW = st.sampled_from(LAWS)
ORDERS = np.array([1.5, 2.0, 8.0, 64.0])

settings.register_profile("ci", derandomize=True)
if os.environ.get("CI"):
    settings.load_profile("ci")


def _names_in(message: str, names: tuple[str, ...]) -> bool:
    return any(re.search(rf"(?<![A-Za-z_]){re.escape(name)}(?![A-Za-z_])", message) for name in names)


def assert_no_nan(value: Any) -> None:
    """No NaN anywhere in a float, an array, an RDP curve, a dataclass, a dict or a sequence."""
    if isinstance(value, RDPCurve):
        value = (value.orders, value.epsilons)
    elif dataclasses.is_dataclass(value) and not isinstance(value, type):
        value = dataclasses.asdict(value)
    if isinstance(value, dict):
        value = list(value.values())
    if isinstance(value, (list, tuple)):
        for item in value:
            assert_no_nan(item)
    elif isinstance(value, (float, np.floating, np.ndarray)):
        assert not np.any(np.isnan(value)), f"NaN returned: {value!r}"


def attempt(call: Callable[..., Any], args: dict[str, Any]) -> Any:
    """``call(**args)``: its result (no NaN), or None after a ValueError/PrivacyError naming an argument."""
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        try:
            result = call(**args)
        except (ValueError, PrivacyError) as error:
            names = tuple(args)
            assert _names_in(str(error), names), f"{type(error).__name__} names none of {names}: {error}"
            return None
    assert_no_nan(result)
    return result


# ---------------------------------------------------------------------- what each entry point does


def exercise_law(law):
    """Every public read of a law at valid inputs."""
    x = np.array([0.0, 0.3, 1.0])
    values = [law.mean, law.prob_zero, law.pmf([0, 1, 2]), law.pgf(x), law.log_pgf_derivative(x)]
    values += [law.pgf_derivative(x), law.expected_quantile(), law.success_probability(0.5), law.to_dict()]
    assert distribution_from_dict(law.to_dict()) == law
    if law.mean <= 1e4:
        assert law.sample(0) >= 0
    return values


def exercise_curve(curve):
    return [curve, curve.epsilon(delta=1e-6), curve.delta(epsilon=1.0), curve + curve, 3 * curve, curve.smoothed()]


def law_method(method: str) -> Callable[..., Any]:
    return lambda law, x: getattr(law, method)(x)


def profile_at(make_profile: Callable[..., Any]) -> Callable[..., Any]:
    def call(epsilon, **kwargs):
        return make_profile(**kwargs)(np.array([epsilon]))

    return call


def svt_everything(partitions, epsilon, granularity, initial_utility):
    params = svt.SVTParams(
        partitions=partitions, epsilon=epsilon, granularity=granularity, initial_utility=initial_utility
    )
    rounds = svt.default_max_rounds(params)
    result = svt.run_svt([0.2, 0.9], params, max_rounds=min(rounds, 200), rng=np.random.default_rng(0))
    return [params.to_dict(), params.query_scale, rounds, svt.worst_case_noiseless_rounds(params), result.to_dict()]


def spend_curve(sample_rate, noise_multiplier, steps, score_noise_multiplier, score_releases):
    spend = TrialSpend(
        sample_rate=sample_rate,
        noise_multiplier=noise_multiplier,
        steps=steps,
        score_noise_multiplier=score_noise_multiplier,
        score_releases=score_releases,
    )
    return [spend.to_dict(), TrialSpend.from_dict(spend.to_dict()) == spend, spend.curve(ORDERS)]


@dataclasses.dataclass(frozen=True)
class Entry:
    """A public entry point: ``call(**drawn args)``, the strategy of each argument, how many examples."""

    name: str
    call: Callable[..., Any]
    args: dict[str, st.SearchStrategy]
    examples: int = 40


ENTRIES = [
    # ------------------------------------------------------------ laws of K
    Entry("Poisson", lambda mean: exercise_law(Poisson(mean)), {"mean": REAL}),
    Entry(
        "TruncatedNegativeBinomial",
        lambda eta, gamma: exercise_law(TruncatedNegativeBinomial(eta, gamma)),
        {"eta": REAL, "gamma": UNIT},
    ),
    Entry(
        "TruncatedNegativeBinomial.from_mean",
        lambda eta, mean: exercise_law(TruncatedNegativeBinomial.from_mean(eta, mean)),
        {"eta": REAL, "mean": REAL},
    ),
    Entry("Logarithmic", lambda gamma: exercise_law(Logarithmic(gamma)), {"gamma": UNIT}),
    Entry("Logarithmic.from_mean", lambda mean: exercise_law(Logarithmic.from_mean(mean)), {"mean": REAL}),
    Entry("Geometric", lambda gamma: exercise_law(Geometric(gamma)), {"gamma": UNIT}),
    Entry("Geometric.from_mean", lambda mean: exercise_law(Geometric.from_mean(mean)), {"mean": REAL}),
    Entry("PointMass", lambda k: exercise_law(PointMass(k)), {"k": COUNT}),
    Entry("law.pmf", lambda law, k: law.pmf(k), {"law": LAW, "k": st.one_of(REAL, VECTOR)}),
    Entry("law.pgf", law_method("pgf"), {"law": LAW, "x": st.one_of(REAL, VECTOR)}),
    Entry("law.log_pgf_derivative", law_method("log_pgf_derivative"), {"law": LAW, "x": REAL}),
    Entry("law.pgf_derivative", law_method("pgf_derivative"), {"law": LAW, "x": REAL}),
    Entry("law.success_probability", lambda law, p: law.success_probability(p), {"law": LAW, "p": REAL}),
    Entry("law.sample", lambda law, seed: law.sample(seed), {"law": LAW, "seed": st.one_of(EDGE, INT)}),
    Entry("secure_rng", lambda seed: secure_rng(seed).random(), {"seed": st.one_of(EDGE, INT)}),
    Entry(
        "distribution_from_dict",
        lambda law, mean: distribution_from_dict({**law.to_dict(), "mean": mean}),
        {"law": LAW, "mean": REAL},
    ),
    # ------------------------------------------------------------ RDP curves
    Entry(
        "RDPCurve",
        lambda orders, epsilons: exercise_curve(RDPCurve(orders, epsilons)),
        {"orders": st.sampled_from([[1.5, 2.0], [1.0 + 1e-12, 1e300], [2.0]]), "epsilons": VECTOR},
    ),
    Entry(
        "RDPCurve.gaussian",
        lambda noise_multiplier: exercise_curve(RDPCurve.gaussian(noise_multiplier=noise_multiplier)),
        {"noise_multiplier": REAL},
    ),
    Entry("RDPCurve.zcdp", lambda rho: exercise_curve(RDPCurve.zcdp(rho=rho)), {"rho": REAL}),
    Entry("RDPCurve.pure", lambda epsilon: exercise_curve(RDPCurve.pure(epsilon=epsilon)), {"epsilon": REAL}),
    Entry(
        "RDPCurve.subsampled_gaussian",
        lambda sample_rate, noise_multiplier, steps: RDPCurve.subsampled_gaussian(
            sample_rate=sample_rate, noise_multiplier=noise_multiplier, steps=steps, orders=ORDERS
        ),
        {"sample_rate": UNIT, "noise_multiplier": REAL, "steps": COUNT},
        examples=25,
    ),
    Entry(
        "RDPCurve.epsilon",
        lambda noise_multiplier, delta: RDPCurve.gaussian(noise_multiplier=noise_multiplier).epsilon(delta=delta),
        {"noise_multiplier": REAL, "delta": UNIT},
    ),
    Entry(
        "RDPCurve.delta",
        lambda epsilon, rho: RDPCurve.zcdp(rho=rho).delta(epsilon=epsilon),
        {"epsilon": REAL, "rho": REAL},
    ),
    Entry(
        "RDPCurve.__add__",
        lambda epsilons: RDPCurve([2.0], [epsilons]) + RDPCurve([2.0, 3.0], [epsilons, 1e308]),
        {"epsilons": REAL},
    ),
    Entry(
        "RDPCurve.__mul__",
        lambda count, epsilons: count * RDPCurve([2.0, 3.0], [epsilons, 0.0]),
        {"count": INT, "epsilons": REAL},
    ),
    # ------------------------------------------------------------ best of K runs
    Entry(
        "repeat_and_select",
        lambda epsilon, law, density_ratio: repeat_and_select(
            RDPCurve.pure(epsilon=epsilon), law, density_ratio=density_ratio
        ),
        {
            "epsilon": REAL,
            "law": st.sampled_from([law for law in LAWS if not isinstance(law, Poisson)]),
            "density_ratio": REAL,
        },
    ),
    Entry(
        "repeat_and_select(poisson)",
        lambda noise_multiplier, law: repeat_and_select(
            RDPCurve.gaussian(noise_multiplier=noise_multiplier),
            law,
            base_delta=gaussian_profile(noise_multiplier=noise_multiplier),
        ),
        {"noise_multiplier": REAL, "law": st.sampled_from([law for law in LAWS if isinstance(law, Poisson)])},
    ),
    Entry(
        "repeat_and_select(curve)",
        lambda epsilons, law: repeat_and_select(RDPCurve(ORDERS, epsilons), law),
        {"epsilons": st.lists(REAL, min_size=4, max_size=4), "law": LAW},
    ),
    Entry(
        "repeat_and_select(generic)",
        lambda rho, law: repeat_and_select(RDPCurve.zcdp(rho=rho, orders=ORDERS), law, generic=True),
        {"rho": REAL, "law": LAW},
        examples=6,
    ),
    Entry(
        "generic_repeat_and_select",
        lambda rho, law, grid_size: generic_repeat_and_select(
            RDPCurve.zcdp(rho=rho, orders=ORDERS), law, grid_size=grid_size
        ),
        {"rho": st.sampled_from([0.0, 1e-300, 0.1, 1e300]), "law": LAW, "grid_size": SMALL_COUNT},
        examples=8,
    ),
    Entry(
        "truncated_negative_binomial_bound",
        lambda rho, density_ratio: truncated_negative_binomial_bound(
            RDPCurve.zcdp(rho=rho, orders=ORDERS), Geometric(0.1), density_ratio=density_ratio
        ),
        {"rho": REAL, "density_ratio": REAL},
    ),
    Entry(
        "poisson_bound",
        lambda rho, mean: poisson_bound(RDPCurve.zcdp(rho=rho, orders=ORDERS), Poisson(mean)),
        {"rho": REAL, "mean": REAL},
    ),
    Entry(
        "add_no_run_atom",
        lambda log_moment, prob_zero: add_no_run_atom(np.array([log_moment]), prob_zero, np.array([2.0])),
        {"log_moment": REAL, "prob_zero": REAL},
    ),
    # ------------------------------------------------------------ exact profiles
    Entry("gaussian_profile", profile_at(gaussian_profile), {"epsilon": REAL, "noise_multiplier": REAL}),
    Entry(
        "subsampled_gaussian_profile",
        profile_at(subsampled_gaussian_profile),
        {
            "epsilon": REAL,
            "sample_rate": UNIT,
            "noise_multiplier": st.one_of(EDGE, st.floats(0.5, 1e3)),
            "steps": SMALL_COUNT,
            "discretization": st.sampled_from([1e-2, 0.1, 1.0, 2.0] + list(EDGES)),
        },
        examples=15,
    ),
    # ------------------------------------------------------------ sparse vector
    Entry(
        "SVTParams",
        svt_everything,
        {"partitions": COUNT, "epsilon": REAL, "granularity": UNIT, "initial_utility": UNIT},
    ),
    Entry(
        "svt_curve",
        lambda epsilon, rounds: svt.svt_curve(epsilon=epsilon, rounds=rounds, orders=ORDERS),
        {"epsilon": REAL, "rounds": COUNT},
    ),
    Entry("noiseless_rounds", lambda target_level: svt.noiseless_rounds(target_level), {"target_level": COUNT}),
    Entry(
        "run_svt",
        lambda utilities, max_rounds: svt.run_svt(
            utilities,
            svt.SVTParams(partitions=5, epsilon=1.0, granularity=0.1),
            max_rounds=max_rounds,
            rng=np.random.default_rng(0),
        ),
        {"utilities": st.lists(UNIT, min_size=0, max_size=3), "max_rounds": SMALL_COUNT},
    ),
    Entry(
        "svt_round",
        lambda level, step: svt.svt_round(
            np.array([0.5]),
            level,
            step,
            svt.SVTParams(partitions=5, epsilon=1.0, granularity=0.1),
            np.random.default_rng(0),
        ),
        {"level": COUNT, "step": COUNT},
    ),
    # ------------------------------------------------------------ a trial's spend
    Entry(
        "TrialSpend",
        spend_curve,
        {
            "sample_rate": UNIT,
            "noise_multiplier": REAL,
            "steps": SMALL_COUNT,
            "score_noise_multiplier": st.one_of(st.none(), REAL),
            "score_releases": SMALL_COUNT,
        },
        examples=25,
    ),
    # ------------------------------------------------------------ DP-BO release (Kusner et al.)
    Entry("beta_t", vr.beta_t, {"t": COUNT, "n_candidates": COUNT, "delta": UNIT}),
    Entry("dataset_shift_bound", vr.dataset_shift_bound, {"k1": UNIT, "n_candidates": COUNT, "failure": UNIT}),
    Entry("srinivas_c1", vr.srinivas_c1, {"noise_variance": REAL}),
    Entry("check_k1", vr.check_k1, {"k1": REAL}),
    Entry(
        "exponential_mechanism_probabilities",
        lambda scores, epsilon, sensitivity: vr.exponential_mechanism_probabilities(
            np.array(scores, dtype=float), epsilon=epsilon, sensitivity=sensitivity
        ),
        {"scores": st.lists(REAL, min_size=0, max_size=3), "epsilon": REAL, "sensitivity": REAL},
    ),
    Entry(
        "kernel_matrix",
        lambda x, kernel, lengthscale: ig.kernel_matrix(
            np.array([x, [0.0, 1.0]], dtype=float), np.array([[0.5, 0.5]]), kernel=kernel, lengthscale=lengthscale
        ),
        {
            "x": st.lists(REAL, min_size=2, max_size=2),
            "kernel": st.sampled_from(["rbf", "matern52"]),
            "lengthscale": REAL,
        },
    ),
    Entry(
        "information_gain",
        lambda kernel, noise_variance: ig.information_gain(np.array([[1.0, kernel], [kernel, 1.0]]), noise_variance),
        {"kernel": REAL, "noise_variance": REAL},
    ),
    Entry(
        "max_information_gain_bound",
        lambda kernel, num_rounds, noise_variance: ig.max_information_gain_bound(
            np.array([[1.0, kernel], [kernel, 1.0]]), num_rounds, noise_variance
        ),
        {"kernel": REAL, "num_rounds": SMALL_COUNT, "noise_variance": REAL},
    ),
    Entry(
        "max_information_gain_bound_from_points",
        lambda x, num_rounds, noise_variance, lengthscale: ig.max_information_gain_bound_from_points(
            np.array([[x], [0.5]]), num_rounds, noise_variance, kernel="matern52", lengthscale=lengthscale
        ),
        {"x": REAL, "num_rounds": SMALL_COUNT, "noise_variance": REAL, "lengthscale": REAL},
    ),
    Entry(
        "algorithm1_bounds",
        lambda **kw: vr.algorithm1_bounds(**kw).to_dict(),
        {
            "n_candidates": COUNT,
            "num_trials": COUNT,
            "epsilon": REAL,
            "delta": UNIT,
            "k1": UNIT,
            "noise_variance": REAL,
            "gamma_bound": REAL,
        },
    ),
    Entry(
        "paper_algorithm1_laplace_scale",
        lambda **kw: vr.paper_algorithm1_laplace_scale(**kw),
        {
            "n_candidates": COUNT,
            "num_trials": COUNT,
            "epsilon": REAL,
            "delta": UNIT,
            "k1": UNIT,
            "noise_variance": REAL,
            "gamma": REAL,
        },
    ),
    Entry(
        "algorithm3_laplace_scale",
        lambda **kw: vr.algorithm3_laplace_scale(**kw),
        {
            "epsilon": REAL,
            "lipschitz": REAL,
            "g_star": REAL,
            "validation_size": COUNT,
            "lambda_min": REAL,
            "lambda_max": REAL,
        },
    ),
    Entry(
        "paper_algorithm3_laplace_scale",
        lambda **kw: vr.paper_algorithm3_laplace_scale(**kw),
        {
            "epsilon": REAL,
            "lipschitz": REAL,
            "g_star": REAL,
            "validation_size": COUNT,
            "lambda_min": REAL,
            "lambda_max": REAL,
        },
    ),
]


@pytest.mark.parametrize("entry", ENTRIES, ids=lambda entry: entry.name)
def test_entry_point_answers_edge_values_cleanly(entry):
    @settings(max_examples=entry.examples, deadline=None, database=None)
    @given(st.fixed_dictionaries(entry.args))
    def run(args):
        attempt(entry.call, args)

    run()


# ---------------------------------------------------------------------- the cases of the issue, pinned


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda: Geometric(1e-300), "gamma must be >= 1e-12"),
        (lambda: Geometric.from_mean(1e300), r"mean must be > 1 and <= 1e\+06"),
        (lambda: TruncatedNegativeBinomial(1e300, 0.5), r"eta must be > -1 and <= 1e\+06"),
        (lambda: TruncatedNegativeBinomial(0.5, 1e-9), r"mean E\[K\] = .* above 1e\+06"),
        (lambda: TruncatedNegativeBinomial.from_mean(-0.9, 1000.0), "gamma >= 1e-12"),
        (lambda: Poisson(1e300), r"mean must be a finite number > 0 and <= 1e\+06"),
        (lambda: PointMass(10**400), "k must be an integer with k >= 1 and k <= 1000000"),
        (lambda: Poisson(3.0).pgf(2.0), r"x must lie in \[0, 1\]"),
        (lambda: Geometric(0.5).pgf(math.inf), r"x must lie in \[0, 1\]"),
        (lambda: Poisson(3.0).pmf(math.nan), "k must not be NaN"),
        (lambda: svt.SVTParams(partitions=5, epsilon=1.0, granularity=1e-300), "granularity must be >= 1e-09 and < 1"),
        (lambda: svt.SVTParams(partitions=1, epsilon=1e-308, granularity=0.1), "epsilon must be >="),
        (
            lambda: RDPCurve.gaussian(noise_multiplier=1.0).epsilon(delta=math.nan),
            "delta must be a finite number > 0 and < 1",
        ),
        (lambda: subsampled_gaussian_profile(sample_rate=0.5, noise_multiplier=1e-3, steps=1), "points per step"),
        (lambda: subsampled_gaussian_profile(sample_rate=0.5, noise_multiplier=1.0, steps=10**7), "steps <= 1000000"),
        (lambda: generic_repeat_and_select(RDPCurve.zcdp(rho=0.1), Poisson(3.0), grid_size=2.5), "grid_size"),
    ],
)
def test_absurd_or_invalid_input_is_refused_with_its_range(make, message):
    with pytest.raises(ValueError, match=message):
        make()


def test_values_at_the_edges_are_the_limits_or_on_the_safe_side():
    assert Poisson(3.0).pmf(math.inf) == 0.0 and Poisson(3.0).pmf(1e308) == 0.0
    assert TruncatedNegativeBinomial(0.5, 0.1).pmf(-math.inf) == 0.0
    assert np.all(RDPCurve.pure(epsilon=1e300).epsilons == 1e300)  # min(ε, αε²/2) = ε once ε² overflows
    assert np.all(np.isinf(RDPCurve.gaussian(noise_multiplier=1e-300).epsilons))  # α/(2σ²) overflows: inf, never NaN
    assert np.all(
        RDPCurve.gaussian(noise_multiplier=1e200).epsilons == 2e-300
    )  # α/(2σ²) underflows: 2e-300 is above it
    assert np.all((10**400 * RDPCurve([2.0, 3.0], [0.0, 1e-3])).epsilons == [0.0, math.inf])
    # subsampling never costs more than the full batch, which bounds it where dp_accounting cannot run
    assert np.all(RDPCurve.subsampled_gaussian(sample_rate=0.5, noise_multiplier=1e-200, steps=3).epsilons == math.inf)
    assert np.all(RDPCurve.subsampled_gaussian(sample_rate=0.5, noise_multiplier=1e200, steps=3).epsilons > 0)
    # log-space fallbacks give the finite value, not inf or an OverflowError
    expected = 2 * (math.log(50 * 100 * math.pi**2) - math.log(3 * 5e-324))
    assert expected <= vr.beta_t(10, 50, delta=5e-324) == pytest.approx(expected, rel=1e-11)
    assert vr.srinivas_c1(5e-324) == pytest.approx(8 / -math.log(5e-324), rel=1e-12)
    # (α − 1)ε overflows at order 64: that order constrains nothing, and no overflow warning escapes
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        selected = repeat_and_select(RDPCurve(ORDERS, [0.0, 0.0, 0.0, 3e306]), Poisson(3.0))
    assert np.all(np.isfinite(selected.epsilons[:3])) and selected.epsilons[3] >= 3e306
    # the convex-hull margin of constraints near 1e308 overflows: nothing is dropped, no warning escapes
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        huge = repeat_and_select(
            RDPCurve.pure(epsilon=9.521065749142721e302),
            TruncatedNegativeBinomial(eta=0.5, gamma=0.1),
            density_ratio=2.0,
        )
    assert np.all(huge.epsilons > 0) and not np.any(np.isnan(huge.epsilons))
    # a law whose first runs have underflowing probability is still sampled near its mean
    law = TruncatedNegativeBinomial.from_mean(1000.0, 1e5)
    assert 0.5e5 < law.sample(0) < 2e5
