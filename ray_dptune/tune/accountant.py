"""PrivacyAccountantCallback: feeds Tune's events to the search's durable account."""

from __future__ import annotations

import json
import os
import time
import uuid
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from ray.tune import Callback

from ray_dptune import validate
from ray_dptune.accounting.bookkeeping.account import LIVE_STATES, SearchAccount
from ray_dptune.accounting.bookkeeping.budget import SearchBudget
from ray_dptune.accounting.bookkeeping.guarantee import Guarantee
from ray_dptune.accounting.bookkeeping.spend import TrialSpend, describe_excess, read_trial_reports, report_covers
from ray_dptune.accounting.curves.rdp import RDPCurve
from ray_dptune.errors import BudgetExceededError, PrivacyError, RefusedBeforeTraining, UnsupportedBoundError
from ray_dptune.records.journal import SearchJournal, journal_location
from ray_dptune.records.ledger import LedgerEntry, PrivacyLedger
from ray_dptune.records.report import PrivacyReport, searcher_report, write_search_report
from ray_dptune.result_keys import EPSILON_KEY, PLAN_KEY, SPENT_KEY
from ray_dptune.search.base import private_searcher_of, refuse_truncation
from ray_dptune.tune.console import end_line, progress_line
from ray_dptune.tune.guard import (
    DATA_INDEPENDENT_STOP_KEYS,
    check_retries,
    check_scheduler,
    check_stop,
    end_trial_in_error,
    refusal_before_training,
    require_selection_rule,
    running_controller,
    stopped_by_rule,
)

if TYPE_CHECKING:
    from ray.tune.experiment import Trial
    from ray.tune.stopper import Stopper

__all__ = ["PrivacyAccountantCallback"]


class PrivacyAccountantCallback(Callback):
    """Keeps one durable privacy account of the search and reports its (ε, δ), live and at the end.

    The guarantee is computed in one place, :class:`~ray_dptune.accounting.bookkeeping.account.SearchAccount`:
    the searcher's mechanism (P&S Thms 2/6 and DP-HyPO Thm 1 for random-count searches,
    sparse-vector rounds plus the final training for constant-overhead tuning, the
    searcher's own release for DP-BO) covers one attempt per trial, up to K; every other
    attempt that may have touched the data is composed at the full plan.

    **Charge first, train second.** Every suggestion and every attempt start is written
    to a write-ahead journal (``privacy_journal.db`` in the experiment folder, SQLite,
    ``synchronous=FULL``) before Tune hands the trial to a worker. ``Tuner.restore``
    rebuilds the account from the journal, not from Tune's throttled checkpoint, and
    charges every attempt the killed driver left running or only suggested. A second
    search into the same experiment folder is refused.

    **The budget is a hard cap** (:class:`~ray_dptune.accounting.bookkeeping.budget.SearchBudget`): with
    ``target_epsilon``, an event that may add cost (a suggestion, a start, a retry Tune
    grants, a searcher's selection) is admitted only while the guarantee after it stays
    within the target, before it is journaled. A retry that does not fit ends its trial in
    ERROR with :class:`~ray_dptune.errors.BudgetExceededError`; a start that does not fit
    ends the search. A failed trial costs nothing more; a random-count search refuses Tune's
    retries of failed trials before any trial (:func:`~ray_dptune.tune.guard.check_retries`). A spend past
    the plan has run: it is charged as it ran and the search is stopped. A search that ends
    before each of its trials ran to its end (Ctrl-C, ``time_budget_s``, a killed driver, a
    refused retry) is recorded as incomplete, and ``release_best`` refuses it.

    Refused before any trial (PrivacyError): a finite ``num_samples`` below K, a plan above
    the target, a scheduler other than FIFO or the private ASHA, a ``stop=`` on a metric, a
    wrapper other than ``ConcurrencyLimiter``. While running: a result without a valid
    ``dp_plan`` and ``dp_spent``, a plan or spend past the search's plan, a trial ending
    before its plan other than by a data-independent ``stop=``.

    Args:
        searcher: the DP searcher (a :class:`~ray_dptune.search.base.PrivateSearcher`), or
            the ``ConcurrencyLimiter`` Tune runs it in.
        delta: δ of the reported (ε, δ).
        plan: the most one trial may spend (a :class:`TrialSpend`, e.g. from
            ``trainable.privacy_plan(param_space)``, or an :class:`RDPCurve`); when None,
            the first trial's reported plan becomes the search's plan. Required with ``ledger``.
        target_epsilon: the hard cap on the search's ε (the dataset's total with a ledger);
            needs ``plan`` so that every attempt is checked before it runs.
        generic: also use the certified numeric P&S Lemma 7 bound (the default, the tightest;
            False: closed forms only).
        report_path: where ``privacy_report.json`` goes (default: the experiment folder).
        journal_path: where the journal goes (default: the experiment folder, which must
            then be on a local or mounted filesystem).
        ledger: a :class:`~ray_dptune.records.ledger.PrivacyLedger`: the search's worst-case
            guarantee is kept there, and ``epsilon_dataset`` composes every search on ``dataset``
            (``target_epsilon`` then applies to it).
        dataset: identifier of the private data set, required with ``ledger``.
        verbose: print a line each time the guarantee or the count of finished trials changes.
        audit: a canary audit's :meth:`~ray_dptune.training.CanaryAudit.journal_record`, journaled
            with the search before any trial; the report gets it without the secret.
        search_epsilon: with a ledger, a hard cap on this search's own guarantee as well
            (``target_epsilon`` then caps the dataset's total).
        reserved_reruns: re-runs of interrupted trials the procedure reserves: the stated guarantee
            includes them from the start, so it is the same number whatever the run met
            (what was charged is ``guarantee()["spent_so_far"]``).
    """

    def __init__(
        self,
        searcher: Any,
        *,
        delta: float,
        plan: TrialSpend | RDPCurve | None = None,
        target_epsilon: float | None = None,
        generic: bool = True,
        report_path: str | None = None,
        journal_path: str | None = None,
        ledger: PrivacyLedger | None = None,
        dataset: str | None = None,
        verbose: bool = True,
        audit: Mapping[str, Any] | None = None,
        reserved_reruns: int = 0,
        search_epsilon: float | None = None,
    ):
        searcher = private_searcher_of(searcher)
        if (ledger is None) != (dataset is None):
            raise ValueError("ledger and dataset go together: pass both (or neither).")
        releases_itself = searcher.privacy_mechanism().releases_itself
        if ledger is not None and searcher.privacy_mechanism().has_final_run:
            raise UnsupportedBoundError(
                "A privacy ledger composes searches by their RDP curves; a subsampled tuning's guarantee is an (ε, δ) "
                "from privacy loss distributions, with no curve to compose. Run it without a ledger."
            )
        if ledger is not None and plan is None and not releases_itself:
            raise ValueError("A ledger needs plan= up front, so that every attempt is charged before it runs.")
        if target_epsilon is not None:
            target_epsilon = validate.finite_positive("target_epsilon", target_epsilon)
            if plan is None and not releases_itself:
                raise ValueError(
                    "target_epsilon needs plan= (the most one trial may spend, e.g. trainable.privacy_plan(space)): "
                    "without it the first trials would start before their cost is known."
                )
        self._searcher = searcher  # read for metric, mode and its details, which change as it runs
        self._account = SearchAccount(
            searcher.privacy_mechanism(),
            delta=delta,
            plan=_plan_record(plan),
            generic=generic,
            reserved_reruns=reserved_reruns,
        )
        self._search_id = uuid.uuid4().hex
        self._budget = SearchBudget(
            target_epsilon=target_epsilon,
            account=lambda: self._account,
            total=self._total_epsilon,
            scope="The search's guarantee" if ledger is None else f"The dataset {dataset!r}'s total",
        )
        self._search_cap = None  # with a ledger: the cap on this search's own guarantee
        if ledger is not None and search_epsilon is not None:
            self._search_cap = SearchBudget(
                target_epsilon=validate.finite_positive("search_epsilon", search_epsilon),
                account=lambda: self._account,
                total=lambda guarantee: guarantee.epsilon,
                scope="The search's guarantee",
            )
        self._report_path = report_path
        self._journal_path = journal_path
        self._journal: SearchJournal | None = None
        self._pending: list[Mapping[str, Any]] = []  # events before the journal's folder is known
        self._dataset = dataset
        self._ledger = None
        if ledger is not None:
            assert dataset is not None  # checked above: ledger and dataset go together
            self._ledger = LedgerEntry(
                ledger, search_id=self._search_id, dataset=dataset, searcher=type(searcher).__name__
            )
        self._verbose = verbose
        self._audit = None if audit is None else dict(audit)  # the journal's; the report's has no secret
        self._restored = False
        self._violation: PrivacyError | None = None
        self._configs: dict[str, Any] = {}
        self._attempt_starts: dict[str, float] = {}  # trial -> when this driver last started it
        self._trial_plans: dict[str, dict[str, Any]] = {}
        self._last_logged: str | None = None
        self._started_at: float | None = None
        self._stop: Any = None  # the run's data-independent stop= criterion, if any
        self._storage: Any = None  # Tune's StorageContext of the run
        searcher.attach_recorder(self._record)
        searcher.attach_account(lambda: self._account)  # replaced by the journal's on a restore
        self._check_caps()  # the plan is known: bound the search before Tune starts

    # ------------------------------------------------------------------ the guarantee
    def guarantee(self, *, if_stopped_now: bool = False) -> dict[str, Any]:
        """The current (ε, δ) of the whole search and how it is made up."""
        guarantee = self._account.guarantee(if_stopped_now=if_stopped_now)
        mechanism = self._account.mechanism
        described = mechanism.description
        dataset_epsilon = (
            None if self._ledger is None else self._ledger.dataset_epsilon(guarantee, delta=self._account.delta)
        )
        spent = self._account.spent(if_stopped_now=if_stopped_now)
        return {
            **described,
            **guarantee.to_dict(),
            "epsilon_dataset": dataset_epsilon,
            "reserved_reruns": self._account.reserved_reruns,
            "spent_so_far": {"epsilon": spent.epsilon, "charged_attempts": spent.charged_attempts},
        }

    @property
    def account(self) -> SearchAccount:
        """The search's account (read-only use)."""
        return self._account

    # ------------------------------------------------------------------ Tune hooks
    @property
    def target_epsilon(self) -> float | None:
        """The hard cap on the search's ε, or None."""
        return self._budget.target_epsilon

    def setup(
        self,
        stop: Stopper | Mapping[str, Any] | None = None,
        num_samples: int | None = None,
        total_num_samples: int | None = None,
        **info: Any,
    ) -> None:
        """Checks the run before any trial starts, and reopens the journal of a restored search.

        Refuses what no bound covers: another searcher than this callback's, a scheduler, ``stop=``
        criterion or retries the searcher does not allow, and a ``num_samples`` that truncates the search.
        Tune's retries are reserved in the guarantee, and the caps are checked.
        """
        if self._searcher.restore_refusal is not None:
            raise self._searcher.restore_refusal
        controller = running_controller()
        if controller is not None:  # before any trial, on tune.run too
            require_selection_rule(self._searcher)  # Tune has given the searcher TuneConfig's metric and mode
            check_scheduler(controller.scheduler_alg, self._searcher)
            search_alg = getattr(controller.search_alg, "searcher", controller.search_alg)
            if private_searcher_of(search_alg) is not self._searcher:
                raise PrivacyError(
                    "Tune runs another searcher than the one given to PrivacyAccountantCallback: pass the same "
                    "DP searcher (or the ConcurrencyLimiter around it) as search_alg."
                )
            self._stop = getattr(controller, "_stopper", None)  # Tune keeps a Stopper object only there
            self._storage = getattr(controller, "_storage", None)  # where the report goes when no trial ran
            experiment = getattr(controller.search_alg, "_experiment", None)  # the spec Tune builds trials from
            if experiment is not None:
                self._reserve_tune_retries(experiment.spec.get("max_failures", 0))
        check_stop(stop)
        check_stop(self._stop)
        self._stop = stop or self._stop
        self._started_at = self._started_at or time.time()
        if not self._restored:  # a restored experiment's spec no longer carries the user's num_samples
            refuse_truncation(num_samples, self._searcher.num_trials)
        if self._restored and self._journal_path is not None and not os.path.exists(self._journal_path):
            raise PrivacyError(
                f"This search's journal {self._journal_path} is missing: the account of what its earlier drivers ran "
                "cannot be rebuilt, and a restore would start from an empty one and under-count. Put the journal "
                "back (the SQLite file and its -wal file) or start a new search."
            )
        if self._journal_path is not None and (self._restored or os.path.exists(self._journal_path)):
            self._open_journal(self._journal_path)
        if controller is not None and self._restored:  # Tune re-queued them before this hook: refuse before any runs
            for trial in controller.get_trials():  # type: ignore[no-untyped-call]  # unannotated in Ray
                if trial.status == "PENDING":
                    self._refuse_rerun_of_a_failed_run(trial.trial_id)
                    self._refuse_unsuggested_trial(trial.trial_id)
        if self._ledger is not None:
            self._ledger.check_dataset()
            self._update_ledger(force=True)
        self._check_caps()
        if self._restored:
            self._budget.check_resumable()

    def on_trial_start(self, iteration: int, trials: list[Trial], trial: Trial, **info: Any) -> None:
        """Records the attempt's start before Tune hands it to a worker; a budget it does not fit refuses it.

        Refuses a re-run of a failed run and, after a restore, a trial the searcher did not suggest.
        """
        if self._journal is None:
            location = self._journal_path or journal_location(trial)
            if location is not None:
                self._open_journal(location)
        check_retries(getattr(trial, "max_failures", 0), self._searcher)  # before the attempt is recorded
        self._refuse_rerun_of_a_failed_run(trial.trial_id)
        self._refuse_unsuggested_trial(trial.trial_id)
        self._configs[trial.trial_id] = _jsonable(trial.config)
        self._attempt_starts[trial.trial_id] = time.time()  # a refusal's error file is written after it
        event = {
            "type": "started",
            "trial_id": trial.trial_id,
            "accounted": bool(self._searcher.accounts_trial(trial.config)),
        }
        # Refused (BudgetExceededError) before it is journaled: Tune then ends the search before this attempt
        # is handed to its worker (a retry that does not fit is refused earlier, in on_trial_recover).
        self._record({**event, "final": True} if self._searcher.final_trial(trial.config) else event)

    def on_trial_result(
        self, iteration: int, trials: list[Trial], trial: Trial, result: dict[str, Any], **info: Any
    ) -> None:
        """Records an accounted trial's reported spend and adds the whole search's ε to ``result``.

        The first report sets the search's plan. A spend past the plan (or past a halving trial's
        charged units) is charged as it ran and stops the search; a trial's plan past the search's
        is refused.
        """
        if trial.trial_id in self._account.trials and not self._account.is_accounted(trial.trial_id):
            return
        trial_plan, spent = read_trial_reports(result, trial_id=trial.trial_id, keys=(PLAN_KEY, SPENT_KEY))
        if self._account.plan is None:
            self._record({"type": "plan", "plan": trial_plan})
            self._check_caps()
        search_plan = self._account.plan_of(trial.trial_id)
        beyond_plan = not (report_covers(trial_plan, spent) and report_covers(search_plan, spent))
        if beyond_plan or not self._account.within_charge(trial.trial_id, spent):
            paid = self._account.units_of(trial.trial_id)
            # It ran them: the account charges what it reports (synced) before the run is stopped.
            self._record({"type": "reported", "trial_id": trial.trial_id, "spent": spent, "overrun": True})
            excess = describe_excess(search_plan if report_covers(trial_plan, spent) else trial_plan, spent)
            self._violation = PrivacyError(
                f"Trial {trial.trial_id} reported spending past "
                + (f"its plan: {excess}" if beyond_plan else f"the {paid} time units charged to it")
                + f". Spent: {spent}; the search's plan: {search_plan}. The search is stopped and nothing may be "
                f"released; the guarantee bounds that trial as it ran: ε = {self._budget.epsilon():.4g}"
            )
            raise self._violation
        if not report_covers(search_plan, trial_plan):
            raise PrivacyError(
                f"Trial {trial.trial_id} plans to spend past the search's plan: {describe_excess(search_plan, trial_plan)}."
                f" Its plan: {trial_plan}; the search's: {search_plan}. Every trial must satisfy one plan (the "
                "guarantee assumes it): check opacus_plan(dataset_size=...) is the training split's size."
            )
        self._trial_plans[trial.trial_id] = trial_plan
        self._record({"type": "reported", "trial_id": trial.trial_id, "spent": spent})
        result[EPSILON_KEY] = self._account.guarantee().epsilon  # Tune's loggers see the whole search's ε

    def on_trial_complete(self, iteration: int, trials: list[Trial], trial: Trial, **info: Any) -> None:
        """Records the completion; an accounted trial stopped before spending its plan stops the search.

        A halving search's trials are exempt: its scheduler stops them, each charged for what it may
        have run. Otherwise only a data-independent ``stop=`` criterion may end a trial early:
        metric-driven early stopping is covered by no bound for a DP searcher. The violation is
        raised at the next step.
        """
        self._record({"type": "completed", "trial_id": trial.trial_id})
        if not self._account.is_accounted(trial.trial_id) or self._account.mechanism.pays_by_units:
            return  # a halving search's scheduler stops trials, each charged for what it may have run
        last = self._account.attempts_of(trial.trial_id)[-1]
        if last["state"] != "completed":
            return  # ended otherwise (a refused retry: Tune stops it through here)
        own_plan = self._trial_plans.get(trial.trial_id)
        spent = last["spent"]
        if own_plan is not None and spent is not None and report_covers(spent, own_plan):
            return  # the trial ran its whole plan
        if stopped_by_rule(self._stop, getattr(trial, "last_result", None) or {}):
            return  # a prefix of its plan: a post-processing of it
        # Tune logs and swallows errors raised while it stops a trial: raise at the next step.
        self._violation = PrivacyError(
            f"Trial {trial.trial_id} ended without error before spending its plan: it was stopped early "
            "(by a scheduler such as ASHA, HyperBand, PBT or median stopping, or by a `stop=` criterion). "
            "Metric-driven early stopping is not covered by any proven bound for a DP searcher; use "
            "ray_dptune.private_tune_config (FIFO) and let every trial run its plan (a stop= on "
            f"{sorted(DATA_INDEPENDENT_STOP_KEYS)} is allowed)."
        )

    def on_step_begin(self, iteration: int, trials: list[Trial], **info: Any) -> None:
        """Raises a pending privacy violation, which ends the search.

        After a refusal before training, it waits until the running attempts have ended.
        """
        if isinstance(self._violation, RefusedBeforeTraining) and self._account.running():
            return  # stopping them now would leave attempts that may have trained: let them end first
        if self._violation is not None:
            raise self._violation

    def on_trial_error(self, iteration: int, trials: list[Trial], trial: Trial, **info: Any) -> None:
        """Records the failed attempt.

        An attempt refused before its first training step holds the searcher: the running trials end,
        then the search stops.
        """
        refusal = refusal_before_training(trial, since=self._attempt_starts.get(trial.trial_id))
        if refusal is None:
            self._record({"type": "failed", "trial_id": trial.trial_id})
            return
        # The account honours it only for an attempt that never reported: one that did has touched the data.
        self._record({"type": "failed", "trial_id": trial.trial_id, "untrained": refusal})
        self._searcher.hold()  # the trials already started end (they likely refuse alike), then the search stops
        self._violation = self._violation or RefusedBeforeTraining(
            f"Trial {trial.trial_id} was refused before its first training step: {refusal}"
        )

    def on_trial_recover(self, iteration: int, trials: list[Trial], trial: Trial, **info: Any) -> None:
        """Tune re-queued the failed trial: the failed attempt is charged now, before the retry can start."""
        try:
            self._record({"type": "failed", "trial_id": trial.trial_id, "retry": True})
        except BudgetExceededError as refusal:
            self._record({"type": "failed", "trial_id": trial.trial_id, "refused": str(refusal)})
            end_trial_in_error(trial, refusal)

    def on_experiment_end(self, trials: list[Trial], **info: Any) -> None:
        """Records the live attempts as interrupted and how the search ended; writes the ledger and the report.

        Raises a pending privacy violation after the report is written.
        """
        for trial in trials:  # those an earlier driver started: Tune's restored state has their configs
            self._configs.setdefault(trial.trial_id, _jsonable(trial.config))
        for trial_id, record in list(self._account.trials.items()):
            if record.last in LIVE_STATES:  # stopped by this driver before it ended: Ctrl-C, time budget, an error
                self._record({"type": "interrupted", "trial_id": trial_id})
        complete, reason = self._budget.completeness(searcher=self._searcher, violation=self._violation)
        self._record({"type": "ended", "complete": complete, "reason": reason})
        self._update_ledger(force=True)
        path = write_search_report(self.report(), report_path=self._report_path, trials=trials, storage=self._storage)
        if self._verbose:
            line = end_line(
                self._budget, complete=complete, reason=reason, path=path, resumable=self._violation is None
            )
            print(f"[ray_dptune] {line}", flush=True)
        if self._violation is not None:
            raise self._violation

    def get_state(self) -> dict[str, Any]:
        """Only where the account lives: the journal, not Tune's checkpoint, is the record."""
        journal = self._journal_path if self._journal is None else self._journal.path
        return {"search_id": self._search_id, "journal": journal}

    def set_state(self, state: dict[str, Any]) -> None:
        """Takes back the search's id and journal: the account is rebuilt from the journal at :meth:`setup`."""
        self._restored = True
        self._search_id = state["search_id"]
        if self._ledger is not None:
            self._ledger.search_id = self._search_id
        self._journal_path = self._journal_path or state.get("journal")

    # ------------------------------------------------------------------ report
    def report(self) -> PrivacyReport:
        """The privacy report: target and whether it held, complete or not, every attempt, the final (ε, δ)."""
        target = None
        if self._budget.target_epsilon is not None:
            target = {"epsilon": self._budget.target_epsilon, "delta": self._account.delta, "held": self._budget.held()}
        complete, reason = self._budget.completeness(searcher=self._searcher, violation=self._violation)
        return searcher_report(
            self._searcher,
            self._account,
            search_id=self._search_id,
            guarantee=self.guarantee(if_stopped_now=True),
            configs=self._configs,
            dataset=self._dataset,
            ledger=None if self._ledger is None else {"path": self._ledger.ledger.path, "search": self._search_id},
            journal=None if self._journal is None else self._journal.path,
            target=target,
            complete=complete,
            incomplete_reason=reason,
            started_at=self._started_at,
            audit=None if self._audit is None else {k: v for k, v in self._audit.items() if k != "secret"},
        )

    def _refuse_rerun_of_a_failed_run(self, trial_id: str) -> None:
        """A failed run is final where retries are not allowed: ``Tuner.restore(resume_errored=True)`` would retry it.

        A re-run Tune granted itself (a preempted node, with ``max_failures=0``) was charged in
        :meth:`on_trial_recover` and is flagged ``retry``; an interrupted attempt is re-run as usual.
        """
        record = self._account.trials.get(trial_id)
        if record is None or not record.attempts or self._account.mechanism.allows_retries:
            return
        last = record.attempts[-1]
        if last["state"] == "failed" and not last.get("retry"):
            raise PrivacyError(
                f"Trial {trial_id} failed, and in a random-count search a failed run is final (one of the K runs, "
                "output 'failed'): re-running it would be a retry decided by its failure, which the selection bound "
                "does not cover. Restore with resume_errored=False (the default); the search is complete as it is."
            )

    def _reserve_tune_retries(self, max_failures: int) -> None:
        """Before any trial: refuses retries the bound does not allow, and states every retry it allows.

        The guarantee is the procedure's, so the attempts Tune's retries may charge are reserved in it
        from the start (the same number whether or not anything fails).
        """
        check_retries(max_failures, self._searcher)
        reserve = self._account.mechanism.retry_reserve(max_failures)
        if reserve is None:
            raise PrivacyError(
                f"FailureConfig(max_failures={max_failures}) lets Tune retry without a bound this search can state "
                "before it runs: give max_failures a finite value."
            )
        if reserve > self._account.reserved_reruns and not self._restored:
            self._account.reserved_reruns = reserve

    def _refuse_unsuggested_trial(self, trial_id: str) -> None:
        """After a restore from the journal, a random-count search runs only the trials its searcher suggested.

        ``Tuner.restore(restart_errored=True)`` (or ``restart_finished``) makes new trials, with new ids,
        from old configurations: a re-run chosen from the runs' outcomes. Every suggestion is journaled
        before its trial can start, so a rebuilt account knows every trial of the search.
        """
        if self._account.mechanism.allows_retries or not self._account.restores:
            return
        if trial_id not in self._account.trials:
            raise PrivacyError(
                f"Tune is starting trial {trial_id}, which this search's searcher never suggested: "
                "Tuner.restore(restart_errored=True) or restart of finished trials re-runs old configurations as "
                "new trials, a retry decided by the results, which the selection bound does not cover. Restore "
                "with the defaults (resume_unfinished=True)."
            )

    # ------------------------------------------------------------------ the journal
    def _record(self, event: dict[str, Any]) -> None:
        """Write-ahead: the event is admitted, reaches the journal (synced when it adds cost), then the account."""
        self._account.admit(event)  # a charge past a halving search's budget is refused before it is written
        self._budget.admit(event)  # a charge past the target likewise
        if self._search_cap is not None:
            self._search_cap.admit(event)
        if self._journal is not None:
            self._journal.append([event])
        else:
            self._pending.append(event)
        self._account.apply(event)
        self._update_ledger()
        self._log_progress()

    def _open_journal(self, path: str) -> None:
        """Starts the journal, or (after a restore) rebuilds the account from it and charges the interrupted."""
        journal = SearchJournal(path)
        self._account = journal.open_search(
            self._search_id, record=self._search_record(), pending=self._pending, account=self._account
        )
        self._pending = []
        self._journal = journal

    def _search_record(self) -> dict[str, Any]:
        return {
            "mechanism": self._account.mechanism.to_dict(),
            "delta": self._account.delta,
            "plan": self._account.plan,
            "searcher": type(self._searcher).__name__,
            "dataset": self._dataset,
            "target_epsilon": self._budget.target_epsilon,
            "reserved_reruns": self._account.reserved_reruns,
            "audit": self._audit,
        }

    # ------------------------------------------------------------------ ledger and target
    def _check_caps(self) -> None:
        """Raises PrivacyError when the search as it stands is over its target (or its own cap, with a ledger)."""
        self._budget.check()
        if self._search_cap is not None:
            self._search_cap.check()

    def _update_ledger(self, *, force: bool = False) -> None:
        if self._ledger is not None:
            self._ledger.update(
                self._account, journal=None if self._journal is None else self._journal.path, force=force
            )

    def _total_epsilon(self, guarantee: Guarantee) -> float | None:
        """The ε the budget applies to: the dataset's total with a ledger, else the search's."""
        return (
            guarantee.epsilon
            if self._ledger is None
            else self._ledger.dataset_epsilon(guarantee, delta=self._account.delta)
        )

    # ------------------------------------------------------------------ helpers
    def _log_progress(self) -> None:
        """O(1): the account keeps counters and caches the curve per count of charged attempts."""
        if not self._verbose or self._account.plan is None:
            return
        line = progress_line(self._budget, num_trials=self._searcher.num_trials)
        if line != self._last_logged:
            print(f"[ray_dptune] {line}", flush=True)
            self._last_logged = line


def _plan_record(plan: TrialSpend | RDPCurve | None) -> dict[str, Any] | None:
    if plan is None:
        return None
    if isinstance(plan, (TrialSpend, RDPCurve)):
        return plan.to_dict()
    raise TypeError(f"plan must be a TrialSpend, an RDPCurve or None, got {type(plan).__name__}.")


def _jsonable(config: dict[str, Any]) -> dict[str, Any]:
    jsonable: dict[str, Any] = json.loads(json.dumps(config, default=repr))
    return jsonable
