"""γ_T's bound is never below the truth through rounding: each piece against 40-digit mpmath.

DP-BO's sensitivity (Kusner Theorem 3) takes an upper bound on γ_T; the bound is composed
from ½ log det(I + K_S/σ²) and the posterior variances Var[f(λ) | y_S]. The cases are
near-singular kernels (three tight clusters) with σ² down to 1e-12, where numpy's own
log-determinant and posterior variance fall below the truth (asserted below, so that
the cases keep their teeth); the bounds must stay above it and, where σ² is not tiny,
within 1e-9 of it. The kernels themselves are checked against the exact kernel function.
"""

import itertools
import math

import mpmath as mp
import numpy as np
import pytest

from ray_dptune.accounting.bounds import information_gain as ig
from ray_dptune.accounting.bounds import rounding

NOISES = (1e-2, 1e-6, 1e-9, 1e-12)
LOOSENESS = {1e-2: 1e-11, 1e-6: 1e-8, 1e-9: 1e-5, 1e-12: 3e-3}
"""How far above the exact log det its bound may be: the rounding allowance grows as 1/σ²."""
CASES = [(seed, kernel) for seed in range(5) for kernel in ("rbf", "matern52")]


def clustered_kernel(seed: int, kernel: str, n: int = 24) -> np.ndarray:
    """n points in 3 clusters of width 1e-4 to 1e-1; + 1e-13·I makes the float matrix itself PSD."""
    rng = np.random.default_rng(seed)
    centres = rng.random((3, 2))
    x = centres[rng.integers(0, 3, n)] + rng.normal(0, 10 ** rng.uniform(-4, -1), (n, 2))
    return ig.kernel_matrix(x, x, kernel=kernel, lengthscale=0.3) + 1e-13 * np.eye(n)


def exact(kernel: np.ndarray, chosen: list[int], noise: float) -> tuple[mp.mpf, list[mp.mpf]]:
    """½ log det(I + K_S/σ²) and every Var[f(λ) | y_S], at 40 digits, the float entries taken as exact."""
    with mp.workdps(40):
        big = mp.matrix(kernel.tolist())
        sigma2 = mp.mpf(noise)
        block = mp.matrix(
            [[big[p, q] + (sigma2 if a == b else 0) for b, q in enumerate(chosen)] for a, p in enumerate(chosen)]
        )
        information = mp.log(mp.det(block / sigma2)) / 2
        inverse = block**-1
        variances = []
        for i in range(kernel.shape[0]):
            column = mp.matrix([big[p, i] for p in chosen])
            variances.append(big[i, i] - (column.T * inverse * column)[0])
        return information, variances


@pytest.fixture(scope="module")
def truths():
    """Each case's kernel, multiset S (10 draws, repeats allowed) and exact values, computed once."""
    table = {}
    for seed, kernel in CASES:
        k = clustered_kernel(seed, kernel)
        chosen = [int(p) for p in np.random.default_rng(100 + seed).integers(0, k.shape[0], 10)]
        for noise in NOISES:
            table[seed, kernel, noise] = (k, chosen, *exact(k, chosen, noise))
    return table


def test_the_cases_are_where_numpy_falls_below_the_truth(truths):
    """numpy's log det (information_gain) and its posterior variance, with no rounding added, go below."""
    low_information = low_variance = 0
    for (_, _, noise), (k, chosen, information, variances) in truths.items():
        low_information += ig.information_gain(k[np.ix_(chosen, chosen)], noise) < information
        block = k[np.ix_(chosen, chosen)] + noise * np.eye(len(chosen))
        plain = np.diag(k) - np.einsum("ij,ij->j", k[chosen, :], np.linalg.solve(block, k[chosen, :]))
        low_variance += any(plain[i] < variances[i] for i in range(k.shape[0]))
    assert low_information >= 5 and low_variance >= 10, (low_information, low_variance)


def test_information_gain_upper_bound_is_above_the_exact_log_det(truths):
    for (seed, kernel, noise), (k, chosen, information, _) in truths.items():
        bound = ig.information_gain_upper_bound(k[np.ix_(chosen, chosen)], noise)
        assert bound >= information, (seed, kernel, noise, bound, information)
        assert bound <= information * (1 + LOOSENESS[noise]), (seed, kernel, noise, bound, information)


def test_posterior_variance_upper_bound_is_above_the_exact_posterior(truths):
    for (seed, kernel, noise), (k, chosen, _, variances) in truths.items():
        bound = ig.posterior_variance_upper_bound(k, chosen, noise)
        slack = [float(bound[i] - variances[i]) for i in range(k.shape[0])]
        assert min(slack) >= 0, (seed, kernel, noise, min(slack))
        if noise >= 1e-6:
            assert max(slack) <= 1e-11, (seed, kernel, noise, max(slack))
        assert np.all(bound <= np.diag(k))  # never above the prior variance, which bounds every posterior one


@pytest.mark.parametrize("kernel", ["rbf", "matern52"])
def test_gamma_bound_is_above_the_exact_maximum_where_rounding_bites(kernel):
    """8 clustered points, σ² = 1e-9, T = 2: every multiset's exact gain (40 digits) is below the bound."""
    k = clustered_kernel(3, kernel, n=8)
    best = max(exact(k, list(pair), 1e-9)[0] for pair in itertools.combinations_with_replacement(range(8), 2))
    bound = ig.max_information_gain_bound(k, 2, 1e-9)
    assert best <= bound <= 2 * best


def test_where_rounding_could_reach_sigma2_the_log_det_bound_gives_up_and_gamma_falls_back():
    """σ² = 1e-14 is below the Cholesky's proven error (~1e-14): no log det bound, and γ_T's bound is the
    one with S = ∅, (T/2) log(1 + max k(λ, λ)/σ²), nudged up by round_up's 1e-12."""
    k = clustered_kernel(0, "rbf")
    chosen = list(range(10))
    assert ig.information_gain_upper_bound(k[np.ix_(chosen, chosen)], 1e-13) < math.inf
    assert ig.information_gain_upper_bound(k[np.ix_(chosen, chosen)], 1e-14) == math.inf
    empty_set = 2.5 * math.log1p(float(np.diag(k).max()) / 1e-14)
    assert ig.max_information_gain_bound(k, 5, 1e-14) == pytest.approx(empty_set * (1 + 1e-12), rel=1e-15)


def test_entry_error_is_the_bound_for_the_kernel_plus_2n_entry_error_on_its_diagonal():
    """entry_error = e bounds γ_T for K + D, D ⪰ 2n·e·I (⪰ the exact kernel's matrix: ‖K − K_exact‖₂ ≤ n·e):
    the diagonal k_ii + 2n·e one ulp up, so that rounding never shrinks D, even where 2n·e is below an ulp."""
    k = clustered_kernel(1, "matern52", n=12)
    for error in (1e-3, 1e-18):
        shifted = k.copy()
        np.fill_diagonal(shifted, np.nextafter(np.diag(k) + 2 * 12 * error, math.inf))
        above = []
        for rounds, noise in ((1, 0.1), (4, 0.01), (30, 1e-4)):
            bound = ig.max_information_gain_bound(shifted, rounds, noise)
            assert ig.max_information_gain_bound(k, rounds, noise, entry_error=error) == bound
            above.append(bound > ig.max_information_gain_bound(k, rounds, noise))
        assert all(above) if error == 1e-3 else any(above)  # one ulp of the diagonal shows at T = 30


def test_a_noise_variance_too_small_for_any_finite_bound_is_refused_by_name():
    x = np.random.default_rng(0).random((20, 2))
    with pytest.raises(ValueError, match="noise_variance = 1e-320"):
        ig.max_information_gain_bound_from_points(x, 5, 1e-320, kernel="rbf", lengthscale=0.2)


def test_refusals_name_the_input():
    k = clustered_kernel(0, "rbf", n=4)
    with pytest.raises(ValueError, match="symmetric"):
        ig.max_information_gain_bound(k + np.triu(np.full((4, 4), 1e-12), 1), 2, 0.1)
    with pytest.raises(ValueError, match="chosen"):
        ig.posterior_variance_upper_bound(k, [4], 0.1)
    with pytest.raises(ValueError, match="chosen"):
        ig.posterior_variance_upper_bound(k, [], 0.1)
    with pytest.raises(ValueError, match="entry_error"):
        ig.max_information_gain_bound(k, 2, 0.1, entry_error=-1.0)


@pytest.mark.parametrize("kernel", ["rbf", "matern52"])
@pytest.mark.parametrize("dim", [1, 3, 8])
@pytest.mark.parametrize("scale", [1e-200, 1e-3, 1.0, 1e3, 1e200])
def test_kernel_entries_are_within_their_error_bound(kernel, dim, scale):
    """kernel_matrix against the kernel evaluated at 40 digits on the same float inputs, at any scale."""
    rng = np.random.default_rng(dim)
    x = scale * rng.random((12, dim))
    x[6:] = x[:6] + scale * 10 ** rng.uniform(-12, 0, (6, 1)) * rng.normal(size=(6, dim))  # close pairs too
    lengthscale = scale * rng.uniform(0.05, 2.0)
    computed = ig.kernel_matrix(x, x, kernel=kernel, lengthscale=lengthscale)
    worst = 0.0
    with mp.workdps(40):
        for i, j in itertools.product(range(12), repeat=2):
            r = mp.sqrt(mp.fsum((mp.mpf(a) - mp.mpf(b)) ** 2 for a, b in zip(x[i], x[j], strict=True))) / lengthscale
            if kernel == "rbf":
                value = mp.exp(-(r**2) / 2)
            else:
                z = mp.sqrt(5) * r
                value = (1 + z + z**2 / 3) * mp.exp(-z)
            worst = max(worst, abs(float(computed[i, j] - value)))
    assert worst <= ig.kernel_entry_error(dim), (worst, ig.kernel_entry_error(dim))


def test_gamma_and_upper_sum_cover_the_errors_they_state():
    """γ_k ≥ ku/(1 − ku) (Higham Lemma 3.1), refused from ku ≥ ½; upper_sum covers 4u(|tᵢ| + 1) per term."""
    u = rounding.UNIT_ROUNDOFF
    with mp.workdps(40):
        for k in (1, 2, 10, 1000, 10**6, 2**51):
            exact_gamma = mp.mpf(k) * u / (1 - mp.mpf(k) * u)
            assert exact_gamma <= rounding.gamma(k) <= exact_gamma * (1 + 1e-14)
        with pytest.raises(ValueError, match="roundings"):
            rounding.gamma(2**52)
        rng = np.random.default_rng(0)
        for size in (1, 10, 1000):
            terms = rng.normal(size=size) * 10 ** rng.uniform(-5, 5, size)
            exact_sum = mp.fsum(mp.mpf(t) for t in terms)
            allowance = 4 * u * mp.fsum(abs(mp.mpf(t)) + 1 for t in terms)
            assert rounding.upper_sum(terms) >= exact_sum + allowance
