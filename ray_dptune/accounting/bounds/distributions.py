"""Laws of the number of runs K of a private hyperparameter search.

Papernot & Steinke (2022), "Hyperparameter Tuning with Rényi Differential Privacy"
(P&S below), run the base algorithm a random number K of times and release only the
best run. The privacy bound depends on the law of K only through its probability
generating function f(x) = E[x^K] (P&S Lemma 7), and the utility through f too
(P&S Sec. 3.6, App. A.2): E[K/(K+1)] = 1 - ∫₀¹ f and P[some run succeeds] = 1 - f(1-p).

Every law here samples exactly (numpy's samplers, or inverse-CDF sampling in double
precision) and, unless a seed or a generator is given, from a generator seeded by the
operating system's secure source (:func:`secure_rng`).
"""

from __future__ import annotations

import abc
import math
import secrets
from collections.abc import Callable
from typing import Any

import numpy as np
from scipy import integrate, special

from ray_dptune import validate

__all__ = [
    "MAX_ETA",
    "MAX_MEAN",
    "MIN_GAMMA",
    "Geometric",
    "Logarithmic",
    "PointMass",
    "Poisson",
    "RunCountDistribution",
    "TruncatedNegativeBinomial",
    "distribution_from_dict",
    "secure_rng",
]

RngLike = np.random.Generator | int | None

MAX_MEAN = 1e6
"""Largest E[K] of a law: the inverse-CDF sampler then needs ~0.2 s a draw (10x more per decade)."""
MIN_GAMMA = 1e-12
"""Smallest γ: 1 - γ still carries γ to 4 digits, so f and f' stay accurate up to x = 1."""
MAX_ETA = 1e6
"""Largest η: log Γ(k + η) - log Γ(η) in the pmf keeps an absolute accuracy of ~1e-9."""
MIN_ABS_ETA = 1e-200
"""Smallest non-zero |η|: below it γ^(-η) - 1 underflows (η = 0 is the logarithmic law)."""
_EXP_LIMIT = 700.0  # e^700 ~ 1e304: above it, γ^(-η) is handled in log space


def secure_rng(seed: RngLike = None) -> np.random.Generator:
    """Returns a numpy Generator; without a seed it is seeded from ``secrets``.

    Args:
        seed: an existing Generator (returned as is), an integer seed (tests,
            reproducibility), or None for 128 bits from the OS's secure source.
    """
    if isinstance(seed, np.random.Generator):
        return seed
    if seed is None:
        seed = secrets.randbits(128)
    elif isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise ValueError(f"seed must be an int >= 0, a numpy Generator or None, got {seed!r}.")
    return np.random.default_rng(int(seed))


def _check_eta(eta: float) -> float:
    eta = validate.in_range("eta", eta, -1.0, MAX_ETA, open_left=True, note=" (P&S Definition 1)")
    if eta != 0.0 and abs(eta) < MIN_ABS_ETA:
        raise ValueError(f"eta must be 0 or at least {MIN_ABS_ETA:g} in absolute value, got {eta}.")
    return eta


def _check_mean(law: RunCountDistribution, *names: str) -> None:
    if not law.mean <= MAX_MEAN:
        raise ValueError(
            f"{law!r} has mean E[K] = {law.mean:g}, above {MAX_MEAN:g} (MAX_MEAN): it cannot be sampled in "
            f"reasonable time; choose {' or '.join(names)} for a mean in [1, {MAX_MEAN:g}]."
        )


def _on_support(k: Any, formula: Callable[[np.ndarray], np.ndarray]) -> np.ndarray:
    """``formula`` at the whole numbers k >= 0 of ``k``, 0 elsewhere (±inf included); NaN raises ValueError."""
    k = validate.not_nan("k", k)
    support = np.isfinite(k) & (k >= 0) & (k == np.floor(k))
    with np.errstate(over="ignore", invalid="ignore"):
        out = formula(np.where(support, k, 1.0))
    return np.where(support & ~np.isnan(out), out, 0.0)  # NaN only where P underflows (k ~ 1e308)


class RunCountDistribution(abc.ABC):
    """Law of the number K of runs; subclasses define the PGF and the sampler."""

    @property
    @abc.abstractmethod
    def mean(self) -> float:
        """E[K]."""

    @abc.abstractmethod
    def pmf(self, k: Any) -> np.ndarray:
        """P[K = k], vectorised over k (0 off the support, ±inf included); NaN raises ValueError."""

    @abc.abstractmethod
    def pgf(self, x: Any) -> np.ndarray:
        """f(x) = E[x^K] for x in [0, 1]; x outside [0, 1] raises ValueError."""

    @abc.abstractmethod
    def log_pgf_derivative(self, x: Any) -> np.ndarray:
        """The log of f'(x) for x in [0, 1] (-inf where f'(x) = 0); x outside [0, 1] raises ValueError."""

    @abc.abstractmethod
    def sample(self, rng: RngLike = None) -> int:
        """Draws K exactly; ``rng`` None means a fresh secure generator."""

    @abc.abstractmethod
    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready description that :func:`distribution_from_dict` reads back."""

    def pgf_derivative(self, x: Any) -> np.ndarray:
        """f'(x) = E[K x^(K-1)]."""
        derivative: np.ndarray = np.exp(self.log_pgf_derivative(x))
        return derivative

    @property
    def prob_zero(self) -> float:
        """P[K = 0]: the chance that no run happens and the output is data-free."""
        return float(self.pmf(0))

    def expected_quantile(self) -> float:
        """E[K/(K+1)] = 1 - ∫₀¹ f(x) dx (P&S App. A.2).

        The expected quantile of the released run when every run's score is an
        independent uniform quantile; K = 0 counts as quantile 0.
        """
        integral, _ = integrate.quad(lambda x: float(self.pgf(x)), 0.0, 1.0, epsabs=1e-13, epsrel=1e-12, limit=200)
        return 1.0 - float(integral)

    def success_probability(self, p: float) -> float:
        """1 - f(1 - p): the chance that at least one of the K runs succeeds.

        Args:
            p: the chance that one run succeeds (e.g. lands in the top 1% of the space).
        """
        p = validate.probability("p", p)
        return float(1.0 - self.pgf(1.0 - p))

    def __eq__(self, other: object) -> bool:
        return type(self) is type(other) and self.to_dict() == other.to_dict()

    def __hash__(self) -> int:
        return hash(tuple(sorted(self.to_dict().items())))

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in self.to_dict().items() if k != "law")
        return f"{type(self).__name__}({args})"


class Poisson(RunCountDistribution):
    """K ~ Poisson(mean); K = 0 is possible and then nothing is run (P&S Thm 6)."""

    def __init__(self, mean: float):
        self._mean = validate.finite_positive("mean", mean, maximum=MAX_MEAN)

    @property
    def mean(self) -> float:
        """E[K], the Poisson mean."""
        return self._mean

    def pmf(self, k: Any) -> np.ndarray:
        """P[K = k] = mean^k e^{-mean} / k!, vectorised over k (0 off the support)."""
        return _on_support(k, lambda ks: np.exp(special.xlogy(ks, self._mean) - self._mean - special.gammaln(ks + 1.0)))

    def pgf(self, x: Any) -> np.ndarray:
        """f(x) = e^{mean (x - 1)} for x in [0, 1]."""
        return np.exp(self._mean * (validate.unit_interval("x", x) - 1.0))

    def log_pgf_derivative(self, x: Any) -> np.ndarray:
        """The log of f'(x) = mean e^{mean (x - 1)}: log(mean) + mean (x - 1)."""
        return math.log(self._mean) + self._mean * (validate.unit_interval("x", x) - 1.0)

    def expected_quantile(self) -> float:
        """E[K/(K+1)] in closed form: 1 - (1 - e^{-mean}) / mean."""
        return 1.0 - float(-np.expm1(-self._mean) / self._mean)

    def sample(self, rng: RngLike = None) -> int:
        """Draws K with numpy's Poisson sampler; ``rng`` None means a fresh secure generator."""
        return int(secure_rng(rng).poisson(self._mean))

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready description: the law's name and its mean."""
        return {"law": "poisson", "mean": self._mean}


class TruncatedNegativeBinomial(RunCountDistribution):
    """P&S Definition 1: P[K=k] ∝ (1-γ)^k Π_{l<k} (l+η)/(l+1) on k = 1, 2, ...

    Defined for every η ∈ (-1, ∞) and γ ∈ (0, 1); η = 0 is the logarithmic law and
    η = 1 the geometric law. P[K = 0] = 0. Laws that floating point cannot evaluate or
    sample are refused: η ≤ MAX_ETA, |η| ≥ MIN_ABS_ETA unless η = 0, γ ≥ MIN_GAMMA, E[K] ≤ MAX_MEAN.
    """

    _CHUNK = 256  # pmf values computed at once by the inverse-CDF sampler

    def __init__(self, eta: float, gamma: float):
        eta = _check_eta(eta)
        gamma = validate.in_range("gamma", gamma, MIN_GAMMA, 1.0, open_right=True)
        self._eta = eta
        self._gamma = gamma
        _check_mean(self, "eta", "gamma")

    @property
    def eta(self) -> float:
        """The shape η."""
        return self._eta

    @property
    def gamma(self) -> float:
        """The parameter γ: the pmf decays like (1-γ)^k."""
        return self._gamma

    @staticmethod
    def _mean_of(eta: float, gamma: float) -> float:
        log_gamma = math.log(gamma)
        if eta == 0.0:
            return (1.0 / gamma - 1.0) / -log_gamma
        # η(1-γ) / (γ (1-γ^η)), with 1-γ^η = -expm1(η log γ) for accuracy near η = 0.
        return eta * (1.0 - gamma) / (gamma * -math.expm1(eta * log_gamma))

    @property
    def mean(self) -> float:
        """E[K] = η(1-γ) / (γ(1-γ^η)), or (1/γ - 1) / log(1/γ) for η = 0."""
        return self._mean_of(self._eta, self._gamma)

    @classmethod
    def from_mean(cls, eta: float, mean: float) -> TruncatedNegativeBinomial:
        """The law with shape η whose mean is the largest not above ``mean``.

        E[K] decreases in γ, so γ is found by bisection and rounded up: the
        returned law never runs more trials on average than asked for, and every
        bound uses the exact mean of the returned law.
        """
        eta = _check_eta(eta)
        mean = validate.number("mean", mean)
        if not 1.0 < mean <= MAX_MEAN:
            raise ValueError(
                f"A truncated negative binomial has mean > 1 (K >= 1 always): mean must be > 1 and <= "
                f"{MAX_MEAN:g}, got {mean}; use PointMass(1) for a single run."
            )
        if cls._mean_of(eta, MIN_GAMMA) <= mean:
            raise ValueError(
                f"No truncated negative binomial with eta = {eta} and gamma >= {MIN_GAMMA:g} has mean {mean}: "
                "near eta = -1 the mean grows only like gamma^-(1+eta); raise eta or lower mean."
            )
        lo, hi = 0.0, 1.0  # mean(lo) > target >= mean(hi) is kept invariant
        for _ in range(2000):
            mid = 0.5 * (lo + hi)
            if mid <= lo or mid >= hi:
                break
            if mid < MIN_GAMMA or cls._mean_of(eta, mid) > mean:  # mean(mid) > mean(MIN_GAMMA) > target there
                lo = mid
            else:
                hi = mid
        law = cls.__new__(cls)
        TruncatedNegativeBinomial.__init__(law, eta, hi)
        return law

    def _log_norm(self) -> float:
        """The log of the pmf's normaliser: log |γ^{-η} - 1| (or log log(1/γ) for η = 0)."""
        log_gamma = math.log(self._gamma)
        if self._eta == 0.0:
            return math.log(-log_gamma)
        b = -self._eta * log_gamma  # log γ^{-η}
        if b > _EXP_LIMIT:  # γ^{-η} overflows: log(e^b - 1) = b + log(1 - e^{-b})
            return b + math.log1p(-math.exp(-b))
        return math.log(abs(math.expm1(b)))

    def pmf(self, k: Any) -> np.ndarray:
        """P[K = k] of Definition 1, vectorised over k (0 off the support k ≥ 1)."""
        return _on_support(k, self._pmf_at)

    def _pmf_at(self, k: np.ndarray) -> np.ndarray:
        valid = k >= 1
        ks = np.where(valid, k, 1.0)
        log_terms = ks * math.log1p(-self._gamma) - self._log_norm()
        if self._eta == 0.0:
            log_terms = log_terms - np.log(ks)
        else:
            # |Π_{l<k} (l+η)/(l+1)| = |Γ(k+η) / (Γ(η) Γ(k+1))|; its sign matches γ^{-η}-1.
            log_terms = (
                log_terms + special.gammaln(ks + self._eta) - special.gammaln(ks + 1.0) - special.gammaln(self._eta)
            )
        return np.where(valid, np.exp(log_terms), 0.0)

    def pgf(self, x: Any) -> np.ndarray:
        """f(x) = ((1-(1-γ)x)^{-η} - 1) / (γ^{-η} - 1), or log(1-(1-γ)x) / log γ for η = 0."""
        log1m = np.log1p(-(1.0 - self._gamma) * validate.unit_interval("x", x))
        if self._eta == 0.0:
            return log1m / math.log(self._gamma)
        a, b = -self._eta * log1m, -self._eta * math.log(self._gamma)  # 0 <= a <= b when η > 0
        if b > _EXP_LIMIT:  # (e^a - 1)/(e^b - 1) = e^{a-b} (1 - e^{-a})/(1 - e^{-b}), which cannot overflow
            return np.exp(a - b) * np.expm1(-a) / math.expm1(-b)
        return np.expm1(a) / math.expm1(b)

    def log_pgf_derivative(self, x: Any) -> np.ndarray:
        """The log of f'(x) = (1-(1-γ)x)^{-η-1} γ^{η+1} E[K]."""
        # f'(x) = (1-(1-γ)x)^{-η-1} γ^{η+1} E[K]   (proof of P&S Thm 2)
        log1m = np.log1p(-(1.0 - self._gamma) * validate.unit_interval("x", x))
        return -(self._eta + 1.0) * (log1m - math.log(self._gamma)) + math.log(self.mean)

    def sample(self, rng: RngLike = None) -> int:
        """Inverse-CDF sampling: exact up to double-precision rounding of the CDF."""
        u = secure_rng(rng).random()
        start, cumulative = 1, 0.0
        while True:
            probs = self.pmf(np.arange(start, start + self._CHUNK))
            cdf = cumulative + np.cumsum(probs)
            index = int(np.searchsorted(cdf, u, side="right"))
            if index < self._CHUNK:
                return start + index
            if 0.0 < cumulative >= cdf[-1]:  # the tail underflowed: u is within rounding of 1
                return start + self._CHUNK - 1
            cumulative = float(cdf[-1])
            start += self._CHUNK

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready description: the law's name, η and γ."""
        return {"law": "truncated_negative_binomial", "eta": self._eta, "gamma": self._gamma}


class Logarithmic(TruncatedNegativeBinomial):
    """The logarithmic law, η = 0: P[K=k] = (1-γ)^k / (k log(1/γ))."""

    def __init__(self, gamma: float):
        super().__init__(0.0, gamma)

    @classmethod
    def from_mean(cls, mean: float) -> Logarithmic:  # type: ignore[override]
        """The logarithmic law whose mean is the largest not above ``mean``."""
        return super().from_mean(0.0, mean)  # type: ignore[return-value]

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready description: the law's name and γ."""
        return {"law": "logarithmic", "gamma": self._gamma}


class Geometric(TruncatedNegativeBinomial):
    """The geometric law on {1, 2, ...}, η = 1: P[K=k] = γ(1-γ)^(k-1), E[K] = 1/γ."""

    def __init__(self, gamma: float):
        super().__init__(1.0, gamma)

    @classmethod
    def from_mean(cls, mean: float) -> Geometric:  # type: ignore[override]
        """The geometric law with γ = 1/mean (exact up to rounding γ up)."""
        return super().from_mean(1.0, mean)  # type: ignore[return-value]

    def sample(self, rng: RngLike = None) -> int:
        """Draws K with numpy's geometric sampler; ``rng`` None means a fresh secure generator."""
        return int(secure_rng(rng).geometric(self._gamma))

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready description: the law's name and γ."""
        return {"law": "geometric", "gamma": self._gamma}


class PointMass(RunCountDistribution):
    """K = k always: plain repetition, accounted by composition (for comparison)."""

    def __init__(self, k: int):
        self._k = validate.integer("k", k, minimum=1, maximum=int(MAX_MEAN))

    @property
    def k(self) -> int:
        """The number of runs."""
        return self._k

    @property
    def mean(self) -> float:
        """E[K] = k."""
        return float(self._k)

    def pmf(self, k: Any) -> np.ndarray:
        """P[K = k]: 1 at the law's own k, 0 elsewhere, vectorised over ``k``; NaN raises ValueError."""
        return np.where(validate.not_nan("k", k) == self._k, 1.0, 0.0)

    def pgf(self, x: Any) -> np.ndarray:
        """f(x) = x^k for x in [0, 1]."""
        return validate.unit_interval("x", x) ** self._k

    def log_pgf_derivative(self, x: Any) -> np.ndarray:
        """The log of f'(x) = k x^(k-1) (-inf at x = 0 for k > 1)."""
        with np.errstate(divide="ignore"):
            log_derivative: np.ndarray = math.log(self._k) + special.xlogy(self._k - 1, validate.unit_interval("x", x))
            return log_derivative

    def expected_quantile(self) -> float:
        """E[K/(K+1)] = k/(k+1)."""
        return self._k / (self._k + 1.0)

    def sample(self, rng: RngLike = None) -> int:
        """Returns k; nothing is drawn."""
        return self._k

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready description: the law's name and k."""
        return {"law": "point_mass", "k": self._k}


def distribution_from_dict(spec: dict[str, Any]) -> RunCountDistribution:
    """Rebuilds a law from :meth:`RunCountDistribution.to_dict` output; a malformed spec raises ValueError."""
    law = spec.get("law") if isinstance(spec, dict) else None
    try:
        if law == "poisson":
            return Poisson(spec["mean"])
        if law == "truncated_negative_binomial":
            return TruncatedNegativeBinomial(spec["eta"], spec["gamma"])
        if law == "logarithmic":
            return Logarithmic(spec["gamma"])
        if law == "geometric":
            return Geometric(spec["gamma"])
        if law == "point_mass":
            return PointMass(spec["k"])
    except KeyError as error:
        raise ValueError(f"The spec of a {law} law needs the key {error}, got {spec!r}.") from error
    raise ValueError(
        f"Unknown law {law!r}; expected one of poisson, truncated_negative_binomial, "
        "logarithmic, geometric, point_mass."
    )
