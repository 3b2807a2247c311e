"""HalvingSearcher: the configurations, brackets and budget of private successive halving.

It is the searcher half of :class:`ray_dptune.PrivateASHAScheduler` (build it with
the scheduler, which holds Tune's knobs): it draws configurations uniformly from the
space, independently of every result, charges each new trial's first segment
(``grace_period`` time units) to the account before returning it, and moves on when
the bracket's budget cannot pay for another first segment. The scheduler charges every
promotion through :meth:`HalvingSearcher.charge`; the rung scores live here, one
:class:`~ray_dptune.search.rungs.Rungs` per bracket, so they are saved and restored
with the searcher.

Two routes (``SearchMechanism.halving``, :mod:`~ray_dptune.accounting.bookkeeping.halving_budget`):

* one bracket: every segment of every trial and every score is covered, by the
  composition of ``budget_units`` units;
* ``repetitions`` = a law of K: K independent brackets (each decides from its own
  scores only), the best bracket winner released, covered by P&S Thms 2/6 over one
  bracket; the other trials' scores are then not covered (purge them).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypedDict

from ray.tune.schedulers import TrialScheduler

from ray_dptune.accounting.bookkeeping.search_mechanism import HalvingMechanism, SearchMechanism
from ray_dptune.accounting.bounds.distributions import RunCountDistribution
from ray_dptune.search.base import PrivateSearcher
from ray_dptune.search.rungs import Rungs
from ray_dptune.search.space import sample_config

__all__ = ["HalvingSearcher"]

_COMPOSITION_COVERAGE = (
    "The guarantee covers everything the search released: every trial's configuration (drawn independently "
    "of the data), reported scores, checkpoints and the released best trial, as long as trials report nothing "
    "but the score and the privacy records (adaptive composition of every segment within the budget)."
)
_BRACKETS_COVERAGE = (
    "The guarantee covers the released output only: the best bracket winner's configuration, score and "
    "checkpoint (release_best). The other trials' scores and which trials were stopped are not covered "
    "(release_best(..., purge=True) deletes them)."
)


class _Knobs(TypedDict):
    grace_period: int
    reduction_factor: float
    max_t: int


class HalvingSearcher(PrivateSearcher):
    """Uniform configurations, bracket after bracket, while the budget pays for a first segment.

    Args:
        grace_period: the first milestone (:class:`~ray_dptune.search.rungs.Rungs`).
        reduction_factor: the milestones' ratio.
        max_t: the last milestone.
        budget_units: time units one bracket's trials together may run.
        repetitions: None for one bracket; else the law K (the number of brackets) is drawn from, once.
        metric: the score, as for every DP searcher.
        mode: "max" or "min".
        seed: of the configurations' draws; None draws from the OS's secure source.
        space: the Tune space (default: ``param_space``).
    """

    threat_model = (
        "training set: every segment of every trial runs DP-SGD within one plan, and every decision to stop "
        "or promote a trial reads only its own bracket's reported scores (public validation data, or noised "
        "in the plan)"
    )
    coverage = _COMPOSITION_COVERAGE
    scheduler: TrialScheduler | None = None
    """The PrivateASHAScheduler that built this searcher (``private_tune_config``'s default scheduler)."""

    def __init__(
        self,
        *,
        grace_period: int,
        reduction_factor: float,
        max_t: int,
        budget_units: int,
        repetitions: RunCountDistribution | None = None,
        metric: str | None = None,
        mode: str | None = None,
        space: dict[str, Any] | None = None,
        seed: int | None = None,
    ):
        super().__init__(metric=metric, mode=mode, seed=seed)
        self._knobs: _Knobs = {"grace_period": grace_period, "reduction_factor": reduction_factor, "max_t": max_t}
        self.rungs = [Rungs(**self._knobs, mode=mode)]  # one per bracket opened
        if repetitions is not None and not isinstance(repetitions, RunCountDistribution):
            raise TypeError(f"repetitions must be a law of K such as Poisson(mean=4), got {repetitions!r}.")
        self._law = repetitions
        brackets = 1 if repetitions is None else repetitions.sample(self._rng)  # drawn once, never again
        self._mechanism = SearchMechanism.halving(
            budget_units=budget_units, max_t=max_t, law=repetitions, num_brackets=brackets
        )
        self._num_trials = brackets * (budget_units // grace_period)  # the most first segments it pays for
        if repetitions is not None:
            self.coverage = _BRACKETS_COVERAGE
        self.suggested_by_this_driver: set[str] = set()  # not saved: a restored driver starts empty
        if space is not None:
            self._set_space(space)

    @property
    def num_brackets(self) -> int:
        """K, the number of brackets, drawn once from the law (1 without one)."""
        return self._mechanism.num_brackets

    def privacy_mechanism(self) -> HalvingMechanism:
        """Private successive halving: every attempt is paid in time units from its bracket's budget."""
        return self._mechanism

    def set_mode(self, mode: str | None) -> None:
        """Sets the mode the rungs compare scores by, where none was given."""
        self._mode = self._mode or mode
        for rungs in self.rungs:
            rungs.mode = rungs.mode or self._mode

    def rungs_of(self, trial_id: str) -> Rungs | None:
        """The rungs of the trial's bracket; None for a trial this search does not know (stop it)."""
        return self.rungs[self._suggested[trial_id]["bracket"]] if trial_id in self._suggested else None

    def budget_left(self) -> int:
        """Time units the current bracket can still pay for."""
        return self._mechanism.budget_units - self.account().bracket_units(len(self.rungs) - 1)

    def charge(self, trial_id: str, units: int) -> None:
        """Charges ``units`` more time units to a running trial (durably) before it may run them.

        Raises:
            PrivacyError: its bracket's budget cannot pay for them (nothing is charged).
        """
        self.record_event({"type": "charged", "trial_id": trial_id, "units": int(units)})

    def record_suggestion(self, trial_id: str, config: Mapping[str, Any]) -> None:
        """Records the suggestion with its first segment's charge, before Tune may start it."""
        self.record_event(
            {
                "type": "suggested",
                "trial_id": trial_id,
                "accounted": True,
                "units": self.rungs[-1].grace_period,
                "bracket": len(self.rungs) - 1,
            }
        )
        self.suggested_by_this_driver.add(trial_id)

    def privacy_details(self) -> dict[str, Any]:
        """The budget, the brackets, the milestones, the units charged, and the best bracket winner as released."""
        details = {
            "budget_units": self._mechanism.budget_units,
            "brackets": len(self.rungs) if self.num_brackets else 0,
            "num_brackets": self.num_brackets,
            "milestones": list(self.rungs[0].milestones),
            "reduction_factor": self.rungs[0].reduction_factor,
        }
        if self.has_account:
            details["units_charged"] = self.account().units_charged
        winners = [(rungs.best_score(), rungs.best()) for rungs in self.rungs if rungs.best() is not None]
        if winners:
            details["released_trial_id"] = max(winners)[1]  # the best bracket winner
        return details

    def on_trial_complete(self, trial_id: str, result: dict[str, Any] | None = None, error: bool = False) -> None:
        """Nothing to learn: configurations never depend on results (the scheduler ranks the scores)."""

    def _done(self) -> bool:
        if self.num_brackets == 0:
            return True
        while self.budget_left() < self.rungs[-1].grace_period:
            if len(self.rungs) >= self.num_brackets:
                return True
            self.rungs.append(Rungs(**self._knobs, mode=self._mode))  # the next bracket, independent
        return False

    def _propose(self, trial_id: str) -> tuple[dict[str, Any], dict[str, Any]]:
        assert self._space is not None  # suggest() refuses to propose without a space
        config = sample_config(self._space, self._rng)
        return config, {"config": config, "bracket": len(self.rungs) - 1}

    def _extra_state(self) -> dict[str, Any]:
        return {"rungs": [rungs.state() for rungs in self.rungs], "mechanism": self._mechanism.to_dict()}

    def _restore_extra(self, state: dict[str, Any]) -> None:
        mechanism = SearchMechanism.from_dict(state["mechanism"])  # K included: never redrawn
        if not isinstance(mechanism, HalvingMechanism):
            raise TypeError(f"A halving searcher's state holds a {mechanism.kind} mechanism.")
        self._mechanism = mechanism
        self._law = mechanism.law
        self.rungs = []
        for recorded in state["rungs"]:
            self.rungs.append(Rungs(**self._knobs, mode=self._mode))
            self.rungs[-1].restore(recorded)
