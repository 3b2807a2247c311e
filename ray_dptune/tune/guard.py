"""Scheduling under a DP searcher: FIFO with a per-trial spend guard, or private successive halving."""

from __future__ import annotations

import logging
import os
import pickle
from typing import TYPE_CHECKING, Any

from ray import tune
from ray.tune.schedulers import FIFOScheduler, TrialScheduler

from ray_dptune.accounting.bookkeeping.spend import report_covers
from ray_dptune.errors import PrivacyError, RefusedBeforeTraining
from ray_dptune.result_keys import PLAN_KEY, SPENT_KEY
from ray_dptune.search.base import private_searcher_of
from ray_dptune.tune.private_asha import PrivateASHAScheduler

if TYPE_CHECKING:
    from ray.tune.execution.tune_controller import TuneController
    from ray.tune.experiment import Trial

__all__ = [
    "DATA_INDEPENDENT_STOP_KEYS",
    "PrivacyGuardScheduler",
    "check_retries",
    "check_scheduler",
    "check_stop",
    "end_trial_in_error",
    "private_tune_config",
    "refusal_before_training",
    "require_selection_rule",
    "running_controller",
    "stopped_by_rule",
    "trial_folder_name",
]

DATA_INDEPENDENT_STOP_KEYS = frozenset({"training_iteration", "time_total_s"})
"""Result keys a ``stop=`` dict may use under a DP searcher: a trial cut by them ran a prefix of its plan."""

logger = logging.getLogger(__name__)

_EARLY_STOPPING = (
    "{name} stops or pauses trials by comparing their intermediate results. Under a DP searcher "
    "the privacy guarantee assumes every trial is one independent run of the base algorithm that "
    "spends its whole plan (Papernot & Steinke 2022, Sec. 3); metric-driven early stopping makes "
    "which trials run, and for how long, depend on the data of other trials, and no proven bound "
    "covers it. Use ray_dptune.PrivacyGuardScheduler (FIFO) instead, or, for private early stopping, "
    "ray_dptune.PrivateASHAScheduler with its own searcher (search_alg=scheduler.searcher)."
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
        super().__init__()  # type: ignore[no-untyped-call]  # Ray's FIFOScheduler.__init__ is unannotated
        self._searcher = None if searcher is None else private_searcher_of(searcher)

    def on_trial_result(self, tune_controller: TuneController, trial: Trial, result: dict[str, Any]) -> str:
        """Stops an accounted trial whose reported spend is not shown to be within its reported plan."""
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


def _nested(result: dict[str, Any], key: str) -> Any:
    """``result[key]``, also when Tune has flattened it into ``key/field`` entries."""
    if key in result:
        return result[key]
    prefix = f"{key}/"
    fields = {name[len(prefix) :]: value for name, value in result.items() if name.startswith(prefix)}
    return fields or None


def require_selection_rule(searcher: Any) -> None:
    """Raises PrivacyError unless the searcher knows its metric and mode before the search starts.

    The rule that picks the released trial is part of the mechanism: one chosen after seeing the
    results is not covered (and a search without one cannot be released at all).
    """
    searcher = private_searcher_of(searcher)
    metric, mode = getattr(searcher, "metric", None), getattr(searcher, "mode", None)
    if metric is None or mode not in ("max", "min"):
        raise PrivacyError(
            f"The search has no selection rule (metric={metric!r}, mode={mode!r}): the rule that picks the "
            "released trial is part of the mechanism and is fixed before any trial. Give both, e.g. "
            "metric='val_acc', mode='max', to the searcher, TuneConfig or private_tuner."
        )


def check_retries(max_failures: int, searcher: Any) -> None:
    """Raises PrivacyError when Tune would re-run a failed trial of a search whose bound does not allow it.

    See :attr:`~ray_dptune.accounting.bookkeeping.search_mechanism.SearchMechanism.allows_retries`. Re-runs after an
    interrupted driver (``Tuner.restore``) and after a preempted node are not failures of the trial: they
    are charged at the plan, under the threat model's assumption that the interruption does not depend on
    the data.
    """
    searcher = private_searcher_of(searcher)
    if not max_failures or searcher.privacy_mechanism().allows_retries:
        return
    runs = "any number of" if max_failures < 0 else f"up to {max_failures + 1}"
    raise PrivacyError(
        f"FailureConfig(max_failures={max_failures}) lets Tune re-run a trial that failed ({runs} runs a trial), "
        f"which {type(searcher).__name__}'s bound does not cover: a retry reveals that the attempt before it failed "
        "and, by its absence, that the others did not, while the random-count selection bound covers the best of K "
        "runs with nothing else known about them (with retries, a trial is in the worst case max_failures + 1 runs "
        "inside the selection). Leave max_failures at 0: a failed trial is then one of the K runs, with output "
        "'failed', ranked last and never released, at no extra cost."
    )


def check_scheduler(scheduler: Any, searcher: Any = None) -> None:
    """Raises PrivacyError unless ``scheduler`` may run with the DP ``searcher``.

    A :class:`~ray_dptune.PrivateASHAScheduler` runs only with its own searcher, and its
    searcher only with it; any other searcher takes FIFO (or its guard) alone.
    """
    searcher = None if searcher is None else private_searcher_of(searcher)
    own = getattr(searcher, "scheduler", None)
    if isinstance(own, PrivateASHAScheduler) and scheduler is not own:
        raise PrivacyError(
            f"This searcher is a PrivateASHAScheduler's; Tune runs it with {type(scheduler).__name__}, which would "
            "run its trials without charging their segments. Pass that PrivateASHAScheduler as scheduler=."
        )
    if isinstance(scheduler, PrivateASHAScheduler) and searcher is not None and searcher is not scheduler.searcher:
        raise PrivacyError(
            "A PrivateASHAScheduler draws its trials with its own searcher, which charges their first segments: "
            "pass search_alg=scheduler.searcher."
        )
    if scheduler is None or type(scheduler) in (FIFOScheduler, PrivacyGuardScheduler, PrivateASHAScheduler):
        return
    raise PrivacyError(_EARLY_STOPPING.format(name=type(scheduler).__name__))


def running_controller() -> TuneController | None:
    """The ``TuneController`` of the Tune run that is calling us (``tune.run`` and ``Tuner.fit`` alike), or None.

    Tune hands callbacks no reference to its run, so the accountant finds the controller
    that calls its hook on the stack (and reads its public ``scheduler_alg`` and ``search_alg``).
    """
    import inspect

    from ray.tune.execution.tune_controller import TuneController

    frame = inspect.currentframe()
    while frame is not None:
        caller = frame.f_locals.get("self")
        if isinstance(caller, TuneController):
            return caller
        frame = frame.f_back
    return None


def check_stop(stop: Any) -> None:
    """Raises PrivacyError unless the ``stop=`` criterion of a run is data-independent.

    Accepted: a dict on ``training_iteration`` / ``time_total_s`` (a trial cut there ran a
    prefix of its plan: a post-processing of it), ``MaximumIterationStopper``,
    ``TimeoutStopper`` (``time_budget_s``: it ends the whole search, which is then
    incomplete), and combinations of these. Refused: a dict on any other result key, a
    function or any other ``Stopper``, which read the trials' results (data-dependent
    early stopping, which no bound covers).
    """
    from ray.tune.stopper import CombinedStopper, MaximumIterationStopper, NoopStopper, TimeoutStopper

    if not stop:
        return
    if isinstance(stop, dict):
        metric_keys = sorted(set(stop) - DATA_INDEPENDENT_STOP_KEYS)
        if metric_keys:
            raise PrivacyError(
                f"stop={stop!r} stops trials on {metric_keys}, results the trials compute from the data: that is "
                "data-dependent early stopping, which no bound covers for a DP searcher. Allowed: "
                f"{sorted(DATA_INDEPENDENT_STOP_KEYS)} (or time_budget_s for the whole search)."
            )
        return
    if isinstance(stop, (list, tuple)):
        for each in stop:
            check_stop(each)
        return
    if isinstance(stop, CombinedStopper):
        for each in stop._stoppers:
            check_stop(each)
        return
    if type(stop) in (MaximumIterationStopper, TimeoutStopper, NoopStopper):
        return
    raise PrivacyError(
        f"stop={type(stop).__name__} may stop trials by reading their results: data-dependent early stopping, "
        "which no bound covers for a DP searcher. Allowed: a dict on "
        f"{sorted(DATA_INDEPENDENT_STOP_KEYS)}, MaximumIterationStopper, TimeoutStopper or time_budget_s."
    )


def stopped_by_rule(stop: Any, result: dict[str, Any]) -> bool:
    """True when a data-independent ``stop=`` criterion (:func:`check_stop`) ended a trial at its last ``result``."""
    from ray.tune.stopper import MaximumIterationStopper

    if isinstance(stop, dict):
        return any(key in result and result[key] >= value for key, value in stop.items())
    if isinstance(stop, MaximumIterationStopper):
        reached: bool = result.get("training_iteration", 0) >= stop._max_iter
        return reached
    return False


def end_trial_in_error(trial: Any, error: Exception) -> None:
    """Ends a trial Tune has re-queued (PENDING) in ERROR with ``error``, from inside a callback of the run.

    Tune's ``stop_trial`` takes it out of scheduling and tells the searcher; the status setter
    Tune lends its schedulers marks it ERROR, and ``handle_error`` appends ``error`` to its error
    file. Tune pickles only a worker's errors, so ``error`` is pickled here in place of the crash
    it replaces: ``ResultGrid``'s ``Result.error`` is then ``error``. Outside a Tune run, ``error``
    is raised.
    """
    from ray import cloudpickle
    from ray.tune.experiment import Trial

    controller = running_controller()
    if controller is None:
        raise error
    controller.stop_trial(trial)  # type: ignore[no-untyped-call]  # unannotated in Ray
    controller._set_trial_status(trial, Trial.ERROR)
    trial.handle_error(error)
    if trial.pickled_error_file is not None:
        with open(trial.pickled_error_file, "wb") as file:
            cloudpickle.dump(error, file)  # type: ignore[no-untyped-call]  # Ray's vendored cloudpickle is unannotated


def refusal_before_training(trial: Any, *, since: float | None) -> str | None:
    """The message of the :class:`~ray_dptune.errors.RefusedBeforeTraining` the trial raised, else None.

    Read from the error Tune has just pickled beside the driver (``Trial.handle_error`` writes it
    there before the callbacks run; the storage copy is synced later): a ``RayTaskError`` whose
    ``cause`` is the trainable's exception. An error that cannot be read, or a file older than
    ``since`` (the attempt's start on this driver's clock; None: not seen starting), is not a refusal:
    Ray rewrites the file only for a worker's errors, so an older one may be an earlier attempt's.
    """
    from ray import cloudpickle

    try:
        if since is None or os.path.getmtime(trial.pickled_error_file) < since:
            return None
        with open(trial.pickled_error_file, "rb") as file:
            error = cloudpickle.load(file)
    except (OSError, TypeError, EOFError, AttributeError, ImportError, pickle.UnpicklingError):  # an ordinary failure
        return None
    cause = getattr(error, "cause", error)
    return str(cause) if isinstance(cause, RefusedBeforeTraining) else None


def private_tune_config(searcher: Any, scheduler: Any = None, **kwargs: Any) -> tune.TuneConfig:
    """A ``tune.TuneConfig`` for a DP searcher: ``num_samples=-1``, a FIFO guard, no early stopping.

    Trial folders are named ``{trainable}_{trial_id}`` (:func:`trial_folder_name`) unless
    ``trial_dirname_creator`` is given: Ray's default name holds the trial's number (how many
    trials ran before it, which a random count hides) and its config.

    Args:
        searcher: the DP searcher, or a ``ConcurrencyLimiter`` around it (its metric and mode
            are used when not given); other wrappers raise PrivacyError.
        scheduler: None (the searcher's :class:`~ray_dptune.PrivateASHAScheduler`, else a
            :class:`PrivacyGuardScheduler`) or a FIFO scheduler; other adaptive ones raise PrivacyError.
        **kwargs: any other TuneConfig argument (``max_concurrent_trials``, ...);
            ``num_samples`` other than -1 raises PrivacyError.
    """
    own = private_searcher_of(searcher)
    scheduler = scheduler or getattr(own, "scheduler", None)  # a PrivateASHAScheduler's searcher brings it
    check_scheduler(scheduler, own)
    num_samples = kwargs.pop("num_samples", -1)
    if num_samples != -1:
        raise PrivacyError(
            f"num_samples={num_samples} caps the number of trials; a DP searcher draws it at random and "
            "ends the search itself. Leave num_samples at -1."
        )
    if kwargs.get("trial_dirname_creator") is None:  # also when a user's TuneConfig left it unset
        kwargs["trial_dirname_creator"] = trial_folder_name
    return tune.TuneConfig(
        search_alg=searcher,
        scheduler=scheduler or PrivacyGuardScheduler(own),
        num_samples=-1,
        **kwargs,
    )


def trial_folder_name(trial: Any) -> str:
    """``{trainable}_{trial_id}``: a trial's folder name with neither its number nor its config."""
    return f"{trial.trainable_name}_{trial.trial_id}"
