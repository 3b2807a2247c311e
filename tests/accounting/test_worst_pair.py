"""The certified partner search and the bare-curve Lemma 7 bound, against two oracles.

* Certified, never optimistic: every bound p ≤ b(q) that :func:`lowest_partner` returns is a
  point where some constraint D_α(Bern(q)‖Bern(p)) or D_α(Bern(p)‖Bern(q)) ≤ ε(α) is violated,
  checked in mpmath at 50 digits (so p lies below the lowest allowed partner b(q)); and it is
  tight: within 1e-9 of the lowest partner allowed once ε is enlarged by the search's slack
  (``CONSTRAINT_SLACK``, relative and absolute), an mpmath bisection.
* Never looser than, and no different from, the bisection it replaced: the default bound on a
  bare curve equals, within 1e-6 and never above it by more than 1e-10 (relative), the old
  certified answer, recomputed here slowly (48-step bisection of every grid point against
  every constraint, then the maximum over every cell, on the same grid and constraints).

Both oracles catch a bound moved by 1e-6 in the wrong direction (the last two tests).
"""

from __future__ import annotations

import mpmath
import numpy as np
import pytest

from ray_dptune.accounting import RDPCurve, generic_repeat_and_select
from ray_dptune.accounting.bounds.distributions import Geometric, Logarithmic, Poisson, TruncatedNegativeBinomial
from ray_dptune.accounting.bounds.lemma7 import partner_search, worst_pair
from ray_dptune.accounting.bounds.lemma7.generic import add_no_run_atom

DP_ORDERS = np.array([1 + x / 10.0 for x in range(1, 100)] + list(range(11, 64)) + [128, 256, 512, 1024], float)
CURVES = {
    "gaussian-2": RDPCurve.gaussian(noise_multiplier=2.0, orders=DP_ORDERS),
    "gaussian-30": RDPCurve.gaussian(noise_multiplier=30.0),
    "dp-sgd": RDPCurve.subsampled_gaussian(sample_rate=0.1, noise_multiplier=2.0, steps=100, orders=DP_ORDERS),
    "pure-3": RDPCurve.pure(epsilon=3.0),
    "gaussian+pure": RDPCurve(DP_ORDERS, DP_ORDERS / 8.0 + RDPCurve.pure(epsilon=1.0, orders=DP_ORDERS).epsilons),
}
LAWS = {
    "poisson-3": Poisson(3.0),
    "geometric-10": Geometric.from_mean(10.0),
    "logarithmic-100": Logarithmic.from_mean(100.0),
    "tnb-(-0.5)-20": TruncatedNegativeBinomial.from_mean(-0.5, 20.0),
}
CASES = [("gaussian-2", "geometric-10"), ("gaussian-30", "poisson-3"), ("dp-sgd", "logarithmic-100"),
         ("pure-3", "poisson-3"), ("gaussian+pure", "tnb-(-0.5)-20")]  # fmt: skip


def bare(name: str) -> RDPCurve:
    """The curve's numbers only (no known mechanism): the bare-curve path."""
    curve = CURVES[name]
    return RDPCurve(curve.orders, curve.epsilons)


# ---------------------------------------------------------------- oracle 1: mpmath at 50 digits
def _excess(q: mpmath.mpf, x: mpmath.mpf, alpha: float, eps: float) -> mpmath.mpf:
    """max over both directions of D_α(Bern(·)‖Bern(·)) - ε(α) for the pair (q, x)."""
    a = mpmath.mpf(alpha)

    def divergence(p: mpmath.mpf, r: mpmath.mpf) -> mpmath.mpf:
        first = p**a * r ** (1 - a) if p > 0 else mpmath.mpf(0)
        second = (1 - p) ** a * (1 - r) ** (1 - a) if p < 1 else mpmath.mpf(0)
        return mpmath.log(first + second) / (a - 1)

    return max(divergence(q, x), divergence(x, q)) - mpmath.mpf(eps)


def _violated(q: float, x: float, alphas: np.ndarray, eps: np.ndarray) -> bool:
    with mpmath.workdps(50):
        return any(_excess(mpmath.mpf(q), mpmath.mpf(x), a, e) > 0 for a, e in zip(alphas, eps))


def _lowest_allowed(q: float, alphas: np.ndarray, eps: np.ndarray) -> float:
    """b(q) by bisection in mpmath (the allowed q' form an interval up to q)."""
    with mpmath.workdps(50):
        lo, hi = mpmath.mpf(0), mpmath.mpf(q)
        for _ in range(90):
            mid = (lo + hi) / 2
            if any(_excess(mpmath.mpf(q), mid, a, e) > 0 for a, e in zip(alphas, eps)):
                lo = mid
            else:
                hi = mid
        return float(hi)


@pytest.mark.slow
@pytest.mark.parametrize(("curve", "law"), CASES, ids=[f"{c}-{law}" for c, law in CASES])
def test_partner_bounds_are_certified_and_tight_in_mpmath(curve: str, law: str) -> None:
    alphas, eps = partner_search.constraint_orders(bare(curve))
    q = worst_pair.q_grid(LAWS[law], 256)
    p = partner_search.lowest_partner(q, alphas, eps)
    rng = np.random.default_rng(0)
    for i in np.unique(np.r_[rng.integers(1, q.size - 1, 10), np.argmax(q > 0.5), q.size - 2]):
        assert p[i] <= q[i]
        if p[i] > 0:
            assert _violated(q[i], p[i], alphas, eps), (q[i], p[i])  # p lies below b(q): certified
        slack = partner_search.CONSTRAINT_SLACK
        target = _lowest_allowed(q[i], alphas, eps * (1 + slack) + slack)  # what the search aims at
        assert target - p[i] <= 1e-9 * target + 1e-300, (q[i], p[i], target)  # tight


@pytest.mark.parametrize(("curve", "law"), CASES, ids=[f"{c}-{law}" for c, law in CASES])
def test_partner_bounds_are_certified_in_mpmath_down_to_the_smallest_q(curve: str, law: str) -> None:
    """The certificate alone (no tightness bisection), fast: at the grid's smallest points, where
    the floating-point error bound of an evaluated excess matters most, and at a spread of others."""
    alphas, eps = partner_search.constraint_orders(bare(curve))
    q = worst_pair.q_grid(LAWS[law], 256)
    p = partner_search.lowest_partner(q, alphas, eps)
    positive = np.nonzero(p > 0)[0]
    for i in np.unique(np.r_[positive[:6], positive[np.linspace(0, positive.size - 1, 6).astype(int)]]):
        assert p[i] <= q[i]
        assert _violated(q[i], p[i], alphas, eps), (q[i], p[i])


def test_constraint_orders_are_evenly_spread_from_the_first_to_the_last() -> None:
    """Any subset of a curve's orders gives valid constraints; this one is the documented choice."""
    curve = RDPCurve.gaussian(noise_multiplier=2.0, orders=np.arange(2.0, 102.0))  # 100 orders
    alphas, eps = partner_search.constraint_orders(curve, max_orders=5)
    assert alphas.tolist() == [2.0, 27.0, 52.0, 76.0, 101.0]  # indices round(0, 24.75, 49.5, 74.25, 99)
    assert np.array_equal(eps, alphas / 8.0)
    assert partner_search.constraint_orders(curve)[0].size == partner_search.MAX_CONSTRAINT_ORDERS == 48
    assert np.array_equal(partner_search.constraint_orders(curve, max_orders=None)[0], curve.orders)


def test_an_excess_is_within_its_error_bound_of_the_exact_one() -> None:
    """What certifies a point: the evaluated excess log S - c lies within its stated error bound of
    the exact one (mpmath, 40 digits), from q near 0 to q near 1 and x from far below q up to q."""
    alphas, eps = partner_search.constraint_orders(CURVES["gaussian+pure"])
    search = partner_search.PartnerSearch(np.array([0.0, 1.0]), alphas, eps)
    table, keys = search.constraints.table, np.arange(search.constraints.keys)
    rng = np.random.default_rng(1)
    q = np.r_[1e-18, 1e-9, 10.0 ** rng.uniform(-6, -0.01, 6), 0.5, 1 - 1e-6, 1 - 1e-12]
    x = q[:, None] * np.r_[1e-300, 1e-30, 10.0 ** rng.uniform(-12, 0, 5), 1 - 1e-9, 1.0][None, :]
    q, x = np.repeat(q, x.shape[1]), x.ravel()
    key, point = np.repeat(keys, q.size), np.tile(np.arange(q.size), keys.size)
    pairs = search.constraints.pairs(key, np.log(q[point]), np.log1p(-q[point]))
    t = pairs.t_of(x[point])
    gap, err = pairs.evaluate(t)[:2]
    first, w = table["first"][key], table["w"][key]
    order = np.abs(alphas[None, :] - np.where(first, 1.0 - w, w)[:, None]).argmin(axis=1)  # w rounds α
    with mpmath.workdps(40):
        for i in range(key.size):
            qi, ti, a = mpmath.mpf(q[point[i]]), mpmath.mpf(t[i]), mpmath.mpf(alphas[order[i]])
            xi = mpmath.exp(ti) if first[i] else -mpmath.expm1(ti)
            hi, lo = (qi, xi) if first[i] else (xi, qi)  # D_α(Bern(hi) ‖ Bern(lo))
            s = hi**a * lo ** (1 - a) + (1 - hi) ** a * (1 - lo) ** (1 - a)
            exact = mpmath.log(s) - (a - 1) * mpmath.mpf(eps[order[i]])
            assert err[i] > 0 and abs(mpmath.mpf(gap[i]) - exact) <= err[i], (q[point[i]], x[point[i]], a)
            # the bound read back from a certified t lies below the exact point (x_of rounds down)
            read = pairs.subset(np.array([i])).x_of(np.array([table["sign"][key[i]] * t[i]]))[0]
            assert read < xi or read == 0.0, (t[i], read)


# ---------------------------------------------------------------- oracle 2: the bisection it replaced
def _reference_partner(q: np.ndarray, alphas: np.ndarray, eps: np.ndarray) -> np.ndarray:
    """The old certified search: 48 bisection steps per point, every constraint, slack 1e-9 on ε."""
    a = alphas[:, None]
    limit = (eps * (1 + 1e-9) + 1e-9)[:, None]

    def logs(v: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        with np.errstate(divide="ignore"):
            return np.log(v)[None, :], np.log1p(-v)[None, :]

    def exceeds(lp, l1p, lr, l1r):  # D_α(Bern(p)‖Bern(r)) > limit
        with np.errstate(invalid="ignore"):
            one = np.where(np.isneginf(lp), -np.inf, a * lp + (1 - a) * lr)
            zero = np.where(np.isneginf(l1p), -np.inf, a * l1p + (1 - a) * l1r)
        return np.logaddexp(one, zero) > (a - 1) * limit

    lq, l1q = logs(q)
    lo, hi = np.zeros_like(q), q.copy()
    for _ in range(48):
        mid = 0.5 * (lo + hi)
        lm, l1m = logs(mid)
        bad = np.any(exceeds(lq, l1q, lm, l1m) | exceeds(lm, l1m, lq, l1q), axis=0)
        hi, lo = np.where(bad, hi, mid), np.where(bad, mid, lo)
    return lo


def _reference_bound(base: RDPCurve, law) -> np.ndarray:
    """generic_repeat_and_select as it was: reference partner, maximum over every cell."""
    base = base.smoothed()
    alphas, eps = partner_search.constraint_orders(base)
    q = worst_pair.q_grid(law, 2048)
    p = _reference_partner(q, alphas, eps)
    high, low = law.log_pgf_derivative(q[1:]), law.log_pgf_derivative(p[:-1])
    x = base.orders - 1.0
    worst = worst_pair.upper_envelope(x, high - low, high)
    return add_no_run_atom(x * base.epsilons + worst, law.prob_zero, base.orders)


@pytest.mark.parametrize(("curve", "law"), CASES, ids=[f"{c}-{law}" for c, law in CASES])
def test_bare_curve_bound_is_the_bisection_answer_never_looser(curve: str, law: str) -> None:
    new = generic_repeat_and_select(bare(curve), LAWS[law]).epsilons
    old = _reference_bound(bare(curve), LAWS[law])
    finite = np.isfinite(old)
    assert np.array_equal(finite, np.isfinite(new))
    assert np.all(new[finite] <= old[finite] * (1 + 1e-10) + 1e-12)  # never looser
    assert np.all(np.abs(new[finite] - old[finite]) <= 1e-6 * old[finite])  # and no different


# ---------------------------------------------------------------- the oracles catch a moved bound
@pytest.mark.slow
def test_mpmath_oracle_catches_a_partner_raised_by_1e_6(monkeypatch: pytest.MonkeyPatch) -> None:
    partner = partner_search.PartnerSearch.partner
    monkeypatch.setattr(partner_search.PartnerSearch, "partner", lambda self: partner(self) * (1 + 1e-6))
    with pytest.raises(AssertionError):
        test_partner_bounds_are_certified_and_tight_in_mpmath("gaussian-2", "geometric-10")


def test_bisection_oracle_catches_a_partner_lowered_by_1e_6(monkeypatch: pytest.MonkeyPatch) -> None:
    partner = partner_search.PartnerSearch.partner
    monkeypatch.setattr(partner_search.PartnerSearch, "partner", lambda self: partner(self) * (1 - 1e-6))
    with pytest.raises(AssertionError):
        test_bare_curve_bound_is_the_bisection_answer_never_looser("gaussian-2", "geometric-10")
