"""Scheduling under a DP searcher: FIFO only, with a per-trial spend guard."""

from __future__ import annotations

import logging
from typing import Any

from ray import tune
from ray.tune.schedulers import FIFOScheduler, TrialScheduler

from ray_dptune.accounting.spend import report_covers
from ray_dptune.errors import PrivacyError

__all__ = ["PrivacyGuardScheduler", "check_scheduler", "private_tune_config"]

logger = logging.getLogger(__name__)

_EARLY_STOPPING = (
    "{name} stops or pauses trials by comparing their intermediate results. Under a DP searcher "
    "the privacy guarantee assumes every trial is one independent run of the base algorithm that "
    "spends its whole plan (Papernot & Steinke 2022, Sec. 3); metric-driven early stopping makes "
    "which trials run, and for how long, depend on the data of other trials, and no proven bound "
    "covers it. Use ray_dptune.PrivacyGuardScheduler (FIFO) instead."
)


class PrivacyGuardScheduler(FIFOScheduler):
    """FIFO scheduling that stops a trial the moment it reports spending above its plan.

    The accountant callback raises :class:`~ray_dptune.errors.PrivacyError` for
    the same report; stopping the trial here keeps it from taking another step
    while that error propagates.

    Args:
        searcher: the DP searcher; trials it does not account (constant-overhead
            screening trials, DP-BO's trials on public training data) report no plan
            and run on. Without it, every trial must report its plan and spend.
    """

    def __init__(self, searcher: Any = None):
        super().__init__()
        self._searcher = searcher

    def on_trial_result(self, tune_controller: Any, trial: Any, result: dict) -> str:
        from ray_dptune.callbacks import PLAN_KEY, SPENT_KEY

        if self._searcher is not None and not self._searcher.accounts_trial(trial.config):
            return TrialScheduler.CONTINUE
        plan, spent = _nested(result, PLAN_KEY), _nested(result, SPENT_KEY)
        try:
            over = not report_covers(plan, spent)
        except (ValueError, AttributeError, TypeError):
            over = True  # a trial that cannot show its spend is within plan does not go on
        if over:
            logger.error("Stopping trial %s: its reported spend is not within its plan.", trial.trial_id)
            return TrialScheduler.STOP
        return TrialScheduler.CONTINUE


def _nested(result: dict, key: str) -> Any:
    """``result[key]``, also when Tune has flattened it into ``key/field`` entries."""
    if key in result:
        return result[key]
    prefix = f"{key}/"
    fields = {name[len(prefix) :]: value for name, value in result.items() if name.startswith(prefix)}
    return fields or None


def check_scheduler(scheduler: Any) -> None:
    """Raises PrivacyError for any scheduler but FIFO (and its guard) under a DP searcher."""
    if scheduler is None or type(scheduler) in (FIFOScheduler, PrivacyGuardScheduler):
        return
    raise PrivacyError(_EARLY_STOPPING.format(name=type(scheduler).__name__))


def private_tune_config(searcher: Any, scheduler: Any = None, **kwargs: Any) -> tune.TuneConfig:
    """A ``tune.TuneConfig`` for a DP searcher: ``num_samples=-1``, a FIFO guard, no early stopping.

    Args:
        searcher: the DP searcher (its metric and mode are used when not given).
        scheduler: None (a :class:`PrivacyGuardScheduler`) or a FIFO scheduler;
            adaptive ones raise PrivacyError.
        **kwargs: any other TuneConfig argument (``max_concurrent_trials``, ...);
            ``num_samples`` other than -1 raises PrivacyError.
    """
    check_scheduler(scheduler)
    num_samples = kwargs.pop("num_samples", -1)
    if num_samples != -1:
        raise PrivacyError(
            f"num_samples={num_samples} caps the number of trials; a DP searcher draws it at random and "
            "ends the search itself. Leave num_samples at -1."
        )
    return tune.TuneConfig(
        search_alg=searcher,
        scheduler=scheduler or PrivacyGuardScheduler(searcher),
        num_samples=-1,
        **kwargs,
    )
