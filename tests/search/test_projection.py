"""project_to_bounded_density: exact ℓ2 projection onto S_{C,c}(π₀) (DP-HyPO §3.2, App. D).

The problem: minimise Σ w_i (f_i - p_i)² subject to c π₀_i ≤ f_i ≤ C π₀_i and
Σ w_i f_i = 1. It is strictly convex (w > 0), so its minimiser is unique and is the
point that satisfies the KKT conditions, f = clip(p - t, cπ₀, Cπ₀) for a single t.
The projection is checked against a general QP solver (quadprog, a test-only
dependency: those tests are skipped without it), against the KKT conditions, and
for feasibility, idempotence and its refusals.
"""

import math

import numpy as np
import pytest

from ray_dptune.search.projection import project_to_bounded_density

C, c = 2.0, 0.75  # the paper's bounds


def instance(rng, n, *, uniform_weights=False, uniform_prior=False, scale=1.0):
    """Random (density, prior, weights): positive weights, a prior with Σ w π₀ = 1, any real density."""
    weights = np.ones(n) if uniform_weights else rng.uniform(0.05, 5.0, n)
    prior = np.ones(n) if uniform_prior else rng.lognormal(0.0, 1.0, n)
    prior = prior / (weights * prior).sum()
    kind = rng.integers(4)
    if kind == 0:  # around the prior
        density = prior * rng.uniform(0.0, 3.0, n)
    elif kind == 1:  # any sign
        density = scale * rng.normal(0.0, 1.0, n)
    elif kind == 2:  # large values (relative to a density, ~1/n) and negative values
        density = scale * rng.choice([-1.0, 1.0], n) * rng.uniform(0.0, 1.0, n)
    else:  # a softmax-like density, as DP-HyPO feeds it
        density = np.exp(rng.normal(0.0, 2.0, n))
        density = density / (weights * density).sum()
    return density, prior, weights


def random_bounds(rng):
    """(C, c) with c < 1 < C: the paper's, or random (some close to 1)."""
    kind = rng.integers(3)
    if kind == 0:
        return C, c
    if kind == 1:
        return 1.0 + rng.exponential(1.0), rng.uniform(0.01, 0.99)
    return 1.0 + 10.0 ** rng.uniform(-4, 0), 1.0 - 10.0 ** rng.uniform(-4, -0.5)


def cases(count, seed, n_max=200):
    """Random instances, density scale 0.01 to 100; n = 1, 2, 3, 5, 10, 50, 100, 200 first, then random ≤ n_max."""
    rng = np.random.default_rng(seed)
    sizes = [1, 2, 3, 5, 10, 50, 100, 200]
    for k in range(count):
        n = sizes[k] if k < len(sizes) else int(rng.integers(1, n_max + 1))
        upper, lower = random_bounds(rng)
        scale = 10.0 ** rng.integers(-2, 3)
        yield (
            *instance(rng, n, uniform_weights=k % 5 == 0, uniform_prior=k % 7 == 0, scale=scale),
            upper,
            lower,
        )


def quadprog_projection(density, prior, weights, upper, lower):
    """The same projection by a general dense QP solver (Goldfarb-Idnani active set)."""
    quadprog = pytest.importorskip("quadprog")
    n = density.size
    # min ½ xᵀGx - aᵀx  s.t.  Aᵀx ≥ b, the first meq rows equalities.
    G = np.diag(2.0 * weights)
    a = 2.0 * weights * density
    A = np.hstack([weights[:, None], np.eye(n), -np.eye(n)])
    b = np.concatenate([[1.0], lower * prior, -upper * prior])
    return quadprog.solve_qp(G, a, A, b, meq=1)[0]


def objective(f, density, weights):
    return float((weights * (f - density) ** 2).sum())


def assert_feasible(f, prior, weights, upper, lower):
    # The bounds hold exactly: the result is produced by np.clip onto them.
    assert np.all(f >= lower * prior)
    assert np.all(f <= upper * prior)
    assert abs((weights * f).sum() - 1.0) <= 1e-12


def assert_kkt(f, density, prior, weights, upper, lower, tol=1e-9):
    """f = clip(density - t, lower·prior, upper·prior) for one t: the optimality conditions."""
    lo, hi = lower * prior, upper * prior
    shift = density - f
    scale = max(1.0, float(np.abs(density).max()), float(hi.max()))
    at_lo = f <= lo + tol * scale
    at_hi = f >= hi - tol * scale
    free = ~(at_lo | at_hi)
    # A cell at its lower bound needs t >= p - lo, one at its upper bound t <= p - hi;
    # free cells pin t = p - f.
    t_min = shift[at_lo & ~at_hi].max(initial=-math.inf)
    t_max = shift[at_hi & ~at_lo].min(initial=math.inf)
    if free.any():
        t = float(np.median(shift[free]))
        np.testing.assert_allclose(shift[free], t, rtol=0, atol=tol * scale)
        assert t_min <= t + tol * scale and t <= t_max + tol * scale
    else:
        assert t_min <= t_max + tol * scale
    np.testing.assert_array_equal(np.clip(f, lo, hi), f)


@pytest.mark.parametrize("seed", range(4))
def test_matches_a_general_qp_solver(seed):
    for density, prior, weights, upper, lower in cases(40, seed):
        f = project_to_bounded_density(density, prior, weights, upper, lower)
        reference = quadprog_projection(density, prior, weights, upper, lower)
        np.testing.assert_allclose(f, reference, rtol=0, atol=1e-9)
        # The QP solver's optimum is no better than ours.
        assert objective(f, density, weights) <= objective(reference, density, weights) * (1 + 1e-12) + 1e-15


@pytest.mark.parametrize("seed", range(4))
def test_feasible_and_optimal(seed):
    for density, prior, weights, upper, lower in cases(100, 100 + seed):
        f = project_to_bounded_density(density, prior, weights, upper, lower)
        assert f.shape == density.shape
        assert_feasible(f, prior, weights, upper, lower)
        assert_kkt(f, density, prior, weights, upper, lower)


def test_no_feasible_point_is_closer():
    """Strict convexity: any other feasible point, and any step towards it, is farther from p."""
    rng = np.random.default_rng(7)
    for density, prior, weights, upper, lower in cases(30, 7):
        f = project_to_bounded_density(density, prior, weights, upper, lower)
        best = objective(f, density, weights)
        for _ in range(5):
            other = project_to_bounded_density(rng.normal(size=f.size) * prior, prior, weights, upper, lower)
            for step in (1.0, 0.1, 1e-3):
                g = (1 - step) * f + step * other
                assert objective(g, density, weights) >= best - 1e-12 * max(1.0, best)


def test_bounds_exact_with_the_papers_setting():
    rng = np.random.default_rng(3)
    for n in (1, 2, 16, 320, 2500):
        prior = np.full(n, 1.0 / n)
        weights = np.ones(n)
        for density in (rng.exponential(1.0 / n, n), np.exp(rng.normal(0, 5, n)), -rng.exponential(1.0, n)):
            f = project_to_bounded_density(density, prior, weights, C, c)
            assert np.all(c * prior <= f) and np.all(f <= C * prior)
            assert abs(f.sum() - 1.0) <= 1e-12


def large_instance(seed=11, n=200):
    rng = np.random.default_rng(seed)
    weights = rng.uniform(0.1, 3.0, n)
    prior = rng.uniform(0.5, 2.0, n)
    prior /= (weights * prior).sum()
    return rng, prior, weights


def test_large_and_negative_values():
    rng, prior, weights = large_instance()
    n = prior.size
    for density in (
        1e6 * rng.normal(size=n),  # huge, both signs
        -1e3 - rng.exponential(size=n),  # all negative
        np.where(np.arange(n) == 5, 1e8, 0.0),  # one huge spike
        np.full(n, -42.0),  # constant
        100.0 * rng.normal(size=n),
    ):
        f = project_to_bounded_density(density, prior, weights, C, c)
        assert np.all(f >= c * prior) and np.all(f <= C * prior)  # exact
        # Σ w f = 1 up to the rounding of p - t: ulp(max |p|) per cell.
        assert abs((weights * f).sum() - 1.0) <= max(1e-12, 1e-13 * float(np.abs(density).max()))
        assert_kkt(f, density, prior, weights, C, c)
    # A constant shift of p does not change the projection.
    density = rng.normal(size=n)
    f = project_to_bounded_density(density, prior, weights, C, c)
    np.testing.assert_allclose(project_to_bounded_density(density + 1e3, prior, weights, C, c), f, atol=1e-12)
    np.testing.assert_allclose(project_to_bounded_density(density - 7.5, prior, weights, C, c), f, atol=1e-14)


def test_mass_exact_for_huge_densities():
    """p - t rounds to ulp(|p|) for |p| ~ 1e6; the remainder goes to the free cells."""
    rng, prior, weights = large_instance()
    f = project_to_bounded_density(1e6 * rng.normal(size=prior.size), prior, weights, C, c)
    assert abs((weights * f).sum() - 1.0) <= 1e-12


def test_idempotent_on_feasible_densities():
    rng = np.random.default_rng(5)
    for density, prior, weights, upper, lower in cases(100, 5):
        f = project_to_bounded_density(density, prior, weights, upper, lower)
        again = project_to_bounded_density(f, prior, weights, upper, lower)
        np.testing.assert_allclose(again, f, rtol=0, atol=1e-14 * max(1.0, float(f.max())))
    # A feasible density built directly (not by the projection) is returned as it is.
    for n in (1, 7, 200):
        weights = rng.uniform(0.2, 2.0, n)
        prior = rng.uniform(0.5, 2.0, n)
        prior /= (weights * prior).sum()
        ratio = rng.uniform(0.9, 1.1, n)
        ratio /= (weights * prior * ratio).sum()  # Σ w f = 1, ratio within [0.8, 1.25] ⊂ [c, C]
        f = prior * ratio
        np.testing.assert_allclose(project_to_bounded_density(f, prior, weights, C, c), f, rtol=0, atol=1e-15)
    # The prior itself is feasible.
    np.testing.assert_allclose(project_to_bounded_density(prior, prior, weights, C, c), prior, rtol=0, atol=1e-15)


def test_unit_bounds_return_the_prior():
    for density, prior, weights, _, _ in cases(50, 9):
        np.testing.assert_array_equal(project_to_bounded_density(density, prior, weights, 1.0, 1.0), prior)


def test_one_unit_bound_returns_the_prior():
    """C = 1 (f ≤ π₀) or c = 1 (f ≥ π₀) with Σ w f = Σ w π₀ = 1 leaves only f = π₀."""
    for k, (density, prior, weights, upper, lower) in enumerate(cases(50, 10)):
        upper, lower = (1.0, lower) if k % 2 else (upper, 1.0)
        f = project_to_bounded_density(density, prior, weights, upper, lower)
        np.testing.assert_allclose(f, prior, rtol=0, atol=1e-14 * max(1.0, float(np.abs(density).max())))


def test_single_cell_returns_the_prior():
    assert project_to_bounded_density([123.0], [0.5], [2.0], C, c).tolist() == [0.5]
    assert project_to_bounded_density([-1e9], [1.0], [1.0], 5.0, 0.1).tolist() == [1.0]


def test_uniform_case_closed_form():
    """With equal weights and a uniform prior, each cell is clip(p_i - t, c/N, C/N)."""
    p = np.array([0.5, 0.3, 0.1, 0.05, 0.05])
    f = project_to_bounded_density(p, np.full(5, 0.2), np.ones(5), C, c)
    # Bounds [0.15, 0.4]; t solves Σ clip(p - t, 0.15, 0.4) = 1: t = 0.1 gives 1.05,
    # t = 0.15 gives 0.95, t = 0.125 gives 0.375 + 0.175 + 3 × 0.15 = 1.
    np.testing.assert_allclose(f, [0.375, 0.175, 0.15, 0.15, 0.15], rtol=0, atol=1e-15)


def test_accepts_lists_and_returns_a_new_array():
    p = np.array([3.0, 1.0])
    f = project_to_bounded_density(p, np.array([0.5, 0.5]), np.ones(2), C, c)
    assert f is not p and p.tolist() == [3.0, 1.0]
    np.testing.assert_allclose(project_to_bounded_density([3.0, 1.0], [0.5, 0.5], [1, 1], C, c), f)


GOOD = (np.array([0.2, 0.5, 0.3]), np.full(3, 1.0 / 3), np.ones(3))


@pytest.mark.parametrize(
    "upper, lower",
    [
        (2.0, 1.5),  # c > 1
        (0.9, 0.5),  # C < 1
        (2.0, 0.0),  # c = 0
        (2.0, -0.5),  # c < 0
        (math.inf, 0.5),  # C infinite
        (math.nan, 0.5),
        (2.0, math.nan),
        (0.5, 2.0),  # swapped
    ],
)
def test_rejects_bad_bounds(upper, lower):
    with pytest.raises(ValueError):
        project_to_bounded_density(*GOOD, upper, lower)


@pytest.mark.parametrize(
    "density, prior, weights",
    [
        (GOOD[0], np.full(3, 0.5), GOOD[2]),  # Σ w π₀ = 1.5: not a density
        (GOOD[0], np.full(3, 0.3), GOOD[2]),  # Σ w π₀ = 0.9
        (GOOD[0], GOOD[1], np.full(3, 0.5)),  # weights change Σ w π₀
        (GOOD[0], np.array([0.5, 0.5, 0.0]), GOOD[2]),  # zero prior cell
        (GOOD[0], np.array([0.7, 0.5, -0.2]), GOOD[2]),  # negative prior cell, sum 1
        (GOOD[0], np.array([0.5, 0.5]), np.array([1.0, 1.0, 0.0])),  # zero weight
        (GOOD[0], np.array([1 / 3, 1 / 3, 1 / 3]), np.array([2.0, 2.0, -1.0])),  # negative weight, Σ w π₀ = 1
        (GOOD[0], np.full(3, 1.0 / 3), np.array([1.0, 1.0, 0.0])),  # zero weight
        (GOOD[0][:2], GOOD[1], GOOD[2]),  # shape mismatch
        (GOOD[0], GOOD[1][:2], GOOD[2]),
        (GOOD[0], GOOD[1], GOOD[2][:2]),
        (GOOD[0].reshape(3, 1), GOOD[1].reshape(3, 1), GOOD[2].reshape(3, 1)),  # not 1-D
        (np.empty(0), np.empty(0), np.empty(0)),  # empty
        (np.array([0.2, math.nan, 0.3]), GOOD[1], GOOD[2]),  # NaN density
        (np.array([0.2, math.inf, 0.3]), GOOD[1], GOOD[2]),  # infinite density
        (GOOD[0], np.array([0.5, math.nan, 0.5]), GOOD[2]),  # NaN prior
        (GOOD[0], GOOD[1], np.array([1.0, math.nan, 1.0])),  # NaN weight
        (GOOD[0], np.array([0.5, math.inf, 0.5]), GOOD[2]),  # infinite prior
    ],
)
def test_rejects_bad_arrays(density, prior, weights):
    with pytest.raises(ValueError):
        project_to_bounded_density(density, prior, weights, C, c)
