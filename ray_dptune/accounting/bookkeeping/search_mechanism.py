"""How a search is bounded: one frozen record per kind of mechanism, owning its bound's inputs.

Each kind is a subclass of :class:`SearchMechanism` (build them with its class methods):
:class:`RandomCountMechanism`, :class:`ConstantOverheadMechanism`, :class:`SearcherRelease`,
:class:`CompositionMechanism`, :class:`HalvingMechanism` and :class:`SubsampledTuningMechanism`. A record is JSON-ready (it is
written to the journal and the report; :meth:`SearchMechanism.from_dict` is the one place a
kind's name is read) and turns a per-attempt plan curve into the curve of the attempts its
bound covers (:meth:`SearchMechanism.selection_curve`).
:class:`ray_dptune.accounting.bookkeeping.account.SearchAccount` composes everything else.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

from ray_dptune import validate
from ray_dptune.accounting.bookkeeping.guarantee import Guarantee
from ray_dptune.accounting.bookkeeping.halving_budget import HalvingBudget
from ray_dptune.accounting.bookkeeping.spend import TrialSpend, parse_report
from ray_dptune.accounting.bounds.distributions import RunCountDistribution, distribution_from_dict
from ray_dptune.accounting.bounds.selection import repeat_and_select
from ray_dptune.accounting.bounds.subsampled_tuning import dpsgd_run_pld, profile_points, subsampled_tuning_epsilon
from ray_dptune.accounting.bounds.svt import svt_curve
from ray_dptune.accounting.curves.rdp import RDPCurve
from ray_dptune.errors import PrivacyError

__all__ = [
    "CompositionMechanism",
    "ConstantOverheadMechanism",
    "HalvingMechanism",
    "RandomCountMechanism",
    "SearchMechanism",
    "SearcherRelease",
    "SubsampledTuningMechanism",
]

_DRAWN = frozenset({"num_trials", "num_brackets"})
"""Parameters drawn from a law before the search: the operator's, never in a public statement."""


@dataclass(frozen=True)
class SearchMechanism:
    """How a search is bounded (build with the class methods; each returns its kind's record).

    The defaults here are those of a search that covers no attempt by a selection theorem:
    every accounted attempt is composed at its plan, and Tune may retry.
    """

    kind: ClassVar[str]
    """The name the journal and the report record."""
    pays_by_units: ClassVar[bool] = False
    """True when every attempt is paid from a budget of time units (private halving), not by attempts."""
    releases_itself: ClassVar[bool] = False
    """True when the searcher's own (ε, δ) release is the whole guarantee and trials are not accounted."""
    has_final_run: ClassVar[bool] = False
    """True when one trial, marked ``final``, runs on all the data at a plan of its own (subsampled tuning)."""

    # ------------------------------------------------------------------ builders
    @classmethod
    def random_count(
        cls, *, law: RunCountDistribution, num_trials: int, density_ratio: float = 1.0, upper: float | None = None
    ) -> RandomCountMechanism:
        """K ~ ``law`` runs, best released: P&S 2022 Thms 2/6; DP-HyPO Thm 1 when ``density_ratio`` = C/c > 1.

        ``upper``: C itself, when the sampler guarantees it (see :func:`repeat_and_select`).
        """
        if upper is not None:
            upper = validate.in_range("upper", upper, 1.0, float(density_ratio), note=" (C, 1 <= C <= C/c)")
        return RandomCountMechanism(law.to_dict(), int(num_trials), float(density_ratio), upper)

    @classmethod
    def constant_overhead(cls, *, epsilon_round: float, max_rounds: int) -> ConstantOverheadMechanism:
        """Ding et al. Alg. 1: ``max_rounds`` ε_round-DP sparse-vector rounds per selection, then one training."""
        return ConstantOverheadMechanism(float(epsilon_round), int(max_rounds))

    @classmethod
    def release(cls, *, epsilon: float, delta: float, description: Mapping[str, Any] | None = None) -> SearcherRelease:
        """A searcher's own (ε, δ)-DP release (DP-BO, Kusner et al. 2015); trials are not accounted."""
        if not (math.isfinite(epsilon) and epsilon >= 0 and 0 <= delta < 1):
            raise ValueError(f"A release needs ε >= 0 finite and δ in [0, 1), got ({epsilon}, {delta}).")
        return SearcherRelease(float(epsilon), float(delta), dict(description or {}))

    @classmethod
    def composition(cls) -> CompositionMechanism:
        """Every accounted attempt composed at its plan (no selection theorem)."""
        return CompositionMechanism()

    @classmethod
    def halving(
        cls, *, budget_units: int, max_t: int, law: RunCountDistribution | None = None, num_brackets: int = 1
    ) -> HalvingMechanism:
        """Private successive halving: brackets of at most ``budget_units`` time units, a unit ``plan / max_t``.

        One bracket (``law`` None): the search costs ``budget_units`` units composed; K =
        ``num_brackets`` ~ ``law`` independent brackets, the best winner released: P&S Thms
        2/6 over that run (:mod:`~ray_dptune.accounting.bookkeeping.halving_budget`).
        """
        budget_units = validate.integer("budget_units", budget_units, minimum=1)
        max_t = validate.integer("max_t", max_t, minimum=1)
        num_brackets = validate.integer("num_brackets", num_brackets)
        if law is None and num_brackets != 1:
            raise ValueError(f"num_brackets = {num_brackets} needs the law it was drawn from (law=).")
        return HalvingMechanism(budget_units, max_t, None if law is None else law.to_dict(), num_brackets)

    @classmethod
    def subsampled_tuning(
        cls, *, law: RunCountDistribution, num_trials: int, sample_rate: float, final_plan: TrialSpend
    ) -> SubsampledTuningMechanism:
        """K ~ ``law`` runs on a Poisson sample of rate ``sample_rate``, then one run of ``final_plan`` on all the data.

        The tuning is P&S 2022 Thms 2/6 on the sample; the whole procedure is bounded by
        :func:`~ray_dptune.accounting.bounds.subsampled_tuning.subsampled_tuning_epsilon`.
        """
        sample_rate = validate.in_range("sample_rate", sample_rate, 0.0, 1.0)
        if not 0.0 < sample_rate < 1.0:
            raise ValueError(
                f"sample_rate must lie strictly between 0 and 1 (the tuning sample's share), got {sample_rate}."
            )
        if final_plan.score_releases:
            raise ValueError("The final run releases its model only: plan it without noisy score releases.")
        return SubsampledTuningMechanism(
            law_record=law.to_dict(),
            num_trials=int(num_trials),
            sample_rate=float(sample_rate),
            final_plan_record=final_plan.to_dict(),
        )

    # ------------------------------------------------------------------ the bound
    @property
    def params(self) -> dict[str, Any]:
        """The bound's inputs as JSON-ready values (the ``params`` of :meth:`to_dict`)."""
        return {}

    @property
    def cover_cap(self) -> int:
        """How many attempts (one per trial) the mechanism's own bound covers."""
        return 0

    @property
    def allows_retries(self) -> bool:
        """Whether Tune may re-run a trial that failed (``FailureConfig(max_failures > 0)``).

        Every attempt outside the cover is bounded by adaptive composition (Mironov 2017, Prop. 1),
        which covers the failure a retry reveals.
        """
        return True

    @property
    def law(self) -> RunCountDistribution | None:
        """The law of the number of runs the selection bound covers, or None."""
        return None

    @property
    def description(self) -> dict[str, Any]:
        """What a searcher's own release says about itself (empty for the other kinds)."""
        return {}

    def retry_reserve(self, max_failures: int) -> int | None:
        """The attempts Tune's ``max_failures`` retries may charge in all: part of the stated guarantee.

        ``max_failures`` for each covered trial; None where no fixed number bounds them (unlimited
        retries).
        """
        if max_failures == 0:
            return 0
        return None if max_failures < 0 else max_failures * self.cover_cap

    def check_reserved_reruns(self, count: int) -> None:
        """Raises ValueError when ``count`` re-runs cannot be reserved by attempt (nothing here: they can)."""

    def check_plan(self, plan: Any) -> None:
        """Raises ValueError when the trials' ``plan`` (a TrialSpend or RDPCurve) is one the bound does not cover."""

    def selection_curve(self, plan: RDPCurve, *, selections: int = 1, generic: bool = True) -> RDPCurve:
        """The curve of the covered attempts when each satisfies ``plan``.

        ``selections`` counts the sparse-vector selections of a constant-overhead search
        that ran (each costs ``max_rounds`` rounds; at least one is charged from the start).
        """
        return RDPCurve.zero(plan.orders)

    def adaptivity(self, plan: RDPCurve, selection: RDPCurve, *, delta: float, generic: bool) -> float | None:
        """The ε an adaptive sampler adds over the uniform one at ``delta`` (None where there is none)."""
        return None

    def budget(self) -> HalvingBudget | None:
        """A fresh budget of time units for an account (private halving), else None."""
        return None

    # ------------------------------------------------------------------ records
    def to_dict(self) -> dict[str, Any]:
        """The JSON-ready record the journal and the report keep: the kind and its parameters."""
        return {"kind": self.kind, "params": json.loads(json.dumps(self.params))}

    def public_definition(self) -> dict[str, Any]:
        """The mechanism as it may be published: its record without the draws the bound keeps hidden.

        The selection bounds cover the best run with the number of runs hidden (P&S 2022, App. D.1:
        with K known, best-of-k costs up to k-fold), so K (``num_trials``) and the number of halving
        brackets (``num_brackets``) are the operator's; the law they were drawn from is public.
        """
        record = self.to_dict()
        record["params"] = {k: v for k, v in record["params"].items() if k not in _DRAWN}
        return record

    @classmethod
    def from_dict(cls, record: Mapping[str, Any]) -> SearchMechanism:
        """The record :meth:`to_dict` wrote (the journal's and the report's), as its kind's class."""
        kinds = {kind.kind: kind for kind in _KINDS}
        if record.get("kind") not in kinds:
            raise ValueError(f"Unknown search mechanism {record.get('kind')!r}; expected one of {sorted(kinds)}.")
        params: dict[str, Any] = dict(record.get("params", {}))
        return kinds[record["kind"]](**{_FIELD_OF.get(str(name), str(name)): value for name, value in params.items()})


_FIELD_OF = {"law": "law_record", "description": "description_record", "final_plan": "final_plan_record"}
"""A record's parameter name -> its field, where they differ (the law and a description are kept as JSON)."""


@dataclass(frozen=True)
class RandomCountMechanism(SearchMechanism):
    """K ~ law runs, the best released (P&S 2022 Thms 2/6, Lemma 7); DP-HyPO Thm 1 when density_ratio > 1."""

    kind: ClassVar[str] = "random_count"
    law_record: dict[str, Any]
    num_trials: int
    density_ratio: float = 1.0
    upper: float | None = None

    @property
    def params(self) -> dict[str, Any]:
        """The law's record, K (``num_trials``), C/c (``density_ratio``), and C (``upper``) when given."""
        params = {"law": self.law_record, "num_trials": self.num_trials, "density_ratio": self.density_ratio}
        return params if self.upper is None else {**params, "upper": self.upper}

    @property
    def cover_cap(self) -> int:
        """K: the last attempt of each of the K trials."""
        return self.num_trials

    @property
    def allows_retries(self) -> bool:
        """False: the selection bound covers the best of K runs with K hidden, each run one draw of the base.

        A retry is decided by the failure of the attempt it replaces, so the runs that stand as
        trials' last attempts are the base *conditioned on not failing*, and the retries are a
        statistic of all K runs (P&S App. D.1: with such a statistic known, best-of-k costs up to
        k-fold): exact enumeration finds the released output's ε above the bound
        (tests/accounting/test_exact_retries.py). A failure without a retry is covered: the run's output is
        "failed", ranked last.
        """
        return False

    @property
    def law(self) -> RunCountDistribution:
        """The law K was drawn from."""
        return distribution_from_dict(self.law_record)

    def selection_curve(self, plan: RDPCurve, *, selections: int = 1, generic: bool = True) -> RDPCurve:
        """The best of K runs, each satisfying ``plan`` (:func:`repeat_and_select`)."""
        return repeat_and_select(plan, self.law, density_ratio=self.density_ratio, upper=self.upper, generic=generic)

    def adaptivity(self, plan: RDPCurve, selection: RDPCurve, *, delta: float, generic: bool) -> float | None:
        """The ε DP-HyPO's adaptive sampler adds over the uniform one at ``delta`` (None when C/c ≤ 1)."""
        if self.density_ratio <= 1.0:
            return None
        uniform = repeat_and_select(plan, self.law, generic=generic)
        return selection.epsilon(delta=delta) - uniform.epsilon(delta=delta)


@dataclass(frozen=True)
class ConstantOverheadMechanism(SearchMechanism):
    """Ding et al. Alg. 1: sparse-vector rounds per selection, then one covered training."""

    kind: ClassVar[str] = "constant_overhead"
    epsilon_round: float
    max_rounds: int

    @property
    def params(self) -> dict[str, Any]:
        """ε of each sparse-vector round, and the most rounds per selection."""
        return {"epsilon_round": self.epsilon_round, "max_rounds": self.max_rounds}

    @property
    def cover_cap(self) -> int:
        """1: the final training."""
        return 1

    def selection_curve(self, plan: RDPCurve, *, selections: int = 1, generic: bool = True) -> RDPCurve:
        """``max_rounds`` sparse-vector rounds per selection (at least one), then one training at ``plan``."""
        rounds = svt_curve(epsilon=self.epsilon_round, rounds=self.max_rounds, orders=plan.orders)
        return max(1, selections) * rounds + plan


@dataclass(frozen=True)
class SearcherRelease(SearchMechanism):
    """A searcher's own (ε, δ)-DP release (DP-BO, Kusner et al. 2015): its trials are not accounted."""

    kind: ClassVar[str] = "release"
    releases_itself: ClassVar[bool] = True
    epsilon: float
    delta: float
    description_record: dict[str, Any] = field(default_factory=dict)

    @property
    def params(self) -> dict[str, Any]:
        """The release's (ε, δ) and its description."""
        return {"epsilon": self.epsilon, "delta": self.delta, "description": self.description_record}

    @property
    def description(self) -> dict[str, Any]:
        """A copy of what the searcher's release says about itself."""
        return dict(self.description_record)

    def retry_reserve(self, max_failures: int) -> int | None:
        """0: retries charge nothing to the account."""
        return 0  # its trials are not accounted

    def release_guarantee(self, count: int, *, delta: float) -> Guarantee:
        """``count`` releases (at least one, charged from the start), composed basically (Dwork & Roth, Thm 3.16).

        Raises:
            PrivacyError: their δ adds up past the search's ``delta``.
        """
        count = max(1, count)
        epsilon, release_delta = count * self.epsilon, count * self.delta
        if release_delta > delta:
            raise PrivacyError(
                f"The searcher released {count} time(s) at δ = {self.delta:g} each, above this search's "
                f"δ = {delta:g}: raise δ."
            )
        return Guarantee(epsilon, release_delta, None, 0, release_epsilon=epsilon, release_delta=release_delta)


@dataclass(frozen=True)
class CompositionMechanism(SearchMechanism):
    """No selection theorem: every accounted attempt composed at its plan (Mironov 2017, Prop. 1)."""

    kind: ClassVar[str] = "composition"

    def retry_reserve(self, max_failures: int) -> int | None:
        """0 when Tune never retries, else None."""
        return 0 if max_failures == 0 else None  # any number of trials, each retried: no fixed number bounds it


@dataclass(frozen=True)
class HalvingMechanism(SearchMechanism):
    """Private successive halving: every attempt paid in time units from a per-bracket budget."""

    kind: ClassVar[str] = "halving"
    pays_by_units: ClassVar[bool] = True
    budget_units: int
    max_t: int
    law_record: dict[str, Any] | None = None
    num_brackets: int = 1

    @property
    def params(self) -> dict[str, Any]:
        """The budget of units per bracket, ``max_t``, the law's record (None for one bracket) and ``num_brackets``."""
        return {
            "budget_units": self.budget_units,
            "max_t": self.max_t,
            "law": self.law_record,
            "num_brackets": self.num_brackets,
        }

    @property
    def law(self) -> RunCountDistribution | None:
        """The law the number of brackets was drawn from; None for one bracket."""
        return None if self.law_record is None else distribution_from_dict(self.law_record)

    def retry_reserve(self, max_failures: int) -> int | None:
        """0: retries are paid in units, not reserved."""
        return 0  # every attempt is paid from the budget of units

    def check_reserved_reruns(self, count: int) -> None:
        """Raises ValueError for any re-run reserved: every attempt is paid from the budget of time units."""
        if count:
            raise ValueError(
                "A private halving search pays every attempt from its budget of time units: re-runs are not "
                "reserved by attempt (retries= does not apply); raise budget_trials instead."
            )

    def selection_curve(self, plan: RDPCurve, *, selections: int = 1, generic: bool = True) -> RDPCurve:
        """Raises ValueError: the account reads a halving search's curve from its budget of units."""
        raise ValueError("A halving search's curve is its budget of plan units: read it from SearchAccount.")

    def budget(self) -> HalvingBudget:
        """A fresh budget of ``budget_units`` time units per bracket."""
        return HalvingBudget(self.params)


@dataclass(frozen=True)
class SubsampledTuningMechanism(RandomCountMechanism):
    """Tune on a Poisson sample, train once on all the data (amplification, then PLD composition).

    The tuning is a random-count search whose every attempt runs on one Poisson sample of rate
    ``sample_rate`` (its selection curve and composed attempts are the account's, at the tuning
    plan); the final trial runs ``final_plan`` on all the data with hyperparameters chosen from
    the tuning's output. :meth:`whole_epsilon` bounds the procedure
    (:mod:`~ray_dptune.accounting.bounds.subsampled_tuning`). Every final attempt is one more run
    on all the data, so each is composed (at least one: it is charged from the start).
    """

    kind: ClassVar[str] = "subsampled_tuning"
    has_final_run: ClassVar[bool] = True
    sample_rate: float = 0.0
    final_plan_record: dict[str, Any] = field(default_factory=dict)

    @property
    def params(self) -> dict[str, Any]:
        """The random-count search's parameters, the sample's rate and the final run's plan."""
        return {**super().params, "sample_rate": self.sample_rate, "final_plan": self.final_plan_record}

    def check_plan(self, plan: Any) -> None:
        """Raises ValueError for a tuning plan with noisy score releases, or a bare curve.

        Amplification covers what ran on the sample; a score on a private validation set lies
        outside it, so its noise must not be discounted by p.
        """
        if not isinstance(plan, TrialSpend) or plan.score_releases:
            raise ValueError(
                "A subsampled tuning's trials must plan DP-SGD on the sample alone (a TrialSpend without score "
                f"releases): a noisy validation score is not on the sample, so it is not amplified. Got {plan}."
            )

    @property
    def final_plan(self) -> TrialSpend:
        """The plan of the final run on all the data (fixed before the search)."""
        return TrialSpend.from_dict(self.final_plan_record)

    def final_runs(self, beyond: list[Any]) -> list[TrialSpend]:
        """The runs to compose, one per final attempt that may have run (at least one, charged from the start).

        ``beyond`` holds, per attempt, what it reported past the final plan (None: within it);
        such an attempt is bounded by a DP-SGD run both are post-processings of (the largest q
        and steps, the smallest σ).

        Raises:
            PrivacyError: a spend no DP-SGD run without score releases bounds.
        """
        plan = self.final_plan
        runs = []
        for spent in beyond:
            parsed = None if spent is None else parse_report(spent)
            if parsed is not None and (not isinstance(parsed, TrialSpend) or parsed.score_releases):
                raise PrivacyError(f"A final run reported a spend no DP-SGD run bounds: {spent}.")
            runs.append(
                plan
                if parsed is None
                else TrialSpend(
                    sample_rate=max(plan.sample_rate, parsed.sample_rate),
                    noise_multiplier=min(plan.noise_multiplier, parsed.noise_multiplier),
                    steps=max(plan.steps, parsed.steps),
                )
            )
        return runs or [plan]

    def whole_guarantee(
        self,
        plan: RDPCurve,
        selection: RDPCurve,
        tuning: RDPCurve,
        *,
        final_runs: list[TrialSpend],
        tuning_overruns: list[Any],
        charged: int,
        delta: float,
    ) -> Guarantee:
        """The procedure's (ε, δ): ``tuning`` (the curve of every attempt on the sample), amplified, then the final runs.

        The guarantee has no RDP curve (it comes from privacy loss distributions). ``plan`` and
        ``selection`` are reported as parts. A tuning attempt that reported noisy scores past its
        plan released them off the sample: no amplified bound covers it, so ε is infinite.
        """
        off_sample = [spent for spent in tuning_overruns if _releases_scores(spent)]
        epsilon = math.inf if off_sample else self.whole_epsilon(tuning, final_runs=final_runs, delta=delta)
        return Guarantee(
            epsilon=epsilon,
            delta=delta,
            curve=None,
            charged_attempts=charged,
            epsilon_selection=selection.epsilon(delta=delta),
            epsilon_one_trial=plan.epsilon(delta=delta),
            release_epsilon=epsilon,
            release_delta=delta,
        )

    def whole_epsilon(self, tuning: RDPCurve, *, final_runs: list[TrialSpend], delta: float) -> float:
        """ε at ``delta`` of the tuning (its curve on the sample) amplified, composed with every final run."""
        runs = iter(final_runs or [self.final_plan])
        final = dpsgd_run_pld(next(runs))
        for run in runs:
            final = final.compose(dpsgd_run_pld(run))
        return subsampled_tuning_epsilon(
            profile_points(tuning), sample_rate=self.sample_rate, final_run=final, delta=delta
        )


def _releases_scores(spent: Any) -> bool:
    """True unless ``spent`` is a DP-SGD run without score releases (a bare curve may hold any)."""
    parsed = parse_report(spent)
    return not isinstance(parsed, TrialSpend) or bool(parsed.score_releases)


_KINDS: tuple[type[SearchMechanism], ...] = (
    RandomCountMechanism,
    ConstantOverheadMechanism,
    SearcherRelease,
    CompositionMechanism,
    HalvingMechanism,
    SubsampledTuningMechanism,
)
