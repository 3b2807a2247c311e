"""DP-BO's settings (Kusner et al. 2015) as one validated, frozen record, and the constants of its release.

:class:`DPBOSettings` checks every argument of :class:`~ray_dptune.search.dpbo.DPBOSearcher`
before any data is seen; :meth:`DPBOSettings.guarantee` states the release's (ε, δ) and
its assumption, and :func:`release_constants` computes the sensitivities and noise
scales over a candidate set Λ (:mod:`ray_dptune.accounting.bounds.dpbo_bounds`).
"""

from __future__ import annotations

import math
import numbers
from dataclasses import asdict, dataclass
from typing import Any, Literal

import numpy as np

from ray_dptune import validate
from ray_dptune.accounting.bounds import dpbo_bounds as vr
from ray_dptune.accounting.bounds.information_gain import KernelName, max_information_gain_bound_from_points
from ray_dptune.accounting.bounds.rounding import round_up
from ray_dptune.errors import UnsupportedBoundError

__all__ = ["DEFAULT_LENGTHSCALE", "DEFAULT_NOISE_VARIANCE", "EXPLORATION_DELTA", "DPBOSettings", "release_constants"]

DEFAULT_LENGTHSCALE = 0.2  # on the unit cube of the candidates' coordinates
DEFAULT_NOISE_VARIANCE = 0.01  # σ² in GP units (prior variance 1)
EXPLORATION_DELTA = 0.1  # δ of β_t when it does not enter the privacy proof (Algorithm 3)
_FIXED = (
    "{name} must be a fixed positive number chosen before seeing any data, got {value!r}: fitting kernel "
    "hyperparameters to validation scores makes the surrogate depend on the private data outside Kusner et al.'s proof."
)


@dataclass(frozen=True, kw_only=True)
class DPBOSettings:
    """Everything DP-BO's release depends on, fixed before any data (see DPBOSearcher's Args).

    Settings that do not apply to ``algorithm`` are None (k1 for algorithm 3; L, g*, m
    and ``reg_key`` for algorithm 1); δ is 0 for algorithm 3.

    Raises:
        ValueError: a setting out of its range (the message names it and the range).
        UnsupportedBoundError: algorithm 2, or algorithm 3 releasing a configuration.
    """

    epsilon: float
    delta: float | None = None
    algorithm: Literal[1, 2, 3] = 1
    release: vr.Release = "both"
    k1: float | None = vr.DEFAULT_K1
    kernel: KernelName = "matern52"
    lengthscale: float = DEFAULT_LENGTHSCALE
    noise_variance: float = DEFAULT_NOISE_VARIANCE
    prior_mean: float = 0.0
    prior_std: float = 1.0
    num_candidates: int = 64
    lipschitz: float | None = None
    g_star: float | None = None
    validation_size: int | None = None
    reg_key: str | None = None

    def __post_init__(self) -> None:
        if self.algorithm == 2:
            vr.algorithm2_laplace_scale()
        if self.algorithm not in (1, 3) or isinstance(self.algorithm, bool):
            raise ValueError(f"algorithm must be 1 or 3 (Kusner et al. 2015; 2 is refused), got {self.algorithm!r}.")
        if self.release not in ("both", "config", "score"):
            raise ValueError(f"release must be 'both', 'config' (λ̃) or 'score' (ṽ), got {self.release!r}.")
        if self.kernel not in ("rbf", "matern52"):
            raise ValueError(
                f"kernel must be 'rbf' or 'matern52' (known γ_T bounds, Srinivas 2010), got {self.kernel!r}."
            )
        n = self.num_candidates
        if isinstance(n, bool) or not isinstance(n, numbers.Integral) or n < 1:
            raise ValueError(f"num_candidates must be an int >= 1, got {n!r}.")
        if not (isinstance(self.prior_mean, numbers.Real) and math.isfinite(self.prior_mean)):
            raise ValueError(f"prior_mean must be a fixed finite number, got {self.prior_mean!r}.")
        values: dict[str, Any] = {
            "algorithm": int(self.algorithm),
            "epsilon": validate.fixed_positive("epsilon", self.epsilon),
            "lengthscale": _fixed("lengthscale", self.lengthscale),
            "noise_variance": _fixed("noise_variance", self.noise_variance),
            "prior_mean": float(self.prior_mean),
            "prior_std": _fixed("prior_std", self.prior_std),
            "num_candidates": int(n),
        }
        if self.algorithm == 1:
            if self.delta is None or not 0.0 < float(self.delta) < 1.0:
                raise ValueError(f"delta must lie strictly between 0 and 1 for algorithm 1, got {self.delta!r}.")
            values.update(delta=float(self.delta), k1=vr.check_k1(self.k1), lipschitz=None, g_star=None)
            values.update(validation_size=None, reg_key=None)
        else:
            if self.delta not in (None, 0, 0.0):
                raise ValueError(f"algorithm 3 is ε-DP (δ = 0): pass delta=None, got {self.delta!r}.")
            if self.release != "score":
                raise UnsupportedBoundError(
                    "Algorithm 3 (Kusner et al. Theorem 7) releases only the best validation score: use release='score'."
                )
            if not isinstance(self.reg_key, str) or not self.reg_key:
                raise ValueError("algorithm 3 needs reg_key, the config key of the L2 weight λ of Kusner eq. (10).")
            values.update(
                delta=0.0,
                k1=None,
                lipschitz=validate.fixed_positive("lipschitz (L)", self.lipschitz),
                g_star=validate.fixed_positive("g_star (g*)", self.g_star),
                validation_size=validate.count("validation_size (m)", self.validation_size),
            )
        for name, value in values.items():
            object.__setattr__(self, name, value)

    def to_dict(self) -> dict[str, Any]:
        """The settings that apply (None ones left out), for the privacy report."""
        return {key: value for key, value in asdict(self).items() if value is not None}

    @property
    def parts(self) -> list[str]:
        """What is released: ``["config", "score"]``, ``["config"]`` or ``["score"]``."""
        return ["config", "score"] if self.release == "both" else [self.release]

    @property
    def delta_beta(self) -> float:
        """δ of GP-UCB's β_t: the δ it takes in the privacy proof, else ``EXPLORATION_DELTA``."""
        if self.algorithm == 3:
            return EXPLORATION_DELTA
        assert self.delta is not None  # __post_init__ sets it for algorithm 1
        return self.delta if self.release == "config" else self.delta / 2.0

    def guarantee(self) -> dict[str, Any]:
        """(ε, δ) of the release, with its assumption, known before the search starts."""
        k = len(self.parts)
        assert self.delta is not None  # __post_init__ sets it (0 for algorithm 3)
        if self.algorithm == 1:
            assumption = (
                "Kusner et al. 2015 Assumption 1: all validation-set functions are jointly GP(0, k1 ⊗ k2) with "
                f"k1(V, V') >= k1 = {self.k1} for neighbouring V, V' and k2 = {self.kernel} (lengthscale "
                f"{self.lengthscale} on the unit-cube coordinates); each observed (metric - {self.prior_mean}) / "
                f"{self.prior_std} is that GP's value plus independent N(0, {self.noise_variance}) noise"
            )
            theorems = "λ̃: Theorem 1 / Corollary 1; ṽ: Theorem 3 / Corollary 2 with the union bound redone"
        else:
            assumption = (
                "Kusner et al. 2015 Assumption 2: the metric is -(1/m) Σ g(w_λ, x̄_i, ȳ_i) with mode='max', or "
                f"(1/m) Σ g with mode='min', over the m = {self.validation_size} validation records; 0 <= g <= g* = "
                f"{self.g_star}, "
                f"g L = {self.lipschitz}-Lipschitz in w; w_λ is the exact minimiser of (λ/2)||w||² + (1/n) Σ ℓ with ℓ "
                f"convex and 1-Lipschitz in w, λ = config[{self.reg_key!r}]; no other hyperparameter varies"
            )
            theorems = "Theorem 7 and the finite-Λ bound after it (min{g*/m, L/(mλ_min)} taken as g*/m); Corollary 4"
        return {
            "epsilon": k * self.epsilon,
            "delta": k * self.delta,
            "epsilon_per_release": self.epsilon,
            "delta_per_release": self.delta,
            "released": self.parts,
            "composition": "basic composition of the released parts (Kusner et al., after Theorem 4)",
            "algorithm": self.algorithm,
            "assumption": assumption,
            "theorems": theorems,
            "protects": "validation set",
        }


def release_constants(
    settings: DPBOSettings, configs: list[dict[str, Any]], features: np.ndarray, num_trials: int
) -> dict[str, Any]:
    """Sensitivities and noise scales of the release over Λ = ``configs`` (GP and metric units)."""
    s, n, t = settings, len(configs), num_trials
    if s.algorithm == 1:
        assert s.delta is not None and s.k1 is not None  # __post_init__ sets them for algorithm 1
        gamma = max_information_gain_bound_from_points(
            features, t, s.noise_variance, kernel=s.kernel, lengthscale=s.lengthscale
        )
        bounds = vr.algorithm1_bounds(
            n_candidates=n,
            num_trials=t,
            epsilon=s.epsilon,
            delta=s.delta,
            k1=s.k1,
            noise_variance=s.noise_variance,
            gamma_bound=gamma,
            release=s.release,
        ).to_dict()
        bounds["laplace_scale_metric_units"] = round_up(bounds["laplace_scale"] * s.prior_std)
        bounds["em_sensitivity_metric_units"] = round_up(bounds["em_sensitivity"] * s.prior_std)
        return bounds
    assert s.reg_key is not None and s.lipschitz is not None  # __post_init__ sets them for algorithm 3
    assert s.g_star is not None and s.validation_size is not None
    lam = [float(c[s.reg_key]) for c in configs]
    bounds = {
        "lambda_min": min(lam),
        "lambda_max": max(lam),
        "sensitivity": vr.algorithm3_sensitivity(
            lipschitz=s.lipschitz,
            g_star=s.g_star,
            validation_size=s.validation_size,
            lambda_min=min(lam),
            lambda_max=max(lam),
        ),
    }
    bounds["laplace_scale"] = bounds["laplace_scale_metric_units"] = round_up(bounds["sensitivity"] / s.epsilon)
    return bounds


def _fixed(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not (math.isfinite(value) and value > 0):  # type: ignore[operator]  # numbers.Real's stub lacks __gt__
        raise ValueError(_FIXED.format(name=name, value=value))
    return float(value)
