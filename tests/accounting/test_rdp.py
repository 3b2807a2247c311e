"""RDPCurve: validation, composition, smoothing, (ε, δ) conversion, base mechanisms."""

import dataclasses
import math

import numpy as np
import pytest
from dp_accounting import get_epsilon_gaussian
from dp_accounting.rdp import rdp_privacy_accountant as dp_rdp
from scipy import optimize

from ray_dptune.accounting import DEFAULT_ORDERS, RDPCurve, gaussian_profile, subsampled_gaussian_profile

DP_ORDERS = np.array(dp_rdp.DEFAULT_RDP_ORDERS, dtype=float)


@pytest.mark.parametrize(
    "orders, epsilons, message",
    [
        ([2.0, 1.5], [1.0, 1.0], "strictly increasing"),
        ([2.0, 2.0], [1.0, 1.0], "strictly increasing"),
        ([1.0, 2.0], [1.0, 1.0], "> 1"),
        ([2.0, np.nan], [1.0, 1.0], "finite"),
        ([2.0, 3.0], [1.0, np.nan], "NaN"),
        ([2.0, 3.0], [1.0, -0.1], ">= 0"),
        ([2.0, 3.0], [1.0], "equal length"),
        ([], [], "non-empty"),
    ],
)
def test_invalid_curves_raise(orders, epsilons, message):
    with pytest.raises(ValueError, match=message):
        RDPCurve(orders, epsilons)


def test_curve_is_immutable_and_owns_its_arrays():
    orders = np.array([2.0, 4.0])
    curve = RDPCurve(orders, [0.1, 0.2])
    orders[0] = 1.5
    assert curve.orders[0] == 2.0
    with pytest.raises(ValueError):
        curve.epsilons[0] = 0.0
    with pytest.raises(dataclasses.FrozenInstanceError):
        curve.orders = orders


def test_default_orders_reach_close_to_one_and_far():
    assert DEFAULT_ORDERS[0] < 1.01 and DEFAULT_ORDERS[-1] >= 1e5
    assert np.all(np.diff(DEFAULT_ORDERS) > 0)


def test_mechanism_closed_forms():
    a = DEFAULT_ORDERS
    np.testing.assert_allclose(RDPCurve.gaussian(noise_multiplier=2.0).epsilons, a / 8.0, rtol=1e-15)
    np.testing.assert_allclose(RDPCurve.zcdp(rho=0.3).epsilons, 0.3 * a, rtol=1e-15)
    np.testing.assert_allclose(RDPCurve.pure(epsilon=0.5).epsilons, np.minimum(0.5, a * 0.125), rtol=1e-15)
    assert np.all(RDPCurve.zero().epsilons == 0)
    # where σ² overflows, α/σ/(2σ); where αε²/2 underflows, a positive floor (0 would claim no loss at all)
    huge_sigma = RDPCurve.gaussian(noise_multiplier=1e150, orders=np.array([1e6])).epsilons[0]
    assert huge_sigma == pytest.approx(5e-295, rel=1e-12, abs=0)
    assert 0 < RDPCurve.pure(epsilon=1e-200, orders=np.array([2.0])).epsilons[0] <= 2e-300
    with pytest.raises(ValueError, match="noise_multiplier"):
        RDPCurve.gaussian(noise_multiplier=0.0)
    with pytest.raises(ValueError, match="rho"):
        RDPCurve.zcdp(rho=-1.0)


def test_composition_adds_and_multiplies():
    g = RDPCurve.gaussian(noise_multiplier=3.0)
    z = RDPCurve.zcdp(rho=0.01)
    np.testing.assert_allclose((g + z).epsilons, g.epsilons + z.epsilons)
    np.testing.assert_allclose((5 * g).epsilons, 5 * g.epsilons)
    assert 5 * g == g * 5
    np.testing.assert_allclose((5 * g).epsilons, (g + g + g + g + g).epsilons, rtol=1e-15, atol=0)
    assert (5 * g).mechanism.steps == 5 and (g + g).mechanism is None  # a product keeps the known mechanism
    assert np.all((0 * RDPCurve([2.0], [np.inf])).epsilons == 0)
    with pytest.raises(TypeError):
        _ = 2.5 * g
    with pytest.raises(ValueError, match="non-negative"):
        _ = -1 * g


def test_composition_on_different_grids_is_conservative():
    a = RDPCurve([2.0, 4.0, 8.0], [0.2, 0.4, 0.8])
    b = RDPCurve([3.0, 4.0, 16.0], [0.3, 0.4, 1.6])
    c = a + b
    assert c.orders.tolist() == [2.0, 3.0, 4.0, 8.0]  # up to the smaller top order
    # at order 3, a is only known at 4 (0.4): monotonicity gives D_3 <= D_4
    assert c.epsilons.tolist() == pytest.approx([0.2 + 0.3, 0.4 + 0.3, 0.8, 0.8 + 1.6])
    assert c.at(np.array([100.0]))[0] == np.inf


def test_resampling_reads_each_new_order_from_the_next_order_above():
    g = RDPCurve.gaussian(noise_multiplier=2.0, orders=np.array([2.0, 4.0, 8.0]))
    r = g.resample(np.array([1.5, 3.0, 4.0, 16.0]))
    assert r.epsilons.tolist() == [2.0 / 8, 4.0 / 8, 4.0 / 8, math.inf]  # D_α <= D_α' for α <= α'
    assert r.orders.tolist() == [1.5, 3.0, 4.0, 16.0] and r.mechanism == g.mechanism


def test_smoothing_applies_monotonicity():
    curve = RDPCurve([2.0, 3.0, 4.0, 5.0], [1.0, 0.5, 0.7, 0.6])
    assert curve.smoothed().epsilons.tolist() == [0.5, 0.5, 0.6, 0.6]
    assert curve.smoothed().smoothed() == curve.smoothed()


@pytest.mark.parametrize("curve_name", ["gaussian", "dpsgd", "composed"])
@pytest.mark.parametrize("delta", [1e-10, 1e-6, 1e-3, 0.3])
def test_conversion_matches_dp_accounting(curve_name, delta):
    curve = {
        "gaussian": RDPCurve.gaussian(noise_multiplier=1.3, orders=DP_ORDERS),
        "dpsgd": RDPCurve.subsampled_gaussian(sample_rate=0.02, noise_multiplier=1.1, steps=500, orders=DP_ORDERS),
        "composed": 30 * RDPCurve.gaussian(noise_multiplier=4.0, orders=DP_ORDERS),
    }[curve_name]
    theirs, _ = dp_rdp.compute_epsilon(curve.orders, curve.epsilons, delta)
    assert curve.epsilon(delta=delta) == pytest.approx(theirs, rel=1e-9, abs=1e-12)
    eps = max(theirs, 0.5)
    their_delta, _ = dp_rdp.compute_delta(curve.orders, curve.epsilons, eps)
    assert curve.delta(epsilon=eps) == pytest.approx(their_delta, rel=1e-9, abs=1e-300)


def test_epsilon_delta_round_trip():
    curve = RDPCurve.subsampled_gaussian(sample_rate=0.01, noise_multiplier=1.0, steps=1000)
    for delta in (1e-8, 1e-5, 1e-2):
        eps = curve.epsilon(delta=delta)
        assert curve.delta(epsilon=eps) <= delta * (1 + 1e-9)
        assert curve.delta(epsilon=eps * 0.98) > delta


@pytest.mark.parametrize("rho", np.logspace(-5, 2, 15))
@pytest.mark.parametrize("delta", [1e-12, 1e-9, 1e-6, 1e-3, 1e-2])
def test_default_grid_is_within_a_tenth_of_a_percent_of_the_continuous_optimum(rho, delta):
    def cks(alpha):
        return rho * alpha + math.log1p(-1 / alpha) - (math.log(delta) + math.log(alpha)) / (alpha - 1)

    x_star = math.sqrt(math.log(1 / delta) / rho)
    res = optimize.minimize_scalar(
        lambda lx: cks(1 + math.exp(lx)), bracket=(math.log(x_star) - 1, math.log(x_star) + 1), tol=1e-12
    )
    continuous = max(0.0, res.fun)
    ours = RDPCurve.zcdp(rho=rho).epsilon(delta=delta)
    assert ours >= continuous * (1 - 1e-9)
    assert ours <= continuous * (1 + 1e-3)


@pytest.mark.slow
def test_subsampled_gaussian_matches_an_independent_implementation():
    """Opacus's analysis (Mironov, Talwar & Zhang 2019) on integer orders."""
    opacus_rdp = pytest.importorskip("opacus.accountants.analysis.rdp")
    orders = np.array([2.0, 3.0, 5.0, 8.0, 16.0, 32.0, 64.0])
    ours = RDPCurve.subsampled_gaussian(sample_rate=0.02, noise_multiplier=1.1, steps=300, orders=orders).epsilons
    theirs = opacus_rdp.compute_rdp(q=0.02, noise_multiplier=1.1, steps=300, orders=orders)
    np.testing.assert_allclose(ours, theirs, rtol=1e-6)
    # Without subsampling, DP-SGD is composition of Gaussians.
    full = RDPCurve.subsampled_gaussian(sample_rate=1.0, noise_multiplier=2.0, steps=7, orders=orders)
    np.testing.assert_allclose(full.epsilons, 7 * orders / 8.0, rtol=1e-9)


@pytest.mark.parametrize("sigma", [0.5, 1.0, 2.236, 10.0])
def test_gaussian_profile_is_exact(sigma):
    profile = gaussian_profile(noise_multiplier=sigma)
    for delta in (1e-9, 1e-6, 1e-3):
        eps = get_epsilon_gaussian(sigma, delta)
        assert float(profile(np.array([eps]))[0]) == pytest.approx(delta, rel=1e-6)
    # RDP conversion can never beat the exact profile of the same mechanism.
    curve = RDPCurve.gaussian(noise_multiplier=sigma)
    eps_grid = np.linspace(0.0, 8.0, 41)
    assert np.all([curve.delta(epsilon=e) >= p * (1 - 1e-9) for e, p in zip(eps_grid, profile(eps_grid))])
    assert np.all(np.diff(profile(eps_grid)) <= 0)


@pytest.mark.slow
def test_subsampled_gaussian_profile_is_an_upper_bound_tighter_than_rdp():
    q, sigma, steps = 0.05, 1.2, 50
    profile = subsampled_gaussian_profile(sample_rate=q, noise_multiplier=sigma, steps=steps)
    curve = RDPCurve.subsampled_gaussian(sample_rate=q, noise_multiplier=sigma, steps=steps)
    eps = np.array([0.5, 1.0, 2.0])
    pld = profile(eps)
    assert np.all(pld <= [curve.delta(epsilon=e) for e in eps])
    # one unsampled step is the Gaussian mechanism: pessimistic PLD is above the exact value, by little
    one = subsampled_gaussian_profile(sample_rate=1.0, noise_multiplier=sigma, steps=1)(eps)
    exact = gaussian_profile(noise_multiplier=sigma)(eps)
    assert np.all(one >= exact * (1 - 1e-12)) and np.allclose(one, exact, rtol=1e-2)


def test_record_round_trip_keeps_infinity():
    curve = RDPCurve([1.5, 2.0, 64.0], [0.1, 0.2, np.inf])
    record = curve.to_dict()
    assert record["epsilons"][-1] == "inf"
    assert RDPCurve.from_dict(record) == curve
    with pytest.raises(ValueError, match="Not an RDP curve"):
        RDPCurve.from_dict({"orders": [2.0]})


def test_epsilon_rejects_bad_delta():
    curve = RDPCurve.gaussian(noise_multiplier=1.0)
    for bad in (0.0, 1.0, -1e-5, float("nan")):
        with pytest.raises(ValueError, match="delta"):
            curve.epsilon(delta=bad)
    with pytest.raises(ValueError, match="epsilon"):
        curve.delta(epsilon=-1.0)


@pytest.mark.slow
def test_subsampled_profile_accepts_any_order_of_epsilons():
    profile = subsampled_gaussian_profile(sample_rate=0.05, noise_multiplier=1.2, steps=20)
    eps = np.array([2.0, 0.5, 1.0])
    np.testing.assert_array_equal(profile(eps), profile(np.sort(eps))[[2, 0, 1]])


def test_dominates_is_conservative_across_grids():
    plan = RDPCurve([2.0, 4.0, 8.0], [0.2, 0.4, 0.8])
    assert plan.dominates(RDPCurve([2.0, 4.0, 8.0], [0.2, 0.39, 0.8]))
    # spent known only at 3 and 8: at plan's order 4 it may be as high as its value at 8
    assert not plan.dominates(RDPCurve([3.0, 8.0], [0.1, 0.5]))
    assert plan.dominates(RDPCurve([3.0, 5.0, 8.0], [0.1, 0.4, 0.8]))
    # no information at plan's top order: not covered
    assert not plan.dominates(RDPCurve([2.0, 4.0], [0.1, 0.2]))


@pytest.mark.slow
def test_dp_accounting_convergence_failures_are_not_logged_per_order(caplog):
    """q = 1/15, σ = 1: dp_accounting cannot sum its series at ~100 fractional orders; the Gaussian bounds them."""
    from ray_dptune.accounting.curves.adaptive_orders import dp_accounting_step_rdp

    unsummed = np.isinf(dp_accounting_step_rdp(sample_rate=1 / 15 + 1e-9, noise_multiplier=1.0, orders=DEFAULT_ORDERS))
    with caplog.at_level("WARNING"):
        dense = RDPCurve.subsampled_gaussian(
            sample_rate=1 / 15 + 1e-9, noise_multiplier=1.0, steps=10, orders=DEFAULT_ORDERS
        )
        adaptive = RDPCurve.subsampled_gaussian(sample_rate=1 / 15 + 1e-9, noise_multiplier=1.0, steps=10)
    assert not [record for record in caplog.records if "failed to converge" in record.getMessage()]
    assert unsummed.sum() > 50
    gaussian = RDPCurve.gaussian(noise_multiplier=1.0).epsilons * 10
    np.testing.assert_array_equal(dense.epsilons[unsummed], gaussian[unsummed])
    assert math.isfinite(dense.epsilon(delta=1e-5)) and math.isfinite(adaptive.epsilon(delta=1e-5))


def _exact_conversions(curve: RDPCurve, *, epsilon: float, delta: float) -> tuple[float, float]:
    """CKS 2020 Prop. 12 and Bretagnolle–Huber over the curve's grid, in 50-digit arithmetic: (δ(ε), ε(δ))."""
    import mpmath

    mpmath.mp.dps = 50
    deltas, epsilons = [], []
    for alpha, rdp in zip(curve.orders.tolist(), curve.epsilons.tolist()):
        a, r = mpmath.mpf(alpha), mpmath.mpf(rdp)
        deltas.append(mpmath.exp((a - 1) * (r - epsilon + mpmath.log(a - 1) - mpmath.log(a)) - mpmath.log(a)))
        deltas.append(mpmath.sqrt(-mpmath.expm1(-r)))
        at_alpha = r + mpmath.log(a - 1) - mpmath.log(a) - (mpmath.log(delta) + mpmath.log(a)) / (a - 1)
        epsilons.append(mpmath.mpf(0) if delta**2 + mpmath.expm1(-r) > 0 else at_alpha)
    return float(min(min(deltas), 1)), float(max(min(epsilons), 0))


@pytest.mark.parametrize("seed", range(6))
def test_conversions_never_fall_below_their_formula_in_exact_arithmetic(seed):
    """δ(ε) and ε(δ) are at least Prop. 12's value over the grid computed in 50 digits, and within
    the rounding margin above it: a margin that rounds down (1 − 1e-12) fails this."""
    rng = np.random.default_rng(seed)
    orders = np.sort(rng.uniform(1.05, 200.0, size=12))
    curve = RDPCurve(orders, rng.uniform(0.01, 2.0) * orders ** rng.uniform(0.3, 1.0))
    for epsilon in (0.5, 2.0, 6.0):
        exact_delta, _ = _exact_conversions(curve, epsilon=epsilon, delta=0.5)
        if 1e-300 < exact_delta < 1:
            got = curve.delta(epsilon=epsilon)
            assert exact_delta <= got <= exact_delta * (1 + 3e-12), (epsilon, got, exact_delta)
    for delta in (1e-5, 1e-9):
        _, exact_epsilon = _exact_conversions(curve, epsilon=1.0, delta=delta)
        if exact_epsilon > 0:
            got = curve.epsilon(delta=delta)
            assert exact_epsilon <= got <= exact_epsilon * (1 + 3e-12), (delta, got, exact_epsilon)
