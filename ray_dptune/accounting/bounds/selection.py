"""RDP of "run the base mechanism K times, release only the best run".

Bounds, each cited at its formula:

* truncated negative binomial K: Papernot & Steinke (2022), arXiv:2110.03620v2,
  Theorem 2, kept in the tighter form of the last equality of its proof (App. B.2);
  with an adaptive sampling density in [c, C] × prior, DP-HyPO (Wang et al. 2023,
  arXiv:2306.05734v2) Theorem 1, likewise from the last equality of its proof (App. A);
* Poisson K: P&S Theorem 6, corrected for the mass at K = 0 (:func:`poisson_bound`);
* any law: P&S Lemma 7, maximised numerically (:mod:`ray_dptune.accounting.bounds.lemma7.generic`);
* a fixed number k of runs: k-fold composition.

All are valid, so :func:`repeat_and_select` returns their pointwise minimum, then
applies monotonicity in the order (P&S Remark 5).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from ray_dptune import validate
from ray_dptune.accounting.bounds.distributions import (
    PointMass,
    Poisson,
    RunCountDistribution,
    TruncatedNegativeBinomial,
)
from ray_dptune.accounting.bounds.dphypo_bound import dphypo_lemma_bound
from ray_dptune.accounting.bounds.lemma7.generic import add_no_run_atom, generic_repeat_and_select
from ray_dptune.accounting.curves.rdp import RDPCurve
from ray_dptune.errors import UnsupportedBoundError

__all__ = [
    "check_density_ratio",
    "known_profile",
    "poisson_bound",
    "repeat_and_select",
    "truncated_negative_binomial_bound",
]


def truncated_negative_binomial_bound(
    base: RDPCurve, law: TruncatedNegativeBinomial, *, density_ratio: float = 1.0
) -> RDPCurve:
    """P&S Theorem 2 (C/c = 1) and DP-HyPO Theorem 1 (C/c > 1), λ̂ optimised.

    With L = log(C/c), E = E[K] and any λ̂ ≥ 1 with (λ̂, ε̂)-RDP, the proofs end on

        ε'(λ) = ε(λ) + λ/(λ-1)·L + log(E)/(λ-1)
                + (1+η)(1-1/λ̂)ε̂ + (1+η)L + (1+η)/λ̂ · log(1/γ - 1 + e^{-(λ̂-1)ε̂ - λ̂L}),

    which the theorems then relax by dropping -1 + e^{...} ≤ 0. The λ̂ terms do
    not depend on λ, so they are minimised once over every order of the base
    (and λ̂ = 1, allowed by P&S Theorem 2, footnote 4). The expression is
    increasing in ε̂, so any upper bound ε̂ ≥ D_λ̂ is valid.
    """
    log_ratio = math.log(check_density_ratio(density_ratio=density_ratio))
    base = base.smoothed()
    eta, gamma = law.eta, law.gamma
    log_odds = math.log1p(-gamma) - math.log(gamma)  # log(1/γ - 1)

    lam_hat, eps_hat = base.orders, base.epsilons
    finite = np.isfinite(eps_hat)
    lam_hat, eps_hat = lam_hat[finite], eps_hat[finite]
    if lam_hat.size == 0:
        return RDPCurve(base.orders, np.full_like(base.epsilons, np.inf))
    with np.errstate(over="ignore"):  # terms above 1.8e308 are inf: conservative
        exponent = -(lam_hat - 1.0) * eps_hat - lam_hat * log_ratio
        hat_terms = (1.0 + eta) * (
            (1.0 - 1.0 / lam_hat) * eps_hat + log_ratio + np.logaddexp(log_odds, exponent) / lam_hat
        )
        # λ̂ = 1: the terms tend to (1+η)(L + log(1/γ - 1 + e^{-L})) as λ̂ → 1.
        at_one = (1.0 + eta) * (log_ratio + np.logaddexp(log_odds, -log_ratio))
        selection_cost = min(float(hat_terms.min()), float(at_one))

        lam = base.orders
        epsilons = base.epsilons + lam / (lam - 1.0) * log_ratio + math.log(law.mean) / (lam - 1.0) + selection_cost
    return RDPCurve(lam, np.maximum(epsilons, 0.0)).smoothed()


def poisson_bound(
    base: RDPCurve, law: Poisson, *, base_delta: Callable[[np.ndarray], np.ndarray] | None = None
) -> RDPCurve:
    """P&S Theorem 6 with the K = 0 atom restored (see :func:`add_no_run_atom`).

    Theorem 6 states ε'(λ) = ε(λ) + μδ̂ + log(μ)/(λ-1) for (ε̂, δ̂)-DP with
    e^ε̂ ≤ λ/(λ-1); its proof goes through Lemma 7, which P&S prove for
    P[K = 0] = 0 only. The statement is false for small μ (negative for μ < 1 as
    λ → 1) and slightly optimistic for every μ. We return
    ε'(λ) = log(e^{-μ} + μ e^{(λ-1)(ε(λ) + μδ̂)}) / (λ-1), which is what the
    proof gives once the atom is kept.

    δ̂ is non-increasing in ε̂, so ε̂ takes the largest allowed value,
    log(λ/(λ-1)). δ̂ there is the smaller of the base's exact profile
    ``base_delta`` (when given) and the (ε, δ) conversion of the RDP curve
    (Canonne, Kamath & Steinke 2020, Prop. 12): both are valid.
    """
    base = base.smoothed()
    mu = law.mean
    lam = base.orders
    eps_hat = np.log1p(1.0 / (lam - 1.0))
    delta_hat = base._deltas(eps_hat)
    if base_delta is not None:
        exact = np.asarray(base_delta(eps_hat), dtype=float)
        if exact.shape != eps_hat.shape or np.any(np.isnan(exact)) or np.any(exact < 0):
            raise ValueError(
                "base_delta must map an array of ε to an array of δ >= 0 of the same shape "
                f"(got shape {exact.shape} for input shape {eps_hat.shape})."
            )
        delta_hat = np.minimum(delta_hat, exact)
    with np.errstate(over="ignore"):  # overflow is inf: conservative
        lemma_7_terms = (lam - 1.0) * (base.epsilons + mu * delta_hat) + math.log(mu)
    return RDPCurve(lam, add_no_run_atom(lemma_7_terms, law.prob_zero, lam)).smoothed()


def repeat_and_select(
    base: RDPCurve,
    distribution: RunCountDistribution,
    *,
    density_ratio: float = 1.0,
    upper: float | None = None,
    base_delta: Callable[[np.ndarray], np.ndarray] | None = None,
    generic: bool = True,
) -> RDPCurve:
    """RDP curve of drawing K from ``distribution``, running the base K times, releasing the best.

    Args:
        base: RDP curve that every single run satisfies (the plan).
        distribution: law of K, drawn once before any run.
        density_ratio: C/c for adaptive sampling whose density stays within
            [c, C] × prior (DP-HyPO); 1 for non-adaptive (uniform) search.
        upper: C itself, when the sampler guarantees it (1 <= C <= C/c): tightens
            DP-HyPO's Lemma A.4 (:func:`~ray_dptune.accounting.bounds.dphypo_bound.dphypo_lemma_bound`).
            None: the worst case C = C/c.
        base_delta: the base's exact (ε, δ) profile, vectorised (e.g.
            :func:`ray_dptune.accounting.curves.profiles.gaussian_profile`); tightens
            the Poisson bound (P&S Theorem 6). Default: the profile of
            ``base.mechanism`` when known (exact for a Gaussian, dp_accounting's
            pessimistic PLD for DP-SGD), else the RDP curve's conversion.
        generic: also evaluate P&S Lemma 7 at its certified numerical worst case
            and keep the pointwise minimum (the default: both are valid bounds, so
            the minimum is the tightest; see :mod:`ray_dptune.accounting.bounds.lemma7.generic`).
            False keeps the closed forms alone (the cross-check).

    Returns:
        An RDPCurve on ``base.orders``.

    Raises:
        UnsupportedBoundError: ``density_ratio > 1`` with a law for which no
            theorem bounds adaptive search (only the truncated negative binomial,
            DP-HyPO Theorem 1, and a fixed k, by composition, are covered).
        TypeError: ``base`` or ``distribution`` of the wrong type.
        ValueError: invalid arguments.
    """
    if not isinstance(base, RDPCurve):
        raise TypeError(f"base must be an RDPCurve, got {type(base).__name__}.")
    if not isinstance(distribution, RunCountDistribution):
        raise TypeError(f"distribution must be a RunCountDistribution, got {type(distribution).__name__}.")
    density_ratio = check_density_ratio(density_ratio=density_ratio)
    if base_delta is not None and not isinstance(distribution, Poisson):
        raise ValueError("base_delta is only used by the Poisson bound (P&S Theorem 6); drop it for this law.")
    adaptive = density_ratio > 1.0

    if isinstance(distribution, PointMass):
        # Composition holds under any adaptive choice of the next configuration.
        bound = distribution.k * base
    elif isinstance(distribution, TruncatedNegativeBinomial):
        bound = truncated_negative_binomial_bound(base, distribution, density_ratio=density_ratio)
        if adaptive and generic:  # DP-HyPO Lemma A.5, certified numeric maximum: also valid, keep the minimum
            bound = bound.minimum(dphypo_lemma_bound(base, distribution, density_ratio=density_ratio, upper=upper))
    elif adaptive:
        raise UnsupportedBoundError(
            f"No proven RDP bound covers adaptive sampling (C/c = {density_ratio}) with K ~ "
            f"{distribution!r}: DP-HyPO Theorem 1 needs a truncated negative binomial K. Use "
            "TruncatedNegativeBinomial.from_mean(eta, mean), or a non-adaptive searcher."
        )
    elif isinstance(distribution, Poisson):
        bound = poisson_bound(base, distribution, base_delta=base_delta or known_profile(base))
    else:
        return generic_repeat_and_select(base, distribution).smoothed()

    if generic and not adaptive:
        bound = bound.minimum(generic_repeat_and_select(base, distribution))
    return bound.smoothed()


def known_profile(base: RDPCurve) -> Callable[[np.ndarray], np.ndarray] | None:
    """The exact (or upper-bounding) (ε, δ) profile of ``base.mechanism``; None when unknown or out of reach."""
    if base.mechanism is None:
        return None
    try:
        return base.mechanism.profile()
    except ValueError:  # a PLD too large to build: the RDP conversion alone is still valid
        return None


def check_density_ratio(*, density_ratio: float) -> float:
    """C/c as a finite float >= 1 (c <= 1 <= C)."""
    return validate.in_range("density_ratio", density_ratio, 1.0, note=" (C/c, with c <= 1 <= C)")
