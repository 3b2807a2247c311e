"""The certified numeric P&S Lemma 7 is an upper bound: never below a 10× denser sampled maximum.

The sampled maximum evaluates Lemma 7's objective at *feasible* points only (the exact
Gaussian partner Φ(Φ⁻¹(q) - μ), or the feasible end of the RDP bisection), so it is a
lower bound on the true maximum; the certified value must lie above it at every order.
"""

from __future__ import annotations

import numpy as np
import pytest
from scipy import special

from ray_dptune.accounting import RDPCurve, generic_repeat_and_select
from ray_dptune.accounting.bounds.distributions import Poisson, TruncatedNegativeBinomial
from ray_dptune.accounting.bounds.lemma7.generic import add_no_run_atom
from ray_dptune.accounting.bounds.lemma7.worst_pair import upper_envelope

pytestmark = pytest.mark.fast

ORDERS = 1.0 + np.logspace(-2, 3, 60)


def _laws(rng: np.random.Generator):
    mean = float(np.exp(rng.uniform(np.log(1.5), np.log(500))))
    return [Poisson(mean), TruncatedNegativeBinomial.from_mean(float(rng.uniform(-0.5, 2.0)), mean)]


def _sampled(base: RDPCurve, law, q: np.ndarray, partner: np.ndarray) -> np.ndarray:
    lam = base.orders[:, None]
    value = lam * law.log_pgf_derivative(q)[None, :] + (1 - lam) * law.log_pgf_derivative(partner)[None, :]
    log_moment = (base.orders - 1) * base.epsilons + value.max(axis=1)
    return add_no_run_atom(log_moment, law.prob_zero, base.orders)


@pytest.mark.parametrize("seed", range(4))
def test_certified_gaussian_is_above_a_ten_times_denser_sampled_maximum(seed: int) -> None:
    rng = np.random.default_rng(seed)
    sigma = float(np.exp(rng.uniform(np.log(0.5), np.log(20))))
    base = RDPCurve.gaussian(noise_multiplier=sigma, orders=ORDERS)
    for law in _laws(rng):
        certified = generic_repeat_and_select(base, law, grid_size=512)
        q = np.unique(np.concatenate([np.linspace(0, 1, 5121), np.logspace(-14, -1e-9, 5121)]))
        fine = _sampled(base, law, q, special.ndtr(special.ndtri(q) - 1 / sigma))
        assert np.all(certified.epsilons >= fine), (sigma, law)
        assert np.median(fine / certified.epsilons) > 0.95  # and it is not vacuous


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(3))
def test_certified_rdp_constraints_are_above_a_ten_times_denser_sampled_maximum(seed: int) -> None:
    rng = np.random.default_rng(100 + seed)
    eps = float(rng.uniform(0.2, 3.0))
    base = RDPCurve.pure(epsilon=eps, orders=ORDERS)
    for law in _laws(rng):
        certified = generic_repeat_and_select(base, law, grid_size=256)
        q = np.unique(np.concatenate([np.linspace(0, 1, 2561), np.logspace(-14, -1e-9, 2561)]))
        # the feasible end of a bisection: every constraint holds there
        feasible = _feasible_partner(q, base)
        fine = _sampled(base, law, q, feasible)
        assert np.all(certified.epsilons >= fine), (eps, law)


def _feasible_partner(q: np.ndarray, base: RDPCurve) -> np.ndarray:
    """The smallest q' on a bisection whose every step keeps (q, q') feasible for all of ``base``'s orders."""
    a, limit = base.orders[:, None], base.epsilons[:, None]

    def exceeds(p: np.ndarray, r: np.ndarray) -> np.ndarray:  # D_α(Bern(p)‖Bern(r)) > ε(α)
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            one = np.where(p > 0, a * np.log(p) + (1 - a) * np.log(r), -np.inf)
            zero = np.where(p < 1, a * np.log1p(-p) + (1 - a) * np.log1p(-r), -np.inf)
        return np.logaddexp(one, zero) > (a - 1) * limit

    lo, hi = np.zeros_like(q), q.copy()
    for _ in range(60):
        mid = 0.5 * (lo + hi)
        bad = np.any(exceeds(q[None, :], mid[None, :]) | exceeds(mid[None, :], q[None, :]), axis=0)
        hi, lo = np.where(bad, hi, mid), np.where(bad, mid, lo)
    return hi


def test_upper_envelope_is_never_below_the_maximum_of_its_lines() -> None:
    rng = np.random.default_rng(0)
    for trial in range(300):
        n = int(rng.integers(1, 400))
        slopes, intercepts = rng.normal(size=n) * rng.choice([1, 100]), rng.normal(size=n)
        if trial % 3 == 0:  # ties and collinear lines
            slopes, intercepts = np.round(slopes), np.round(intercepts)
        x = np.sort(rng.exponential(size=50) * rng.choice([0.01, 1, 1000]))
        truth = (x[:, None] * slopes[None, :] + intercepts[None, :]).max(axis=1)
        got = upper_envelope(x, slopes, intercepts)
        assert np.all(got >= truth)
        assert np.all(got - truth <= 1e-8 * (np.abs(truth) + x * np.abs(slopes).max() + 1))
        lead = (x[:, None] * slopes[None, :] + intercepts[None, :]).argmax(axis=1)
        scale = x * np.abs(slopes[lead]) + np.abs(intercepts[lead])  # at most the hull's scale
        assert np.all(got - truth >= 0.5e-9 * scale)  # the documented margin is 1e-9 of the hull's scale


def test_gaussian_default_meets_the_issue_targets() -> None:
    """Issue 13: 0.1-zCDP Gaussian base, mean 10, δ = 1e-6, no profile passed."""
    from ray_dptune.accounting import repeat_and_select

    base = RDPCurve.gaussian(noise_multiplier=5**0.5)
    assert repeat_and_select(base, TruncatedNegativeBinomial.from_mean(0.0, 10.0)).epsilon(delta=1e-6) <= 3.00
    assert repeat_and_select(base, TruncatedNegativeBinomial.from_mean(1.0, 10.0)).epsilon(delta=1e-6) <= 3.21
    assert repeat_and_select(base, Poisson(10.0)).epsilon(delta=1e-6) <= 3.78


@pytest.mark.parametrize(
    "partner",
    [lambda q: np.full_like(q, np.nan), lambda q: q[:-1], lambda q: np.where(q > 0.5, np.nan, 0.0)],
    ids=["all-nan", "short", "some-nan"],
)
def test_a_partner_with_nan_or_the_wrong_shape_is_refused(partner) -> None:
    """A user's partner q -> q' that is malformed is refused, never maximised over (NaN would drop constraints)."""
    with pytest.raises(ValueError, match="same shape, without NaN"):
        generic_repeat_and_select(RDPCurve.gaussian(noise_multiplier=2.0), Poisson(mean=5), partner=partner)
