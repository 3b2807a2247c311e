"""What one trial spends: DP-SGD steps plus noisy score releases, as a value.

A trial describes its privacy cost by the parameters accounting needs, nothing
more (as dp_accounting's DpEvents do); :meth:`TrialSpend.curve` interprets them.
The same record serves as a trial's *plan* (what it may spend) and as what it has
*spent* so far, and travels through Ray Tune results as a plain dict.
"""

from __future__ import annotations

import functools
from dataclasses import asdict, dataclass, replace
from typing import Any

import numpy as np

from ray_dptune import validate
from ray_dptune.accounting.curves.rdp import RDPCurve
from ray_dptune.errors import PrivacyError

__all__ = [
    "TrialSpend",
    "covering_curve",
    "curve_from_report",
    "describe_excess",
    "parse_report",
    "read_trial_reports",
    "report_covers",
    "sampling_schedule",
    "unit_spend",
]


@dataclass(frozen=True, kw_only=True)
class TrialSpend:
    """DP-SGD with Poisson sampling, then ``score_releases`` Gaussian score releases.

    Attributes:
        sample_rate: Poisson sampling rate q of DP-SGD (batch size / dataset size).
        noise_multiplier: σ of DP-SGD (noise std / clipping norm).
        steps: DP-SGD steps taken (spent) or allowed (plan).
        score_noise_multiplier: σ of the Gaussian noise added to each released
            score of sensitivity 1 (e.g. a validation accuracy computed on n private
            examples, scaled by n); None when the score is computed on public data.
        score_releases: number of noisy scores released.
    """

    sample_rate: float
    noise_multiplier: float
    steps: int
    score_noise_multiplier: float | None = None
    score_releases: int = 0

    def __post_init__(self) -> None:
        validate.probability("sample_rate", self.sample_rate, open_left=True)
        validate.finite_positive("noise_multiplier", self.noise_multiplier)
        for name in ("steps", "score_releases"):
            validate.integer(name, getattr(self, name))
        if self.score_releases and self.score_noise_multiplier is None:
            raise ValueError("score_releases > 0 needs score_noise_multiplier (the σ of the score's noise).")
        if self.score_noise_multiplier is not None:
            validate.finite_positive("score_noise_multiplier", self.score_noise_multiplier)

    def curve(self, orders: np.ndarray | None = None) -> RDPCurve:
        """The RDP curve: subsampled Gaussian over the steps, composed with the scores."""
        curve = RDPCurve.subsampled_gaussian(
            sample_rate=self.sample_rate, noise_multiplier=self.noise_multiplier, steps=self.steps, orders=orders
        )
        if self.score_releases:
            assert self.score_noise_multiplier is not None  # __post_init__ refuses releases without it
            curve = curve + self.score_releases * RDPCurve.gaussian(
                noise_multiplier=self.score_noise_multiplier, orders=curve.orders
            )
        return curve

    def covers(self, other: TrialSpend) -> bool:
        """True when ``other`` is provably no more private-costly than this record.

        Without score releases the bounds use this record's exact trade-off (its
        mechanism, :attr:`RDPCurve.mechanism`), which RDP domination does not imply; so
        ``other`` must then be a post-processing of it: no score releases, σ' ≥ σ (extra
        noise), q' ≤ q (Poisson subsampling's profile is monotone in q: Balle, Barthe &
        Gaboardi 2018, by joint convexity) and at most as many steps. With score releases
        the bounds use the RDP curve alone, and the curves are compared order by order.
        """
        if self.score_releases == 0:  # the curve keeps its mechanism (cheap: no curve is built)
            return (
                other.score_releases == 0
                and other.noise_multiplier >= self.noise_multiplier
                and other.sample_rate <= self.sample_rate
                and other.steps <= self.steps
            )
        same_mechanism = (
            other.sample_rate == self.sample_rate
            and other.noise_multiplier == self.noise_multiplier
            and other.score_noise_multiplier in (None, self.score_noise_multiplier)
        )
        if same_mechanism:
            return other.steps <= self.steps and other.score_releases <= self.score_releases
        return self.curve().dominates(other.curve())

    def repeated(self, count: int) -> TrialSpend:
        """``count`` runs of this record one after another: steps and score releases times ``count``."""
        count = validate.integer("count", count)
        return replace(self, steps=self.steps * count, score_releases=self.score_releases * count)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (what a trainable reports)."""
        return {"kind": "dpsgd", **asdict(self)}

    @classmethod
    def from_dict(cls, record: Any) -> TrialSpend:
        """Reads :meth:`to_dict`; anything else raises ValueError naming the problem."""
        if not isinstance(record, dict) or record.get("kind") != "dpsgd":
            raise ValueError(f"Not a DP-SGD spend record (need a dict with kind='dpsgd'): {record!r}")
        fields = {k: v for k, v in record.items() if k != "kind"}
        try:
            return cls(**fields)
        except TypeError as error:
            raise ValueError(f"Malformed DP-SGD spend record {record!r}: {error}") from error


def sampling_schedule(dataset_size: int, batch_size: int) -> tuple[float, int]:
    """(sample rate q, steps per epoch) of Poisson sampling, as Opacus runs it.

    q = batch_size / dataset_size, and ``int(1 / q)`` steps per epoch: the length of
    ``opacus.utils.uniform_sampler.UniformWithReplacementSampler`` at that rate, the batch
    sampler of ``opacus.data_loader.DPDataLoader`` (the same expression, so the same float;
    tests/test_imports.py checks it against Opacus). Here rather than in training/ so that a
    plan needs no torch (``ray-dptune calibrate --dataset-size``).

    Raises:
        ValueError: batch_size is not in [1, dataset_size].
    """
    dataset_size = validate.integer("dataset_size", dataset_size, minimum=1)
    batch_size = validate.integer("batch_size", batch_size, minimum=1)
    if batch_size > dataset_size:
        raise ValueError(f"batch_size must lie in [1, {dataset_size}] (the training set's size), got {batch_size}.")
    sample_rate = batch_size / dataset_size
    return sample_rate, int(1 / sample_rate)


def curve_from_report(record: Any) -> RDPCurve:
    """An RDP curve from a trial's report: a :class:`TrialSpend` dict or an RDPCurve dict.

    Raises:
        ValueError: the record is neither.
    """
    parsed = parse_report(record)
    return parsed.curve() if isinstance(parsed, TrialSpend) else parsed


def parse_report(record: Any) -> TrialSpend | RDPCurve:
    """Validates a trial's report without computing any curve (cheap: called per result).

    Raises:
        ValueError: the record is neither a TrialSpend dict nor an RDPCurve dict.
    """
    if isinstance(record, dict) and record.get("kind") == "dpsgd":
        return TrialSpend.from_dict(record)
    if isinstance(record, dict) and "orders" in record:
        return RDPCurve.from_dict(record)
    raise ValueError(
        "A privacy report must be a TrialSpend dict (kind='dpsgd') or an RDPCurve dict "
        f"(orders, epsilons); got {record!r}."
    )


def read_trial_reports(result: dict[str, Any], *, trial_id: str, keys: tuple[str, ...]) -> tuple[Any, ...]:
    """The records under ``keys`` of a trial's result (its plan and its spend), each validated.

    Raises:
        PrivacyError: a record is missing or malformed.
    """
    records = []
    for key in keys:
        record = result.get(key)
        try:
            parse_report(record)
        except ValueError as error:
            raise PrivacyError(
                f"Trial {trial_id} reported a result without a valid {key!r} ({error}). A DP trainable "
                "must report its plan and what it has spent with every result (ray_dptune.dp_trainable does)."
            ) from error
        records.append(record)
    return tuple(records)


def report_covers(plan: Any, spent: Any) -> bool:
    """True when the ``spent`` report provably costs no more than the ``plan`` report.

    A DP-SGD plan without score releases is bounded through its exact trade-off, so only
    a :class:`TrialSpend` it covers qualifies; otherwise the RDP curves are compared order by order.

    Raises:
        ValueError: either record is malformed.
    """
    plan, spent = parse_report(plan), parse_report(spent)
    if isinstance(plan, TrialSpend) and isinstance(spent, TrialSpend):
        return plan.covers(spent)
    plan_curve = _as_curve(plan)
    if plan_curve.mechanism is not None:  # bounded by the plan's exact trade-off: a bare curve cannot prove it
        return False
    return plan_curve.dominates(_as_curve(spent))


def describe_excess(plan: Any, spent: Any) -> str:
    """Which fields of ``spent`` take it past ``plan``, in words (for an error message)."""
    plan, spent = parse_report(plan), parse_report(spent)
    if not (isinstance(plan, TrialSpend) and isinstance(spent, TrialSpend)):
        return "its RDP curve is above the plan's at some order"
    worse = [
        ("sample_rate", spent.sample_rate > plan.sample_rate, "larger"),
        ("noise_multiplier", spent.noise_multiplier < plan.noise_multiplier, "smaller"),
        ("steps", spent.steps > plan.steps, "more"),
        ("score_releases", spent.score_releases > plan.score_releases, "more"),
    ]
    parts = [
        f"{name} {getattr(spent, name):g} ({word} than the plan's {getattr(plan, name):g})"
        for name, differs, word in worse
        if differs
    ]
    return "; ".join(parts) or "its score noise differs from the plan's"


def covering_curve(records: list[Any]) -> RDPCurve:
    """An RDP curve that every record's mechanism satisfies (a plan and the spends that went past it).

    A record that covers all the others gives its own curve and exact mechanism (each
    other is then a post-processing of it, :func:`report_covers`); otherwise the pointwise
    maximum of the curves (each read conservatively, :meth:`RDPCurve.at`) bounds every
    mechanism at every order, with no exact trade-off kept. A search whose trials were each
    one of these mechanisms is bounded with it as the base (P&S 2022: the base need only
    satisfy the curve; a mixture over trials does by quasi-convexity of Rényi divergence).
    """
    widest = next((r for r in records if all(report_covers(r, other) for other in records)), None)
    if widest is not None:
        return curve_from_report(widest)
    curves = [curve_from_report(record) for record in records]
    grid = functools.reduce(np.union1d, [curve.orders for curve in curves])
    return RDPCurve(grid, np.max([curve.at(grid) for curve in curves], axis=0))


def unit_spend(plan: Any, *, units_per_plan: int) -> TrialSpend:
    """One time unit of a DP-SGD ``plan`` that spans ``units_per_plan`` units (e.g. one epoch of ``epochs``).

    Raises:
        TypeError: the plan is not a :class:`TrialSpend`.
        ValueError: its steps or score releases do not split evenly into ``units_per_plan``
            units (a unit would then have no exact cost).
    """
    parsed = parse_report(plan)
    if not isinstance(parsed, TrialSpend):
        raise TypeError("Charging a trial by time units needs a DP-SGD plan (a TrialSpend dict), not a bare curve.")
    if parsed.steps % units_per_plan or parsed.score_releases % units_per_plan:
        raise ValueError(
            f"The plan's {parsed.steps} steps and {parsed.score_releases} score releases do not split into "
            f"max_t = {units_per_plan} equal time units: set max_t to the trial's epochs (time_attr counting epochs)."
        )
    return replace(parsed, steps=parsed.steps // units_per_plan, score_releases=parsed.score_releases // units_per_plan)


def _as_curve(record: TrialSpend | RDPCurve) -> RDPCurve:
    return record.curve() if isinstance(record, TrialSpend) else record
