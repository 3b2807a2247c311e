"""Privacy of base mechanisms: RDP curves and exact (ε, δ) profiles.

Pure numpy/scipy plus dp_accounting; nothing here imports Ray or torch.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable

import numpy as np
from scipy import special

SUBSAMPLED_GAUSSIAN_MAX_ORDER = 1024.0
SUBSAMPLED_GAUSSIAN_DENSE_UP_TO = 64.0
SUBSAMPLED_GAUSSIAN_THINNING = 4

DeltaProfile = Callable[[np.ndarray], np.ndarray]
"""An exact (or upper-bounding) privacy profile: ε ↦ δ(ε), vectorised."""


def _positive(name: str, value: float) -> float:
    value = float(value)
    if not value > 0 or math.isnan(value):
        raise ValueError(f"{name} must be > 0, got {value}.")
    return value


def gaussian_rdp(noise_multiplier: float, orders: np.ndarray) -> np.ndarray:
    """α / (2σ²): Gaussian mechanism with sensitivity 1 (Mironov 2017, Prop. 7)."""
    sigma = _positive("noise_multiplier", noise_multiplier)
    return orders / (2.0 * sigma**2)


def zcdp_rdp(rho: float, orders: np.ndarray) -> np.ndarray:
    """ρα: the definition of ρ-zCDP (Bun & Steinke 2016, Def. 1.1)."""
    rho = float(rho)
    if not rho >= 0 or math.isinf(rho):
        raise ValueError(f"rho must be a finite number >= 0, got {rho}.")
    return rho * orders


def pure_dp_rdp(epsilon: float, orders: np.ndarray) -> np.ndarray:
    """min(ε, αε²/2) for an ε-DP mechanism.

    D_α ≤ D_∞ ≤ ε, and ε-DP implies ε²/2-zCDP (Bun & Steinke 2016, Prop. 3.3).
    """
    epsilon = float(epsilon)
    if not epsilon >= 0 or math.isinf(epsilon):
        raise ValueError(f"epsilon must be a finite number >= 0, got {epsilon}.")
    return np.minimum(epsilon, orders * epsilon**2 / 2.0)


def subsampled_gaussian_rdp(sample_rate: float, noise_multiplier: float, steps: int, orders: np.ndarray) -> np.ndarray:
    """RDP of ``steps`` Poisson-subsampled Gaussian steps (DP-SGD), add/remove-one.

    Computed by dp_accounting's RdpAccountant (Mironov, Talwar & Zhang 2019), which
    bounds both directions of the divergence. Its series for fractional orders does
    not converge reliably far above ``SUBSAMPLED_GAUSSIAN_MAX_ORDER``; higher orders
    get ``inf`` ("no bound"), which is always valid and never the optimum for DP-SGD
    at practical δ. Above ``SUBSAMPLED_GAUSSIAN_DENSE_UP_TO``, where each order costs
    most and DP-SGD's optimum rarely lies, only every ``SUBSAMPLED_GAUSSIAN_THINNING``-th
    order is computed; the others take the value of the next computed order up,
    valid because D_α is non-decreasing in α (van Erven & Harremos 2014, Thm 3).
    """
    _check_dpsgd(sample_rate, noise_multiplier, steps)
    orders = np.asarray(orders, dtype=float)
    computed = _computed_orders(orders)
    epsilons = np.full(orders.shape, np.inf)
    if computed.any():
        from dp_accounting import dp_event  # imported here: dp_accounting takes ~1.5 s to import
        from dp_accounting.rdp import rdp_privacy_accountant

        accountant = rdp_privacy_accountant.RdpAccountant(orders=list(orders[computed]))
        event = dp_event.PoissonSampledDpEvent(sample_rate, dp_event.GaussianDpEvent(noise_multiplier))
        accountant.compose(event, int(steps))
        known_orders, known = orders[computed], np.asarray(accountant.rdp, dtype=float)
        fill = (orders <= SUBSAMPLED_GAUSSIAN_MAX_ORDER) & ~computed
        epsilons[computed] = known
        epsilons[fill] = known[np.searchsorted(known_orders, orders[fill], side="left")]
    return epsilons


def _computed_orders(orders: np.ndarray) -> np.ndarray:
    """Orders computed exactly: all up to the dense limit, then a thinned set up to the max."""
    dense = orders <= SUBSAMPLED_GAUSSIAN_DENSE_UP_TO
    sparse = np.flatnonzero((orders > SUBSAMPLED_GAUSSIAN_DENSE_UP_TO) & (orders <= SUBSAMPLED_GAUSSIAN_MAX_ORDER))
    chosen = sparse[::-1][::SUBSAMPLED_GAUSSIAN_THINNING]  # from the top, so the largest is computed
    mask = dense.copy()
    mask[chosen] = True
    return mask


def _check_dpsgd(sample_rate: float, noise_multiplier: float, steps: int) -> None:
    if not 0 < float(sample_rate) <= 1:
        raise ValueError(f"sample_rate must lie in (0, 1], got {sample_rate}.")
    _positive("noise_multiplier", noise_multiplier)
    if isinstance(steps, bool) or int(steps) != steps or steps < 0:
        raise ValueError(f"steps must be an integer >= 0, got {steps!r}.")


def gaussian_profile(noise_multiplier: float) -> DeltaProfile:
    """Exact δ(ε) of the Gaussian mechanism with sensitivity 1.

    Balle & Wang (2018), "Improving the Gaussian Mechanism", Theorem 8:
    δ(ε) = Φ(1/(2σ) - εσ) - e^ε Φ(-1/(2σ) - εσ), computed in log space.
    """
    sigma = _positive("noise_multiplier", noise_multiplier)

    def delta(epsilon: np.ndarray) -> np.ndarray:
        eps = np.asarray(epsilon, dtype=float)
        log_a = special.log_ndtr(0.5 / sigma - eps * sigma)
        log_b = eps + special.log_ndtr(-0.5 / sigma - eps * sigma)
        with np.errstate(divide="ignore", invalid="ignore"):
            value = np.where(log_b < log_a, np.exp(log_a) * -np.expm1(log_b - log_a), 0.0)
        return np.clip(value, 0.0, 1.0)

    return delta


@functools.lru_cache(maxsize=32)
def _subsampled_gaussian_pld(sample_rate: float, noise_multiplier: float, steps: int, discretization: float):
    from dp_accounting.pld import privacy_loss_distribution

    pld = privacy_loss_distribution.from_gaussian_mechanism(
        standard_deviation=noise_multiplier,
        sensitivity=1.0,
        pessimistic_estimate=True,
        value_discretization_interval=discretization,
        sampling_prob=sample_rate,
    )
    return pld.self_compose(steps) if steps > 1 else pld


def subsampled_gaussian_profile(
    sample_rate: float, noise_multiplier: float, steps: int, *, discretization: float = 1e-4
) -> DeltaProfile:
    """δ(ε) of DP-SGD from dp_accounting's privacy loss distribution accountant.

    The PLD is built with ``pessimistic_estimate=True`` (Meiser & Mohammadi 2018;
    Doroshenko et al. 2022), so every δ it returns is an upper bound on the true
    profile: safe to feed to P&S Theorem 6.
    """
    _check_dpsgd(sample_rate, noise_multiplier, steps)
    if steps == 0:
        return lambda epsilon: np.zeros_like(np.asarray(epsilon, dtype=float))
    pld = _subsampled_gaussian_pld(float(sample_rate), float(noise_multiplier), int(steps), float(discretization))

    def delta(epsilon: np.ndarray) -> np.ndarray:
        eps = np.atleast_1d(np.asarray(epsilon, dtype=float))
        order = np.argsort(eps)  # dp_accounting wants ascending ε
        values = np.empty_like(eps)
        values[order] = np.asarray(pld.get_delta_for_epsilon(eps[order]), dtype=float)
        return np.clip(values, 0.0, 1.0).reshape(np.shape(epsilon))

    return delta
