"""P&S Lemma 7 (generic bound) evaluated numerically at its worst case.

Papernot & Steinke (2022), Lemma 7: for any law of K with PGF f,

    D_λ(A‖A') ≤ D_λ(Q‖Q') + 1/(λ-1) · log( f'(q)^λ f'(q')^(1-λ) ),

where (q, q') are the probabilities that one [0, 1]-valued post-processing gives
under Q and Q'. Knowing only the base RDP curve ε(·), every such pair satisfies
D_α(Bern(q)‖Bern(q')) ≤ ε(α) and D_α(Bern(q')‖Bern(q)) ≤ ε(α) for all α (data
processing; neighbouring is symmetric), so maximising over that set is a valid
bound for every law — including those with no closed form. When the base's
mechanism is known (a Gaussian, DP-SGD: ``RDPCurve.mechanism``), the feasible set
is its exact trade-off region instead, much smaller (Gaussian: q' ≥ Φ(Φ⁻¹(q) - μ)).
The mass at K = 0, which Lemma 7's proof leaves out, is added back
(:func:`add_no_run_atom`).

The maximum is certified, not sampled: f' is non-decreasing (a PGF has
non-negative coefficients), and the smallest feasible q', b(q), is non-decreasing
in q (each binary divergence grows as q moves away from q'). On a cell
[q_i, q_{i+1}] the objective is therefore at most
λ log f'(q_{i+1}) + (1-λ) log f'(b(q_i)), with b(q_i) replaced by a lower bound
(the lower end of its bisection bracket, or the known mechanism's partner rounded
down). The max over cells bounds the true max from above. Each cell's bound is a
line in λ, so the max over cells for all orders at once is an upper envelope of
lines (:func:`upper_envelope`: only the convex hull's lines are evaluated).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable

import numpy as np

from ray_dptune import validate
from ray_dptune.accounting.rdp import RDPCurve
from ray_dptune.accounting.distributions import RunCountDistribution

__all__ = ["add_no_run_atom", "generic_repeat_and_select", "upper_envelope"]

_BISECTION_STEPS = 48
_MAX_CONSTRAINT_ORDERS = 48  # fewer constraints = a larger feasible set = still a valid bound
_CONSTRAINT_SLACK = 1e-9  # relative slack on ε(α): rounding may only enlarge the feasible set
MAX_GRID_SIZE = 2**16  # memory grows as len(orders) × grid_size


def add_no_run_atom(log_moment: np.ndarray, prob_zero: float, orders: np.ndarray) -> np.ndarray:
    """ε'(λ) = log(P[K=0] + e^{log_moment}) / (λ-1), where log_moment bounds the K ≥ 1 part.

    P&S Lemma 7 bounds Σ_y A(y)^λ A'(y)^{1-λ} over the outputs of runs by
    e^{(λ-1)D_λ(Q‖Q')} f'(q)^λ f'(q')^{1-λ} (its proof holds verbatim when
    P[K = 0] > 0: the constant term of f cancels in f(Q(≤y)) - f(Q(<y))). The
    data-independent output of K = 0 has mass P[K=0] under both inputs and adds
    P[K=0] to the sum; if it coincides with a run's output, (u, v) ↦ u^λ v^{1-λ}
    is convex and homogeneous, hence subadditive, and the same bound holds.
    """
    prob_zero = validate.probability("prob_zero", prob_zero)
    log_moment = validate.not_nan("log_moment", log_moment)
    log_prob_zero = math.log(prob_zero) if prob_zero > 0 else -np.inf
    return np.maximum(np.logaddexp(log_prob_zero, log_moment) / (orders - 1.0), 0.0)


def _log_probs(p: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    with np.errstate(divide="ignore"):
        return np.log(p), np.log1p(-p)


def _binary_renyi_exceeds(alpha, log_p, log_1mp, log_r, log_1mr, limit) -> np.ndarray:
    """D_α(Bern(p)‖Bern(r)) > limit, from precomputed logs (0^α r^(1-α) = 0 for α > 1)."""
    with np.errstate(invalid="ignore"):
        one = np.where(np.isneginf(log_p), -np.inf, alpha * log_p + (1.0 - alpha) * log_r)
        zero = np.where(np.isneginf(log_1mp), -np.inf, alpha * log_1mp + (1.0 - alpha) * log_1mr)
    return np.logaddexp(one, zero) > (alpha - 1.0) * limit


def _smallest_feasible_partner(q: np.ndarray, alphas: np.ndarray, bounds: np.ndarray) -> np.ndarray:
    """A lower bound on min{q' ≤ q : (q, q') satisfies every binary constraint}."""
    a = alphas[:, None]
    eps = bounds[:, None] * (1.0 + _CONSTRAINT_SLACK) + _CONSTRAINT_SLACK
    log_q, log_1mq = (v[None, :] for v in _log_probs(q))
    lo = np.zeros_like(q)  # infeasible (or q = 0)
    hi = q.copy()  # feasible: the divergence of a law from itself is 0
    for _ in range(_BISECTION_STEPS):
        mid = 0.5 * (lo + hi)
        log_m, log_1mm = (v[None, :] for v in _log_probs(mid))
        infeasible = np.any(
            _binary_renyi_exceeds(a, log_q, log_1mq, log_m, log_1mm, eps)
            | _binary_renyi_exceeds(a, log_m, log_1mm, log_q, log_1mq, eps),
            axis=0,
        )
        hi = np.where(infeasible, hi, mid)
        lo = np.where(infeasible, mid, lo)
    return lo


def _q_grid(distribution: RunCountDistribution, size: int) -> np.ndarray:
    """Points of [0, 1] dense where q is near 0 or 1 and where log f' moves fastest.

    Any grid that contains 0 and 1 certifies the maximum (see the module docstring);
    the grid only decides how tight it is, so it is cached by the law's description.
    """
    try:
        key = (type(distribution).__qualname__, json.dumps(distribution.to_dict(), sort_keys=True), size)
    except (TypeError, ValueError):  # an undescribable law: no cache
        return _build_q_grid(distribution, size)
    if key not in _GRID_CACHE:
        if len(_GRID_CACHE) > 64:
            _GRID_CACHE.clear()
        _GRID_CACHE[key] = _build_q_grid(distribution, size)
    return _GRID_CACHE[key]


_GRID_CACHE: dict[tuple, np.ndarray] = {}


def _build_q_grid(distribution: RunCountDistribution, size: int) -> np.ndarray:
    uniform = np.linspace(0.0, 1.0, size // 4)
    ends = np.logspace(-14, -0.3, size // 4)
    # Equal steps of log f' (inverted by bisection; log f' is non-decreasing).
    top = float(distribution.log_pgf_derivative(1.0))
    bottom = max(float(distribution.log_pgf_derivative(0.0)), top - 60.0)
    targets = np.linspace(bottom, top, size // 2)
    lo, hi = np.zeros_like(targets), np.ones_like(targets)
    for _ in range(60):
        mid = 0.5 * (lo + hi)
        below = distribution.log_pgf_derivative(mid) < targets
        lo = np.where(below, mid, lo)
        hi = np.where(below, hi, mid)
    grid = np.unique(np.concatenate([uniform, ends, 1.0 - ends, hi, [0.0, 1.0]]))
    grid.flags.writeable = False
    return grid


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
    x = np.asarray(x, dtype=float)
    live = intercepts > -np.inf
    slopes, intercepts = slopes[live], intercepts[live]
    if slopes.size == 0:
        return np.full_like(x, -np.inf)
    if not (np.all(np.isfinite(slopes)) and np.all(np.isfinite(intercepts))):
        return np.full_like(x, np.inf)
    order = np.lexsort((-intercepts, -slopes))  # slope descending, then intercept descending
    best_so_far = np.maximum.accumulate(intercepts[order])
    keep = np.ones(order.size, dtype=bool)
    keep[1:] = intercepts[order][1:] > best_so_far[:-1]
    s, c = slopes[order][keep][::-1], intercepts[order][keep][::-1]  # slope ascending, intercept descending
    for _ in range(_ENVELOPE_PASSES):
        if s.size <= 2:
            break
        breaks = (c[:-1] - c[1:]) / (s[1:] - s[:-1])  # where line k+1 overtakes line k
        useless = np.zeros(s.size, dtype=bool)
        useless[1:-1] = breaks[:-1] >= breaks[1:]
        if not useless.any():
            break
        useless[1:] &= ~useless[:-1]  # never two neighbours in one pass
        s, c = s[~useless], c[~useless]
    scale = x * np.abs(s).max() + np.abs(c).max()
    if s.size > 2 and np.any(np.diff((c[:-1] - c[1:]) / (s[1:] - s[:-1])) <= 0):  # not converged: every line
        values = np.max([x * si + ci for si, ci in zip(s, c)], axis=0)
        return values + _ENVELOPE_SLACK * scale
    breaks = (c[:-1] - c[1:]) / (s[1:] - s[:-1]) if s.size > 1 else np.empty(0)
    lead = np.searchsorted(breaks, x)
    values = np.full_like(x, -np.inf)
    for shift in (-1, 0, 1):
        line = np.clip(lead + shift, 0, s.size - 1)
        values = np.maximum(values, x * s[line] + c[line])
    return values + _ENVELOPE_SLACK * scale


_ENVELOPE_PASSES = 200
_ENVELOPE_SLACK = 1e-9


def generic_repeat_and_select(
    base: RDPCurve,
    distribution: RunCountDistribution,
    *,
    grid_size: int | None = None,
    partner: Callable[[np.ndarray], np.ndarray] | None = None,
) -> RDPCurve:
    """RDP of best-of-K from P&S Lemma 7 alone, maximised over all feasible (q, q').

    Args:
        base: RDP curve of one run (it is smoothed first).
        distribution: law of K; only its ``log_pgf_derivative`` is used.
        grid_size: about how many points of [0, 1] the certified maximum uses;
            more points give a tighter (never a looser) bound. Default 4096 when the
            partner is known exactly, 2048 when it is bisected from the RDP curve.
        partner: q ↦ a lower bound on the smallest q' that one post-processing can give
            with q (vectorised). Default: ``base.mechanism.partner`` when the base's
            mechanism is known (exact for a Gaussian, from a PLD for DP-SGD), else the
            binary-divergence constraints of the RDP curve, by bisection.

    Returns:
        The curve on ``base.orders``; ``inf`` where the bound is infinite.
    """
    base = base.smoothed()
    finite = np.isfinite(base.epsilons)
    if not finite.any():
        return RDPCurve(base.orders, np.full_like(base.epsilons, np.inf))
    if partner is None and base.mechanism is not None:
        try:
            base.mechanism.profile()  # a PLD out of reach raises here: fall back to the RDP constraints
            partner = base.mechanism.partner
        except ValueError:
            partner = None
    if grid_size is None:
        grid_size = 4096 if partner is not None else 2048
    grid_size = validate.positive_int("grid_size", grid_size, maximum=MAX_GRID_SIZE)

    q = _q_grid(distribution, grid_size)
    if partner is not None:
        low_partner = np.asarray(partner(q), dtype=float)
        if low_partner.shape != q.shape or np.any(np.isnan(low_partner)):
            raise ValueError("partner must map an array of q to an array of q' of the same shape, without NaN.")
        low_partner = np.clip(low_partner, 0.0, q)
    else:
        c_alpha, c_eps = base.orders[finite], base.epsilons[finite]
        if c_alpha.size > _MAX_CONSTRAINT_ORDERS:
            keep = np.unique(np.linspace(0, c_alpha.size - 1, _MAX_CONSTRAINT_ORDERS).round().astype(int))
            c_alpha, c_eps = c_alpha[keep], c_eps[keep]
        low_partner = _smallest_feasible_partner(q, c_alpha, c_eps)
    log_fp_high = distribution.log_pgf_derivative(q[1:])  # f'(q_{i+1}) bounds f' on the cell
    log_fp_partner = distribution.log_pgf_derivative(low_partner[:-1])  # b(q_i) bounds q' from below

    # Cell i: λ·high + (1-λ)·partner = (λ-1)·(high - partner) + high, a line in λ - 1.
    with np.errstate(invalid="ignore", over="ignore"):  # NaN (inf - inf) is a NaN line: every value inf
        worst = upper_envelope(base.orders - 1.0, log_fp_high - log_fp_partner, log_fp_high)
        log_moment = (base.orders - 1.0) * base.epsilons + worst
    log_moment = np.where(np.isnan(log_moment), np.inf, log_moment)
    return RDPCurve(base.orders, add_no_run_atom(log_moment, distribution.prob_zero, base.orders))
