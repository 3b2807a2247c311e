"""Rounding that keeps a bound computed in floating point on the safe side (the GP bounds of DP-BO).

A bound is nudged up (:func:`round_up`) so that rounding can never make it optimistic; where
rounding can cost more than that margin (a log-determinant, a quadratic form), the bound adds
its proven error (Higham, *Accuracy and Stability of Numerical Algorithms*, 2nd ed., 2002).
"""

from __future__ import annotations

import math

import numpy as np

__all__ = ["ROUND_UP", "UNIT_ROUNDOFF", "gamma", "log_det_upper_bound", "round_up", "upper_sum"]

ROUND_UP = 1e-12  # relative margin: a bound computed in floating point is never below the exact one
UNIT_ROUNDOFF = 2.0**-53  # u of IEEE double precision


def round_up(value: float) -> float:
    """``value`` nudged up by ``ROUND_UP`` (relative), so rounding cannot make a bound optimistic."""
    return float(value) * (1.0 + ROUND_UP) if value > 0 else float(value)


def gamma(k: int) -> float:
    """γ_k = ku / (1 − ku), the relative error of k roundings (Higham Lemma 3.1), itself rounded up."""
    ku = k * UNIT_ROUNDOFF
    if ku >= 0.5:
        raise ValueError(f"{k} roundings: γ_k is not small enough to bound an error.")
    return ku / (1.0 - ku) * (1.0 + 4.0 * UNIT_ROUNDOFF)


def upper_sum(terms: np.ndarray) -> float:
    """An upper bound on Σ tᵢ, each tᵢ computed with an absolute error ≤ 4u(|tᵢ| + 1) (a log of a rounded quotient).

    Summation adds at most γ_{m−1} Σ|tᵢ| in any order (Higham eq. 3.5).
    """
    terms = np.asarray(terms, dtype=float)
    m = terms.size
    size = float(np.abs(terms).sum()) + m
    return float(terms.sum()) + gamma(m + 4) * size * 2.0


def log_det_upper_bound(formed: np.ndarray, *, floor: float, scale: float = 1.0) -> float:
    """An upper bound on log det(B / scale), or inf where rounding could reach B's smallest eigenvalue.

    Args:
        formed: B in floating point, each entry B's own rounded at most twice (|Δb_ij| ≤ γ_2|b_ij|).
        floor: f > 0 with B ⪰ f·I (B symmetric).
        scale: s > 0, exact.

    The Cholesky factor L̂ satisfies L̂L̂ᵀ = formed + ΔA, |ΔA| ≤ γ_{m+1}|L̂||L̂ᵀ| (Higham Thm 10.3), so
    ‖ΔA‖₂ ≤ γ_{m+1}‖L̂‖_F². With e ≥ ‖ΔA‖₂ + ‖formed − B‖₂, B ⪯ L̂L̂ᵀ + e·I and λ_min(L̂L̂ᵀ) ≥ f − e, so
    log det(B/s) ≤ Σ log(l̂_ii²/s) + m·log(1 + e/(f − e)).
    """
    m = formed.shape[0]
    try:
        lower = np.linalg.cholesky(formed)
    except np.linalg.LinAlgError:
        return math.inf
    diagonal = np.diag(lower)
    with np.errstate(over="ignore"):
        error = gamma(m + 1) * float((lower * lower).sum()) * (1.0 + gamma(m * m))
        error += gamma(2) * float(np.sqrt((formed * formed).sum())) * (1.0 + gamma(m * m))
    if not (math.isfinite(error) and error < floor / 2 and np.all(diagonal > 0)):
        return math.inf
    spread = m * math.log1p(error / (floor - error)) * (1.0 + gamma(4))
    return float(upper_sum(np.log(diagonal * diagonal / scale)) + spread)
