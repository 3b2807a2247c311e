"""Planning a private hyperparameter search before running it (``ray-dptune plan`` and ``calibrate``).

The (ε, δ) of a whole search — draw K from a law, run the base mechanism K times,
release only the best run (Papernot & Steinke 2022, Thms 2 and 6, via
:func:`~ray_dptune.accounting.repeat_and_select`) — beside plain composition of
ceil(E[K]) runs (Mironov 2017, Prop. 1), with the utility side of each law: the
expected quantile of the released run and the chance that some run succeeds; and the
other way round (:func:`calibration`), the DP-SGD noise multiplier σ that meets a target
(ε, δ) for the whole search, with what the search costs at it.

numpy and the accounting only: no Ray, no torch.

Example:
    >>> base = RunMechanism.zcdp(rho=0.1)
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

from ray_dptune import validate
from ray_dptune.accounting import RDPCurve, gaussian_profile, repeat_and_select, subsampled_gaussian_profile
from ray_dptune.accounting.bookkeeping.calibrate import (
    calibrate_noise_multiplier,
    calibrate_subsampled_tuning,
    one_run_noise_multiplier,
    search_epsilon,
)
from ray_dptune.accounting.bookkeeping.search_mechanism import SearchMechanism
from ray_dptune.accounting.bookkeeping.spend import TrialSpend, sampling_schedule
from ray_dptune.accounting.bounds.distributions import (
    Geometric,
    Logarithmic,
    PointMass,
    Poisson,
    RunCountDistribution,
    TruncatedNegativeBinomial,
)
from ray_dptune.accounting.curves.profiles import DeltaProfile
from ray_dptune.tuning_sample import planned_sample_size

__all__ = [
    "DEFAULT_LAWS",
    "LawSpec",
    "RunMechanism",
    "TrialSchedule",
    "calibration",
    "epsilon_curves",
    "plan_rows",
    "unique_laws",
]

DEFAULT_LAWS = ("poisson", "logarithmic", "tnb:0.5", "geometric")


@dataclasses.dataclass(frozen=True)
class LawSpec:
    """A law of the number of runs K, named by the user, not yet given a mean.

    Attributes:
        name: canonical name (``poisson``, ``tnb:0.5``, ``point``, ...).
        kind: ``poisson``, ``logarithmic``, ``geometric``, ``tnb`` or ``point`` (K = the mean, always).
        eta: shape η of a truncated negative binomial law (``kind == "tnb"``), else None.
    """

    name: str
    kind: str
    eta: float | None = None

    @classmethod
    def parse(cls, text: str) -> LawSpec:
        """``poisson``, ``logarithmic``, ``geometric``, ``tnb:ETA`` or ``point`` (case-insensitive).

        Raises:
            ValueError: unknown law or invalid η (η must be > -1, P&S Definition 1).
        """
        value = text.strip().lower()
        if value in ("poisson", "logarithmic", "geometric", "point"):
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
        raise ValueError(
            f"unknown law {text!r}; choose poisson, logarithmic, geometric, tnb:ETA (e.g. tnb:0.5) or point"
        )

    def build(self, mean: float) -> RunCountDistribution:
        """The law with this shape and mean ``mean`` (for TNB laws, the largest mean not above it).

        Raises:
            ValueError: no such law (a point mass needs a whole mean; the TNB laws a mean > 1).
        """
        if self.kind == "poisson":
            return Poisson(mean)
        if self.kind == "point":
            if mean != math.floor(mean):
                raise ValueError(f"law 'point' runs exactly --mean times: --mean must be a whole number, got {mean:g}")
            return PointMass(int(mean))
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
class RunMechanism:
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
    def gaussian(cls, *, noise_multiplier: float) -> RunMechanism:
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
    ) -> RunMechanism:
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
    def zcdp(cls, *, rho: float) -> RunMechanism:
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

    def selection_epsilon(self, law: RunCountDistribution, *, delta: float, generic: bool = True) -> float:
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
    base: RunMechanism,
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
            epsilon = base.selection_epsilon(law, delta=delta, generic=generic)
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
    base: RunMechanism, laws: Sequence[LawSpec], *, delta: float, top: float, points: int, generic: bool = True
) -> tuple[dict[str, tuple[list[float], list[float]]], tuple[np.ndarray, list[float]]]:
    """ε of the whole search against E[K] up to ``top`` (P&S Figure 4), per law and for composition.

    Returns:
        ({law name: (exact means, ε)}, (run counts k, ε of composing k runs)); each law
        is evaluated at ``points`` geometric means from 1 (Poisson) or 1.5 (the TNB laws,
        whose mean exceeds 1), a point mass at the run counts k.
    """
    runs = np.unique(np.round(np.geomspace(1.0, top, 4 * points)).astype(int))
    by_law = {}
    for spec in laws:
        low = 1.0 if spec.kind == "poisson" else 1.5
        means = runs if spec.kind == "point" else np.geomspace(low, top, points)
        grid = [spec.build(float(mean)) for mean in means]
        by_law[spec.name] = (
            [law.mean for law in grid],
            [base.selection_epsilon(law, delta=delta, generic=generic) for law in grid],
        )
    return by_law, (runs, [base.composition_epsilon(int(k), delta=delta) for k in runs])


@dataclasses.dataclass(frozen=True, kw_only=True)
class TrialSchedule:
    """The DP-SGD schedule of one trial, its noise multiplier left free (``calibrate``'s plan).

    Attributes:
        sample_rate: Poisson sampling rate q.
        steps: DP-SGD steps T.
        dataset_size, batch_size, epochs: where q and T came from (:meth:`from_training`), else None.
    """

    sample_rate: float
    steps: int
    dataset_size: int | None = None
    batch_size: int | None = None
    epochs: int | None = None

    def __post_init__(self) -> None:
        self.plan(noise_multiplier=1.0)  # TrialSpend validates q in (0, 1] and T

    @classmethod
    def from_training(cls, *, dataset_size: int, batch_size: int, epochs: int) -> TrialSchedule:
        """The schedule ``dp_trainable`` plans for (:func:`ray_dptune.training.plan.trial_plan`), without torch.

        Raises:
            ValueError: batch_size outside [1, dataset_size], or epochs < 1.
        """
        sample_rate, steps_per_epoch = sampling_schedule(dataset_size, batch_size)
        return cls(
            sample_rate=sample_rate,
            steps=validate.integer("epochs", epochs, minimum=1) * steps_per_epoch,
            dataset_size=dataset_size,
            batch_size=batch_size,
            epochs=epochs,
        )

    def plan(self, *, noise_multiplier: float) -> TrialSpend:
        """The trial's plan at noise multiplier ``noise_multiplier``."""
        return TrialSpend(sample_rate=self.sample_rate, noise_multiplier=noise_multiplier, steps=self.steps)

    @property
    def description(self) -> str:
        """One human-readable line."""
        text = f"DP-SGD, sample rate {self.sample_rate:.6g}, {self.steps} steps"
        if self.dataset_size is not None:
            text += f" ({self.epochs} epochs of batch {self.batch_size} from {self.dataset_size} examples)"
        return text


def calibration(
    schedule: TrialSchedule,
    law: RunCountDistribution,
    *,
    epsilon: float,
    delta: float,
    retries: int = 0,
) -> dict[str, Any]:
    """σ for a whole search of K ~ ``law`` trials to meet (``epsilon``, ``delta``), and its cost (``calibrate``).

    σ is :func:`~ray_dptune.accounting.bookkeeping.calibrate.calibrate_noise_multiplier`'s, with
    ``retries`` attempts reserved at the plan; the search's ε at σ is the account's
    (:class:`~ray_dptune.accounting.bookkeeping.account.SearchAccount`) with no retry used and with
    all of them used, and σ of one run alone (K = 1, no retry) prices the tuning.

    Returns:
        A dict with keys noise_multiplier, epsilon_search (no retry used),
        epsilon_search_all_retries, epsilon_trial (one trial alone at σ),
        noise_multiplier_one_run, noise_ratio (σ / σ of one run), and the inputs
        (epsilon_target, delta, retries, law, schedule).

    Raises:
        PrivacyError: no σ meets the target.
        ValueError: invalid arguments.
    """

    def plan_for(sigma: float) -> TrialSpend:
        return schedule.plan(noise_multiplier=sigma)

    sigma = calibrate_noise_multiplier(plan_for, epsilon=epsilon, delta=delta, law=law, retries=retries)
    plan = plan_for(sigma)
    one_run = calibrate_noise_multiplier(plan_for, epsilon=epsilon, delta=delta, law=PointMass(1))
    return {
        "epsilon_target": epsilon,
        "delta": delta,
        "retries": retries,
        "law": {**law.to_dict(), "mean": law.mean},
        "schedule": dataclasses.asdict(schedule),
        "noise_multiplier": sigma,
        "epsilon_search": search_epsilon(plan, delta=delta, law=law),
        "epsilon_search_all_retries": search_epsilon(plan, delta=delta, law=law, retries=retries),
        "epsilon_trial": search_epsilon(plan, law=PointMass(1), delta=delta),
        "noise_multiplier_one_run": one_run,
        "noise_ratio": sigma / one_run,
    }


def subsampled_calibration(
    schedule: TrialSchedule,
    law: RunCountDistribution,
    *,
    epsilon: float,
    delta: float,
    tuning_fraction: float,
    final_noise_overhead: float = 0.1,
    retries: int = 0,
) -> dict[str, Any]:
    """σ_T and σ_B of a search on a Poisson sample of rate ``tuning_fraction``, then one run on all the data.

    The split is :func:`~ray_dptune.accounting.bookkeeping.calibrate.calibrate_subsampled_tuning`'s;
    the whole procedure's ε is the account's. Beside it, the σ an ordinary search of the same law
    needs on all the data (:func:`calibration`), and the DP-SGD steps each search takes on average.

    Raises:
        ValueError: a schedule without its training form (the sample's planned size needs N, B and E).
        PrivacyError: no split meets the target.
    """
    if schedule.dataset_size is None or schedule.batch_size is None or schedule.epochs is None:
        raise ValueError(
            "--tuning-fraction plans the trials on the sample: give --dataset-size, --batch-size and --epochs"
        )
    tuning_schedule = TrialSchedule.from_training(
        dataset_size=planned_sample_size(tuning_fraction, schedule.dataset_size),
        batch_size=schedule.batch_size,
        epochs=schedule.epochs,
    )
    sigma_tuning, sigma_final = calibrate_subsampled_tuning(
        lambda sigma: tuning_schedule.plan(noise_multiplier=sigma),
        lambda sigma: schedule.plan(noise_multiplier=sigma),
        epsilon=epsilon,
        delta=delta,
        law=law,
        sample_rate=tuning_fraction,
        final_noise_overhead=final_noise_overhead,
        retries=retries,
    )
    mechanism = SearchMechanism.subsampled_tuning(
        law=law, num_trials=1, sample_rate=tuning_fraction, final_plan=schedule.plan(noise_multiplier=sigma_final)
    )
    ordinary = calibration(schedule, law, epsilon=epsilon, delta=delta, retries=retries)
    return {
        "epsilon_target": epsilon,
        "delta": delta,
        "retries": retries,
        "tuning_fraction": tuning_fraction,
        "final_noise_overhead": final_noise_overhead,
        "law": {**law.to_dict(), "mean": law.mean},
        "schedule": dataclasses.asdict(schedule),
        "tuning_schedule": dataclasses.asdict(tuning_schedule),
        "noise_multiplier_tuning": sigma_tuning,
        "noise_multiplier_final": sigma_final,
        "epsilon_search": search_epsilon(
            tuning_schedule.plan(noise_multiplier=sigma_tuning), delta=delta, mechanism=mechanism, retries=retries
        ),
        "noise_multiplier_ordinary_search": ordinary["noise_multiplier"],
        "noise_multiplier_one_run": one_run_noise_multiplier(
            lambda sigma: schedule.plan(noise_multiplier=sigma), epsilon=epsilon, delta=delta
        ),
        "steps_per_search": law.mean * tuning_schedule.steps + schedule.steps,
        "steps_per_ordinary_search": law.mean * schedule.steps,
    }
