"""Privacy of base mechanisms: RDP curves and exact (ε, δ) profiles.

Pure numpy/scipy plus dp_accounting; nothing here imports Ray or torch.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
from scipy import special

from ray_dptune import validate
from ray_dptune.accounting.curves import adaptive_orders, pld_reading

logger = logging.getLogger(__name__)

SUBSAMPLED_GAUSSIAN_MAX_ORDER = 1024.0
DP_ACCOUNTING_NOISE_RANGE = (1e-150, 1e150)
"""σ where dp_accounting's RDP series runs (σ² a normal double); outside, the unsubsampled Gaussian bounds it."""
PLD_MAX_NOISE = 1e100
"""Largest σ a privacy loss distribution is built for (dp_accounting overflows near 1e154)."""
PLD_MAX_POINTS = 1e7
"""Most points of one step's privacy loss distribution, ~(1/σ² + 20/σ)/discretization (~100 s to build)."""
PLD_MAX_STEPS = 10**6
"""Most DP-SGD steps composed into one privacy loss distribution (1e5 steps already take ~10 s)."""
_MAX_EXP_ARGUMENT = 709.0  # e^709 is a finite double
UNDERFLOW = 1e-300
"""ε(α) below this may have underflowed; it is raised to 2·UNDERFLOW, above the exact value."""

DeltaProfile = Callable[[np.ndarray], np.ndarray]
"""An exact (or upper-bounding) privacy profile: ε ↦ δ(ε), vectorised."""


def _no_underflow(values: np.ndarray, cap: float = 2.0 * UNDERFLOW) -> np.ndarray:
    """Values of a positive ε(α) below UNDERFLOW raised to ``cap`` (>= the exact value); the rest as is."""
    return np.where(values < UNDERFLOW, cap, values)


def gaussian_rdp(*, noise_multiplier: float, orders: np.ndarray) -> np.ndarray:
    """α / (2σ²): Gaussian mechanism with sensitivity 1 (Mironov 2017, Prop. 7).

    Overflow gives inf; for σ ≥ 1e150, where σ² overflows, α/σ/(2σ) is used instead.
    """
    sigma = validate.finite_positive("noise_multiplier", noise_multiplier)
    with np.errstate(divide="ignore", over="ignore", under="ignore"):
        values = orders / (2.0 * sigma**2) if sigma < 1e150 else orders / sigma / (2.0 * sigma)
    return _no_underflow(values)


def zcdp_rdp(*, rho: float, orders: np.ndarray) -> np.ndarray:
    """ρα: the definition of ρ-zCDP (Bun & Steinke 2016, Def. 1.1)."""
    rho = validate.non_negative("rho", rho)
    with np.errstate(over="ignore", under="ignore"):
        values = rho * orders
    return _no_underflow(values) if rho > 0 else values


def pure_dp_rdp(*, epsilon: float, orders: np.ndarray) -> np.ndarray:
    """min(ε, αε²/2) for an ε-DP mechanism.

    D_α ≤ D_∞ ≤ ε, and ε-DP implies ε²/2-zCDP (Bun & Steinke 2016, Prop. 3.3).
    """
    epsilon = validate.non_negative("epsilon", epsilon)
    square = epsilon**2 if epsilon < 1e150 else math.inf  # then αε²/2 > ε: the minimum is ε
    with np.errstate(over="ignore", under="ignore"):
        values = np.minimum(epsilon, orders * square / 2.0)
    return _no_underflow(values, min(epsilon, 2.0 * UNDERFLOW)) if epsilon > 0 else values


def subsampled_gaussian_rdp(
    *, sample_rate: float, noise_multiplier: float, steps: int, orders: np.ndarray, adaptive: bool = False
) -> np.ndarray:
    """RDP of ``steps`` Poisson-subsampled Gaussian steps (DP-SGD), add/remove-one.

    Computed by dp_accounting's RdpAccountant (Mironov, Talwar & Zhang 2019), which
    bounds both directions of the divergence. Its series for fractional orders does
    not converge reliably far above ``SUBSAMPLED_GAUSSIAN_MAX_ORDER``; higher orders
    get ``inf`` ("no bound"), which is always valid and never the optimum for DP-SGD
    at practical δ. ``adaptive``: compute only the orders that can move a result and
    bound the others by convexity (:mod:`ray_dptune.accounting.curves.adaptive_orders`);
    else every order up to the maximum is computed.
    """
    sample_rate, noise_multiplier, steps = _check_dpsgd(sample_rate, noise_multiplier, steps)
    orders = np.asarray(orders, dtype=float)
    if steps == 0:
        return np.zeros_like(orders)
    low, high = DP_ACCOUNTING_NOISE_RANGE
    if not low <= noise_multiplier <= high:  # subsampling never costs more than the full batch
        return _composed(gaussian_rdp(noise_multiplier=noise_multiplier, orders=orders), steps)
    gaussian = gaussian_rdp(noise_multiplier=noise_multiplier, orders=orders)
    if adaptive:
        moments = adaptive_orders.subsampled_gaussian_step_moments(
            sample_rate=sample_rate,
            noise_multiplier=noise_multiplier,
            steps=steps,
            orders=orders,
            max_order=SUBSAMPLED_GAUSSIAN_MAX_ORDER,
        )
        with np.errstate(invalid="ignore"):
            epsilons = np.where(orders <= SUBSAMPLED_GAUSSIAN_MAX_ORDER, moments / (orders - 1.0), np.inf)
    else:
        epsilons = np.full(orders.shape, np.inf)
        computed = orders <= SUBSAMPLED_GAUSSIAN_MAX_ORDER
        if computed.any():
            epsilons[computed] = adaptive_orders.dp_accounting_step_rdp(
                sample_rate=sample_rate, noise_multiplier=noise_multiplier, orders=orders[computed]
            )
    # NaN or a negative RDP is rounding noise of dp_accounting's series. The full batch's Gaussian bounds every
    # order: Rényi divergence is jointly quasi-convex (van Erven & Harremos 2014), and each mixture component's
    # divergence is 0 or the Gaussian's.
    epsilons = np.where(np.isnan(epsilons) | (epsilons < 0), gaussian, np.minimum(epsilons, gaussian))
    return _composed(epsilons, steps)


def _composed(epsilons: np.ndarray, steps: int) -> np.ndarray:
    """``steps`` · ε(α), as dp_accounting composes (count · ε); overflow is inf, an underflowed ε(α) is raised."""
    factor = float(steps) if steps < 2**1000 else math.inf
    with np.errstate(over="ignore"):
        return _no_underflow(factor * _no_underflow(epsilons))


def _check_dpsgd(sample_rate: float, noise_multiplier: float, steps: int) -> tuple[float, float, int]:
    return (
        validate.probability("sample_rate", sample_rate, open_left=True),
        validate.finite_positive("noise_multiplier", noise_multiplier),
        validate.integer("steps", steps, whole_floats=True),
    )


def gaussian_profile(*, noise_multiplier: float) -> DeltaProfile:
    """Exact δ(ε) of the Gaussian mechanism with sensitivity 1.

    Balle & Wang (2018), "Improving the Gaussian Mechanism", Theorem 8:
    δ(ε) = Φ(1/(2σ) - εσ) - e^ε Φ(-1/(2σ) - εσ), computed in log space.
    """
    sigma = validate.finite_positive("noise_multiplier", noise_multiplier)

    def delta(epsilon: np.ndarray) -> np.ndarray:
        eps = validate.not_nan("epsilon", epsilon)
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            log_a = special.log_ndtr(0.5 / sigma - eps * sigma)
            log_b = eps + special.log_ndtr(-0.5 / sigma - eps * sigma)
            value = np.where(log_b < log_a, np.exp(log_a) * -np.expm1(log_b - log_a), 0.0)
        return np.clip(value, 0.0, 1.0)

    return delta


@functools.lru_cache(maxsize=32)
def _subsampled_gaussian_pld(sample_rate: float, noise_multiplier: float, steps: int, discretization: float) -> Any:
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
    *, sample_rate: float, noise_multiplier: float, steps: int, discretization: float = 1e-4
) -> DeltaProfile:
    """δ(ε) of DP-SGD from dp_accounting's privacy loss distribution accountant.

    The PLD is built with ``pessimistic_estimate=True`` (Meiser & Mohammadi 2018;
    Doroshenko et al. 2022), so every δ it returns is an upper bound on the true
    profile: safe to feed to P&S Theorem 6.

    Raises:
        ValueError: invalid arguments, σ > PLD_MAX_NOISE, or a distribution too large to build
            (one step of more than PLD_MAX_POINTS points, more than PLD_MAX_STEPS steps, or out of memory).
    """
    sample_rate, noise_multiplier, steps = _check_dpsgd(sample_rate, noise_multiplier, steps)
    if steps == 0:
        return lambda epsilon: np.zeros_like(validate.not_nan("epsilon", epsilon))
    pld = subsampled_gaussian_pld(
        sample_rate=sample_rate, noise_multiplier=noise_multiplier, steps=steps, discretization=discretization
    )

    def delta(epsilon: np.ndarray) -> np.ndarray:
        eps = np.atleast_1d(validate.not_nan("epsilon", epsilon))
        deltas: np.ndarray = np.clip(pld_reading.hockey_stick_deltas(pld, eps), 0.0, 1.0).reshape(np.shape(epsilon))
        return deltas

    return delta


def subsampled_gaussian_pld(
    *, sample_rate: float, noise_multiplier: float, steps: int, discretization: float = 1e-4
) -> Any:
    """dp_accounting's pessimistic privacy loss distribution of ``steps`` >= 1 DP-SGD steps (cached).

    Raises:
        ValueError: invalid arguments, σ > PLD_MAX_NOISE, or a distribution too large to build
            (one step of more than PLD_MAX_POINTS points, more than PLD_MAX_STEPS steps, or out of memory).
    """
    sample_rate, noise_multiplier, steps = _check_dpsgd(sample_rate, noise_multiplier, steps)
    validate.finite_positive("noise_multiplier", noise_multiplier, maximum=PLD_MAX_NOISE)
    validate.integer("steps", steps, minimum=1, maximum=PLD_MAX_STEPS)
    discretization = validate.finite_positive("discretization", discretization, maximum=1.0)
    points = (1.0 / noise_multiplier / noise_multiplier + 20.0 / noise_multiplier) / discretization
    if points > PLD_MAX_POINTS:
        raise ValueError(
            f"noise_multiplier = {noise_multiplier} with discretization = {discretization} needs ~{points:.2g} "
            f"points per step (at most {PLD_MAX_POINTS:g}): raise noise_multiplier or discretization."
        )
    return _built_pld(sample_rate, noise_multiplier, steps, discretization)


def _built_pld(sample_rate: float, noise_multiplier: float, steps: int, discretization: float) -> Any:
    """The cached PLD; running out of memory (too many steps) raises ValueError naming the arguments."""
    try:
        with np.errstate(all="ignore"):
            return _subsampled_gaussian_pld(sample_rate, noise_multiplier, steps, discretization)
    except (MemoryError, ValueError, OverflowError) as error:
        raise ValueError(
            f"dp_accounting cannot build the privacy loss distribution of steps = {steps} with sample_rate = "
            f"{sample_rate}, noise_multiplier = {noise_multiplier}, discretization = {discretization} ({error}): "
            "fewer steps or a coarser discretization."
        ) from error


PROFILE_DISCRETIZATION = 1e-3
"""PLD discretisation of the profiles derived automatically (pessimistic, so any value is valid;
1e-3 is ~10× faster to build than 1e-4 and moves δ by ~1e-4 relative)."""
_PROFILE_EPSILONS = np.concatenate([[0.0], np.geomspace(1e-3, 60.0, 160)])


@dataclass(frozen=True, kw_only=True)
class KnownMechanism:
    """What a curve's mechanism *is*, when more than its RDP is known (provenance of the curve).

    ``steps`` Poisson-subsampled Gaussian steps of rate ``sample_rate`` and noise
    ``noise_multiplier`` (sensitivity 1, add/remove-one); ``sample_rate = 1`` is the
    plain Gaussian mechanism (``steps`` of them compose to σ/√steps). Set by
    :meth:`RDPCurve.gaussian` and :meth:`RDPCurve.subsampled_gaussian`, kept by
    operations that leave the mechanism one of these, dropped by any other. The
    mechanism's exact (ε, δ) profile, and hence the set of (q, q') that one
    post-processing can give (used by P&S Lemma 7 and Theorem 6), follow from it.
    """

    noise_multiplier: float
    sample_rate: float = 1.0
    steps: int = 1

    def __post_init__(self) -> None:
        _check_dpsgd(self.sample_rate, self.noise_multiplier, self.steps)

    @property
    def is_gaussian(self) -> bool:
        """True for the plain Gaussian mechanism (``sample_rate`` 1, no subsampling)."""
        return self.sample_rate == 1.0

    def composed(self, count: int) -> KnownMechanism | None:
        """The mechanism run ``count`` times (None for count 0: nothing is known to be run)."""
        return dataclasses.replace(self, steps=self.steps * count) if count >= 1 else None

    def profile(self) -> DeltaProfile:
        """δ(ε): Balle & Wang's exact Gaussian, or dp_accounting's pessimistic PLD for DP-SGD.

        Raises:
            ValueError: the PLD is out of reach (see :func:`subsampled_gaussian_profile`).
        """
        if self.is_gaussian:
            return gaussian_profile(noise_multiplier=self.noise_multiplier / math.sqrt(self.steps))
        key = (self.sample_rate, self.noise_multiplier, self.steps)
        _profile_for(*key)  # builds (or fails) now, not at the first read
        return lambda epsilon: _cached_deltas(key, np.asarray(epsilon, dtype=float))

    def epsilon(self, *, delta: float) -> float:
        """The smallest ε (to 1e-6 relative, rounded up) with δ(ε) <= ``delta`` on :meth:`profile`.

        The profile bounds the true δ(ε) from above and is non-increasing, so the bisection's
        upper end is a valid ε; for DP-SGD, dp_accounting reads ε off the pessimistic PLD
        itself. Raises ValueError when the PLD is out of reach.
        """
        if not self.is_gaussian:
            self.profile()  # checks the arguments and builds (or refuses) the PLD
            pld = _built_pld(self.sample_rate, self.noise_multiplier, self.steps, PROFILE_DISCRETIZATION)
            with np.errstate(all="ignore"):
                return float(pld.get_epsilon_for_delta(delta)) * (1.0 + 1e-12)
        profile = self.profile()
        low, high = 0.0, 1.0
        while profile(np.array([high]))[0] > delta:
            low, high = high, 2.0 * high
            if high > _MAX_EXP_ARGUMENT:
                return math.inf
        while high - low > 1e-6 * high:
            middle = 0.5 * (low + high)
            low, high = (middle, high) if profile(np.array([middle]))[0] > delta else (low, middle)
        return high

    def partner(self, q: np.ndarray) -> np.ndarray:
        """A lower bound on min{q' : (q, q') given by one post-processing of the two output laws}.

        Gaussian: exactly Φ(Φ⁻¹(q) - √steps/σ), the Neyman–Pearson bound (Dong, Roth & Su
        2022, Gaussian DP, Def. 2.7 with Prop. 2.11's symmetry). DP-SGD: (ε, δ(ε))-DP for
        every ε of a grid gives q ≤ e^ε q' + δ and 1 - q' ≤ e^ε (1 - q) + δ (both
        directions: dp_accounting's add/remove PLD takes the larger δ); a finite grid
        keeps fewer constraints, so the result can only be lower (valid).

        Raises:
            ValueError: the PLD is out of reach.
        """
        q = np.asarray(q, dtype=float)
        if self.is_gaussian:
            shift = math.sqrt(self.steps) / self.noise_multiplier
            with np.errstate(divide="ignore", invalid="ignore"):
                exact = special.ndtr(special.ndtri(q) - shift)
            # rounding of ndtr/ndtri: towards the lower bound
            clipped: np.ndarray = np.clip(exact * (1.0 - 1e-12), 0.0, q)
            return clipped
        eps = _PROFILE_EPSILONS
        deltas = self.profile()(eps) * (1.0 + 1e-12)
        bound = np.zeros_like(q)
        for chunk in range(0, eps.size, 32):  # bounded memory: q.size × 32 at a time
            e, d = eps[chunk : chunk + 32, None], deltas[chunk : chunk + 32, None]
            first = (q[None, :] - d) * np.exp(-e)
            second = 1.0 - d - np.exp(e) * (1.0 - q[None, :])
            bound = np.maximum(bound, np.maximum(first, second).max(axis=0))
        return np.clip(bound * (1.0 - 1e-12), 0.0, q)


@functools.lru_cache(maxsize=16)
def _profile_for(sample_rate: float, noise_multiplier: float, steps: int) -> DeltaProfile:
    return subsampled_gaussian_profile(
        sample_rate=sample_rate, noise_multiplier=noise_multiplier, steps=steps, discretization=PROFILE_DISCRETIZATION
    )


_DELTA_CACHE: dict[tuple[tuple[float, float, int], tuple[int, ...], bytes], np.ndarray] = {}


def clear_profile_caches() -> None:
    """Forgets every cached privacy loss distribution and profile (memory; cold timings)."""
    _subsampled_gaussian_pld.cache_clear()
    _profile_for.cache_clear()
    _DELTA_CACHE.clear()


def _cached_deltas(mechanism: tuple[float, float, int], epsilon: np.ndarray) -> np.ndarray:
    """δ of DP-SGD's PLD profile at ``epsilon``, memoised (the bounds read the same grids again and again)."""
    key = (mechanism, epsilon.shape, epsilon.tobytes())
    if key not in _DELTA_CACHE:
        if len(_DELTA_CACHE) > 256:
            _DELTA_CACHE.clear()
        _DELTA_CACHE[key] = _profile_for(*mechanism)(epsilon)
        _DELTA_CACHE[key].flags.writeable = False
    return _DELTA_CACHE[key]
