"""The budget of private successive halving: time units charged per bracket, and its bound.

A halving search runs brackets of asynchronous successive halving. Each bracket may
charge at most ``budget_units`` time units (a unit is ``plan / max_t``: one epoch's
DP-SGD steps and score releases), and every unit is charged before it runs. Whatever a
bracket decides from its own released scores, it is then a post-processing of
``budget_units`` units composed adaptively (pad it with unused units: Mironov 2017,
Prop. 1; DP-SGD alone: one run of that many steps, whose exact PLD profile and
trade-off apply). So:

* one bracket (``law`` None): the search costs ``budget_units`` units composed;
* K ~ ``law`` independent brackets, the best bracket's winner released: Papernot &
  Steinke 2022, Thms 2/6 with that run as the base mechanism (``repeat_and_select``).

Units charged outside any bracket (a trial Tune started that the searcher never
suggested) are composed on top at the units charged to them. A trial that reports
spending more units than were charged to it has them charged when the report arrives,
past the budget if need be (the bracket's bound then grows to what it ran); a spend no
number of units covers (another σ or q) is composed whole into the brackets' run.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from ray_dptune import validate
from ray_dptune.accounting.bookkeeping.spend import (
    TrialSpend,
    curve_from_report,
    parse_report,
    report_covers,
    unit_spend,
)
from ray_dptune.accounting.bounds.distributions import distribution_from_dict
from ray_dptune.accounting.bounds.selection import repeat_and_select
from ray_dptune.accounting.curves.rdp import RDPCurve
from ray_dptune.errors import PrivacyError

__all__ = ["HalvingBudget"]


class HalvingBudget:
    """Units charged per bracket (and outside any) of one halving search's account."""

    def __init__(self, params: Mapping[str, Any]):
        self.budget_units = int(params["budget_units"])
        self.max_t = int(params["max_t"])
        self.law = None if params.get("law") is None else distribution_from_dict(params["law"])
        self.units: dict[int | None, int] = {}  # bracket (None: outside any) -> units charged
        self.bracket_of: dict[str, int | None] = {}

    @property
    def total(self) -> int:
        """Time units charged so far, every bracket together."""
        return sum(self.units.values())

    def units_added(self, event: Mapping[str, Any], last: tuple[str, int] | None) -> int:
        """Units ``event`` charges; ``last``: (state, units) of the trial's current attempt, None for a new trial.

        A suggestion charges its first segment, a promotion its next one; a trial started
        without a suggestion may run its whole plan (outside any bracket); a retried or
        restarted attempt may re-run everything charged to the attempt before it.
        """
        kind = event["type"]
        if kind == "charged" or (kind == "suggested" and last is None):
            return validate.integer("units", event.get("units"), minimum=1)
        if kind == "started" and last is None:
            return self.max_t if event.get("accounted", True) else 0
        if kind != "started":
            return 0
        assert last is not None  # a new trial's start returned above
        return last[1] if last[0] != "suggested" else 0

    def check(self, trial_id: str, units: int, *, bracket: int | None) -> None:
        """Raises PrivacyError when charging ``units`` would take the trial's bracket past its budget."""
        bracket = self.bracket_of.get(trial_id, bracket)
        if bracket is not None and self.units.get(bracket, 0) + units > self.budget_units:
            raise PrivacyError(
                f"Charging {units} more time unit(s) to trial {trial_id} would take bracket {bracket} past its budget "
                f"of {self.budget_units} units ({self.units.get(bracket, 0)} charged): the segment must not run."
            )

    def add(self, trial_id: str, units: int, *, bracket: int | None) -> None:
        """Charges ``units`` to the trial's bracket: the first one it was charged in, else ``bracket``."""
        bracket = self.bracket_of.setdefault(trial_id, bracket)
        self.units[bracket] = self.units.get(bracket, 0) + units

    def units_needed(self, plan: Mapping[str, Any], spent: Any) -> int | None:
        """The fewest units of ``plan`` whose charge covers the ``spent`` report; None when none does.

        None: the spend is not DP-SGD at the plan's σ and q (its cost is not a number of units).
        """
        unit = unit_spend(plan, units_per_plan=self.max_t)
        parsed = parse_report(spent)
        if not isinstance(parsed, TrialSpend):
            return None
        counts = [(parsed.steps, unit.steps), (parsed.score_releases, unit.score_releases)]
        if any(used and not per_unit for used, per_unit in counts):
            return None
        needed = max(math.ceil(used / per_unit) for used, per_unit in counts if per_unit)
        return needed if report_covers(unit.repeated(needed).to_dict(), spent) else None

    def curve(
        self, plan: Mapping[str, Any], *, generic: bool, beyond_plan: Mapping[tuple[str, int], Any] | None = None
    ) -> RDPCurve:
        """The search's curve: its brackets' bound, plus units charged outside any bracket.

        ``beyond_plan``: (trial id, attempt) -> a spend reported past the plan. One that no number of
        units covers is composed whole: into every bracket's run for a trial in a bracket (it
        may be in any of them), on top of the whole bound for a trial outside every bracket.
        """
        unit = unit_spend(plan, units_per_plan=self.max_t)
        bracket = unit.repeated(max([self.budget_units, *(u for b, u in self.units.items() if b is not None)]))
        base, on_top = bracket.curve(), []
        for (trial_id, _), spent in (beyond_plan or {}).items():
            if self.units_needed(plan, spent) is None:
                if self.bracket_of.get(trial_id) is None:
                    on_top.append(curve_from_report(spent))
                else:
                    base = base + curve_from_report(spent)
        curve = base if self.law is None else repeat_and_select(base, self.law, generic=generic)
        outside = self.units.get(None, 0)
        curve = curve + unit.repeated(outside).curve() if outside else curve
        for spent_curve in on_top:
            curve = curve + spent_curve
        return curve
