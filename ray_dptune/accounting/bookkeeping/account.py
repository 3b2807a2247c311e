"""The privacy account of one search: its mechanism, its plan, every attempt, and one rule.

Every adapter — searchers, the callback, the ledger, the report, the CLI — reads a
search's guarantee from here and computes none of its own. The account is a fold of
events (:meth:`SearchAccount.apply`), so a write-ahead journal of the same events
rebuilds it exactly after any fault (:mod:`ray_dptune.records.journal`).

**The rule.** The mechanism's bound covers a fixed number of attempts: the last
attempt of at most ``cover_cap`` accounted trials (K for random-count and DP-HyPO
searches, the final training for constant-overhead tuning, none for plain
composition). A trial's last attempt is covered whatever its end — completed, failed
with no retry, or interrupted by a live driver that recorded it — because a failed or
stopped run is one run of the base algorithm whose output is "failed": a post-processing
of that run, so it satisfies the plan's profile, ranked last and never released (the
bounds of P&S Thms 2/6, Lemma 7 and DP-HyPO Thm 1 hold for any base mechanism within the
profile). Every other attempt that may have touched the data — superseded by a retry
(charged when Tune grants the retry, before it can start), left live by a driver that
died (:meth:`SearchAccount.restored`), of a trial beyond the cap — is composed at the
full plan (Mironov 2017, Prop. 1: RDP composes adaptively). In a subsampled tuning
(:class:`~ray_dptune.accounting.bookkeeping.search_mechanism.SubsampledTuningMechanism`) the
trial marked ``final`` runs on all the data at the mechanism's final plan: every one of its
attempts is one more final run, composed (at least one, charged from the start), and the rule
above holds for the tuning's attempts on the sample. ``if_stopped_now=True``
charges live attempts too: the durable worst case a ledger keeps. An attempt that reports
spending past the plan is bounded as it ran: for every attempt, the plan gives way to a
curve both satisfy (:func:`ray_dptune.accounting.bookkeeping.spend.covering_curve`).

**The stated guarantee is the procedure's.** A search may reserve ``reserved_reruns``
attempts (re-runs after interruptions) before it starts; its guarantee is then
selection + max(reserved, charged)·plan: the same number before the search and after
it, whatever failed, until more attempts are charged than were reserved (then the
chain below goes on: the account never states less than what it charged). What was
charged is the operator's odometer (:meth:`SearchAccount.spent`), never the statement.

**A budget.** Each charged attempt adds the same plan curve, so the possible
guarantees form a chain: selection + n·plan. A search with a target admits an event
only when :meth:`SearchAccount.guarantee_after` stays within it, i.e. n never passes a
number fixed before the search by (target, plan, selection): a Rényi filter with a
data-independent budget (Feldman & Zrnic 2021, Thm 3.3), so the cap holds although the
number of retries depends on the run.

No Ray, no torch.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, get_args

from ray_dptune import validate
from ray_dptune.accounting.bookkeeping.guarantee import Guarantee
from ray_dptune.accounting.bookkeeping.search_mechanism import (
    SearcherRelease,
    SearchMechanism,
    SubsampledTuningMechanism,
)
from ray_dptune.accounting.bookkeeping.spend import covering_curve, curve_from_report, parse_report, report_covers
from ray_dptune.accounting.curves.rdp import RDPCurve
from ray_dptune.errors import PrivacyError

__all__ = [
    "ACCOUNT_VERSION",
    "ATTEMPT_STATES",
    "CHARGING_EVENTS",
    "ENDED_STATES",
    "EVENT_TYPES",
    "LIVE_STATES",
    "AttemptState",
    "EventType",
    "SearchAccount",
]

ACCOUNT_VERSION = 1
AttemptState = Literal["suggested", "started", "reporting", "completed", "failed", "interrupted", "unknown"]
"""Where an attempt stands; "unknown": left live by a driver that died."""
EventType = Literal[
    "plan",
    "restored",
    "selection",
    "release",
    "ended",
    "suggested",
    "started",
    "charged",
    "reported",
    "completed",
    "failed",
    "interrupted",
]
"""The events a search's account folds (and its journal holds), each a dict with this ``"type"``."""
ATTEMPT_STATES: tuple[AttemptState, ...] = get_args(AttemptState)
EVENT_TYPES: tuple[EventType, ...] = get_args(EventType)
LIVE_STATES: frozenset[AttemptState] = frozenset({"suggested", "started", "reporting"})
ENDED_STATES: frozenset[AttemptState] = frozenset({"completed", "failed", "interrupted"})
"""A last attempt in one of these ended under a live driver and is covered by the mechanism's bound
(unless it failed and Tune retries it: ``retry`` in the attempt)."""
CHARGING_EVENTS: frozenset[EventType] = frozenset({"suggested", "started", "failed", "selection", "release", "charged"})
"""Events that may add privacy cost before anything runs: a budget admits them first."""


@dataclass
class _Trial:
    accounted: bool
    final: bool = False  # the final run on all the data of a subsampled tuning (its own plan)
    attempts: list[dict[str, Any]] = field(default_factory=list)

    @property
    def last(self) -> AttemptState | None:
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
        reserved_reruns: attempts the procedure may charge beyond its bound's cover (re-runs after
            interruptions), part of the stated guarantee from the start.
    """

    def __init__(
        self,
        mechanism: SearchMechanism,
        *,
        delta: float,
        plan: Mapping[str, Any] | None = None,
        generic: bool = True,
        reserved_reruns: int = 0,
    ):
        if not 0.0 < float(delta) < 1.0:
            raise ValueError(f"delta must lie strictly between 0 and 1, got {delta}.")
        if isinstance(mechanism, SearcherRelease) and mechanism.delta > float(delta):
            raise PrivacyError(
                f"The searcher releases at δ = {mechanism.delta:g}, above this search's δ = {float(delta):g}: "
                "lower the searcher's δ or raise the search's."
            )
        mechanism.check_reserved_reruns(reserved_reruns)
        self.mechanism = mechanism
        self.delta = float(delta)
        self.reserved_reruns = validate.integer("reserved_reruns", reserved_reruns, minimum=0)
        self.generic = bool(generic)
        self.plan: dict[str, Any] | None = None
        self.trials: dict[str, _Trial] = {}
        self.selections = 0  # sparse-vector selections run (constant overhead)
        self.releases: list[dict[str, Any]] = []  # searcher releases (DP-BO)
        self.restores = 0
        self.ended: dict[str, Any] | None = None  # how the last driver ended the search (complete or why not)
        self._attempts = 0  # accounted attempts, every state
        self._coverable = 0  # accounted trials whose last attempt is live or ended (not to be retried)
        self._settled = 0  # accounted trials whose last attempt ended (not to be retried)
        self._trials_completed = 0  # every trial whose last attempt completed
        self._budget = mechanism.budget()
        self.beyond_plan: dict[tuple[str, int], Any] = {}  # (trial, attempt) -> a spend the plan does not cover
        self.final_beyond_plan: dict[tuple[str, int], Any] = {}  # the same for final runs, past the final plan
        self._cache: dict[tuple[Any, ...], Any] = {}
        if plan is not None:
            self.apply({"type": "plan", "plan": dict(plan)})

    # ------------------------------------------------------------------ events
    def apply(self, event: Mapping[str, Any]) -> None:
        """Folds one event into the account (the journal replays the same events)."""
        handler = _HANDLERS.get(event["type"])
        if handler is None:
            raise ValueError(f"Unknown account event {event['type']!r}; expected one of {EVENT_TYPES}.")
        handler(self, event)

    def _on_plan(self, event: Mapping[str, Any]) -> None:
        self.mechanism.check_plan(parse_report(event["plan"]))
        self.plan = dict(event["plan"])

    def _on_restored(self, event: Mapping[str, Any]) -> None:
        self.restores += 1
        for trial_id, live in self.trials.items():
            if live.last in LIVE_STATES:
                self._set_state(trial_id, "unknown")

    def _on_selection(self, event: Mapping[str, Any]) -> None:
        self.selections += 1

    def _on_release(self, event: Mapping[str, Any]) -> None:
        self.releases.append(dict(event.get("release") or {}))

    def _on_ended(self, event: Mapping[str, Any]) -> None:
        self.ended = {"complete": bool(event["complete"]), "reason": event.get("reason")}

    def _on_suggested(self, event: Mapping[str, Any]) -> None:
        trial_id = str(event["trial_id"])
        units = self._units_added(event)
        if trial_id not in self.trials:
            self._new_attempt(
                trial_id, bool(event["accounted"]), "suggested", units, _bracket(event), final=bool(event.get("final"))
            )

    def _on_started(self, event: Mapping[str, Any]) -> None:
        trial_id = str(event["trial_id"])
        units = self._units_added(event)
        trial = self.trials.get(trial_id)
        if trial is None:
            self._new_attempt(trial_id, bool(event["accounted"]), "started", units, final=bool(event.get("final")))
        elif trial.last == "suggested":
            self._set_state(trial_id, "started")
        else:
            if trial.last in LIVE_STATES:  # restarted without an error event: interrupted
                self._set_state(trial_id, "unknown")
            self._new_attempt(trial_id, trial.accounted, "started", units)

    def _on_charged(self, event: Mapping[str, Any]) -> None:
        trial_id = str(event["trial_id"])
        units = self._units_added(event)
        self.trials[trial_id].attempts[-1]["units"] += units
        assert self._budget is not None  # only a halving search's scheduler charges units
        self._budget.add(trial_id, units, bracket=None)  # a promotion: the trial's own bracket

    def _on_reported(self, event: Mapping[str, Any]) -> None:
        trial_id = str(event["trial_id"])
        trial = self.trials.get(trial_id)
        if trial is None or trial.last not in LIVE_STATES:  # an unknown trial may be a final run: bounded as one
            final = trial.final if trial is not None else self.mechanism.has_final_run
            started = {"type": "started", "trial_id": trial_id, "accounted": bool(event.get("accounted", True))}
            self.apply({**started, "final": final})
            trial = self.trials[trial_id]
        trial.attempts[-1]["spent"] = spent = event.get("spent")
        self._set_state(trial_id, "reporting")
        plan = self.plan_of(trial_id)
        if trial.accounted and None not in (plan, spent) and not report_covers(plan, spent):
            beyond = self.final_beyond_plan if trial.final else self.beyond_plan
            beyond[(trial_id, len(trial.attempts))] = spent  # it ran: bounded as it ran
        self._charge_overrun(trial_id, spent)

    def _on_ended_attempt(self, event: Mapping[str, Any]) -> None:
        """completed, failed or interrupted: the live attempt ends so (a later duplicate changes nothing)."""
        trial = self.trials.get(str(event["trial_id"]))
        if trial is None or trial.last not in LIVE_STATES:
            return
        attempt = trial.attempts[-1]
        self._count(trial, -1)
        attempt["state"] = event["type"]
        if event.get("retry"):
            attempt["retry"] = True  # Tune re-runs the trial: this attempt is charged from now on
        if event.get("refused"):
            attempt["refused"] = str(event["refused"])  # a retry the budget could not pay for
        if event.get("untrained") and attempt["spent"] is None:
            attempt["untrained"] = str(event["untrained"])  # refused before its first training step
        self._count(trial, +1)

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
        assert self._budget is not None  # only a halving search has brackets
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
        """Trials suggested or started so far, accounted or not."""
        return len(self.trials)

    @property
    def trials_completed(self) -> int:
        """Trials whose last attempt completed, accounted or not."""
        return self._trials_completed

    def charged_attempts(self, *, if_stopped_now: bool = False) -> int:
        """Accounted attempts outside the mechanism's bound, each composed at the full plan."""
        if self.mechanism.pays_by_units:
            return 0  # every attempt is charged by its units, inside the budget
        covered = self._settled if if_stopped_now else self._coverable
        return self._attempts - min(self.mechanism.cover_cap, covered)

    def guarantee(self, *, if_stopped_now: bool = False, extra_charges: int = 0) -> Guarantee:
        """The whole search's stated (ε, δ): the mechanism's bound plus max(reserved, charged) attempts at the plan.

        Args:
            if_stopped_now: charge live attempts too (the durable worst case).
            extra_charges: that many more attempts composed at the plan (headroom for retries).
        """
        charged = self._charged(if_stopped_now=if_stopped_now, extra_charges=extra_charges)
        if self.refused_before_training() and not extra_charges:
            return self._untouched()
        return self._guarantee(max(charged, self.reserved_reruns), charged)

    def spent(self, *, if_stopped_now: bool = False) -> Guarantee:
        """What the attempts charged so far compose to: the operator's odometer, at most the stated guarantee."""
        charged = self._charged(if_stopped_now=if_stopped_now, extra_charges=0)
        if self.refused_before_training():
            return self._untouched()
        return self._guarantee(charged, charged)

    def refused_before_training(self) -> bool:
        """True when the search ended without touching the data.

        Every accounted attempt of the search, whatever its state, ended refused before its first
        training step (:class:`~ray_dptune.errors.RefusedBeforeTraining`, with no report). An
        attempt merely suggested counts as one that may have run: Ray builds a trial's actor (and a
        class trainable's ``setup``) before the accountant hears of its start.

        Its whole output is then a function of public inputs (the code, the configurations the
        searcher drew before any result, the training set's size every plan already assumes), so
        the search is (0, 0)-DP. O(trials); read when a search has ended.
        """
        if self.ended is None or self.selections or self.releases or self.mechanism.releases_itself:
            return False
        attempts = [attempt for trial in self.trials.values() if trial.accounted for attempt in trial.attempts]
        return bool(attempts) and all(attempt.get("untrained") for attempt in attempts)

    def running(self) -> int:
        """Accounted attempts suggested or started and not ended: a stopping search waits for each (Ray's speed decides none)."""
        return sum(1 for trial in self.trials.values() if trial.accounted and trial.last in LIVE_STATES)

    def _untouched(self) -> Guarantee:
        reason = next(
            attempt["untrained"]
            for trial in self.trials.values()
            for attempt in trial.attempts
            if attempt.get("untrained")
        )
        return Guarantee(
            0.0, self.delta, RDPCurve.zero(), 0, reason=f"refused before any training step touched the data: {reason}"
        )

    def _charged(self, *, if_stopped_now: bool, extra_charges: int) -> int:
        if extra_charges < 0:
            raise ValueError(f"extra_charges must be >= 0, got {extra_charges}.")
        if extra_charges and self.mechanism.pays_by_units:
            raise ValueError("A halving search pays for every attempt from its budget of time units, not by attempts.")
        return self.charged_attempts(if_stopped_now=if_stopped_now) + extra_charges

    def _guarantee(self, composed: int, charged: int) -> Guarantee:
        """The mechanism's bound with ``composed`` attempts at the plan on top; ``charged`` of them happened."""
        key: tuple[Any, ...] = (
            "guarantee",
            composed,
            charged,
            self.selections,
            len(self.releases),
            self.units_charged,
            self._plan_key(),
        )
        key += (json.dumps(list(self.beyond_plan.values()), sort_keys=True),)
        key += (self._final_key(),)
        cached = self._cache.get(key)
        if cached is None:
            cached = self._cache[key] = self._compute(composed, charged)
        return cached

    def guarantee_after(self, event: Mapping[str, Any]) -> Guarantee:
        """The guarantee once ``event`` is applied, the account unchanged: the trial and counters it touches are put back, O(1).

        A halving search's events are admitted by its budget of units instead (:meth:`admit`).
        """
        if event["type"] not in CHARGING_EVENTS or self._budget is not None:
            return self.guarantee()
        trial_id = str(event.get("trial_id"))
        saved_trial = self.trials.get(trial_id)
        saved = (
            self._attempts,
            self._coverable,
            self._settled,
            self._trials_completed,
            self.selections,
            list(self.releases),
        )
        saved_copy = None if saved_trial is None else copy.deepcopy(saved_trial)
        try:
            self.apply(event)
            return self.guarantee()
        finally:
            self._attempts, self._coverable, self._settled, self._trials_completed = saved[:4]
            self.selections, self.releases = saved[4], saved[5]
            if saved_copy is None:
                self.trials.pop(trial_id, None)
            else:
                self.trials[trial_id] = saved_copy

    def unfinished(self) -> dict[str, int]:
        """Accounted trials whose last attempt did not end its run, by why: ``{"live", "interrupted", "unknown", "refused"}``.

        A trial failed with its retry refused by the budget counts as refused.
        """
        counts = {"live": 0, "interrupted": 0, "unknown": 0, "refused": 0}
        for trial in self.trials.values():
            if not trial.accounted or not trial.attempts:
                continue
            last = trial.attempts[-1]
            if last.get("refused"):
                counts["refused"] += 1
            elif last["state"] in LIVE_STATES:
                counts["live"] += 1
            elif last["state"] in ("interrupted", "unknown"):
                counts[last["state"]] += 1
        return counts

    def attempts_of(self, trial_id: str) -> list[dict[str, Any]]:
        """Copies of the attempts of ``trial_id``, oldest first: the state, spend, units and flags of each."""
        return [dict(attempt) for attempt in self.trials[trial_id].attempts]

    def plan_of(self, trial_id: str) -> dict[str, Any] | None:
        """The plan ``trial_id``'s attempts must fit: the final plan for a subsampled tuning's final run, else the search's."""
        trial = self.trials.get(trial_id)
        if trial is not None and trial.final and isinstance(self.mechanism, SubsampledTuningMechanism):
            return dict(self.mechanism.final_plan_record)
        return self.plan

    def is_final(self, trial_id: str) -> bool:
        """True when ``trial_id`` is a subsampled tuning's final run on all the data."""
        return trial_id in self.trials and self.trials[trial_id].final

    def is_accounted(self, trial_id: str) -> bool:
        """True when the account knows ``trial_id`` and counts its attempts in the guarantee."""
        return trial_id in self.trials and self.trials[trial_id].accounted

    # ------------------------------------------------------------------ internals
    def _compute(self, composed: int, charged: int) -> Guarantee:
        mechanism = self.mechanism
        if isinstance(mechanism, SearcherRelease):  # the searcher's own releases are the whole guarantee
            return mechanism.release_guarantee(len(self.releases), delta=self.delta)
        if self.plan is None:
            return Guarantee(None, self.delta, None, charged, reason="no trial has reported its plan yet")
        plan_curve, selection = self._selection()
        total = selection + composed * plan_curve if composed else selection
        if isinstance(mechanism, SubsampledTuningMechanism):
            ran = [  # every final attempt that may have run: what it reported past the final plan, or None
                self.final_beyond_plan.get((trial_id, n))
                for trial_id, trial in self.trials.items()
                if trial.final and trial.accounted
                for n, attempt in enumerate(trial.attempts, 1)
                if not attempt.get("untrained")
            ]
            parts: dict[str, Any] = {"tuning_overruns": list(self.beyond_plan.values()), "charged": charged}
            return mechanism.whole_guarantee(
                plan_curve, selection, total, final_runs=mechanism.final_runs(ran), delta=self.delta, **parts
            )
        epsilon = total.epsilon(delta=self.delta)
        if mechanism.pays_by_units and total.mechanism is not None:  # one DP-SGD run: its exact profile
            epsilon = min(epsilon, total.mechanism.epsilon(delta=self.delta))
        return Guarantee(
            epsilon=epsilon,
            delta=self.delta,
            curve=total,
            charged_attempts=charged,
            epsilon_selection=selection.epsilon(delta=self.delta),
            epsilon_one_trial=plan_curve.epsilon(delta=self.delta),
            epsilon_adaptivity=mechanism.adaptivity(plan_curve, selection, delta=self.delta, generic=self.generic),
        )

    def _selection(self) -> tuple[RDPCurve, RDPCurve]:
        assert self.plan is not None  # _compute returns before selecting while no plan is known
        key = (
            "selection",
            self.selections,
            tuple(sorted(self._budget.units.items(), key=str)) if self._budget else None,
            self._plan_key(),
            json.dumps(list(self.beyond_plan.values()), sort_keys=True),
        )
        if key not in self._cache:
            beyond = list(self.beyond_plan.values())
            plan_curve = covering_curve([self.plan, *beyond]) if beyond else curve_from_report(self.plan)
            if self._budget is not None:
                selection = self._budget.curve(self.plan, generic=self.generic, beyond_plan=self.beyond_plan)
            else:
                selection = self.mechanism.selection_curve(plan_curve, selections=self.selections, generic=self.generic)
            self._cache[key] = (plan_curve, selection)
        cached: tuple[RDPCurve, RDPCurve] = self._cache[key]
        return cached

    def _charge_overrun(self, trial_id: str, spent: Any) -> None:
        """Charges a halving trial for units it reports having run beyond its charge (it ran them).

        A spend no number of units covers is charged max_t units here and composed whole by the budget's curve.
        """
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
        last = None if trial is None else (trial.attempts[-1]["state"], trial.attempts[-1]["units"])
        return self._budget.units_added(event, last)

    def _final_key(self) -> str:
        """The final runs' attempts and their spends past the final plan (what the subsampled bound reads)."""
        finals = [[bool(a.get("untrained")) for a in trial.attempts] for trial in self.trials.values() if trial.final]
        return json.dumps([finals, list(self.final_beyond_plan.values())], sort_keys=True)

    def _plan_key(self) -> str | None:
        return None if self.plan is None else json.dumps(self.plan, sort_keys=True)

    def _new_attempt(
        self,
        trial_id: str,
        accounted: bool,
        state: AttemptState,
        units: int = 0,
        bracket: int | None = None,
        *,
        final: bool = False,
    ) -> None:
        trial = self.trials.setdefault(trial_id, _Trial(accounted, final))
        self._count(trial, -1)
        trial.attempts.append({"state": state, "spent": None, "units": units})
        if units:
            assert self._budget is not None  # units are charged only in a halving search (_units_added)
            self._budget.add(trial_id, units, bracket=bracket)
        if trial.accounted and not trial.final:
            self._attempts += 1
        self._count(trial, +1)

    def _set_state(self, trial_id: str, state: AttemptState) -> None:
        trial = self.trials[trial_id]
        self._count(trial, -1)
        trial.attempts[-1]["state"] = state
        self._count(trial, +1)

    def _count(self, trial: _Trial, sign: int) -> None:
        """Adds (or removes) a trial's last attempt to the O(1) counters."""
        last = trial.last
        if last == "completed":
            self._trials_completed += sign
        if not trial.accounted or trial.final:
            return  # a final run is composed whole by its mechanism (_final_runs), not covered or charged here
        ended = last in ENDED_STATES and not trial.attempts[-1].get("retry")
        if ended or last in LIVE_STATES:
            self._coverable += sign
        if ended:
            self._settled += sign


def _bracket(event: Mapping[str, Any]) -> int | None:
    """The bracket a suggestion opens its trial in (0 by default); None for any other event."""
    return int(event.get("bracket", 0)) if event["type"] == "suggested" else None


_HANDLERS: dict[EventType, Callable[[SearchAccount, Mapping[str, Any]], None]] = {
    "plan": SearchAccount._on_plan,
    "restored": SearchAccount._on_restored,
    "selection": SearchAccount._on_selection,
    "release": SearchAccount._on_release,
    "ended": SearchAccount._on_ended,
    "suggested": SearchAccount._on_suggested,
    "started": SearchAccount._on_started,
    "charged": SearchAccount._on_charged,
    "reported": SearchAccount._on_reported,
    "completed": SearchAccount._on_ended_attempt,
    "failed": SearchAccount._on_ended_attempt,
    "interrupted": SearchAccount._on_ended_attempt,
}
"""One handler per :data:`EventType` (checked by the account's tests)."""
