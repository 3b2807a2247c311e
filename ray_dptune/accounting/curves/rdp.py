"""RDPCurve: a Rényi DP guarantee as ε(α) on a grid of orders, and its (ε, δ) view."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ray_dptune import validate
from ray_dptune.accounting.curves import profiles

__all__ = ["DEFAULT_ORDERS", "RDPCurve"]


def _default_orders() -> np.ndarray:
    """α - 1 log-spaced from 1e-3 to 1e5, 40 orders per decade.

    Consecutive values of α - 1 differ by a factor 10^(1/40) ≈ 1.059. For a ρ-zCDP
    curve, ε(α) ≈ ρ(α-1) + log(1/δ)/(α-1) near its optimum, so the worst grid point
    is off the continuous optimum by a factor (√s + 1/√s)/2 ≤ 1.0002 with s = 1.059
    (tested in tests/accounting/test_rdp.py over ρ ∈ [1e-5, 100], δ ∈ [1e-12, 1e-2]).
    """
    return 1.0 + np.logspace(-3.0, 5.0, 8 * 40 + 1)


DEFAULT_ORDERS: np.ndarray = _default_orders()
DEFAULT_ORDERS.flags.writeable = False

# Each (ε, δ) conversion is inflated by this relative margin, so that floating-point
# rounding in the many terms of a bound can never make a reported ε smaller than the
# exact value of the bound.
_ROUNDING_MARGIN = 1e-12


def _readonly(array: np.ndarray) -> np.ndarray:
    array = np.array(array, dtype=float)  # always a private copy
    array.flags.writeable = False
    return array


@dataclass(frozen=True, eq=False)
class RDPCurve:
    """An (α, ε(α))-RDP guarantee for every order α on a grid (Mironov 2017).

    Immutable. Composition is ``+`` (Mironov 2017, Prop. 1) and ``k * curve`` for
    an integer k. Orders must be finite, > 1 and strictly increasing; ε(α) must be
    >= 0 (``inf`` means "no bound at this order").

    Example:
        >>> curve = RDPCurve.gaussian(noise_multiplier=5 ** 0.5)   # 0.1-zCDP
        >>> round((10 * curve).epsilon(delta=1e-6), 2)
        7.77
    """

    orders: np.ndarray
    epsilons: np.ndarray
    mechanism: profiles.KnownMechanism | None = field(default=None, kw_only=True)
    """What the curve's mechanism is when more than its RDP is known (a Gaussian, DP-SGD),
    or None. Set only by the constructors below; bounds read the mechanism's exact (ε, δ)
    profile from it (P&S Lemma 7 and Theorem 6). Not compared, not serialised."""

    def __post_init__(self) -> None:
        orders = np.asarray(self.orders, dtype=float)
        epsilons = np.asarray(self.epsilons, dtype=float)
        if orders.ndim != 1 or epsilons.shape != orders.shape or orders.size == 0:
            raise ValueError(
                f"orders and epsilons must be non-empty 1-D arrays of equal length, got shapes "
                f"{orders.shape} and {epsilons.shape}."
            )
        if not np.all(np.isfinite(orders)) or np.any(orders <= 1.0):
            raise ValueError("RDP orders must be finite and > 1; use orders such as 1 + np.logspace(-3, 5, 200).")
        if np.any(np.diff(orders) <= 0):
            raise ValueError("RDP orders must be strictly increasing; sort them and drop duplicates.")
        if np.any(np.isnan(epsilons)) or np.any(epsilons < 0):
            raise ValueError("RDP epsilons must be >= 0 and not NaN (use inf where no bound holds).")
        object.__setattr__(self, "orders", _readonly(orders))
        object.__setattr__(self, "epsilons", _readonly(epsilons))
        if self.mechanism is not None and not isinstance(self.mechanism, profiles.KnownMechanism):
            raise TypeError(f"mechanism must be a KnownMechanism or None, got {type(self.mechanism).__name__}.")

    # ------------------------------------------------------------------ constructors
    @classmethod
    def gaussian(cls, *, noise_multiplier: float, orders: np.ndarray | None = None) -> RDPCurve:
        """Gaussian mechanism, sensitivity 1: ε(α) = α/(2σ²)."""
        orders = _orders_or_default(orders)
        return cls(
            orders,
            profiles.gaussian_rdp(noise_multiplier=noise_multiplier, orders=orders),
            mechanism=profiles.KnownMechanism(noise_multiplier=noise_multiplier),
        )

    @classmethod
    def zcdp(cls, *, rho: float, orders: np.ndarray | None = None) -> RDPCurve:
        """ρ-zCDP: ε(α) = ρα."""
        orders = _orders_or_default(orders)
        return cls(orders, profiles.zcdp_rdp(rho=rho, orders=orders))

    @classmethod
    def pure(cls, *, epsilon: float, orders: np.ndarray | None = None) -> RDPCurve:
        """ε-DP: ε(α) = min(ε, αε²/2)."""
        orders = _orders_or_default(orders)
        return cls(orders, profiles.pure_dp_rdp(epsilon=epsilon, orders=orders))

    @classmethod
    def subsampled_gaussian(
        cls, *, sample_rate: float, noise_multiplier: float, steps: int, orders: np.ndarray | None = None
    ) -> RDPCurve:
        """DP-SGD: ``steps`` Poisson-subsampled Gaussian steps (via dp_accounting).

        On the default orders, only the orders that can move a result are computed and
        the rest are bounded by convexity (:mod:`ray_dptune.accounting.curves.adaptive_orders`);
        given ``orders`` are each computed.
        """
        adaptive = orders is None
        orders = _orders_or_default(orders)
        return cls(
            orders,
            profiles.subsampled_gaussian_rdp(
                sample_rate=sample_rate,
                noise_multiplier=noise_multiplier,
                steps=steps,
                orders=orders,
                adaptive=adaptive,
            ),
            mechanism=profiles.KnownMechanism(sample_rate=sample_rate, noise_multiplier=noise_multiplier, steps=steps)
            if steps >= 1
            else None,
        )

    @classmethod
    def zero(cls, orders: np.ndarray | None = None) -> RDPCurve:
        """The curve of a mechanism that does not touch the data."""
        orders = _orders_or_default(orders)
        return cls(orders, np.zeros_like(orders))

    # ------------------------------------------------------------------ algebra
    def at(self, orders: np.ndarray) -> np.ndarray:
        """ε at arbitrary orders, conservatively: the value at the next grid order up.

        Valid because D_α is non-decreasing in α (van Erven & Harremos 2014, Thm 3);
        orders above the grid get ``inf``.
        """
        orders = np.asarray(orders, dtype=float)
        index = np.searchsorted(self.orders, orders, side="left")
        padded = np.append(self.epsilons, np.inf)
        return padded[index]

    def resample(self, orders: np.ndarray) -> RDPCurve:
        """This curve on another grid, conservatively (see :meth:`at`); the same mechanism."""
        return RDPCurve(orders, self.at(orders), mechanism=self.mechanism)

    def __add__(self, other: RDPCurve) -> RDPCurve:
        """Composition: the RDP of running both mechanisms (Mironov 2017, Prop. 1)."""
        if not isinstance(other, RDPCurve):
            return NotImplemented
        with np.errstate(over="ignore"):  # a sum above 1.8e308 is inf: conservative
            if np.array_equal(self.orders, other.orders):
                return RDPCurve(self.orders, self.epsilons + other.epsilons)
            top = min(self.orders[-1], other.orders[-1])
            grid = np.union1d(self.orders, other.orders)
            grid = grid[grid <= top]
            return RDPCurve(grid, self.at(grid) + other.at(grid))

    def __mul__(self, count: int) -> RDPCurve:
        """``count``-fold composition."""
        if isinstance(count, bool) or not isinstance(count, (int, np.integer)):
            return NotImplemented
        count = validate.integer("count", count)  # the number of compositions
        # 0 * inf is nan, but composing a mechanism zero times costs nothing.
        if count == 0:
            return RDPCurve(self.orders, np.zeros_like(self.epsilons))
        factor = float(count) if count < 2**1000 else math.inf  # float(10**400) would raise
        mechanism = self.mechanism.composed(count) if self.mechanism is not None and count < 2**62 else None
        with np.errstate(over="ignore", invalid="ignore"):  # overflow is inf (conservative); inf * 0 is 0
            epsilons = np.where(self.epsilons == 0.0, 0.0, factor * self.epsilons)
        return RDPCurve(self.orders, epsilons, mechanism=mechanism)

    __rmul__ = __mul__

    def smoothed(self) -> RDPCurve:
        """The tightest curve implied by monotonicity in α: ε̃(α) = min_{α' ≥ α} ε(α')."""
        return RDPCurve(self.orders, np.minimum.accumulate(self.epsilons[::-1])[::-1], mechanism=self.mechanism)

    def minimum(self, other: RDPCurve) -> RDPCurve:
        """Pointwise minimum of two valid bounds on the same mechanism."""
        grid = self.orders if np.array_equal(self.orders, other.orders) else np.union1d(self.orders, other.orders)
        return RDPCurve(grid, np.minimum(self.at(grid), other.at(grid)))

    def dominates(self, other: RDPCurve) -> bool:
        """True when this curve bounds ``other`` at every one of its own orders.

        ``other`` is read at this curve's orders conservatively (:meth:`at`: the next
        order up, ``inf`` above its grid), so a True answer proves ε_other(α) ≤ ε_self(α)
        wherever this curve is used; grids that do not nest can only make it False.
        """
        return bool(np.all(other.at(self.orders) <= self.epsilons))

    # ------------------------------------------------------------------ (ε, δ)
    def epsilon(self, *, delta: float) -> float:
        """Smallest ε with (ε, δ)-DP implied by the curve.

        Canonne, Kamath & Steinke (2020), arXiv:2004.00010v4, Proposition 12:
        ε = ε(α) + log((α-1)/α) - (log δ + log α)/(α-1), minimised over the grid;
        ε = 0 where δ ≥ √(1 - e^{-ε(α)}), since KL ≤ D_α and TV ≤ √(1 - e^{-KL})
        (Bretagnolle–Huber).
        """
        return self.epsilon_and_order(delta=delta)[0]

    def epsilon_and_order(self, *, delta: float) -> tuple[float, float]:
        """(ε, the order attaining it) for :meth:`epsilon`."""
        delta = _check_delta(delta)
        alpha, r = self.orders, self.epsilons
        with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
            eps = r + np.log(alpha - 1.0) - np.log(alpha) - (math.log(delta) + np.log(alpha)) / (alpha - 1.0)
            eps = np.where(delta**2 + np.expm1(-r) > 0, 0.0, eps)
        eps = np.where(np.isnan(eps), np.inf, eps)
        best = int(np.argmin(eps))
        value = max(0.0, float(eps[best]))
        return value * (1.0 + _ROUNDING_MARGIN), float(alpha[best])

    def delta(self, *, epsilon: float) -> float:
        """Smallest δ with (ε, δ)-DP implied by the curve (the inverse of :meth:`epsilon`).

        CKS 2020, Prop. 12: δ = exp((α-1)(ε(α) - ε)) (1 - 1/α)^(α-1) / α, and the
        Bretagnolle–Huber bound √(1 - e^{-ε(α)}); the minimum over the grid, capped at 1.
        """
        epsilon = validate.number("epsilon", epsilon)
        if not epsilon >= 0:
            raise ValueError(f"epsilon must be >= 0 (inf allowed), got {epsilon}.")
        return float(np.min(self._deltas(np.array([epsilon]))))

    def _deltas(self, epsilons: np.ndarray) -> np.ndarray:
        """δ(ε) for several ε at once: shape (len(epsilons),) after min over orders."""
        alpha, r = self.orders[None, :], self.epsilons[None, :]
        eps = np.asarray(epsilons, dtype=float)[:, None]
        with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
            log_delta = (alpha - 1.0) * (r - eps + np.log(alpha - 1.0) - np.log(alpha)) - np.log(alpha)
            log_kl = 0.5 * np.log(-np.expm1(-r))
            log_delta = np.where(np.isnan(log_delta), np.inf, log_delta)
            best = np.minimum(log_delta.min(axis=1), np.min(log_kl, axis=1))
            deltas: np.ndarray = np.minimum(np.exp(best) * (1.0 + _ROUNDING_MARGIN), 1.0)
            return deltas

    # ------------------------------------------------------------------ records
    def to_dict(self) -> dict[str, Any]:
        """JSON-ready ``{"orders": [...], "epsilons": [...]}`` (inf as the string "inf")."""
        return {
            "orders": self.orders.tolist(),
            "epsilons": [e if math.isfinite(e) else "inf" for e in self.epsilons.tolist()],
        }

    @classmethod
    def from_dict(cls, record: dict[str, Any]) -> RDPCurve:
        """Reads back :meth:`to_dict`; malformed records raise ValueError."""
        try:
            orders = np.asarray(record["orders"], dtype=float)
            epsilons = np.asarray([float(e) for e in record["epsilons"]], dtype=float)
        except (KeyError, TypeError, ValueError) as error:
            raise ValueError(f"Not an RDP curve record (need 'orders' and 'epsilons' lists): {error}") from error
        return cls(orders, epsilons)

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, RDPCurve)
            and np.array_equal(self.orders, other.orders)
            and np.array_equal(self.epsilons, other.epsilons)
        )

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return (
            f"RDPCurve({self.orders.size} orders in [{self.orders[0]:.4g}, {self.orders[-1]:.4g}], "
            f"ε(α) in [{self.epsilons.min():.4g}, {self.epsilons.max():.4g}])"
        )


def _orders_or_default(orders: np.ndarray | None) -> np.ndarray:
    return DEFAULT_ORDERS if orders is None else np.asarray(orders, dtype=float)


def _check_delta(delta: float) -> float:
    return validate.probability("delta", delta, open_left=True, open_right=True)
