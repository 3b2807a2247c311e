"""A trial's privacy plan: what its DP-SGD run and score releases may spend, before training.

The plan is a :class:`~ray_dptune.accounting.bookkeeping.spend.TrialSpend` built from the four
privacy parameters (σ, batch size, epochs, score σ) and the size of the training
set. The sampling schedule is Opacus's: Poisson sampling at rate q = batch_size / n,
and as many steps per epoch as ``opacus.utils.uniform_sampler.UniformWithReplacementSampler``
yields (``int(1 / q)``).

:func:`space_plan` returns one plan covering every configuration of a Ray Tune
search space, which is what the accounting of a whole search needs.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, fields
from numbers import Integral, Real
from typing import Any, cast

from ray_dptune.accounting.bookkeeping.spend import TrialSpend, sampling_schedule

__all__ = [
    "PRIVACY_KEYS",
    "PrivacyParams",
    "candidates",
    "describe_plans",
    "dominant_plan",
    "space_plan",
    "trial_plan",
]

UNTUNABLE_BATCH_RANGE = (
    "batch_size is given as a range ({domain}); the privacy cost is not monotone in the batch "
    "size (int(n / batch_size) steps per epoch), so the largest value need not be the worst "
    "case. Tune it with tune.choice([...]) or tune.grid_search([...]), or fix it."
)
NO_DOMINANT_PLAN = (
    "No configuration of the search space spends at least as much as every other one at "
    "every Rényi order, so no single plan covers the search: {plans}. Do not tune the privacy "
    "parameters (noise_multiplier, batch_size, epochs, score_noise_multiplier), or restrict "
    "them so that one combination dominates (e.g. the smallest noise_multiplier with the "
    "largest epochs and batch_size)."
)


@dataclass(frozen=True, kw_only=True)
class PrivacyParams:
    """The parameters of one trial that its privacy cost depends on.

    Attributes:
        noise_multiplier: σ of DP-SGD (noise std / clipping norm), > 0; None until set
            (by the config, or calibrated by :func:`ray_dptune.private_tuner`).
        batch_size: expected Poisson batch size, >= 1.
        epochs: passes over the training set, >= 1.
        score_noise_multiplier: σ of the Gaussian noise added to the correct-count of
            each reported score; None when the validation data is public.
    """

    noise_multiplier: float | None
    batch_size: int
    epochs: int
    score_noise_multiplier: float | None = None

    def __post_init__(self) -> None:
        if self.noise_multiplier is not None:
            _check_positive_real("noise_multiplier", self.noise_multiplier)
        for name in ("batch_size", "epochs"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, Integral) or value < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {value!r}.")
        if self.score_noise_multiplier is not None:
            _check_positive_real("score_noise_multiplier", self.score_noise_multiplier)

    @classmethod
    def resolve(cls, config: Mapping[str, Any], defaults: PrivacyParams) -> PrivacyParams:
        """The trial's parameters: each config key of :data:`PRIVACY_KEYS` overrides ``defaults``."""
        params = cls(**{key: config.get(key, getattr(defaults, key)) for key in PRIVACY_KEYS})
        params.require_noise()
        return params

    def require_noise(self) -> None:
        """Raises ValueError when σ was never set."""
        if self.noise_multiplier is None:
            raise ValueError(
                "noise_multiplier is not set: pass noise_multiplier= to dp_trainable, put it in the param_space, "
                "or build the search with ray_dptune.private_tuner, which calibrates it for the budget."
            )


PRIVACY_KEYS: tuple[str, ...] = tuple(f.name for f in fields(PrivacyParams))
"""Config keys that change what a trial spends; each overrides the fixed argument of the same name."""


def trial_plan(params: PrivacyParams, dataset_size: int) -> TrialSpend:
    """The most one trial will spend: every epoch's steps and one score release per epoch."""
    params.require_noise()
    assert params.noise_multiplier is not None
    sample_rate, steps_per_epoch = sampling_schedule(dataset_size, params.batch_size)
    noisy_scores = params.score_noise_multiplier is not None
    return TrialSpend(
        sample_rate=sample_rate,
        noise_multiplier=float(params.noise_multiplier),
        steps=params.epochs * steps_per_epoch,
        score_noise_multiplier=None if params.score_noise_multiplier is None else float(params.score_noise_multiplier),
        score_releases=params.epochs if noisy_scores else 0,
    )


def space_plan(param_space: Mapping[str, Any], defaults: PrivacyParams, dataset_size: int) -> TrialSpend:
    """One plan that covers every configuration of a Ray Tune search space.

    Each privacy key of ``param_space`` contributes candidate values: the worst end of
    a sampled range (smallest σ, largest epochs; the upper end of an integer range is
    taken even where Tune excludes it, which is safe), every value of a
    ``tune.choice`` or ``tune.grid_search``; keys not in the space use ``defaults``.
    The plan of each combination is computed, and the one whose RDP curve is at least
    every other's at every order is returned (what :meth:`TrialSpend.covers` checks).

    Args:
        param_space: the ``param_space`` given to ``tune.Tuner``.
        defaults: the fixed privacy parameters.
        dataset_size: size of the training set.

    Returns:
        The covering plan.

    Raises:
        ValueError: a privacy key has a domain that cannot be bounded (``sample_from``,
            a batch-size range, a non-integer range of epochs), or no combination
            dominates all others.
    """
    values_per_key = [
        candidates(key, param_space[key]) if key in param_space else [getattr(defaults, key)] for key in PRIVACY_KEYS
    ]
    plans = [
        trial_plan(PrivacyParams(**dict(zip(PRIVACY_KEYS, values))), dataset_size)
        for values in itertools.product(*values_per_key)
    ]
    plan = dominant_plan(plans)
    if plan is None:
        raise ValueError(NO_DOMINANT_PLAN.format(plans=describe_plans(dict.fromkeys(plans))))
    return plan


def dominant_plan(plans: Iterable[TrialSpend]) -> TrialSpend | None:
    """The plan whose RDP curve is at least every other's at every order, or None if there is none."""
    plans = list(dict.fromkeys(plans))
    if len(plans) == 1:
        return plans[0]
    curves = [plan.curve() for plan in plans]
    for plan, curve in zip(plans, curves):
        if all(curve.dominates(other) for other in curves):
            return plan
    return None


def candidates(key: str, value: Any) -> list[Any]:
    """The values of one key of a Tune space that a worst case must be taken over."""
    from ray.tune.search.sample import Float, Integer  # imported here: Ray is slow to import

    from ray_dptune.search.space import choices, is_fixed

    values = choices(value)
    if values is not None:
        return values
    if isinstance(value, (Float, Integer)):
        return [_worst_end(key, value, integer=isinstance(value, Integer))]
    if not is_fixed(value):
        raise ValueError(
            f"{key} is given as {type(value).__name__} domain {value!r}, whose range is unknown; "
            "use tune.choice, tune.grid_search, a numeric range, or a fixed value."
        )
    return [value]


def _worst_end(key: str, domain: Any, *, integer: bool) -> Any:
    """The end of a numeric range that spends most: smallest σ, largest number of epochs."""
    if key == "batch_size":
        raise ValueError(UNTUNABLE_BATCH_RANGE.format(domain=domain))
    if key == "epochs":
        if not integer:
            raise ValueError(f"epochs must be an integer; use tune.randint or tune.choice, not {domain!r}.")
        return int(domain.upper)
    return domain.lower


def _check_positive_real(name: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, Real) or not 0 < cast(float, value) < math.inf:
        raise ValueError(f"{name} must be a finite number > 0, got {value!r}.")


def describe_plans(plans: Iterable[TrialSpend]) -> str:
    """One line per plan's parameters, for error messages."""
    return "; ".join(
        f"(q={p.sample_rate:.4g}, σ={p.noise_multiplier:g}, steps={p.steps}, "
        f"score σ={p.score_noise_multiplier}, releases={p.score_releases})"
        for p in plans
    )
