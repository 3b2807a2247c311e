"""Planning a private hyperparameter search before running it (``ray-dptune plan``).

The (ε, δ) of a whole search — draw K from a law, run the base mechanism K times,
release only the best run (Papernot & Steinke 2022, Thms 2 and 6, via
:func:`~ray_dptune.accounting.repeat_and_select`) — beside plain composition of
ceil(E[K]) runs (Mironov 2017, Prop. 1), with the utility side of each law: the
expected quantile of the released run and the chance that some run succeeds.

numpy and the accounting only: no Ray, no torch.

Example:
    >>> base = BaseMechanism.zcdp(rho=0.1)
    >>> row, = plan_rows(base, [LawSpec.parse("poisson")], [10.0], delta=1e-6, success_p=0.01)
    >>> row["epsilon"] < row["epsilon_composition"]
    True
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from ray_dptune.accounting import RDPCurve, gaussian_profile, repeat_and_select, subsampled_gaussian_profile
from ray_dptune.accounting.mechanisms import DeltaProfile
from ray_dptune.distributions import (
    Geometric,
    Logarithmic,
    PointMass,
    Poisson,
    RunCountDistribution,
    TruncatedNegativeBinomial,
)

__all__ = ["DEFAULT_LAWS", "BaseMechanism", "LawSpec", "epsilon_curves", "plan_rows", "unique_laws"]

DEFAULT_LAWS = ("poisson", "logarithmic", "tnb:0.5", "geometric")


@dataclasses.dataclass(frozen=True)
class LawSpec:
    """A law of the number of runs K, named by the user, not yet given a mean.

    Attributes:
        name: canonical name (``poisson``, ``tnb:0.5``, ...).
        kind: ``poisson``, ``logarithmic``, ``geometric`` or ``tnb``.
        eta: shape η of a truncated negative binomial law (``kind == "tnb"``), else None.
    """

    name: str
    kind: str
    eta: float | None = None

    @classmethod
    def parse(cls, text: str) -> LawSpec:
        """``poisson``, ``logarithmic``, ``geometric`` or ``tnb:ETA`` (case-insensitive).

        Raises:
            ValueError: unknown law or invalid η (η must be > -1, P&S Definition 1).
        """
        value = text.strip().lower()
        if value in ("poisson", "logarithmic", "geometric"):
            return cls(name=value, kind=value)
        if value == "tnb" or value.startswith("tnb:"):
            eta_text = value[4:]
            if not eta_text:
                raise ValueError(f"{text!r}: a truncated negative binomial needs its shape, e.g. tnb:0.5")
            try:
                eta = float(eta_text)
            except ValueError:
                eta = math.nan
            if not math.isfinite(eta):
                raise ValueError(f"{text!r}: the shape η after 'tnb:' must be a number")
            if eta <= -1.0:
                raise ValueError(f"{text!r}: the shape η must be > -1 (P&S Definition 1)")
            return cls(name=f"tnb:{eta:g}", kind="tnb", eta=eta)
        raise ValueError(f"unknown law {text!r}; choose poisson, logarithmic, geometric or tnb:ETA (e.g. tnb:0.5)")

    def build(self, mean: float) -> RunCountDistribution:
        """The law with this shape and mean ``mean`` (for TNB laws, the largest mean not above it)."""
        if self.kind == "poisson":
            return Poisson(mean)
        if self.kind == "logarithmic":
            return Logarithmic.from_mean(mean)
        if self.kind == "geometric":
            return Geometric.from_mean(mean)
        assert self.eta is not None
        return TruncatedNegativeBinomial.from_mean(self.eta, mean)


def unique_laws(laws: Sequence[LawSpec] | None) -> list[LawSpec]:
    """The laws in order, without repeats; ``DEFAULT_LAWS`` when none are given."""
    specs = list(laws) if laws else [LawSpec.parse(name) for name in DEFAULT_LAWS]
    return list(dict.fromkeys(specs))


@dataclasses.dataclass(frozen=True)
class BaseMechanism:
    """The mechanism every single run satisfies (build with the class methods).

    Attributes:
        curve: its RDP curve.
        profile: its exact (ε, δ) profile when known (tightens the Poisson bound, P&S Thm 2), else None.
        description: one human-readable line.
        params: JSON-ready description.
    """

    curve: RDPCurve
    profile: DeltaProfile | None
    description: str
    params: dict[str, Any]

    @classmethod
    def gaussian(cls, *, noise_multiplier: float) -> BaseMechanism:
        """The Gaussian mechanism with sensitivity 1, with its exact profile."""
        sigma = noise_multiplier
        return cls(
            curve=RDPCurve.gaussian(noise_multiplier=sigma),
            profile=gaussian_profile(noise_multiplier=sigma),
            description=f"Gaussian mechanism, σ = {sigma:g} (sensitivity 1), exact profile for poisson",
            params={"mechanism": "gaussian", "sigma": sigma},
        )

    @classmethod
    def dpsgd(
        cls, *, sample_rate: float, noise_multiplier: float, steps: int, exact_profile: bool = False
    ) -> BaseMechanism:
        """``steps`` Poisson-subsampled Gaussian steps; with ``exact_profile``, also their PLD profile."""
        rate, sigma = sample_rate, noise_multiplier
        profile = None
        if exact_profile:
            profile = subsampled_gaussian_profile(sample_rate=rate, noise_multiplier=sigma, steps=steps)
        note = ", exact PLD profile for poisson" if exact_profile else ""
        return cls(
            curve=RDPCurve.subsampled_gaussian(sample_rate=rate, noise_multiplier=sigma, steps=steps),
            profile=profile,
            description=f"DP-SGD, sample rate {rate:g}, σ = {sigma:g}, {steps} steps{note}",
            params={
                "mechanism": "dpsgd",
                "sample_rate": rate,
                "sigma": sigma,
                "steps": steps,
                "exact_profile": bool(exact_profile),
            },
        )

    @classmethod
    def zcdp(cls, *, rho: float) -> BaseMechanism:
        """Any ρ-zCDP mechanism (no profile)."""
        return cls(
            curve=RDPCurve.zcdp(rho=rho),
            profile=None,
            description=f"{rho:g}-zCDP mechanism",
            params={"mechanism": "zcdp", "rho": rho},
        )

    def epsilon(self, *, delta: float) -> float:
        """ε at ``delta`` of one run."""
        return self.curve.epsilon(delta=delta)

    def search_epsilon(self, law: RunCountDistribution, *, delta: float, generic: bool = True) -> float:
        """ε at ``delta`` of K ~ ``law`` runs, best released (P&S Thms 2/6; ``generic``: also Lemma 7)."""
        profile = self.profile if isinstance(law, Poisson) else None
        return repeat_and_select(self.curve, law, base_delta=profile, generic=generic).epsilon(delta=delta)

    def composition_epsilon(self, runs: int, *, delta: float) -> float:
        """ε at ``delta`` of ``runs`` runs, all released (composition, Mironov 2017 Prop. 1)."""
        return repeat_and_select(self.curve, PointMass(runs)).epsilon(delta=delta)


def _ratio(numerator: float, denominator: float) -> float:
    if denominator > 0 and math.isfinite(denominator):
        return numerator / denominator
    return math.nan


def plan_rows(
    base: BaseMechanism,
    laws: Sequence[LawSpec],
    means: Sequence[float],
    *,
    delta: float,
    success_p: float,
    generic: bool = True,
) -> list[dict[str, Any]]:
    """One row per (mean, law): the numbers ``ray-dptune plan`` prints.

    Args:
        base: the mechanism every run satisfies.
        laws: laws of K.
        means: requested E[K] values.
        delta: δ of the whole search.
        success_p: chance that one run succeeds.
        generic: also use the certified numeric P&S Lemma 7 bound (keeps the smaller ε; the default).

    Returns:
        Dicts with keys law, law_spec, requested_mean, mean, epsilon, composition_runs,
        epsilon_composition, ratio, expected_quantile, success_probability, epsilon_one_run.
    """
    one_run = base.epsilon(delta=delta)
    rows = []
    for mean in means:
        runs = max(1, math.ceil(mean))
        composed = base.composition_epsilon(runs, delta=delta)
        for spec in laws:
            law = spec.build(mean)
            epsilon = base.search_epsilon(law, delta=delta, generic=generic)
            rows.append(
                {
                    "law": spec.name,
                    "law_spec": law.to_dict(),
                    "requested_mean": mean,
                    "mean": law.mean,
                    "epsilon": epsilon,
                    "composition_runs": runs,
                    "epsilon_composition": composed,
                    "ratio": _ratio(epsilon, composed),
                    "expected_quantile": law.expected_quantile(),
                    "success_probability": law.success_probability(success_p),
                    "epsilon_one_run": one_run,
                }
            )
    return rows


def epsilon_curves(
    base: BaseMechanism, laws: Sequence[LawSpec], *, delta: float, top: float, points: int, generic: bool = True
) -> tuple[dict[str, tuple[list[float], list[float]]], tuple[np.ndarray, list[float]]]:
    """ε of the whole search against E[K] up to ``top`` (P&S Figure 4), per law and for composition.

    Returns:
        ({law name: (exact means, ε)}, (run counts k, ε of composing k runs)); each law
        is evaluated at ``points`` geometric means from 1 (Poisson) or 1.5 (the others,
        whose mean exceeds 1).
    """
    by_law = {}
    for spec in laws:
        low = 1.0 if spec.kind == "poisson" else 1.5
        grid = [spec.build(float(mean)) for mean in np.geomspace(low, top, points)]
        by_law[spec.name] = (
            [law.mean for law in grid],
            [base.search_epsilon(law, delta=delta, generic=generic) for law in grid],
        )
    runs = np.unique(np.round(np.geomspace(1.0, top, 4 * points)).astype(int))
    return by_law, (runs, [base.composition_epsilon(int(k), delta=delta) for k in runs])
