"""γ_T, the maximum information gain of T noisy GP observations, and a sound bound on it.

GP-UCB's regret bound (Srinivas Theorem 1), hence DP-BO's score sensitivity (Kusner
Theorem 3), needs an upper bound on γ_T over the finite candidate set Λ.

References:
    Srinivas, Krause, Kakade, Seeger. "Gaussian Process Optimization in the Bandit
    Setting", ICML 2010: §2 (information gain), Lemma 5.3–5.4.
    Krause & Guestrin 2005: the information gain is monotone submodular.
    Nemhauser, Wolsey, Fisher. "An analysis of approximations for maximizing
    submodular set functions", Math. Programming 14, 1978 (greedy ≥ (1 − (1 − 1/T)^T)·OPT).

Everything is in the GP's units (k(λ, λ) ≤ 1); numpy only.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Literal

import numpy as np

from ray_dptune import validate
from ray_dptune.accounting.rounding import round_up

__all__ = [
    "KernelName",
    "information_gain",
    "kernel_matrix",
    "max_information_gain_bound",
    "max_information_gain_bound_from_points",
]

MAX_ROUNDS = 10_000  # the greedy γ_T bound costs O(T³) time and O(T²) memory
KernelName = Literal["rbf", "matern52"]


def kernel_matrix(x: np.ndarray, y: np.ndarray, *, kernel: KernelName, lengthscale: float) -> np.ndarray:
    """k2(x, y) with k2(λ, λ) = 1 (Kusner §2): squared exponential or Matérn-5/2.

    Args:
        x: (n, d) and y: (m, d) inputs (the unit cube of the searcher's coordinates).
        kernel: "rbf", exp(−r²/(2ℓ²)); or "matern52", (1 + √5 r/ℓ + 5r²/(3ℓ²)) e^{−√5 r/ℓ}.
        lengthscale: ℓ > 0, fixed before seeing any data.
    """
    ell = validate.fixed_positive("lengthscale", lengthscale)
    x, y = np.atleast_2d(validate.finite_array("x", x)), np.atleast_2d(validate.finite_array("y", y))
    if kernel not in ("rbf", "matern52"):
        raise ValueError(f"kernel must be 'rbf' or 'matern52', got {kernel!r}.")
    with np.errstate(over="ignore", divide="ignore", invalid="ignore"):  # far points: distance inf, kernel 0
        sq = _squared_distances(x, y)
        if not (1e-150 < ell < 1e150 and np.all(np.isfinite(sq))):  # ℓ² or a distance overflows: scale first
            sq, ell = _squared_distances(x / ell, y / ell), 1.0
        if kernel == "rbf":
            return np.exp(-sq / (2.0 * ell * ell))
        r = math.sqrt(5.0) * np.sqrt(sq) / ell
        value = (1.0 + r + r * r / 3.0) * np.exp(-r)
    # NaN only from inf · 0 at r >= 1e154, where the kernel is 0
    gram: np.ndarray = np.where(np.isnan(value), 0.0, value)
    return gram


def _squared_distances(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    distances: np.ndarray = np.maximum(((x[:, None, :] - y[None, :, :]) ** 2).sum(-1), 0.0)
    return distances


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


def max_information_gain_bound(kernel: np.ndarray, num_rounds: int, noise_variance: float) -> float:
    """A sound upper bound on γ_T = max_{|A| = T} ½ log det(I + σ⁻² K_A) over a finite Λ.

    A ranges over *multisets* of Λ (GP-UCB may query a point again), the set
    Srinivas Lemma 5.3–5.4 need: I(y_T; f) = ½ Σ_t log(1 + σ⁻²σ²_{t−1}(λ_t)) ≤ γ_T.
    F(A) = I(y_A; f) is monotone submodular on the ground set Λ × {1..T} (the copies
    have independent noise, the y's are conditionally independent given f; Krause &
    Guestrin 2005), so with the greedy multiset S_0 ⊂ … ⊂ S_T, each of these bounds OPT:

    * F(S_T) / (1 − (1 − 1/T)^T), Nemhauser et al. 1978 (≤ F(S_T)/(1 − 1/e));
    * min_s F(S_s) + T·max_λ Δ(λ | S_s), submodularity (F(O) ≤ F(S) + Σ_{o∈O} Δ(o | S));
      s = 0 gives the trivial (T/2) log(1 + σ⁻²);
    * ½ log det(I + Tσ⁻² K_Λ) for |Λ| ≤ 1 000: with counts N, I = ½ log det(I + σ⁻²K^½NK^½)
      and N ≼ T·I.

    The least of them is returned, nudged up to absorb rounding.

    Args:
        kernel: (n, n) the PSD kernel matrix of Λ, k(λ, λ) ≤ 1.
        num_rounds: T ≥ 1. noise_variance: σ² > 0.
    """
    k = np.asarray(kernel, dtype=float)
    if k.ndim != 2 or k.shape[0] != k.shape[1] or k.shape[0] == 0 or not np.all(np.isfinite(k)):
        raise ValueError("kernel must be a non-empty square matrix of finite numbers.")
    return _greedy_gamma_bound(np.diag(k).copy(), lambda p: k[:, p], num_rounds, noise_variance, k)


def max_information_gain_bound_from_points(
    x: np.ndarray, num_rounds: int, noise_variance: float, *, kernel: KernelName, lengthscale: float
) -> float:
    """:func:`max_information_gain_bound` for Λ = the rows of ``x``, without the n × n matrix when n > 1 000."""
    x = np.atleast_2d(np.asarray(x, dtype=float))
    if x.shape[0] <= 1000:
        return max_information_gain_bound(
            kernel_matrix(x, x, kernel=kernel, lengthscale=lengthscale), num_rounds, noise_variance
        )
    column = lambda p: kernel_matrix(x, x[p : p + 1], kernel=kernel, lengthscale=lengthscale)[:, 0]
    return _greedy_gamma_bound(np.ones(x.shape[0]), column, num_rounds, noise_variance, None)


def _greedy_gamma_bound(
    diag: np.ndarray,
    column: Callable[[int], np.ndarray],
    num_rounds: int,
    noise_variance: float,
    full: np.ndarray | None,
) -> float:
    """The bounds of :func:`max_information_gain_bound`; ``column(p)`` is k(Λ, λ_p), ``full`` K or None."""
    rounds = validate.positive_int("num_rounds", num_rounds, maximum=MAX_ROUNDS)
    noise = validate.fixed_positive("noise_variance", noise_variance)
    with np.errstate(over="ignore", invalid="ignore"):  # σ² tiny: gains inf, and information_gain refuses it
        return _greedy_bounds(diag, column, rounds, noise, full)


def _greedy_bounds(
    diag: np.ndarray, column: Callable[[int], np.ndarray], rounds: int, noise: float, full: np.ndarray | None
) -> float:
    """The body of :func:`_greedy_gamma_bound`, on checked arguments."""
    n = diag.size
    var = np.clip(diag, 0.0, None)
    factors = np.zeros((n, rounds))  # posterior variance = diag(K) − Σ_j factors[:, j]²
    chosen, value, online = [], 0.0, math.inf
    for s in range(rounds + 1):
        gains = 0.5 * np.log1p(var / noise)
        online = min(online, value + rounds * float(gains.max()))  # F(S_s) + T·max Δ(λ | S_s)
        if s == rounds:
            break
        p = int(np.argmax(gains))
        value += float(gains[p])
        factors[:, s] = (column(p) - factors[:, :s] @ factors[p, :s]) / math.sqrt(var[p] + noise)
        var = np.clip(var - factors[:, s] ** 2, 0.0, None)
        chosen.append(p)
    k_chosen = np.stack([column(p)[chosen] for p in chosen], axis=1)
    value = max(value, information_gain(k_chosen, noise))  # F(S_T) two ways: take the larger
    bounds = [value / (1.0 - (1.0 - 1.0 / rounds) ** rounds), online]
    if full is not None and n <= 1000:
        eig = np.clip(np.linalg.eigvalsh((full + full.T) / 2.0), 0.0, None)
        bounds.append(0.5 * float(np.log1p(rounds * eig / noise).sum()))
    return round_up(min(bounds)) + 1e-12
