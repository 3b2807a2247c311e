"""The worst pair (q, q'): max of λ·log f'(q) + (1-λ)·log f'(q') over the pairs an RDP curve allows.

P&S Lemma 7 (:mod:`~ray_dptune.accounting.bounds.lemma7.generic`) and DP-HyPO Lemma A.5
(:mod:`~ray_dptune.accounting.bounds.dphypo_bound`) both end on this maximum, where (q, q') are the
probabilities that one [0, 1]-valued post-processing gives under two neighbouring inputs.
It is bounded from above (certified), not sampled:

* f' is non-decreasing on [0, 1] (a PGF has non-negative coefficients), so for each q the
  worst q' is the lowest allowed one, b(q), which is non-decreasing in q
  (:mod:`~ray_dptune.accounting.bounds.lemma7.partner_search` bounds it from below, certified).
* On a cell [q_i, q_{i+1}] of a grid holding 0 and 1 the objective is at most
  λ·log f'(q_{i+1}) + (1-λ)·log f'(p_i) for any p_i ≤ b(q_i) and λ > 1: a line in λ - 1.
  The largest cell value bounds the maximum; the upper envelope of the lines gives it at
  every order at once (:func:`upper_envelope`).

Only the cells that lead need their p_i exactly. The partner is solved in full at sparse
points and between them from their neighbours (``partner_search.LEVELS``); the leading cells
are then checked against every constraint and solved in full where a bound was not tight,
until the leaders are settled (every p_i is a certified lower bound throughout, so the result
is an upper bound at every step; the checks only make it tight).
"""

from __future__ import annotations

import json

import numpy as np

from ray_dptune import validate
from ray_dptune.accounting.bounds.distributions import RunCountDistribution
from ray_dptune.accounting.bounds.lemma7 import partner_search
from ray_dptune.accounting.bounds.lemma7.partner_search import MAX_CONSTRAINT_ORDERS, PartnerSearch, constraint_orders
from ray_dptune.accounting.curves.rdp import RDPCurve

__all__ = ["MAX_GRID_SIZE", "q_grid", "upper_envelope", "worst_cells", "worst_log_pgf_ratio"]

MAX_GRID_SIZE = 2**16
"""Cap on ``grid_size`` (the generic bound's; DP-HyPO's was 2**15). Memory is O(grid + orders)
now, so the larger cap costs no more than the smaller one did."""
SPOT = 8
"""Of the leading cells away from any change of binding constraint, every SPOT-th is checked too."""
_ENVELOPE_PASSES = 200
_ENVELOPE_SLACK = 1e-9
_GRID_CACHE: dict[tuple[str, str, int], np.ndarray] = {}
_HIGH_CACHE: dict[int, tuple[np.ndarray, np.ndarray]] = {}


def q_grid(law: RunCountDistribution, size: int) -> np.ndarray:
    """Points of [0, 1] dense near 0 and 1 and at equal steps of log f' (cached by the law's description).

    Any grid that holds 0 and 1 certifies the maximum; the grid only decides how tight it is.
    """
    size = validate.positive_int("grid_size", size, maximum=MAX_GRID_SIZE)
    try:
        key = (type(law).__qualname__, json.dumps(law.to_dict(), sort_keys=True), size)
    except (TypeError, ValueError):  # an undescribable law: no cache
        return _build_q_grid(law, size)
    if key not in _GRID_CACHE:
        if len(_GRID_CACHE) > 64:
            _GRID_CACHE.clear()
        _GRID_CACHE[key] = _build_q_grid(law, size)
    return _GRID_CACHE[key]


def _build_q_grid(law: RunCountDistribution, size: int) -> np.ndarray:
    ends = np.logspace(-14, -0.3, size // 4)
    top = float(law.log_pgf_derivative(1.0))
    bottom = max(float(law.log_pgf_derivative(0.0)), top - 60.0)
    targets = np.linspace(bottom, top, size // 2)
    lo, hi = np.zeros_like(targets), np.ones_like(targets)
    for _ in range(60):  # invert the non-decreasing log f' by bisection
        mid = 0.5 * (lo + hi)
        below = law.log_pgf_derivative(mid) < targets
        lo, hi = np.where(below, mid, lo), np.where(below, hi, mid)
    grid = np.unique(np.concatenate([np.linspace(0.0, 1.0, size // 4), ends, 1.0 - ends, hi, [0.0, 1.0]]))
    grid.flags.writeable = False
    return grid


def _grid_and_high(law: RunCountDistribution, size: int) -> tuple[np.ndarray, np.ndarray]:
    """The grid and log f' at its points after the first (cached with the grid)."""
    grid = q_grid(law, size)
    cached = _HIGH_CACHE.get(id(grid))
    if cached is None or cached[0] is not grid:
        if len(_HIGH_CACHE) > 64:
            _HIGH_CACHE.clear()
        cached = _HIGH_CACHE[id(grid)] = (grid, np.asarray(law.log_pgf_derivative(grid[1:]), dtype=float))
    return grid, cached[1]


# ------------------------------------------------------------------ upper envelope of lines
def _hull(slopes: np.ndarray, intercepts: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, bool]:
    """The lines that lead somewhere on x > 0 (slope ascending), their indices, and whether pruning converged."""
    index = np.nonzero(intercepts > -np.inf)[0]
    slopes, intercepts = slopes[index], intercepts[index]
    order = np.lexsort((-intercepts, -slopes))  # slope descending, then intercept descending
    best_so_far = np.maximum.accumulate(intercepts[order])
    keep = np.ones(order.size, dtype=bool)
    keep[1:] = intercepts[order][1:] > best_so_far[:-1]
    s, c, index = slopes[order][keep][::-1], intercepts[order][keep][::-1], index[order][keep][::-1]
    for _ in range(_ENVELOPE_PASSES):
        if s.size <= 2:
            break
        breaks = (c[:-1] - c[1:]) / (s[1:] - s[:-1])  # where line k+1 overtakes line k
        useless = np.zeros(s.size, dtype=bool)
        useless[1:-1] = breaks[:-1] >= breaks[1:]
        if not useless.any():
            break
        # all at once: a line below its neighbours' crossing stays below the lines that remain (if
        # k+1 <= max(k, k+2) and k <= max(k-1, k+1), then both <= max(k-1, k+2) wherever they lead)
        s, c, index = s[~useless], c[~useless], index[~useless]
    converged = s.size <= 2 or not np.any(np.diff((c[:-1] - c[1:]) / (s[1:] - s[:-1])) <= 0)
    return s, c, index, bool(converged)


def upper_envelope(x: np.ndarray, slopes: np.ndarray, intercepts: np.ndarray) -> np.ndarray:
    """max_i (x·slopes_i + intercepts_i) at every x > 0, from above.

    The convex-hull trick: lines that no x > 0 makes the maximum are dropped (first
    those with a smaller slope *and* intercept than another, then, in slope order,
    each line that its neighbours overtake before it could lead), leaving the upper
    envelope, whose breakpoints increase; each x then reads its leading line and that
    line's two neighbours, and the result is raised by a relative 1e-9, far above the
    rounding of the breakpoints. A NaN or +inf line makes every value inf; lines with
    an intercept of -inf are -inf everywhere.
    """
    return _envelope(np.asarray(x, dtype=float), slopes, intercepts)[0]


def _envelope(x: np.ndarray, slopes: np.ndarray, intercepts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(:func:`upper_envelope`'s values, the indices of the lines that give them)."""
    none = np.zeros(0, dtype=int)
    live = intercepts > -np.inf
    if not live.any():
        return np.full_like(x, -np.inf), none
    if not (np.all(np.isfinite(slopes[live])) and np.all(np.isfinite(intercepts[live]))):
        return np.full_like(x, np.inf), none
    s, c, index, converged = _hull(slopes, intercepts)
    scale = x * np.abs(s).max() + np.abs(c).max()
    if not converged:  # every hull line, densely
        dense = x[:, None] * s[None, :] + c[None, :]
        return dense.max(axis=1) + _ENVELOPE_SLACK * scale, np.unique(index[dense.argmax(axis=1)])
    breaks = (c[:-1] - c[1:]) / (s[1:] - s[:-1]) if s.size > 1 else np.empty(0)
    lead = np.searchsorted(breaks, x)
    values, leader = np.full_like(x, -np.inf), np.zeros(x.size, dtype=int)
    for shift in (-1, 0, 1):
        line = np.clip(lead + shift, 0, s.size - 1)
        value = x * s[line] + c[line]
        leader = np.where(value > values, line, leader)
        values = np.maximum(values, value)
    return values + _ENVELOPE_SLACK * scale, np.unique(index[leader])


# ------------------------------------------------------------------ the maximum over cells
def worst_cells(
    x: np.ndarray, q: np.ndarray, partner: np.ndarray, law: RunCountDistribution
) -> tuple[np.ndarray, np.ndarray]:
    """Upper bound on max_i λ·log f'(q_{i+1}) + (1-λ)·log f'(partner_i) at λ = 1 + x, and the leading cells.

    ``partner`` must be ≤ b(q) pointwise (then each cell's line bounds the objective on it).
    """
    high = np.asarray(law.log_pgf_derivative(q[1:]), dtype=float)
    return _cells(np.asarray(x, dtype=float), np.arange(q.size - 1), high, partner, law)


def _cells(
    x: np.ndarray, cells: np.ndarray, high: np.ndarray, partner: np.ndarray, law: RunCountDistribution
) -> tuple[np.ndarray, np.ndarray]:
    """The envelope over ``cells`` only (high[i] = log f'(q_{i+1})), and the leading cells."""
    with np.errstate(invalid="ignore", over="ignore"):  # inf - inf = NaN: a NaN line makes every value inf
        low = law.log_pgf_derivative(partner[cells])  # b(q_i) bounds q' from below
        values, lines = _envelope(x, high[cells] - low, high[cells])
    return values, cells[lines]


def _check(search: PartnerSearch, leaders: np.ndarray) -> np.ndarray:
    """The leaders whose bound is not tight.

    Checked against every constraint: those next to a change of binding constraint (where a window
    may miss one) and every SPOT-th of the others; if any is not tight, all of them.
    """
    risky = ~search.steady[leaders]
    risky[::SPOT] = True
    todo = search.unsettled(leaders[risky])
    if todo.size and not risky.all():
        todo = np.union1d(todo, search.unsettled(leaders[~risky]))
    return todo


def worst_log_pgf_ratio(
    orders: np.ndarray,
    law: RunCountDistribution,
    constraint: RDPCurve,
    *,
    grid_size: int,
    max_constraint_orders: int | None = MAX_CONSTRAINT_ORDERS,
) -> np.ndarray:
    """Upper bound on max α·log f'(q) + (1-α)·log f'(q') over (q, q') allowed by ``constraint``, per α.

    Allowed: D_α̂(Bern(q)‖Bern(q')) and D_α̂(Bern(q')‖Bern(q)) ≤ constraint(α̂) at (at most
    ``max_constraint_orders`` of) its finite orders α̂, the curve smoothed first (valid for
    two-point laws, whose divergence is non-decreasing in the order).

    Args:
        orders: the α at which to evaluate, each > 1 (shape: n).
        law: law of the number of runs; only ``log_pgf_derivative`` on [0, 1] is used.
        constraint: RDP curve bounding every binary pair.
        grid_size: about how many points of [0, 1]; more is tighter, never looser.
        max_constraint_orders: cap on the constraint orders used (evenly spread); None: all.

    Returns:
        Shape n; ``inf`` where no finite bound is found.
    """
    x = np.asarray(orders, dtype=float) - 1.0
    grid_size = validate.positive_int("grid_size", grid_size, maximum=MAX_GRID_SIZE)
    alphas, epsilons = constraint_orders(constraint, max_orders=max_constraint_orders)
    if alphas.size == 0:
        return np.full_like(x, np.inf)
    q, high = _grid_and_high(law, grid_size)
    cells = np.arange(q.size - 1)
    search = PartnerSearch(q, alphas, epsilons)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore", under="ignore"):
        search.solve_top()
        checked = search.known.copy()  # solved against every constraint already
        for every, width, iterations in partner_search.LEVELS[1:]:
            search.solve_level(search.interior[::every], width, iterations)
        worst, leaders = _cells(x, cells, high, search.partner(), law)
        for _ in range(3):  # the leaders, checked against every constraint; where not tight, solved in full
            todo = _check(search, leaders[~checked[leaders]])
            checked[leaders] = True
            if todo.size == 0 or not search.refine(todo):
                break
            worst, leaders = _cells(x, cells, high, search.partner(), law)
    result: np.ndarray = np.where(np.isnan(worst), np.inf, worst)
    return result
