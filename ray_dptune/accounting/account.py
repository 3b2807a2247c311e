"""The privacy account of one search: its mechanism, its plan, every attempt, and one rule.

Every adapter — searchers, the callback, the ledger, the report, the CLI — reads a
search's guarantee from here and computes none of its own. The account is a fold of
events (:meth:`SearchAccount.apply`), so a write-ahead journal of the same events
rebuilds it exactly after any fault (:mod:`ray_dptune.journal`).

**The rule.** The mechanism's bound covers a fixed number of attempts: the last
attempt of at most ``cover_cap`` accounted trials (K for random-count and DP-HyPO
searches, the final training for constant-overhead tuning, none for plain
composition). Every other attempt that may have touched the data — failed, superseded
by a retry, interrupted by a restore, of a trial beyond the cap, or a suggestion whose
fate is unknown — is composed at the full plan (Mironov 2017, Prop. 1: RDP composes
adaptively). A live attempt is covered while its driver lives; once the driver is gone
(:meth:`SearchAccount.restored`) it is charged. ``if_stopped_now=True`` charges live
attempts too: the durable worst case a ledger keeps.

No Ray, no torch.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any, Mapping

from ray_dptune import validate
from ray_dptune.accounting.guarantee import Guarantee
from ray_dptune.accounting.halving_budget import HalvingBudget
from ray_dptune.accounting.rdp import RDPCurve
from ray_dptune.accounting.selection import repeat_and_select
from ray_dptune.accounting.spend import curve_from_report, parse_report
from ray_dptune.accounting.svt import svt_curve
from ray_dptune.distributions import RunCountDistribution, distribution_from_dict
from ray_dptune.errors import PrivacyError

__all__ = [
    "ACCOUNT_VERSION",
    "ATTEMPT_STATES",
    "Mechanism",
    "SearchAccount",
]

ACCOUNT_VERSION = 1
ATTEMPT_STATES = ("suggested", "started", "reporting", "completed", "failed", "unknown")
LIVE_STATES = frozenset({"suggested", "started", "reporting"})
_COVERABLE = LIVE_STATES | {"completed"}
_KINDS = ("random_count", "constant_overhead", "release", "composition", "halving")


@dataclass(frozen=True)
class Mechanism:
    """How a search is bounded, as JSON-ready parameters (build with the class methods)."""

    kind: str
    params: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.kind not in _KINDS:
            raise ValueError(f"Unknown search mechanism {self.kind!r}; expected one of {_KINDS}.")

    @classmethod
    def random_count(cls, *, law: RunCountDistribution, num_trials: int, density_ratio: float = 1.0) -> Mechanism:
        """K ~ ``law`` runs, best released: P&S 2022 Thms 2/6; DP-HyPO Thm 1 when ``density_ratio`` = C/c > 1."""
        return cls(
            "random_count", {"law": law.to_dict(), "num_trials": int(num_trials), "density_ratio": float(density_ratio)}
        )

    @classmethod
    def constant_overhead(cls, *, epsilon_round: float, max_rounds: int) -> Mechanism:
        """Ding et al. Alg. 1: ``max_rounds`` ε_round-DP sparse-vector rounds per selection, then one training."""
        return cls("constant_overhead", {"epsilon_round": float(epsilon_round), "max_rounds": int(max_rounds)})

    @classmethod
    def release(cls, *, epsilon: float, delta: float, description: Mapping[str, Any] | None = None) -> Mechanism:
        """A searcher's own (ε, δ)-DP release (DP-BO, Kusner et al. 2015); trials are not accounted."""
        if not (math.isfinite(epsilon) and epsilon >= 0 and 0 <= delta < 1):
            raise ValueError(f"A release needs ε >= 0 finite and δ in [0, 1), got ({epsilon}, {delta}).")
        return cls(
            "release", {"epsilon": float(epsilon), "delta": float(delta), "description": dict(description or {})}
        )

    @classmethod
    def composition(cls) -> Mechanism:
        """Every accounted attempt composed at its plan (no selection theorem)."""
        return cls("composition", {})

    @classmethod
    def halving(
        cls, *, budget_units: int, max_t: int, law: RunCountDistribution | None = None, num_brackets: int = 1
    ) -> Mechanism:
        """Private successive halving: brackets of at most ``budget_units`` time units, a unit ``plan / max_t``.

        One bracket (``law`` None): the search costs ``budget_units`` units composed; K =
        ``num_brackets`` ~ ``law`` independent brackets, the best winner released: P&S Thms
        2/6 over that run (:mod:`~ray_dptune.accounting.halving_budget`).
        """
        budget_units = validate.integer("budget_units", budget_units, minimum=1)
        max_t = validate.integer("max_t", max_t, minimum=1)
        num_brackets = validate.integer("num_brackets", num_brackets)
        if law is None and num_brackets != 1:
            raise ValueError(f"num_brackets = {num_brackets} needs the law it was drawn from (law=).")
        law_record = None if law is None else law.to_dict()
        params = {"budget_units": budget_units, "max_t": max_t, "law": law_record, "num_brackets": num_brackets}
        return cls("halving", params)

    @property
    def cover_cap(self) -> int:
        """How many attempts (one per trial) the mechanism's own bound covers."""
        if self.kind == "random_count":
            return int(self.params["num_trials"])
        return 1 if self.kind == "constant_overhead" else 0

    @property
    def law(self) -> RunCountDistribution | None:
        return distribution_from_dict(self.params["law"]) if self.kind == "random_count" else None

    def selection_curve(self, plan: RDPCurve, *, selections: int = 1, generic: bool = True) -> RDPCurve:
        """The curve of the covered attempts when each satisfies ``plan``.

        ``selections`` counts the sparse-vector selections of a constant-overhead search
        that ran (each costs ``max_rounds`` rounds; at least one is charged from the start).
        """
        if self.kind == "halving":
            raise ValueError("A halving search's curve is its budget of plan units: read it from SearchAccount.")
        if self.kind == "random_count":
            return repeat_and_select(plan, self.law, density_ratio=self.params["density_ratio"], generic=generic)
        if self.kind == "constant_overhead":
            rounds = svt_curve(
                epsilon=self.params["epsilon_round"], rounds=self.params["max_rounds"], orders=plan.orders
            )
            return max(1, selections) * rounds + plan
        return RDPCurve.zero(plan.orders)

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "params": json.loads(json.dumps(dict(self.params)))}

    @classmethod
    def from_dict(cls, record: Mapping[str, Any]) -> Mechanism:
        return cls(record["kind"], dict(record.get("params", {})))


@dataclass
class _Trial:
    accounted: bool
    attempts: list[dict[str, Any]] = field(default_factory=list)

    @property
    def last(self) -> str | None:
        return self.attempts[-1]["state"] if self.attempts else None


class SearchAccount:
    """The record of one search and the one function that turns it into a guarantee.

    Mutate only through :meth:`apply` (or the named helpers that build its events), so
    that replaying a journal of the same events gives the same account. Every update
    and every read is O(1) in the number of trials (counters, and a curve cached per
    count of charged attempts).

    Args:
        mechanism: how the search is bounded.
        delta: δ of the reported (ε, δ).
        plan: the most one accounted attempt may spend (a TrialSpend or RDPCurve dict),
            or None until the first trial reports it.
        generic: also use the certified numeric P&S Lemma 7 bound for random-count searches (default:
            the tightest bound; False keeps the closed forms alone).
    """

    def __init__(self, mechanism: Mechanism, *, delta: float, plan: Mapping | None = None, generic: bool = True):
        if not 0.0 < float(delta) < 1.0:
            raise ValueError(f"delta must lie strictly between 0 and 1, got {delta}.")
        if mechanism.kind == "release" and mechanism.params["delta"] > float(delta):
            raise PrivacyError(
                f"The searcher releases at δ = {mechanism.params['delta']:g}, above this search's δ = {float(delta):g}: "
                "lower the searcher's δ or raise the search's."
            )
        self.mechanism = mechanism
        self.delta = float(delta)
        self.generic = bool(generic)
        self.plan: dict | None = None
        self.trials: dict[str, _Trial] = {}
        self.selections = 0  # sparse-vector selections run (constant overhead)
        self.releases: list[dict[str, Any]] = []  # searcher releases (DP-BO)
        self.restores = 0
        self._attempts = 0  # accounted attempts, every state
        self._coverable = 0  # accounted trials whose last attempt is live or completed
        self._completed = 0  # accounted trials whose last attempt completed
        self._trials_completed = 0  # every trial whose last attempt completed
        self._budget = HalvingBudget(mechanism.params) if mechanism.kind == "halving" else None
        self._cache: dict[tuple, Any] = {}
        if plan is not None:
            self.apply({"type": "plan", "plan": dict(plan)})

    # ------------------------------------------------------------------ events
    def apply(self, event: Mapping[str, Any]) -> None:
        """Folds one event into the account (the journal replays the same events)."""
        kind = event["type"]
        if kind == "plan":
            parse_report(event["plan"])
            self.plan = dict(event["plan"])
            return
        if kind == "restored":
            self.restores += 1
            for trial_id, trial in self.trials.items():
                if trial.last in LIVE_STATES:
                    self._set_state(trial_id, "unknown")
            return
        if kind == "selection":
            self.selections += 1
            return
        if kind == "release":
            self.releases.append(dict(event.get("release") or {}))
            return
        trial_id = str(event["trial_id"])
        units = self._units_added(event)
        if kind == "suggested":
            if trial_id not in self.trials:
                self._new_attempt(trial_id, bool(event["accounted"]), "suggested", units, _bracket(event))
        elif kind == "started":
            trial = self.trials.get(trial_id)
            if trial is None:
                self._new_attempt(trial_id, bool(event["accounted"]), "started", units)
            elif trial.last == "suggested":
                self._set_state(trial_id, "started")
            else:
                if trial.last in LIVE_STATES:  # restarted without an error event: interrupted
                    self._set_state(trial_id, "unknown")
                self._new_attempt(trial_id, trial.accounted, "started", units)
        elif kind == "charged":
            self.trials[trial_id].attempts[-1]["units"] += units
            self._budget.add(trial_id, units, bracket=None)  # a promotion: the trial's own bracket
        elif kind == "reported":
            trial = self.trials.get(trial_id)
            if trial is None or trial.last not in LIVE_STATES:
                self.apply({"type": "started", "trial_id": trial_id, "accounted": bool(event.get("accounted", True))})
                trial = self.trials[trial_id]
            trial.attempts[-1]["spent"] = event.get("spent")
            self._set_state(trial_id, "reporting")
            self._charge_overrun(trial_id, event.get("spent"))
        elif kind in ("completed", "failed"):
            trial = self.trials.get(trial_id)
            if trial is not None and trial.last in LIVE_STATES:
                self._set_state(trial_id, kind)
        else:
            raise ValueError(f"Unknown account event {kind!r}.")

    def admit(self, event: Mapping[str, Any]) -> None:
        """Raises PrivacyError when ``event`` would charge a halving bracket past its budget (nothing changes)."""
        if self._budget is None:
            return
        trial_id = str(event.get("trial_id"))
        if event["type"] == "charged" and trial_id not in self.trials:
            raise ValueError(f"Cannot charge trial {trial_id}: it was never suggested or started.")
        self._budget.check(trial_id, self._units_added(event), bracket=_bracket(event))

    @property
    def units_charged(self) -> int:
        """Time units charged so far (private successive halving; 0 otherwise)."""
        return 0 if self._budget is None else self._budget.total

    def bracket_units(self, bracket: int) -> int:
        """Time units charged to ``bracket`` of a halving search."""
        return self._budget.units.get(bracket, 0)

    def units_of(self, trial_id: str) -> int:
        """Time units charged to the trial's current attempt: how far it may run."""
        trial = self.trials.get(trial_id)
        return trial.attempts[-1]["units"] if trial is not None and trial.attempts else 0

    def within_charge(self, trial_id: str, spent: Mapping[str, Any]) -> bool:
        """True unless a halving search's trial reports spending more than its charged units of the plan."""
        if self._budget is None or self.plan is None:
            return True
        needed = self._budget.units_needed(self.plan, spent)
        return needed is not None and needed <= self.units_of(trial_id)

    def restored(self) -> None:
        """A new driver took over: every live attempt's fate is unknown, so it is charged."""
        self.apply({"type": "restored"})

    # ------------------------------------------------------------------ reading
    @property
    def num_trials_started(self) -> int:
        return len(self.trials)

    @property
    def trials_completed(self) -> int:
        return self._trials_completed

    def charged_attempts(self, *, if_stopped_now: bool = False) -> int:
        """Accounted attempts outside the mechanism's bound, each composed at the full plan."""
        if self.mechanism.kind == "halving":
            return 0  # every attempt is charged by its units, inside the budget
        covered = self._completed if if_stopped_now else self._coverable
        return self._attempts - min(self.mechanism.cover_cap, covered)

    def guarantee(self, *, if_stopped_now: bool = False) -> Guarantee:
        """The whole search's (ε, δ): the mechanism's bound plus every charged attempt at its plan."""
        charged = self.charged_attempts(if_stopped_now=if_stopped_now)
        key = ("guarantee", charged, self.selections, len(self.releases), self.units_charged, self._plan_key())
        cached = self._cache.get(key)
        if cached is None:
            cached = self._cache[key] = self._compute(charged)
        return cached

    def attempts_of(self, trial_id: str) -> list[dict[str, Any]]:
        return [dict(attempt) for attempt in self.trials[trial_id].attempts]

    def is_accounted(self, trial_id: str) -> bool:
        return trial_id in self.trials and self.trials[trial_id].accounted

    # ------------------------------------------------------------------ internals
    def _compute(self, charged: int) -> Guarantee:
        mechanism = self.mechanism
        if mechanism.kind == "release":
            count = max(1, len(self.releases))  # charged from the start; each further release composes
            epsilon = count * mechanism.params["epsilon"]
            release_delta = count * mechanism.params["delta"]
            if release_delta > self.delta:
                raise PrivacyError(
                    f"The searcher released {count} time(s) at δ = {mechanism.params['delta']:g} each, above this "
                    f"search's δ = {self.delta:g}: raise δ."
                )
            return Guarantee(epsilon, release_delta, None, 0, release_epsilon=epsilon, release_delta=release_delta)
        if self.plan is None:
            return Guarantee(None, self.delta, None, charged, reason="no trial has reported its plan yet")
        plan_curve, selection = self._selection()
        total = selection + charged * plan_curve if charged else selection
        adaptivity = None
        if mechanism.kind == "random_count" and mechanism.params["density_ratio"] > 1.0:
            uniform = repeat_and_select(plan_curve, mechanism.law, generic=self.generic)
            adaptivity = selection.epsilon(delta=self.delta) - uniform.epsilon(delta=self.delta)
        epsilon = total.epsilon(delta=self.delta)
        if mechanism.kind == "halving" and total.mechanism is not None:  # one DP-SGD run: its exact profile
            epsilon = min(epsilon, total.mechanism.epsilon(delta=self.delta))
        return Guarantee(
            epsilon=epsilon,
            delta=self.delta,
            curve=total,
            charged_attempts=charged,
            epsilon_selection=selection.epsilon(delta=self.delta),
            epsilon_one_trial=plan_curve.epsilon(delta=self.delta),
            epsilon_adaptivity=adaptivity,
        )

    def _selection(self) -> tuple[RDPCurve, RDPCurve]:
        key = (
            "selection",
            self.selections,
            tuple(sorted(self._budget.units.items(), key=str)) if self._budget else None,
            self._plan_key(),
        )
        if key not in self._cache:
            plan_curve = curve_from_report(self.plan)
            if self._budget is not None:
                selection = self._budget.curve(self.plan, generic=self.generic)
            else:
                selection = self.mechanism.selection_curve(plan_curve, selections=self.selections, generic=self.generic)
            self._cache[key] = (plan_curve, selection)
        return self._cache[key]

    def _charge_overrun(self, trial_id: str, spent: Any) -> None:
        """Charges a halving trial for units it reports having run beyond its charge (it ran them); a spend
        beyond the whole plan (no units cover it) is refused by the callback before it is recorded."""
        trial = self.trials[trial_id]
        if self._budget is None or self.plan is None or not trial.accounted:
            return
        needed = self._budget.units_needed(self.plan, spent)
        extra = (self._budget.max_t if needed is None else needed) - trial.attempts[-1]["units"]
        if extra > 0:
            trial.attempts[-1]["units"] += extra
            self._budget.add(trial_id, extra, bracket=None)

    def _units_added(self, event: Mapping[str, Any]) -> int:
        """The time units ``event`` charges in a halving search (0 otherwise)."""
        trial = self.trials.get(str(event.get("trial_id")))
        if self._budget is None or (trial is not None and not trial.accounted):
            return 0
        last = None if trial is None else (trial.last, trial.attempts[-1]["units"])
        return self._budget.units_added(event, last)

    def _plan_key(self) -> str | None:
        return None if self.plan is None else json.dumps(self.plan, sort_keys=True)

    def _new_attempt(
        self, trial_id: str, accounted: bool, state: str, units: int = 0, bracket: int | None = None
    ) -> None:
        trial = self.trials.setdefault(trial_id, _Trial(accounted))
        self._count(trial, -1)
        trial.attempts.append({"state": state, "spent": None, "units": units})
        if units:
            self._budget.add(trial_id, units, bracket=bracket)
        if trial.accounted:
            self._attempts += 1
        self._count(trial, +1)

    def _set_state(self, trial_id: str, state: str) -> None:
        trial = self.trials[trial_id]
        self._count(trial, -1)
        trial.attempts[-1]["state"] = state
        self._count(trial, +1)

    def _count(self, trial: _Trial, sign: int) -> None:
        """Adds (or removes) a trial's last attempt to the O(1) counters."""
        last = trial.last
        if last == "completed":
            self._trials_completed += sign
        if not trial.accounted:
            return
        if last in _COVERABLE:
            self._coverable += sign
        if last == "completed":
            self._completed += sign


def _bracket(event: Mapping[str, Any]) -> int | None:
    """The bracket a suggestion opens its trial in (0 by default); None for any other event."""
    return int(event.get("bracket", 0)) if event["type"] == "suggested" else None
