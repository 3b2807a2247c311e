"""PrivateASHAScheduler: asynchronous successive halving whose whole run has one proven (ε, δ).

Route: adaptive composition. Each trial trains in segments between milestones
(``grace_period``, ``grace_period·η``, …, ``max_t`` time units); a trial goes on past a
milestone only if its reported score is in the top 1/η there (ASHA's rule,
:class:`~ray_dptune.search.rungs.Rungs`) *and* the search's budget pays for its next
segment, charged to the durable account before the trial may run it. New trials come
from :class:`~ray_dptune.search.halving.HalvingSearcher`, uniformly, while the budget
pays for their first segment. Every decision reads only released scores, so the run is
an adaptive composition of at most ``budget`` units of the trial plan (Mironov 2017,
Prop. 1; a run that stops early is a post-processing of one padded to the budget): the
search costs what one DP-SGD run of ``budget`` units' steps costs, whatever was stopped.

Route two, ``repetitions=`` a law of K: K independent brackets of that budget, each
deciding from its own scores, the best bracket winner released — Papernot & Steinke's
random-count theorems with one bracket as the base mechanism.
"""

from __future__ import annotations

import logging
import math
from typing import TYPE_CHECKING, Any

from ray.tune.schedulers import FIFOScheduler, TrialScheduler

from ray_dptune import validate
from ray_dptune.accounting.bounds.distributions import RunCountDistribution
from ray_dptune.errors import PrivacyError
from ray_dptune.search.halving import HalvingSearcher
from ray_dptune.search.rungs import Rungs

if TYPE_CHECKING:
    from ray.tune.execution.tune_controller import TuneController
    from ray.tune.experiment import Trial

__all__ = ["PrivateASHAScheduler"]

logger = logging.getLogger(__name__)


class PrivateASHAScheduler(FIFOScheduler):
    """ASHA-style early stopping for DP-SGD trials, within a privacy budget it never exceeds.

    Pass it as ``scheduler=`` and its :attr:`searcher` as ``search_alg=`` (or give the
    searcher to :func:`ray_dptune.private_tuner` or :func:`ray_dptune.private_tune_config`,
    which add the scheduler), with :class:`ray_dptune.PrivacyAccountantCallback`.

    A time unit is one step of ``time_attr`` (an epoch of :func:`ray_dptune.dp_trainable`
    with the default ``training_iteration``); the trial's plan covers ``max_t`` units and
    must split evenly into them. The budget is ``budget_trials`` whole trials' worth of
    units; the guarantee is that of ``budget_trials · max_t`` units of the plan composed.

    Example:
        >>> from ray import tune
        >>> from ray_dptune import PrivateASHAScheduler, private_tune_config
        >>> asha = PrivateASHAScheduler(max_t=9, grace_period=1, reduction_factor=3, budget_trials=4,
        ...                             metric="val_acc", mode="max")
        >>> config = private_tune_config(asha.searcher, max_concurrent_trials=2)

    Args:
        max_t: time units of a whole trial (the plan's span, e.g. ``epochs``).
        grace_period: time units every trial runs before it can be stopped.
        reduction_factor: η: about 1 in η trials goes on at each milestone.
        budget_trials: the budget of a bracket, in whole trials (``max_t`` units each); it may be
            fractional as long as it buys a whole number of units.
        repetitions: None (one bracket: every score is covered, the composition of the budget);
            or a law of K such as ``Poisson(mean=4)``: K independent brackets, each deciding from its
            own scores, the best bracket winner released (P&S Thms 2/6 over one bracket; purge the rest).
        time_attr: the reported counter of time units (``training_iteration`` by default).
        metric: the score (default: ``tune.TuneConfig``'s).
        mode: its direction, "max" or "min" (default: ``tune.TuneConfig``'s).
        space: the Tune space (default: ``param_space``).
        seed: of the configurations' draws (tests); None draws from the OS's secure source.
    """

    _supports_buffered_results = False  # a trial must not run past a milestone before the decision

    def __init__(
        self,
        *,
        max_t: int,
        budget_trials: float,
        grace_period: int = 1,
        reduction_factor: float = 3,
        repetitions: RunCountDistribution | None = None,
        time_attr: str = "training_iteration",
        metric: str | None = None,
        mode: str | None = None,
        space: dict[str, Any] | None = None,
        seed: int | None = None,
    ):
        super().__init__()  # type: ignore[no-untyped-call]  # Ray's FIFOScheduler.__init__ is unannotated
        rungs = Rungs(grace_period=grace_period, reduction_factor=reduction_factor, max_t=max_t, mode=mode)
        budget_units = float(budget_trials) * max_t if isinstance(budget_trials, (int, float)) else math.nan
        if not (math.isfinite(budget_units) and budget_units == int(budget_units) and budget_units >= grace_period):
            raise ValueError(
                f"budget_trials must buy a whole number of time units, at least grace_period = {grace_period}: "
                f"budget_trials * max_t = {budget_trials!r} * {max_t} is not."
            )
        if not isinstance(time_attr, str) or not time_attr:
            raise ValueError(f"time_attr must be the name of a reported counter, got {time_attr!r}.")
        self.time_attr = time_attr
        self.searcher = HalvingSearcher(
            grace_period=rungs.grace_period,
            reduction_factor=rungs.reduction_factor,
            max_t=rungs.max_t,
            budget_units=int(budget_units),
            repetitions=repetitions,
            metric=metric,
            mode=mode,
            space=space,
            seed=seed,
        )
        self.searcher.scheduler = self
        self._metric, self._mode = metric, mode
        self._not_resumed: list[Trial] = []

    @property
    def rungs(self) -> Rungs:
        """The first bracket's rungs (every bracket has the same milestones)."""
        return self.searcher.rungs[0]

    def set_search_properties(self, metric: str | None, mode: str | None, **spec: Any) -> bool:
        """Takes Tune's metric and mode where none was given (the searcher's, once set, win)."""
        if mode is not None and mode not in ("max", "min"):
            raise ValueError(f"mode must be 'max' or 'min', got {mode!r}.")
        self._metric = self._metric or self.searcher.metric or metric
        self._mode = self._mode or self.searcher.mode or mode
        self.searcher.set_mode(self._mode)
        return True

    def on_trial_add(self, tune_controller: TuneController, trial: Trial) -> None:
        """Ends, instead of resuming, a trial that a killed driver left unfinished.

        Its charged units stay charged (the journal); re-running it would touch the data
        again, so it is not resumed: the search goes on with new trials the budget pays for.
        """
        from ray.tune.experiment import Trial

        unfinished = trial.status not in (Trial.TERMINATED, Trial.ERROR)
        if unfinished and trial.trial_id not in self.searcher.suggested_by_this_driver:
            self._not_resumed.append(trial)  # Tune cannot stop a trial while it adds it: at the next step

    def choose_trial_to_run(self, tune_controller: TuneController) -> Trial | None:
        """Ends the interrupted trials first: Tune starts pending trials only after asking this."""
        while self._not_resumed:
            trial = self._not_resumed.pop()
            logger.warning("Trial %s was interrupted with its driver; private halving does not resume it.", trial)
            tune_controller.stop_trial(trial)  # type: ignore[no-untyped-call]  # unannotated in Ray
        return super().choose_trial_to_run(tune_controller)

    def on_trial_result(self, tune_controller: TuneController, trial: Trial, result: dict[str, Any]) -> str:
        """Stops a trial at a milestone unless its score ranks and the budget pays for its next segment."""
        trial_id = trial.trial_id
        time = self._time(result)
        charged_until = self.searcher.account().units_of(trial_id)
        if time < charged_until:
            return TrialScheduler.CONTINUE
        if time > charged_until:
            logger.error(
                "Stopping trial %s at %s = %d, past the %d units charged.",
                trial_id,
                self.time_attr,
                time,
                charged_until,
            )
            return TrialScheduler.STOP  # the accountant raises PrivacyError for the spend
        score = None if self._metric is None else result.get(self._metric)
        rungs = self.searcher.rungs_of(trial_id)  # its bracket's rungs only
        if rungs is None:  # not in the searcher's (restored) record: no bracket may rank it
            return TrialScheduler.STOP
        ranks = isinstance(score, (int, float)) and rungs.promotable(trial_id, time, float(score))
        if time >= rungs.max_t or not ranks:
            return TrialScheduler.STOP
        try:
            self.searcher.charge(trial_id, rungs.next_milestone(time) - time)
        except PrivacyError:
            logger.info(
                "Trial %s ranks at %s = %d; the budget cannot pay for its next segment.", trial_id, self.time_attr, time
            )
            return TrialScheduler.STOP
        return TrialScheduler.CONTINUE

    def debug_string(self) -> str:
        """Tune's status line: the milestones and the time units the current bracket has left."""
        searcher = self.searcher
        return (
            f"PrivateASHAScheduler: milestones {list(self.rungs.milestones)}, {searcher.budget_left()} time units left"
        )

    def _time(self, result: dict[str, Any]) -> int:
        if self.time_attr not in result:
            raise PrivacyError(
                f"A result has no {self.time_attr!r}: private successive halving charges trials by that counter."
            )
        return validate.integer(self.time_attr, result[self.time_attr], whole_floats=True)
