"""P&S Lemma 7 (generic bound) evaluated numerically at its worst case.

Papernot & Steinke (2022), arXiv:2110.03620v2, Lemma 7: for any law of K with PGF f,

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

The maximum is certified, not sampled, by :mod:`ray_dptune.accounting.bounds.lemma7.worst_pair`
(shared with DP-HyPO's Lemma A.5): on each cell [q_i, q_{i+1}] of a grid the objective
is at most λ log f'(q_{i+1}) + (1-λ) log f'(p_i) for any p_i below the lowest feasible
q' at q_i, and the largest cell value, an upper envelope of lines in λ, bounds the max.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from ray_dptune import validate
from ray_dptune.accounting.bounds.distributions import RunCountDistribution
from ray_dptune.accounting.bounds.lemma7 import worst_pair
from ray_dptune.accounting.curves.rdp import RDPCurve

__all__ = ["add_no_run_atom", "generic_repeat_and_select"]

BARE_GRID_SIZE = 2048
"""Grid for a curve whose mechanism is unknown (its partner is solved from the RDP constraints)."""
KNOWN_GRID_SIZE = 4096
"""Grid when the base's mechanism gives the partner in closed form (cheap per point)."""


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
    result: np.ndarray = np.maximum(np.logaddexp(log_prob_zero, log_moment) / (orders - 1.0), 0.0)
    return result


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
            more points give a tighter (never a looser) bound. Default
            :data:`KNOWN_GRID_SIZE` when the partner is known exactly,
            :data:`BARE_GRID_SIZE` when it is solved from the RDP curve.
        partner: q ↦ a lower bound on the smallest q' that one post-processing can give
            with q (vectorised). Default: ``base.mechanism.partner`` when the base's
            mechanism is known (exact for a Gaussian, from a PLD for DP-SGD), else the
            binary-divergence constraints of the RDP curve, solved and certified by
            :class:`~ray_dptune.accounting.bounds.lemma7.partner_search.PartnerSearch`.

    Returns:
        The curve on ``base.orders``; ``inf`` where the bound is infinite.
    """
    base = base.smoothed()
    if not np.isfinite(base.epsilons).any():
        return RDPCurve(base.orders, np.full_like(base.epsilons, np.inf))
    if partner is None and base.mechanism is not None:
        try:
            base.mechanism.profile()  # a PLD out of reach raises here: fall back to the RDP constraints
            partner = base.mechanism.partner
        except ValueError:
            partner = None
    if grid_size is None:
        grid_size = KNOWN_GRID_SIZE if partner is not None else BARE_GRID_SIZE
    grid_size = validate.positive_int("grid_size", grid_size, maximum=worst_pair.MAX_GRID_SIZE)

    if partner is None:
        worst = worst_pair.worst_log_pgf_ratio(base.orders, distribution, base, grid_size=grid_size)
    else:
        q = worst_pair.q_grid(distribution, grid_size)
        low_partner = np.asarray(partner(q), dtype=float)
        if low_partner.shape != q.shape or np.any(np.isnan(low_partner)):
            raise ValueError("partner must map an array of q to an array of q' of the same shape, without NaN.")
        worst = worst_pair.worst_cells(base.orders - 1.0, q, np.clip(low_partner, 0.0, q), distribution)[0]
    with np.errstate(invalid="ignore", over="ignore"):  # NaN (inf - inf) counts as inf: conservative
        log_moment = (base.orders - 1.0) * base.epsilons + worst
    log_moment = np.where(np.isnan(log_moment), np.inf, log_moment)
    return RDPCurve(base.orders, add_no_run_atom(log_moment, distribution.prob_zero, base.orders))
