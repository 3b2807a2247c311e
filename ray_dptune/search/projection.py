"""ℓ2 projection of a density onto the bounded-density set S_{C,c}(π₀) (DP-HyPO §3.2, App. D).

On a discretisation with cells of measure w_i, a density is a vector f with
Σ w_i f_i = 1, and S_{C,c}(π₀) = {f : c π₀_i ≤ f_i ≤ C π₀_i, Σ w_i f_i = 1}. The
projection of p minimises Σ w_i (f_i - p_i)² over that set. Its KKT conditions give
f_i = clip(p_i - t, c π₀_i, C π₀_i) for one shift t (the weights cancel), and
g(t) = Σ w_i clip(p_i - t, ...) is continuous, piecewise linear and non-increasing,
so t is found exactly from the sorted breakpoints in O(n log n). The paper solved
the same problem with a general QP solver (CVXOPT).
"""

from __future__ import annotations

import numpy as np

__all__ = ["project_to_bounded_density"]


def project_to_bounded_density(
    density: np.ndarray, prior: np.ndarray, weights: np.ndarray, upper: float, lower: float
) -> np.ndarray:
    """The ℓ2 projection of ``density`` onto S_{upper, lower}(prior).

    Args:
        density: p_i, the density to project, one value per cell (any real numbers).
        prior: π₀_i > 0, a density: Σ weights_i prior_i = 1.
        weights: w_i > 0, the measure of each cell.
        upper: C >= 1, the largest allowed ratio to the prior.
        lower: c in (0, 1], the smallest allowed ratio to the prior.

    Returns:
        f with lower·prior ≤ f ≤ upper·prior and Σ weights·f = 1 (to rounding).

    Raises:
        ValueError: inconsistent shapes, non-positive prior or weights, a prior
            that is not a density, or bounds with c > 1, C < 1 or c ≤ 0.
    """
    p, prior, weights = (np.asarray(a, dtype=float) for a in (density, prior, weights))
    _check(p, prior, weights, upper, lower)
    lo, hi = lower * prior, upper * prior
    # Sweep t upwards: cell i is at hi_i for t ≤ p_i - hi_i, free (slope -w_i) in between,
    # and at lo_i for t ≥ p_i - lo_i.
    events = np.concatenate([p - hi, p - lo])
    slope_changes = np.concatenate([-weights, weights])
    order = np.argsort(events, kind="stable")
    events, slope_changes = events[order], slope_changes[order]
    slopes = np.cumsum(slope_changes)  # slope of g right after each event
    mass = (weights * hi).sum() + np.concatenate([[0.0], np.cumsum(slopes[:-1] * np.diff(events))])
    # mass[k] = g(events[k]), non-increasing from Σ w·hi = C ≥ 1 to Σ w·lo = c ≤ 1
    k = int(np.searchsorted(-mass, -1.0, side="left"))
    shift: float
    if k == 0:
        shift = events[0]
    elif k == events.size:
        shift = events[-1]
    else:
        t0, t1, g0, g1 = events[k - 1], events[k], mass[k - 1], mass[k]
        shift = t1 if g0 == g1 else t0 + (g0 - 1.0) * (t1 - t0) / (g0 - g1)
    projected = np.clip(p - shift, lo, hi)
    # p - t rounds to ulp(|p|): with huge p the free cells' mass drifts; give them the remainder.
    free = (projected > lo) & (projected < hi)
    if free.any():
        projected[free] += (1.0 - (weights * projected).sum()) / weights[free].sum()
        projected = np.clip(projected, lo, hi)
    return projected


def _check(p: np.ndarray, prior: np.ndarray, weights: np.ndarray, upper: float, lower: float) -> None:
    if p.ndim != 1 or prior.shape != p.shape or weights.shape != p.shape or p.size == 0:
        raise ValueError("density, prior and weights must be 1-D arrays of the same non-zero length.")
    if not np.all(np.isfinite(p)):
        raise ValueError("density must be finite.")
    if np.any(prior <= 0) or np.any(weights <= 0):
        raise ValueError("prior and weights must be > 0 on every cell.")
    if not np.isclose((prior * weights).sum(), 1.0, rtol=1e-9, atol=0.0):
        raise ValueError(f"prior must be a density: Σ weights·prior = {(prior * weights).sum()}, not 1.")
    if not (0.0 < lower <= 1.0 <= upper < np.inf):
        raise ValueError(f"Need 0 < c <= 1 <= C < inf for S_(C,c) to hold densities, got C = {upper}, c = {lower}.")
