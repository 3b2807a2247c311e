"""repeat_and_select: closed forms, limits, dp_accounting agreement, refusals."""

import math

import dp_accounting
import numpy as np
import pytest
from dp_accounting.rdp import rdp_privacy_accountant as dp_rdp

from ray_dptune.accounting import RDPCurve, gaussian_profile, generic_repeat_and_select, repeat_and_select
from ray_dptune.accounting.bounds.distributions import (
    Geometric,
    Logarithmic,
    PointMass,
    Poisson,
    RunCountDistribution,
    TruncatedNegativeBinomial,
)
from ray_dptune.accounting.bounds.lemma7.generic import add_no_run_atom
from ray_dptune.accounting.bounds.selection import poisson_bound, truncated_negative_binomial_bound
from ray_dptune.errors import PrivacyError, UnsupportedBoundError

SIGMA = math.sqrt(5.0)  # 0.1-zCDP
BASE = RDPCurve.gaussian(noise_multiplier=SIGMA)
DP_ORDERS = np.array(dp_rdp.DEFAULT_RDP_ORDERS, dtype=float)


def theorem_2(eps, eps_hat, lam, lam_hat, law, log_ratio=0.0):
    """P&S Theorem 2 / DP-HyPO Theorem 1 exactly as stated (the relaxed form)."""
    eta, gamma = law.eta, law.gamma
    return (
        eps
        + (1 + eta) * (1 - 1 / lam_hat) * eps_hat
        + (lam / (lam - 1) + 1 + eta) * log_ratio
        + (1 + eta) * math.log(1 / gamma) / lam_hat
        + math.log(law.mean) / (lam - 1)
    )


@pytest.mark.slow
@pytest.mark.parametrize("eta", [-0.5, 0.0, 0.5, 1.0, 3.0])
@pytest.mark.parametrize("mean", [2.0, 10.0, 1000.0])
def test_tnb_bound_is_at_most_theorem_2_at_every_pair_of_grid_orders(eta, mean):
    law = TruncatedNegativeBinomial.from_mean(eta, mean)
    ours = repeat_and_select(BASE, law, generic=False)  # the closed form itself (the default may be lower still)
    lam = BASE.orders
    stated = np.array(
        [
            min(theorem_2(BASE.epsilons[i], e_hat, lam[i], l_hat, law) for l_hat, e_hat in zip(lam, BASE.epsilons))
            for i in range(lam.size)
        ]
    )
    assert np.all(ours.epsilons <= stated * (1 + 1e-12))
    # and it is the same theorem: after monotone smoothing, the only gain is the
    # dropped -1 + e^{-(λ̂-1)ε̂} term, worth at most (1+η) log(1/(1-γ))
    smoothed = np.minimum.accumulate(stated[::-1])[::-1]
    assert np.all(ours.epsilons >= smoothed + (1 + eta) * math.log1p(-law.gamma) - 1e-12)


@pytest.mark.parametrize("eta", [0.0, 0.5, 1.0])
def test_corollary_4_for_zcdp(eta):
    """Cor. 4: for ρ-zCDP the bound at the optimal λ is 2√(ρ log E) + 2(1+η)√(ρ log 1/γ) - ηρ."""
    rho = 0.1
    law = TruncatedNegativeBinomial.from_mean(eta, 10.0)
    closed = (
        2 * math.sqrt(rho * math.log(law.mean)) + 2 * (1 + eta) * math.sqrt(rho * math.log(1 / law.gamma)) - eta * rho
    )
    ours = repeat_and_select(RDPCurve.zcdp(rho=rho), law, generic=False)
    lam_star = 1 + math.sqrt(math.log(law.mean) / rho)
    below = ours.orders <= lam_star
    # a grid of λ̂ can lose at most the grid's resolution against the continuous λ̂ of Cor. 4
    assert np.all(ours.epsilons[below] <= closed * (1 + 1e-3))
    assert ours.epsilons[below].max() >= closed * (1 - 0.05)


@pytest.mark.parametrize("eta", [-0.5, 0.0, 1.0, 2.0])
def test_corollary_3_for_pure_dp(eta):
    """Cor. 3: an ε-DP base gives ((2+η)ε)-DP, the limit λ, λ̂ → ∞ of Theorem 2."""
    eps = 0.3
    orders = 1 + np.logspace(-2, 9, 400)
    law = TruncatedNegativeBinomial.from_mean(eta, 20.0)
    ours = repeat_and_select(RDPCurve.pure(epsilon=eps, orders=orders), law, generic=False)
    assert ours.epsilons[-1] <= (2 + eta) * eps * (1 + 1e-6)
    assert ours.epsilons[-1] == pytest.approx((2 + eta) * eps, rel=1e-3)


@pytest.mark.parametrize("theta", [0.0, 1.0])
@pytest.mark.parametrize("ratio", [1.5, 2.0 / 0.75])
def test_dphypo_theorem_2_for_pure_dp(theta, ratio):
    """DP-HyPO Thm 2: ((2+θ)(ε + log C/c))-DP, the large-order limit of Thm 1."""
    eps = 0.3
    orders = 1 + np.logspace(-2, 9, 400)
    law = TruncatedNegativeBinomial.from_mean(theta, 20.0)
    ours = repeat_and_select(RDPCurve.pure(epsilon=eps, orders=orders), law, density_ratio=ratio, generic=False)
    expected = (2 + theta) * (eps + math.log(ratio))
    assert ours.epsilons[-1] <= expected * (1 + 1e-6)
    assert ours.epsilons[-1] == pytest.approx(expected, rel=1e-3)


def test_dphypo_theorem_1_at_every_pair_of_orders():
    law = Geometric.from_mean(10.0)
    ratio = 2.0 / 0.75
    ours = repeat_and_select(BASE, law, density_ratio=ratio)
    lam = BASE.orders
    for i in (5, 80, 200):
        stated = min(
            theorem_2(BASE.epsilons[i], e, lam[i], l, law, math.log(ratio)) for l, e in zip(lam, BASE.epsilons)
        )
        assert ours.epsilons[i] <= stated * (1 + 1e-12)


def test_density_ratio_one_is_the_non_adaptive_bound_and_the_cost_grows_with_it():
    law = TruncatedNegativeBinomial.from_mean(0.5, 10.0)
    plain = repeat_and_select(BASE, law, generic=False)
    assert repeat_and_select(BASE, law, density_ratio=1.0, generic=False) == plain
    near = repeat_and_select(BASE, law, density_ratio=1 + 1e-9, generic=False)  # the closed form is continuous
    np.testing.assert_allclose(near.epsilons, plain.epsilons, rtol=1e-6)
    eps = [repeat_and_select(BASE, law, density_ratio=r).epsilon(delta=1e-6) for r in (1.0, 1.5, 2.0, 4.0)]
    assert eps == sorted(eps) and eps[0] < eps[-1]


def test_poisson_theorem_6_by_hand():
    """Theorem 6's proof with the K = 0 atom kept: log(e^{-μ} + μ e^{(λ-1)(ε + μδ̂)}) / (λ-1)."""
    mu = 10.0
    profile = gaussian_profile(noise_multiplier=SIGMA)
    ours = poisson_bound(BASE, Poisson(mu), base_delta=profile)
    lam = BASE.orders
    delta_hat = profile(np.log(lam / (lam - 1)))
    hand = np.logaddexp(-mu, math.log(mu) + (lam - 1) * (BASE.epsilons + mu * delta_hat)) / (lam - 1)
    assert np.all(ours.epsilons <= hand * (1 + 1e-12))
    assert ours.epsilons[-1] == pytest.approx(hand[-1], rel=1e-12)  # smoothing leaves the top order
    # never below Theorem 6 as stated, and for μ = 10 the correction is tiny where it matters
    stated = BASE.epsilons + mu * delta_hat + math.log(mu) / (lam - 1)
    assert np.all(ours.epsilons >= np.minimum.accumulate(stated[::-1])[::-1] - 1e-12)
    assert ours.epsilon(delta=1e-6) == pytest.approx(RDPCurve(lam, stated).smoothed().epsilon(delta=1e-6), rel=1e-5)


def test_theorem_6_as_stated_is_impossible_for_a_small_mean():
    """With μ < 1 the stated bound goes negative as λ → 1, but RDP is never negative."""
    mu, lam = 0.5, 1.01
    eps = lam / (2 * SIGMA**2)
    delta_hat = float(gaussian_profile(noise_multiplier=SIGMA)(np.array([math.log(lam / (lam - 1))]))[0])
    assert eps + mu * delta_hat + math.log(mu) / (lam - 1) < 0
    corrected = repeat_and_select(BASE, Poisson(mu), base_delta=gaussian_profile(noise_multiplier=SIGMA))
    assert np.all(corrected.epsilons > 0)


def test_poisson_with_the_exact_gaussian_profile_beats_the_anchor():
    """ANCHORS: dp_accounting 4.607; Theorem 6 with the exact δ̂ gives ≈ 3.776."""
    tuned = repeat_and_select(BASE, Poisson(10.0), base_delta=gaussian_profile(noise_multiplier=SIGMA))
    assert tuned.epsilon(delta=1e-6) <= 3.80
    assert tuned.epsilon(delta=1e-6) == pytest.approx(3.7755, abs=2e-3)


def _dp_accounting_curve(mean, shape, sigma=SIGMA):
    accountant = dp_rdp.RdpAccountant(orders=list(DP_ORDERS))
    accountant.compose(dp_accounting.dp_event.RepeatAndSelectDpEvent(dp_accounting.GaussianDpEvent(sigma), mean, shape))
    return accountant


@pytest.mark.parametrize("shape", [0.0, 0.5, 1.0, np.inf])
@pytest.mark.parametrize("mean", [1.5, 10.0, 300.0])
def test_never_looser_than_dp_accounting_on_the_same_base_curve(shape, mean):
    """Tighter everywhere, once dp_accounting's Poisson curve has its K = 0 atom back."""
    law = Poisson(mean) if shape == np.inf else TruncatedNegativeBinomial.from_mean(shape, mean)
    theirs = _dp_accounting_curve(mean, shape).rdp
    if shape == np.inf:
        theirs = add_no_run_atom((DP_ORDERS - 1) * theirs, math.exp(-mean), DP_ORDERS)
    ours = repeat_and_select(RDPCurve.gaussian(noise_multiplier=SIGMA, orders=DP_ORDERS), law)
    assert np.all(ours.epsilons <= theirs * (1 + 1e-9))
    for delta in (1e-10, 1e-6, 1e-3):
        their_eps, _ = dp_rdp.compute_epsilon(DP_ORDERS, theirs, delta)
        assert ours.epsilon(delta=delta) <= their_eps * (1 + 1e-9)


def test_same_method_as_dp_accounting_for_poisson_agrees_closely():
    """Theorem 6 with δ̂ from the RDP curve is dp_accounting's method: same numbers."""
    theirs = _dp_accounting_curve(10.0, np.inf)
    ours = repeat_and_select(
        RDPCurve(DP_ORDERS, RDPCurve.gaussian(noise_multiplier=SIGMA, orders=DP_ORDERS).epsilons),
        Poisson(10.0),
        generic=False,
    )
    assert ours.epsilon(delta=1e-6) == pytest.approx(theirs.get_epsilon(1e-6), rel=1e-3)
    assert theirs.get_epsilon(1e-6) == pytest.approx(4.6074, abs=1e-3)


def test_point_mass_is_composition_even_when_adaptive():
    assert repeat_and_select(BASE, PointMass(7)) == (7 * BASE).smoothed()
    assert repeat_and_select(BASE, PointMass(7), density_ratio=3.0) == (7 * BASE).smoothed()


def test_more_runs_cost_more():
    for make in (Poisson, Logarithmic.from_mean, Geometric.from_mean):
        eps = [repeat_and_select(BASE, make(m)).epsilon(delta=1e-6) for m in (2.0, 10.0, 100.0)]
        assert eps == sorted(eps)


def test_random_count_search_beats_composition():
    composed = (10 * BASE).epsilon(delta=1e-6)
    for law in (Poisson(10.0), Logarithmic.from_mean(10.0), Geometric.from_mean(10.0)):
        assert repeat_and_select(BASE, law).epsilon(delta=1e-6) < 0.6 * composed


class _OneTwoOrThree(RunCountDistribution):
    """A law with no closed-form bound: K uniform on {1, 2, 3}."""

    mean = 2.0

    def pmf(self, k):
        return np.where(np.isin(np.asarray(k), [1, 2, 3]), 1 / 3, 0.0)

    def pgf(self, x):
        x = np.asarray(x, dtype=float)
        return (x + x**2 + x**3) / 3

    def log_pgf_derivative(self, x):
        x = np.asarray(x, dtype=float)
        return np.log((1 + 2 * x + 3 * x**2) / 3)

    def sample(self, rng=None):
        return 1 + int(np.random.default_rng(rng).integers(3))

    def to_dict(self):
        return {"law": "one_two_or_three"}


def test_any_law_is_covered_by_the_generic_lemma():
    curve = repeat_and_select(BASE, _OneTwoOrThree())
    # more than one run, less than composing its mean number of runs
    assert BASE.epsilon(delta=1e-6) < curve.epsilon(delta=1e-6) < (2 * BASE).epsilon(delta=1e-6)
    with pytest.raises(UnsupportedBoundError):
        repeat_and_select(BASE, _OneTwoOrThree(), density_ratio=2.0)


def test_generic_lemma_is_infinite_without_mass_on_one_run():
    """With P[K=1] = 0, f'(0) = 0 and the certified maximum is unbounded: never a guess."""
    assert np.all(np.isinf(generic_repeat_and_select(BASE, PointMass(3)).epsilons))
    assert repeat_and_select(BASE, PointMass(3), generic=True) == (3 * BASE).smoothed()


@pytest.mark.slow
@pytest.mark.parametrize("law", [Poisson(10.0), Logarithmic.from_mean(10.0), Geometric.from_mean(10.0)], ids=repr)
def test_generic_lemma_tightens_the_closed_forms(law):
    closed = repeat_and_select(BASE, law, generic=False)
    both = repeat_and_select(BASE, law, generic=True)
    assert np.all(both.epsilons <= closed.epsilons)
    if isinstance(law, Poisson):  # Theorem 6 already has the Gaussian base's exact profile: Lemma 7 cannot beat it
        assert both.epsilon(delta=1e-6) == pytest.approx(closed.epsilon(delta=1e-6), rel=1e-9)
    else:
        assert both.epsilon(delta=1e-6) < closed.epsilon(delta=1e-6)


@pytest.mark.slow
def test_generic_bound_of_tnb_approaches_poisson_as_eta_grows():
    poisson = generic_repeat_and_select(BASE, Poisson(10.0)).epsilon(delta=1e-6)
    gaps = [
        abs(
            generic_repeat_and_select(BASE, TruncatedNegativeBinomial.from_mean(eta, 10.0)).epsilon(delta=1e-6)
            - poisson
        )
        for eta in (3.0, 30.0, 300.0)
    ]
    assert gaps[0] > gaps[1] > gaps[2]
    assert gaps[2] < 0.02 * poisson


def test_adaptive_poisson_has_no_proven_bound():
    with pytest.raises(UnsupportedBoundError, match="truncated negative binomial") as info:
        repeat_and_select(BASE, Poisson(10.0), density_ratio=2.0)
    assert isinstance(info.value, PrivacyError) and isinstance(info.value, ValueError)


@pytest.mark.parametrize("ratio", [0.5, float("nan"), float("inf")])
def test_invalid_density_ratio(ratio):
    with pytest.raises(ValueError, match="density_ratio"):
        repeat_and_select(BASE, Geometric(0.1), density_ratio=ratio)


def test_invalid_arguments():
    with pytest.raises(TypeError, match="RDPCurve"):
        repeat_and_select([1.0, 2.0], Poisson(3.0))
    with pytest.raises(TypeError, match="RunCountDistribution"):
        repeat_and_select(BASE, 10)
    with pytest.raises(ValueError, match="only used by the Poisson"):
        repeat_and_select(BASE, Geometric(0.1), base_delta=gaussian_profile(noise_multiplier=SIGMA))
    with pytest.raises(ValueError, match="same shape"):
        repeat_and_select(BASE, Poisson(3.0), base_delta=lambda eps: 0.1)


def test_tnb_bound_helper_is_exposed_for_reports():
    law = Logarithmic.from_mean(10.0)
    assert truncated_negative_binomial_bound(BASE, law) == repeat_and_select(BASE, law, generic=False)
