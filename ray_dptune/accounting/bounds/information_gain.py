"""γ_T, the maximum information gain of T noisy GP observations, and a sound bound on it.

GP-UCB's regret bound (Srinivas Theorem 1), hence DP-BO's score sensitivity (Kusner
Theorem 3), needs an upper bound on γ_T over the finite candidate set Λ.

References:
    Srinivas, Krause, Kakade, Seeger. "Gaussian Process Optimization in the Bandit
    Setting", ICML 2010: §2 (information gain), Lemma 5.3–5.4.
    Krause & Guestrin 2005: the information gain is monotone submodular.
    Higham, "Accuracy and Stability of Numerical Algorithms", 2nd ed. 2002: the rounding
    errors added to each bound.

Nemhauser et al.'s F(greedy)/(1 − 1/e) is not among the bounds: it holds only for an exact
greedy, which floating point does not give. Everything is in the GP's units; numpy and scipy.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Literal

import numpy as np
import scipy.linalg

from ray_dptune import validate
from ray_dptune.accounting.bounds.rounding import UNIT_ROUNDOFF, gamma, log_det_upper_bound, round_up

__all__ = [
    "KernelName",
    "information_gain",
    "information_gain_upper_bound",
    "kernel_entry_error",
    "kernel_matrix",
    "max_information_gain_bound",
    "max_information_gain_bound_from_points",
    "posterior_variance_upper_bound",
]

MAX_ROUNDS = 10_000  # the greedy γ_T bound costs O(T³) time and O(T²) memory
KernelName = Literal["rbf", "matern52"]


def kernel_matrix(x: np.ndarray, y: np.ndarray, *, kernel: KernelName, lengthscale: float) -> np.ndarray:
    """k2(x, y) with k2(λ, λ) = 1 (Kusner §2): squared exponential or Matérn-5/2.

    Args:
        x: (n, d) inputs (the unit cube of the searcher's coordinates).
        y: (m, d) inputs, in the same coordinates.
        kernel: "rbf", exp(−r²/2); or "matern52", (1 + √5 r + 5r²/3) e^{−√5 r}; r = ‖x − y‖/ℓ.
        lengthscale: ℓ > 0, fixed before seeing any data.

    Each entry is within :func:`kernel_entry_error` of the exact kernel's, at any scale: the
    differences are scaled before they are squared (a distance that overflows is a kernel of 0).
    """
    ell = validate.fixed_positive("lengthscale", lengthscale)
    x, y = np.atleast_2d(validate.finite_array("x", x)), np.atleast_2d(validate.finite_array("y", y))
    if kernel not in ("rbf", "matern52"):
        raise ValueError(f"kernel must be 'rbf' or 'matern52', got {kernel!r}.")
    with np.errstate(over="ignore", under="ignore", invalid="ignore"):
        scaled = (x[:, None, :] - y[None, :, :]) / ell
        sq = (scaled * scaled).sum(-1)
        if kernel == "rbf":
            rbf: np.ndarray = np.exp(-sq / 2.0)
            return rbf
        r = math.sqrt(5.0) * np.sqrt(sq)
        value = (1.0 + r + r * r / 3.0) * np.exp(-r)
    # NaN only from inf · 0 where r overflows, where the kernel is 0
    gram: np.ndarray = np.where(np.isnan(value), 0.0, value)
    return gram


def kernel_entry_error(dim: int) -> float:
    """A bound on |fl(k2(x, y)) − k2(x, y)| for :func:`kernel_matrix` at d-dimensional points: 2(d + 16)u.

    r² carries a relative error ≤ γ_{d+4} (a difference, a quotient, a square, a sum of d; Higham
    §2.2, eq. 3.5); z·e^{−z} ≤ 1/e turns it into ≤ γ_{d+4}/e of the RBF, and Matérn's
    |r·∂k/∂r| = r²(1 + r)e^{−r}/3 ≤ 0.6 into ≤ 0.3γ_{d+10}; evaluating either adds ≤ 8u (k ≤ 1).
    """
    return 2.0 * (validate.positive_int("dim", dim) + 16) * UNIT_ROUNDOFF


def information_gain(kernel: np.ndarray, noise_variance: float) -> float:
    """I(y_A; f) = ½ log det(I + σ⁻² K_A) in nats (Srinivas §2, eq. before Lemma 5.3)."""
    k = np.atleast_2d(validate.finite_array("kernel", kernel))
    if k.ndim != 2 or k.shape[0] != k.shape[1]:
        raise ValueError(f"kernel must be a square matrix, got shape {k.shape}.")
    noise = validate.fixed_positive("noise_variance", noise_variance)
    with np.errstate(over="ignore"):
        scaled = k / noise
    if not np.all(np.isfinite(scaled)):
        raise ValueError(f"kernel / noise_variance overflows (noise_variance = {noise}): rescale the kernel.")
    sign, logdet = np.linalg.slogdet(np.eye(k.shape[0]) + scaled)
    if sign <= 0 or not math.isfinite(logdet):
        raise ValueError(
            "I + K/σ² is not positive definite: the kernel matrix is not PSD, or noise_variance is below its rounding."
        )
    return 0.5 * float(logdet)


def information_gain_upper_bound(kernel: np.ndarray, noise_variance: float) -> float:
    """An upper bound on :func:`information_gain` that no rounding makes optimistic.

    Args:
        kernel: the exact, symmetric PSD kernel matrix K_A.
        noise_variance: σ² > 0.

    ½ log det(I + K_A/σ²) = ½ log det((K_A + σ²I)/σ²), and K_A + σ²I ⪰ σ²I
    (:func:`~ray_dptune.accounting.bounds.rounding.log_det_upper_bound`); inf where rounding could reach σ².
    """
    k = _symmetric_kernel(kernel)
    noise = validate.fixed_positive("noise_variance", noise_variance)
    return _log_det_half(k, noise)


def posterior_variance_upper_bound(kernel: np.ndarray, chosen: Sequence[int], noise_variance: float) -> np.ndarray:
    """v̄(λ) ≥ Var[f(λ) | y_S] for each λ of Λ, S = ``chosen`` (a multiset of Λ's indices), f ~ GP(0, K).

    Args:
        kernel: the exact, symmetric PSD kernel matrix K of Λ.
        chosen: S, the indices into Λ of the observed points (a multiset: an index may repeat).
        noise_variance: σ² > 0.

    For any weights w, E[(f(λ) − wᵀy_S)²] = K_λλ − 2wᵀK_Sλ + wᵀ(K_SS + σ²I)w ≥ Var[f(λ) | y_S], the
    least such error; w from a Cholesky solve, and the quadratic form's rounding added (Higham eq. 3.5).
    """
    k = _symmetric_kernel(kernel)
    noise = validate.fixed_positive("noise_variance", noise_variance)
    indices = [int(p) for p in chosen]
    if not indices or any(p != q or not 0 <= p < k.shape[0] for p, q in zip(indices, chosen, strict=True)):
        raise ValueError(f"chosen must be a non-empty sequence of indices into the kernel's {k.shape[0]} rows.")
    return _variance_upper(np.diag(k).copy(), k[indices, :], indices, noise)


def max_information_gain_bound(
    kernel: np.ndarray, num_rounds: int, noise_variance: float, *, entry_error: float = 0.0
) -> float:
    """A sound upper bound on γ_T = max_{|A| = T} ½ log det(I + σ⁻² K_A) over a finite Λ.

    A ranges over *multisets* of Λ (GP-UCB may query a point again), the set
    Srinivas Lemma 5.3–5.4 need: I(y_T; f) = ½ Σ_t log(1 + σ⁻²σ²_{t−1}(λ_t)) ≤ γ_T.
    F(A) = I(y_A; f) is monotone submodular on the ground set Λ × {1..T} (the copies
    have independent noise, the y's are conditionally independent given f; Krause &
    Guestrin 2005), so each of these bounds γ_T:

    * F(S) + T·max_λ Δ(λ | S) for any multiset S (F(O) ≤ F(S) + Σ_{o∈O} Δ(o | S)), at the S of a greedy
      run where it is least; S = ∅ gives (T/2) log(1 + max_λ k(λ, λ)/σ²);
    * ½ log det(I + Tσ⁻² K_Λ) for |Λ| ≤ 1 000: with counts N, I = ½ log det(I + σ⁻²K^½NK^½)
      and N ≼ T·I.

    Each is evaluated with its rounding errors added (:func:`information_gain_upper_bound`,
    :func:`posterior_variance_upper_bound`), and the least is returned.

    Args:
        kernel: (n, n) the symmetric kernel matrix of Λ: the exact PSD one, or within ``entry_error`` of it.
        num_rounds: T ≥ 1.
        noise_variance: σ² > 0.
        entry_error: a bound on each entry's distance from the exact PSD kernel's (0: ``kernel`` is
            exact). The bound is computed for K plus a diagonal ⪰ 2n·entry_error·I, hence ⪰ K_exact
            (‖K − K_exact‖₂ ≤ n·entry_error).
    """
    k = _symmetric_kernel(kernel)
    return _gamma_bound(np.diag(k).copy(), lambda p: k[:, p], num_rounds, noise_variance, k, entry_error)


def max_information_gain_bound_from_points(
    x: np.ndarray, num_rounds: int, noise_variance: float, *, kernel: KernelName, lengthscale: float
) -> float:
    """:func:`max_information_gain_bound` for Λ = the rows of ``x`` under the exact kernel (:func:`kernel_entry_error`).

    Without the n × n matrix when n > 1 000: the kernel's columns are computed as they are needed.
    """
    x = np.atleast_2d(np.asarray(x, dtype=float))
    error = kernel_entry_error(x.shape[1])
    if x.shape[0] <= 1000:
        gram = kernel_matrix(x, x, kernel=kernel, lengthscale=lengthscale)
        return max_information_gain_bound(gram, num_rounds, noise_variance, entry_error=error)
    column = lambda p: kernel_matrix(x, x[p : p + 1], kernel=kernel, lengthscale=lengthscale)[:, 0]
    return _gamma_bound(np.ones(x.shape[0]), column, num_rounds, noise_variance, None, error)


def _symmetric_kernel(kernel: np.ndarray) -> np.ndarray:
    k = np.asarray(kernel, dtype=float)
    if k.ndim != 2 or k.shape[0] != k.shape[1] or k.shape[0] == 0 or not np.all(np.isfinite(k)):
        raise ValueError("kernel must be a non-empty square matrix of finite numbers.")
    if not np.array_equal(k, k.T):
        raise ValueError("kernel must be symmetric (a kernel matrix k(λ_i, λ_j)).")
    return k


def _gamma_bound(
    diag: np.ndarray,
    column: Callable[[int], np.ndarray],
    num_rounds: int,
    noise_variance: float,
    full: np.ndarray | None,
    entry_error: float,
) -> float:
    """The bounds of :func:`max_information_gain_bound`; ``column(p)`` is k(Λ, λ_p), ``full`` K or None."""
    rounds = validate.positive_int("num_rounds", num_rounds, maximum=MAX_ROUNDS)
    noise = validate.fixed_positive("noise_variance", noise_variance)
    error = validate.non_negative("entry_error", entry_error)
    if error > 0:  # M = K + D with D ⪰ n·error·I ⪰ K_exact − K; one ulp up, so rounding cannot shrink D
        diag = np.nextafter(diag + 2.0 * diag.size * error, math.inf)

    def row(p: int) -> np.ndarray:  # M's row (= column) of λ_p
        values = np.array(column(p), dtype=float)
        values[p] = diag[p]
        return values

    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):  # σ² tiny: gains inf
        bounds = [0.5 * rounds * math.log1p(float(diag.max()) / noise)]  # S = ∅
        chosen = _least_online_greedy_prefix(diag, row, rounds, noise)
        if chosen:
            rows = np.stack([row(p) for p in chosen])
            gain = 0.5 * math.log1p(float(_variance_upper(diag, rows, chosen, noise).max()) / noise)
            bounds.append(_log_det_half(rows[:, chosen], noise) + rounds * gain)
        if full is not None and diag.size <= 1000:
            shifted = full.copy()
            np.fill_diagonal(shifted, diag)  # M
            bounds.append(_log_det_half(rounds * shifted, noise))
    bound = min(bounds)
    if not math.isfinite(bound):
        raise ValueError(
            f"noise_variance = {noise} is so small that γ_T has no finite bound (k(λ, λ)/σ² overflows): "
            "rescale the kernel."
        )
    return round_up(bound)


def _least_online_greedy_prefix(
    diag: np.ndarray, row: Callable[[int], np.ndarray], rounds: int, noise: float
) -> list[int]:
    """The greedy multiset S_s whose F(S_s) + T·max Δ(λ | S_s) is least, in floating point (a choice only)."""
    n = diag.size
    var = np.clip(diag, 0.0, None)
    factors = np.zeros((n, rounds))  # posterior variance = diag(M) − Σ_j factors[:, j]²
    chosen: list[int] = []
    value, least, best = 0.0, math.inf, 0
    for s in range(rounds + 1):
        gains = 0.5 * np.log1p(var / noise)
        if value + rounds * float(gains.max()) < least:
            least, best = value + rounds * float(gains.max()), s
        if s == rounds:
            break
        p = int(np.argmax(gains))
        value += float(gains[p])
        factors[:, s] = (row(p) - factors[:, :s] @ factors[p, :s]) / math.sqrt(var[p] + noise)
        var = np.clip(var - factors[:, s] ** 2, 0.0, None)
        chosen.append(p)
    return chosen[:best]


def _log_det_half(block: np.ndarray, noise: float) -> float:
    """An upper bound on ½ log det(I + block/σ²) for an exact PSD ``block`` (or one rounded once, as T·K)."""
    formed = block + noise * np.eye(block.shape[0])
    return 0.5 * log_det_upper_bound(formed, floor=noise, scale=noise)


def _variance_upper(diag: np.ndarray, rows: np.ndarray, chosen: list[int], noise: float) -> np.ndarray:
    """:func:`posterior_variance_upper_bound` from M's diagonal and its rows ``rows`` = M_{S,Λ}."""
    size = len(chosen)
    formed = rows[:, chosen] + noise * np.eye(size)
    try:
        weights = scipy.linalg.cho_solve((np.linalg.cholesky(formed), True), rows)
    except np.linalg.LinAlgError:
        return diag  # the prior variance bounds every posterior one
    with np.errstate(over="ignore", invalid="ignore"):
        squared_error = diag - 2.0 * (weights * rows).sum(0) + (weights * (formed @ weights)).sum(0)
        magnitude = np.abs(weights)
        scale = diag + 2.0 * (magnitude * np.abs(rows)).sum(0) + (magnitude * (np.abs(formed) @ magnitude)).sum(0)
        upper = squared_error + 4.0 * gamma(2 * size + 8) * scale
    bounded: np.ndarray = np.where(np.isfinite(upper), np.clip(upper, 0.0, diag), diag)
    return bounded
