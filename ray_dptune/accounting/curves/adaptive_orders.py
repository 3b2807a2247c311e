"""The subsampled Gaussian's RDP on an order grid chosen adaptively, bounded between orders by convexity.

dp_accounting computes one order at a time (Mironov, Talwar & Zhang 2019), and a
fractional order costs a series of up to 1000 terms, so a dense grid of orders is
slow. Two facts let us compute few orders and still bound every order of the grid:

* f(α) = (α − 1)·ε(α) = log E_{μ0}[(μ/μ0)^α] is convex in α (Hölder's inequality; a
  log-moment generating function) and f(1) = 0. So on [a, b] between two computed
  orders f lies below its chord: the chord is a valid upper bound at every order
  in between (and from (1, 0) up to the first computed order). Above the largest
  computed order the bound is ``inf`` ("no bound"), never optimistic.
* The chord's excess over the truth is at most its gap to the lower bound that
  convexity also gives (the secants of the neighbouring intervals, extended).

Orders are added where that gap could move a result: an interval is refined when,
for some probe objective — the RDP→(ε, δ) conversion ε(α) + c/(α − 1), the selection
bounds' λ̂ term (f(λ̂) + c)/λ̂ (c from 0.5 to 100), and log δ(ε) ≈ f(α) − ε(α − 1) —
the interval's lower bound beats the best upper bound on the grid by more than
``REFINE_TOLERANCE``. Which orders are computed changes only tightness, never
validity: the node values are dp_accounting's, as when every order is computed.
"""

from __future__ import annotations

import logging
import math

import numpy as np

__all__ = ["REFINE_TOLERANCE", "dp_accounting_step_rdp", "subsampled_gaussian_step_moments"]

logger = logging.getLogger(__name__)

REFINE_TOLERANCE = 1e-4
"""Relative improvement of a probe objective below which an interval is not refined."""
MAX_FAILURES_PER_INTERVAL = 3
"""Orders dp_accounting could not sum in one interval before the chord is kept there (each costs ~1000 terms)."""
_INITIAL_NODES = (
    1.001,
    1.01,
    1.1,
    1.5,
    2.0,
    3.0,
    4.0,
    6.0,
    8.0,
    12.0,
    16.0,
    24.0,
    32.0,
    64.0,
    128.0,
    256.0,
    512.0,
    1024.0,
)
_PROBE_CONSTANTS = np.geomspace(0.5, 100.0, 48)
_PROBE_EPSILONS = np.geomspace(1e-4, 7.0, 48)
_MAX_NODES = 400


def subsampled_gaussian_step_moments(
    *, sample_rate: float, noise_multiplier: float, steps: int, orders: np.ndarray, max_order: float
) -> np.ndarray:
    """Upper bounds on f(α) = (α − 1)·ε(α) of one Poisson-subsampled Gaussian step, at ``orders``.

    ``steps`` only weighs the refinement (a composed ε above ~1e3 needs no precision).
    Orders above the largest order dp_accounting computed (at most ``max_order``) get ``inf``.
    """
    grid = np.asarray(orders, dtype=float)
    wanted = grid[grid <= max_order]
    nodes: dict[float, float] = {1.0: 0.0}
    failed: set[float] = set()

    def compute(new_orders: list[float]) -> None:
        values = dp_accounting_step_rdp(
            sample_rate=sample_rate, noise_multiplier=noise_multiplier, orders=np.array(new_orders)
        ) * (np.array(new_orders) - 1.0)
        for order, value in zip(new_orders, values):
            if math.isfinite(value) and value >= 0.0:
                nodes[order] = float(value)
            else:  # no convergence (or rounding noise): no bound claimed there; the neighbours' chord bounds it
                failed.add(order)

    top = float(wanted.max()) if wanted.size else 1.0
    last = min((o for o in _INITIAL_NODES if o >= min(top, max_order)), default=max_order)
    compute([o for o in _INITIAL_NODES if o <= min(last, max_order)])
    while len(nodes) < _MAX_NODES:
        added = [order for order in _refinements(nodes, failed, wanted, steps) if order not in nodes]
        if not added:
            break
        compute(added)
    return _chord(nodes, grid)


def dp_accounting_step_rdp(*, sample_rate: float, noise_multiplier: float, orders: np.ndarray) -> np.ndarray:
    """dp_accounting's RDP of one Poisson-subsampled Gaussian step at ``orders`` (its logs silenced).

    Mironov, Talwar & Zhang (2019): integer orders in closed form, fractional ones by a
    series; an order whose series does not converge comes back ``inf``.
    """
    from dp_accounting import dp_event  # imported here: dp_accounting takes ~1.5 s to import
    from dp_accounting.rdp import rdp_privacy_accountant

    accountant = rdp_privacy_accountant.RdpAccountant(orders=list(orders))
    event = dp_event.PoissonSampledDpEvent(sample_rate, dp_event.GaussianDpEvent(noise_multiplier))
    absl_logger = logging.getLogger("absl")  # dp_accounting logs a line per order whose series it cannot sum
    level = absl_logger.level
    absl_logger.setLevel(logging.ERROR)
    try:
        with np.errstate(all="ignore"):
            accountant.compose(event, 1)
    finally:
        absl_logger.setLevel(level)
    rdp = np.asarray(accountant.rdp, dtype=float)
    if not np.all(np.isfinite(rdp)):
        logger.debug(
            "dp_accounting: no finite RDP at %d of %d orders (q=%g, σ=%g).",
            int(np.sum(~np.isfinite(rdp))),
            rdp.size,
            sample_rate,
            noise_multiplier,
        )
    return rdp


def _chord(nodes: dict[float, float], orders: np.ndarray) -> np.ndarray:
    """Piecewise-linear interpolation of f through the computed nodes; inf above the last."""
    xs = np.array(sorted(nodes))
    fs = np.array([nodes[x] for x in xs])
    values = np.full(orders.shape, np.inf)
    inside = orders <= xs[-1]
    values[inside] = np.interp(orders[inside], xs, fs)
    return values


def _refinements(nodes: dict[float, float], failed: set[float], grid: np.ndarray, steps: int) -> list[float]:
    """One new order inside every interval whose looseness could move a probe objective."""
    xs = np.array(sorted(nodes))
    fs = np.array([nodes[x] for x in xs])
    grid = grid[grid < xs[-1]]
    if grid.size == 0:
        return []
    upper = np.interp(grid, xs, fs)
    lower = _secant_lower_bound(xs, fs, grid)
    best = np.min(_probes(upper, grid, steps), axis=1)
    best[_PROBE_CONSTANTS.size : 2 * _PROBE_CONSTANTS.size] = np.minimum(  # λ̂ = 1 is allowed exactly
        best[_PROBE_CONSTANTS.size : 2 * _PROBE_CONSTANTS.size], _PROBE_CONSTANTS
    )
    margin = REFINE_TOLERANCE * np.maximum(
        np.abs(best), np.where(np.arange(best.size) >= 2 * _PROBE_CONSTANTS.size, 1.0, 0.0)
    )
    could_win = np.any(_probes(lower, grid, steps) < (best - margin)[:, None], axis=0)
    cell = np.searchsorted(xs, grid, side="right") - 1
    chosen = []
    for index in np.unique(cell[could_win & (upper > lower)]):
        a, b = xs[index], xs[index + 1]
        inside = grid[(grid > a) & (grid < b)]
        failures = [order for order in failed if a < order < b]
        if len(failures) < MAX_FAILURES_PER_INTERVAL:  # dp_accounting's series keeps failing there: keep the chord
            candidate = _split(max(failures, default=a), b, inside[inside > max(failures, default=a)])
            chosen += [] if candidate is None else [candidate]
    return chosen


def _secant_lower_bound(xs: np.ndarray, fs: np.ndarray, grid: np.ndarray) -> np.ndarray:
    """max(0, the neighbouring secants extended into each interval): f lies above it (convexity)."""
    slopes = np.diff(fs) / np.diff(xs)
    cell = np.searchsorted(xs, grid, side="right") - 1
    lower = np.zeros_like(grid)
    left = cell >= 1
    lower[left] = fs[cell[left]] + (grid[left] - xs[cell[left]]) * slopes[cell[left] - 1]
    right = cell + 2 < xs.size
    from_right = fs[cell[right] + 1] - (xs[cell[right] + 1] - grid[right]) * slopes[cell[right] + 1]
    lower[right] = np.maximum(lower[right], from_right)
    bound: np.ndarray = np.maximum(lower, 0.0)
    return bound


def _probes(moments: np.ndarray, orders: np.ndarray, steps: int) -> np.ndarray:
    """Probe objectives (rows) at each order (columns): what the ε(δ) and δ(ε) conversions and a λ̂ term minimise."""
    composed = steps * moments
    c = _PROBE_CONSTANTS[:, None]
    with np.errstate(over="ignore", invalid="ignore"):
        conversion = (composed + c) / (orders - 1.0)
        selection = (composed + c) / orders
        log_delta = composed - _PROBE_EPSILONS[:, None] * (orders - 1.0)
        probes = np.vstack([conversion, selection, log_delta])
    relevant = composed / (orders - 1.0) <= 1e3  # a composed ε above 1e3 is no guarantee worth refining
    return np.where(relevant & np.isfinite(probes), probes, np.inf)


def _split(a: float, b: float, inside: np.ndarray) -> float | None:
    """The order to compute in (a, b), near its middle in log(α − 1).

    An integer up to 64 (closed form, cheap), else one of the requested orders, so refining never computes
    more orders than were asked for.
    """
    integers = np.arange(math.floor(a) + 1.0, min(math.ceil(b), 65.0))
    candidates = integers if a >= 2.0 and integers.size else inside
    if candidates.size == 0:
        return None
    middle = (
        0.5 * (math.log(a - 1.0) + math.log(b - 1.0)) if a > 1.0 else math.log(candidates[candidates.size // 2] - 1.0)
    )
    return float(candidates[np.argmin(np.abs(np.log(candidates - 1.0) - middle))])
