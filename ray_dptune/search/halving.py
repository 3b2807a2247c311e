"""HalvingSearcher: the configurations and the budget of private successive halving.

It is the searcher half of :class:`ray_dptune.PrivateASHAScheduler` (build it with
the scheduler, which holds Tune's knobs): it draws configurations uniformly from the
space, independently of every result, charges each new trial's first segment
(``grace_period`` time units) to the account before returning it, and ends the search
once the budget cannot pay for another first segment. The scheduler charges every
promotion through :meth:`HalvingSearcher.charge`; the rung scores live here, so they
are saved and restored with the searcher.

The bound is the budget's (``Mechanism.halving``): the whole run — every segment of
every trial, stopped, failed or promoted, and every reported score — is a
post-processing of ``budget_units`` units of the trial's plan composed adaptively.
"""

from __future__ import annotations

from typing import Any

from ray_dptune.accounting.account import Mechanism
from ray_dptune.search.base import PrivateSearcher
from ray_dptune.search.rungs import Rungs
from ray_dptune.search.space import sample_config

__all__ = ["HalvingSearcher"]


class HalvingSearcher(PrivateSearcher):
    """Uniform configurations while the budget pays for a first segment; the rungs' record.

    Args:
        rungs: the milestones and the recorded scores (the scheduler's).
        budget_units: time units all trials together may run (``Mechanism.halving``).
        metric, mode, seed: as for every DP searcher.
        space: the Tune space (default: ``param_space``).
    """

    threat_model = (
        "training set: every segment of every trial runs DP-SGD within one plan, and every decision to stop "
        "or promote a trial reads only its reported score (public validation data, or noised in the plan)"
    )
    coverage = (
        "The guarantee covers everything the search released: every trial's configuration (drawn independently "
        "of the data), reported scores, checkpoints and the released best trial, as long as trials report nothing "
        "but the score and the privacy records (adaptive composition of every segment within the budget)."
    )

    def __init__(
        self,
        *,
        rungs: Rungs,
        budget_units: int,
        metric: str | None = None,
        mode: str | None = None,
        space: dict[str, Any] | None = None,
        seed: int | None = None,
    ):
        super().__init__(metric=metric, mode=mode, seed=seed)
        self.rungs = rungs
        self._mechanism = Mechanism.halving(budget_units=budget_units, max_t=rungs.max_t)
        self._num_trials = budget_units // rungs.grace_period  # the most first segments the budget pays for
        self.suggested_by_this_driver: set[str] = set()  # not saved: a restored driver starts empty
        if space is not None:
            self._set_space(space)

    def privacy_mechanism(self) -> Mechanism:
        return self._mechanism

    def budget_left(self) -> int:
        """Time units the budget can still pay for."""
        return self._mechanism.params["budget_units"] - self.account().units_charged

    def charge(self, trial_id: str, units: int) -> None:
        """Charges ``units`` more time units to a running trial (durably) before it may run them.

        Raises:
            PrivacyError: the budget cannot pay for them (nothing is charged).
        """
        self.record_event({"type": "charged", "trial_id": trial_id, "units": int(units)})

    def record_suggestion(self, trial_id: str, config: dict[str, Any]) -> None:
        """Records the suggestion with its first segment's charge, before Tune may start it."""
        self.record_event(
            {"type": "suggested", "trial_id": trial_id, "accounted": True, "units": self.rungs.grace_period}
        )
        self.suggested_by_this_driver.add(trial_id)

    def privacy_details(self) -> dict[str, Any]:
        details = {
            "budget_units": self._mechanism.params["budget_units"],
            "milestones": list(self.rungs.milestones),
            "reduction_factor": self.rungs.reduction_factor,
        }
        if self.has_account:
            details["units_charged"] = self.account().units_charged
        best = self.rungs.best()
        if best is not None:
            details["released_trial_id"] = best
        return details

    def on_trial_complete(self, trial_id: str, result: dict | None = None, error: bool = False) -> None:
        """Nothing to learn: configurations never depend on results (the scheduler ranks the scores)."""

    def _done(self) -> bool:
        return self.budget_left() < self.rungs.grace_period

    def _propose(self, trial_id: str) -> tuple[dict[str, Any], dict[str, Any]]:
        config = sample_config(self._space, self._rng)
        return config, config

    def _extra_state(self) -> dict[str, Any]:
        return {"rungs": self.rungs.state()}

    def _restore_extra(self, state: dict[str, Any]) -> None:
        self.rungs.restore(state["rungs"])
