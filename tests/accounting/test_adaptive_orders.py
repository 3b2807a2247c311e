"""The subsampled Gaussian on an adaptive order grid: valid at every order, as tight as every order computed."""

import math

import numpy as np
import pytest
from scipy import integrate

from ray_dptune.accounting.bounds.distributions import Poisson, TruncatedNegativeBinomial
from ray_dptune.accounting.bounds.selection import repeat_and_select
from ray_dptune.accounting.curves import adaptive_orders
from ray_dptune.accounting.curves.rdp import DEFAULT_ORDERS, RDPCurve

SETTINGS = [  # (q, σ, steps): DP-SGD from strong to weak privacy, small and large batches
    (0.01, 1.1, 1000),
    (0.004, 0.8, 2000),
    (0.16, 1.5, 60),
    (0.001, 3.0, 10000),
    (0.05, 0.6, 300),
    (0.0178, 1.73, 500),
    (0.5, 1.0, 10),
    (1e-5, 1.0, 100000),
    (0.02, 10.0, 50),
]


def true_log_moment(q: float, sigma: float, order: float) -> float:
    """log E_{z~N(0,σ²)}[((1 − q) + q e^{(2z − 1)/(2σ²)})^α] by quadrature, independent of dp_accounting."""

    def exponent(z):
        log_ratio = np.logaddexp(math.log1p(-q), math.log(q) + (2 * z - 1) / (2 * sigma**2))
        return order * log_ratio - z**2 / (2 * sigma**2)

    low, high = -40 * sigma, 40 * sigma + order + 1  # the integrand's mass, with its peak shifted by up to ~α
    peak = float(np.max(exponent(np.linspace(low, high, 20001))))
    breaks = list(np.linspace(low, high, 41)[1:-1])
    value, _ = integrate.quad(
        lambda z: math.exp(exponent(z) - peak), low, high, epsabs=0, epsrel=1e-13, limit=800, points=breaks
    )
    return math.log(value / (sigma * math.sqrt(2 * math.pi))) + peak


@pytest.mark.parametrize("q, sigma", [(0.01, 1.1), (0.05, 0.9), (0.2, 2.0), (0.001, 0.7)])
def test_every_order_bounds_the_true_divergence(q, sigma):
    """Orders between computed ones are chords of a convex function: never below the quadrature truth."""
    curve = RDPCurve.subsampled_gaussian(sample_rate=q, noise_multiplier=sigma, steps=1)
    checked = DEFAULT_ORDERS[(DEFAULT_ORDERS <= 40)][::3]
    truth = np.array([true_log_moment(q, sigma, a) / (a - 1) for a in checked])
    assert np.all(curve.at(checked) >= truth * (1 - 1e-9))
    assert np.all(np.isfinite(curve.at(checked)))


def test_computed_orders_equal_dp_accountings_and_the_rest_lie_on_chords(monkeypatch):
    """Nodes carry dp_accounting's own value; between nodes the curve is the chord of (α − 1)ε(α)."""
    computed = []
    original = adaptive_orders.dp_accounting_step_rdp

    def spy(**kwargs):
        values = original(**kwargs)
        computed.extend(zip(kwargs["orders"], values))
        return values

    monkeypatch.setattr(adaptive_orders, "dp_accounting_step_rdp", spy)
    curve = RDPCurve.subsampled_gaussian(sample_rate=0.01, noise_multiplier=1.1, steps=1)
    nodes = {float(a): float(v) for a, v in computed if math.isfinite(v)}
    on_grid = [a for a in nodes if a in set(DEFAULT_ORDERS)]
    assert on_grid and all(curve.at(np.array([a]))[0] == pytest.approx(nodes[a], rel=1e-12) for a in on_grid)
    assert len(computed) < np.sum(DEFAULT_ORDERS <= 1024) / 2  # fewer than half the orders were computed
    xs = np.array(sorted(nodes))
    between = DEFAULT_ORDERS[(DEFAULT_ORDERS > xs[0]) & (DEFAULT_ORDERS < xs[-1])]
    chord = np.interp(between, xs, np.array([nodes[x] * (x - 1) for x in xs])) / (between - 1)
    np.testing.assert_allclose(curve.at(between), np.minimum(chord, between / (2 * 1.1**2)), rtol=1e-12)


@pytest.mark.slow
@pytest.mark.parametrize("q, sigma, steps", SETTINGS)
def test_as_tight_as_every_order_computed(q, sigma, steps):
    """ε(δ), and the selection bounds built on the curve, within 1e-4 of computing all 241 orders."""
    adaptive = RDPCurve.subsampled_gaussian(sample_rate=q, noise_multiplier=sigma, steps=steps)
    dense = RDPCurve.subsampled_gaussian(sample_rate=q, noise_multiplier=sigma, steps=steps, orders=DEFAULT_ORDERS)
    for delta in (1e-5, 1e-9):
        assert adaptive.epsilon(delta=delta) <= dense.epsilon(delta=delta) * (1 + 1e-4)
    for law in (TruncatedNegativeBinomial.from_mean(1.0, 10), TruncatedNegativeBinomial.from_mean(0.0, 3), Poisson(10)):
        tight = repeat_and_select(dense, law).epsilon(delta=1e-5)
        assert repeat_and_select(adaptive, law).epsilon(delta=1e-5) <= tight * (1 + 1e-4)


def test_orders_dp_accounting_cannot_sum_are_bounded_by_their_neighbours():
    """q = 0.5, σ = 1: fractional orders near 1 do not converge; chords and the Gaussian bound cover them."""
    curve = RDPCurve.subsampled_gaussian(sample_rate=0.5, noise_multiplier=1.0, steps=10)
    below_top = DEFAULT_ORDERS <= 1024
    assert np.all(np.isfinite(curve.epsilons[below_top]))
    assert np.all(np.diff(curve.epsilons) >= -1e-12 * curve.epsilons[1:])  # (α − 1)ε convex, 0 at 1: ε non-decreasing
    assert np.all(curve.epsilons <= 10 * DEFAULT_ORDERS / 2 * (1 + 1e-12))  # never above the full batch's Gaussian


def test_above_the_largest_computed_order_the_full_batch_gaussian_bounds_it():
    curve = RDPCurve.subsampled_gaussian(sample_rate=0.01, noise_multiplier=2.0, steps=7)
    high = DEFAULT_ORDERS > 1024
    np.testing.assert_allclose(curve.epsilons[high], 7 * DEFAULT_ORDERS[high] / (2 * 2.0**2), rtol=1e-12)


@pytest.mark.parametrize("max_order", [30.0, 100.0, 1024.0])
def test_no_order_is_bounded_below_dp_accountings_value_whatever_the_cap(max_order):
    """f(α) = (α − 1)ε(α) at every requested order is at least dp_accounting's own (or inf), also for orders
    the initial nodes do not reach (a cap between nodes) and orders past the cap."""
    orders = np.array([1.5, 2.0, 7.0, 30.0, 50.0, 100.0, 700.0, 1024.0, 2000.0])
    kwargs = {"sample_rate": 0.01, "noise_multiplier": 1.1}
    moments = adaptive_orders.subsampled_gaussian_step_moments(**kwargs, steps=1, orders=orders, max_order=max_order)
    exact = adaptive_orders.dp_accounting_step_rdp(**kwargs, orders=orders) * (orders - 1.0)
    assert np.all(moments >= exact * (1 - 1e-12))
    assert np.all(np.isinf(moments[orders > max_order]))
    assert np.all(np.isfinite(moments[orders <= min(max_order, 24.0)]))  # the initial nodes reach these
