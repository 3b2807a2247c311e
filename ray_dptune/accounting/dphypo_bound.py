"""DP-HyPO's adaptive repeat-and-select bound, evaluated at its Lemma A.5 instead of its closed form.

Wang, Gao, Zhang, Su & Shen (2023), "DP-HyPO", arXiv:2306.05734v2, Appendix A. The
proof of Theorem 1 (p. 23) starts from Lemma A.5 (p. 21) for any law of the number
of runs T with PGF f:

    D_α(A1‖A2) ≤ sup_λ D_α(M_λ‖M'_λ) + α/(α-1)·log(C/c)
                 + 1/(α-1) · log( f'(q)^α · f'(q')^(1-α) ),                      (L.A.5)

where q = E_{P+}[g], q' = E_{P'-}[g] for one post-processing g : Y → [0, 1] of the
pair (P+, P'-) of Lemma A.4. Everything after this line in the proof (the split
with exponents ν, u and α̂, dropping (γ + (1-γ)(1-q))^u ≤ γ^u, and the final
-1 + e^{...} ≤ 0) only upper-bounds the last term for the worst (q, q'). Here the
worst (q, q') is found numerically instead, with every constraint the proof uses at
once:

* Lemma A.4 (p. 19-20) bounds the pair at every order α̂. Its chain reads
  ``≤ Σ_y sup_{λ,λ'}(c_λ/c'_λ)^{α-1} (Σ a_λ)^{α-1} (Σ a_λ)·sup_λ c_λ / (Σ b_λ)^{α-1}``
  before its last inequality, with c_λ = π+(λ)/π(λ) ≤ C (π is the prior). The
  paper then uses sup_λ c_λ ≤ C/c; keeping C gives

      D_α̂(P+‖P'-) ≤ ε(α̂) + log(C/c) + log(C)/(α̂-1)  =: a(α̂),                  (A.4')

  which is the paper's α̂/(α̂-1)·log(C/c) when C is unknown (c = 1, C = C/c, the
  worst case: c ≤ 1 ≤ C since densities average 1 under the prior). The reverse
  pair obeys the same bound (P'- ≤ P'+, P+ ≥ P-, and Lemma A.4 with D, D'
  swapped; neighbouring is symmetric), as the proof needs for its order α̂ step.
* Data processing (the proof's "1 - q and 1 - q' are postprocessings of some P+
  and P-"): D_α̂(Bern(q)‖Bern(q')) ≤ a(α̂) and D_α̂(Bern(q')‖Bern(q)) ≤ a(α̂)
  for every α̂ at once. Between two-point laws Rényi divergence is non-decreasing
  in α̂, so the constraint curve may be smoothed (min over α' ≥ α̂); the term
  a(α) of (L.A.5) itself is not (P+, P'- are not probability laws).

The maximum of (L.A.5) over that set is certified, not sampled (see
:func:`worst_log_pgf_ratio`). Each closed-form relaxation of Theorem 1 is an upper
bound on this maximum over a larger set (one α̂, one direction, q ≤ 1); the
certified maximum adds a small grid margin and uses at most
``MAX_CONSTRAINT_ORDERS`` orders, so callers take the pointwise minimum with the
closed form (:func:`ray_dptune.accounting.selection.repeat_and_select`). Lemma A.5 holds for any law of T on N≥0, so this function
accepts any law; the mass at T = 0 is added back as in the non-adaptive case
(:func:`ray_dptune.accounting.generic.add_no_run_atom`).

Two steps of the paper's proof treat P+ and P'- (suprema and infima over the
densities, with masses up to C and down to c) as if they were probability laws:
(A.12) P+(≤y) = P+(<y) + P+(y) and "1 - q is a post-processing of P+". The
library's exact adaptive audit (``tests/test_dphypo_bound.py``) checks this
bound, and the closed form, against the exact best-of-T law of adversarial
adaptive samplers.
"""

from __future__ import annotations

import math

import numpy as np

from ray_dptune import validate
from ray_dptune.accounting.generic import add_no_run_atom
from ray_dptune.accounting.rdp import RDPCurve
from ray_dptune.accounting.distributions import RunCountDistribution

__all__ = ["dphypo_lemma_bound", "lemma_a4_curve", "worst_log_pgf_ratio"]

BISECTION_STEPS = 48
CONSTRAINT_SLACK = 1e-9  # relative and absolute slack on a(α̂): rounding may only enlarge the feasible set
MAX_CONSTRAINT_ORDERS = 40  # fewer constraints = a larger feasible set = still a valid bound
DEFAULT_GRID_SIZE = 1024
MAX_GRID_SIZE = 2**15


def lemma_a4_curve(base: RDPCurve, *, density_ratio: float, upper: float | None = None) -> RDPCurve:
    """a(α) = ε(α) + log(C/c) + log(C)/(α-1): DP-HyPO Lemma A.4, kept before its last inequality.

    Args:
        base: RDP curve of one run (smoothed first; monotonicity holds for each base run).
        density_ratio: C/c >= 1.
        upper: C, with 1 <= C <= C/c; ``None`` takes the worst case C = C/c (c = 1),
            which gives the paper's α/(α-1)·log(C/c).

    Returns:
        The curve a on ``base.orders`` (not smoothed: it bounds a pair of measures that
        need not be probability laws).
    """
    ratio = validate.in_range("density_ratio", density_ratio, 1.0, note=" (C/c, with c <= 1 <= C)")
    upper = ratio if upper is None else validate.in_range("upper", upper, 1.0, ratio, note=" (C, with 1 <= C <= C/c)")
    base = base.smoothed()
    lam = base.orders
    with np.errstate(over="ignore"):
        eps = base.epsilons + math.log(ratio) + math.log(upper) / (lam - 1.0)
    return RDPCurve(lam, eps)


def _log_probs(p: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    with np.errstate(divide="ignore"):
        return np.log(p), np.log1p(-p)


def _exceeds(alpha, log_p, log_1mp, log_r, log_1mr, limit) -> np.ndarray:
    """D_α(Bern(p)‖Bern(r)) > limit, from logs (a term with p = 0 is 0 for α > 1)."""
    with np.errstate(invalid="ignore"):
        one = np.where(np.isneginf(log_p), -np.inf, alpha * log_p + (1.0 - alpha) * log_r)
        zero = np.where(np.isneginf(log_1mp), -np.inf, alpha * log_1mp + (1.0 - alpha) * log_1mr)
    return np.logaddexp(one, zero) > (alpha - 1.0) * limit


def _lowest_partner(q: np.ndarray, alphas: np.ndarray, limits: np.ndarray) -> np.ndarray:
    """A lower bound on b(q) = min{q' <= q : both binary divergences <= limits at every alpha}.

    For fixed q the feasible q' form an interval containing q (Rényi divergence is
    quasi-convex), so bisection keeps ``lo`` infeasible (or 0) and ``hi`` feasible.
    """
    a = alphas[:, None]
    lim = limits[:, None] * (1.0 + CONSTRAINT_SLACK) + CONSTRAINT_SLACK
    log_q, log_1mq = (v[None, :] for v in _log_probs(q))
    lo, hi = np.zeros_like(q), q.copy()
    for _ in range(BISECTION_STEPS):
        mid = 0.5 * (lo + hi)
        log_m, log_1mm = (v[None, :] for v in _log_probs(mid))
        bad = np.any(
            _exceeds(a, log_q, log_1mq, log_m, log_1mm, lim) | _exceeds(a, log_m, log_1mm, log_q, log_1mq, lim), axis=0
        )
        hi, lo = np.where(bad, hi, mid), np.where(bad, mid, lo)
    return lo


def _grid(law: RunCountDistribution, size: int) -> np.ndarray:
    """Points of [0, 1]: uniform, log-dense at both ends, and at equal steps of log f'."""
    ends = np.logspace(-14, -0.3, size // 4)
    top = float(law.log_pgf_derivative(1.0))
    bottom = max(float(law.log_pgf_derivative(0.0)), top - 60.0)
    targets = np.linspace(bottom, top, size // 2)
    lo, hi = np.zeros_like(targets), np.ones_like(targets)
    for _ in range(60):  # invert the non-decreasing log f' by bisection
        mid = 0.5 * (lo + hi)
        below = law.log_pgf_derivative(mid) < targets
        lo, hi = np.where(below, mid, lo), np.where(below, hi, mid)
    return np.unique(np.concatenate([np.linspace(0.0, 1.0, size // 4), ends, 1.0 - ends, hi, [0.0, 1.0]]))


def worst_log_pgf_ratio(
    orders: np.ndarray,
    law: RunCountDistribution,
    constraint: RDPCurve,
    *,
    grid_size: int = DEFAULT_GRID_SIZE,
    max_constraint_orders: int = MAX_CONSTRAINT_ORDERS,
) -> np.ndarray:
    """Upper bound on max α·log f'(q) + (1-α)·log f'(q') over (q, q') feasible for ``constraint``, per α.

    Feasible: D_α̂(Bern(q)‖Bern(q')) and D_α̂(Bern(q')‖Bern(q)) <= constraint(α̂) for
    every α̂ of ``constraint`` (at most ``max_constraint_orders`` of them are used:
    fewer constraints only enlarge the set). f' is non-decreasing, so the worst q' is
    the lowest feasible one, b(q), and b is non-decreasing in q. On a grid cell
    [q_i, q_{i+1}] the objective is at most α·log f'(q_{i+1}) + (1-α)·log f'(b(q_i)),
    with b(q_i) replaced by a lower end of its bisection bracket; the largest cell
    value bounds the maximum from above.

    Args:
        orders: the α at which to evaluate, each > 1.
        law: law of T; only ``log_pgf_derivative`` on [0, 1] is used.
        constraint: RDP curve bounding the binary pair (smoothed here: valid for
            two-point laws).
        grid_size: about how many points of [0, 1]; more is tighter, never looser.
        max_constraint_orders: cap on the constraint orders used.

    Returns:
        An array like ``orders``; ``inf`` where no finite bound is found.
    """
    grid_size = validate.positive_int("grid_size", grid_size, maximum=MAX_GRID_SIZE)
    max_constraint_orders = validate.positive_int("max_constraint_orders", max_constraint_orders)
    lam = np.asarray(orders, dtype=float)
    constraint = constraint.smoothed()
    finite = np.isfinite(constraint.epsilons)
    if not finite.any():
        return np.full_like(lam, np.inf)
    c_alpha, c_eps = constraint.orders[finite], constraint.epsilons[finite]
    if c_alpha.size > max_constraint_orders:
        keep = np.unique(np.linspace(0, c_alpha.size - 1, max_constraint_orders).round().astype(int))
        c_alpha, c_eps = c_alpha[keep], c_eps[keep]
    q = _grid(law, grid_size)
    partner = _lowest_partner(q, c_alpha, c_eps)
    high = law.log_pgf_derivative(q[1:])
    low = law.log_pgf_derivative(partner[:-1])
    with np.errstate(invalid="ignore", over="ignore"):  # inf - inf = NaN counts as inf: conservative
        cell = lam[:, None] * high[None, :] + (1.0 - lam[:, None]) * low[None, :]
        worst = np.where(np.isnan(cell), np.inf, cell).max(axis=1)
    return worst


def dphypo_lemma_bound(
    base: RDPCurve,
    law: RunCountDistribution,
    *,
    density_ratio: float,
    upper: float | None = None,
    grid_size: int = DEFAULT_GRID_SIZE,
) -> RDPCurve:
    """RDP of DP-HyPO (adaptive best-of-T, densities within [c, C] × prior) from its Lemma A.5.

    ε'(α) = a(α) + max_{(q,q') feasible} [α log f'(q) + (1-α) log f'(q')] / (α-1), with
    a from :func:`lemma_a4_curve` (Lemma A.4 before its last inequality) and the
    feasible set of the module docstring; plus the T = 0 atom, then smoothed in α
    (the outputs A1, A2 are probability laws). Wang et al. 2023, arXiv:2306.05734v2,
    Lemma A.5 (p. 21), the first line of the proof of Theorem 1 (p. 23).

    Args:
        base: RDP curve every run satisfies, whatever its hyperparameters (the plan).
        law: law of the number of runs T (any; Lemma A.5 only uses its PGF).
        density_ratio: C/c >= 1 of the sampling densities relative to the prior.
        upper: C itself when known (1 <= C <= C/c); tightens Lemma A.4 by
            log(1/c)/(α-1). ``None``: C = C/c (the paper's bound).
        grid_size: points of [0, 1] for the certified maximum.

    Returns:
        An RDPCurve on ``base.orders``; ``inf`` where no finite bound is found.
    """
    if not isinstance(base, RDPCurve):
        raise TypeError(f"base must be an RDPCurve, got {type(base).__name__}.")
    if not isinstance(law, RunCountDistribution):
        raise TypeError(f"law must be a RunCountDistribution, got {type(law).__name__}.")
    a4 = lemma_a4_curve(base, density_ratio=density_ratio, upper=upper)
    lam = a4.orders
    worst = worst_log_pgf_ratio(lam, law, a4, grid_size=grid_size)
    with np.errstate(invalid="ignore", over="ignore"):
        log_moment = (lam - 1.0) * a4.epsilons + worst
    log_moment = np.where(np.isnan(log_moment), np.inf, log_moment)
    return RDPCurve(lam, add_no_run_atom(log_moment, law.prob_zero, lam)).smoothed()
