"""PrivacyAccountantCallback: feeds Tune's events to the search's durable account."""

from __future__ import annotations

import json
import os
import uuid
from typing import Any

from ray.tune import Callback

from ray_dptune.accounting.account import SearchAccount
from ray_dptune.accounting.guarantee import Guarantee
from ray_dptune.accounting.rdp import RDPCurve
from ray_dptune.accounting.spend import TrialSpend, parse_report, report_covers
from ray_dptune.errors import PrivacyError
from ray_dptune.journal import JOURNAL_FILE, SearchJournal
from ray_dptune.ledger import PrivacyLedger
from ray_dptune.report import REPORT_FILE, PrivacyReport, searcher_report, write_report
from ray_dptune.schedulers import check_scheduler, running_scheduler
from ray_dptune.search.base import PrivateSearcher, refuse_truncation

__all__ = ["PLAN_KEY", "REPORT_FILE", "SPENT_KEY", "PrivacyAccountantCallback"]

PLAN_KEY = "dp_plan"
SPENT_KEY = "dp_spent"


class PrivacyAccountantCallback(Callback):
    """Keeps one durable privacy account of the search and reports its (ε, δ), live and at the end.

    The guarantee is computed in one place, :class:`~ray_dptune.accounting.account.SearchAccount`:
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

    Checks, each raising :class:`~ray_dptune.errors.PrivacyError`: a finite
    ``num_samples`` below K; a plan above ``target_epsilon`` (before any trial when
    ``plan`` is given); a result without a well-formed ``dp_plan`` and ``dp_spent``; a
    trial whose plan the search's plan does not cover; spending above the plan; a trial
    that ends before spending its plan (early stopping).

    Args:
        searcher: the DP searcher (a :class:`~ray_dptune.search.base.PrivateSearcher`).
        delta: δ of the reported (ε, δ).
        plan: the most one trial may spend (a :class:`TrialSpend`, e.g. from
            ``trainable.privacy_plan(param_space)``, or an :class:`RDPCurve`); when None,
            the first trial's reported plan becomes the search's plan. Required with ``ledger``.
        target_epsilon: refuse to run a search whose guarantee would exceed it.
        generic: also use the certified numeric P&S Lemma 7 bound (the default, the tightest;
            False: closed forms only).
        report_path: where ``privacy_report.json`` goes (default: the experiment folder).
        journal_path: where the journal goes (default: the experiment folder, which must
            then be on a local or mounted filesystem).
        ledger: a :class:`~ray_dptune.ledger.PrivacyLedger`: the search's worst-case
            guarantee is kept there, and ``epsilon_dataset`` composes every search on ``dataset``
            (``target_epsilon`` then applies to it).
        dataset: identifier of the private data set, required with ``ledger``.
        verbose: print a line each time the guarantee or the count of finished trials changes.
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
    ):
        if not isinstance(searcher, PrivateSearcher):
            raise TypeError(
                "searcher must be a ray_dptune DP searcher (RandomCountSearcher, DPHyPOSearcher, "
                f"ConstantOverheadSearcher, DPBOSearcher), got {type(searcher).__name__}."
            )
        if (ledger is None) != (dataset is None):
            raise ValueError("ledger and dataset go together: pass both (or neither).")
        if ledger is not None and plan is None and searcher.privacy_mechanism().kind != "release":
            raise ValueError("A ledger needs plan= up front, so that every attempt is charged before it runs.")
        self._searcher = searcher  # read for metric, mode and its details, which change as it runs
        self._account = SearchAccount(
            searcher.privacy_mechanism(), delta=delta, plan=_plan_record(plan), generic=generic
        )
        self._search_id = uuid.uuid4().hex
        self._target_epsilon = target_epsilon
        self._report_path = report_path
        self._journal_path = journal_path
        self._journal: SearchJournal | None = None
        self._pending: list[dict[str, Any]] = []  # events before the journal's folder is known
        self._ledger, self._dataset = ledger, dataset
        self._ledger_charge: tuple | None = None
        self._verbose = verbose
        self._restored = False
        self._violation: PrivacyError | None = None
        self._configs: dict[str, Any] = {}
        self._trial_plans: dict[str, dict] = {}
        self._last_logged: tuple | None = None
        searcher.attach_recorder(self._record)
        searcher.attach_account(lambda: self._account)  # replaced by the journal's on a restore
        self._check_target()  # the plan is known: bound the search before Tune starts

    # ------------------------------------------------------------------ the guarantee
    def guarantee(self, *, if_stopped_now: bool = False) -> dict[str, Any]:
        """The current (ε, δ) of the whole search and how it is made up."""
        guarantee = self._account.guarantee(if_stopped_now=if_stopped_now)
        mechanism = self._account.mechanism
        described = dict(mechanism.params["description"]) if mechanism.kind == "release" else {}
        return {**described, **guarantee.to_dict(), "epsilon_dataset": self._dataset_epsilon(guarantee)}

    @property
    def account(self) -> SearchAccount:
        """The search's account (read-only use)."""
        return self._account

    # ------------------------------------------------------------------ Tune hooks
    def setup(self, **info: Any) -> None:
        if self._searcher.restore_refusal is not None:
            raise self._searcher.restore_refusal
        check_scheduler(running_scheduler(), self._searcher)  # before any trial, on tune.run too
        if not self._restored:  # a restored experiment's spec no longer carries the user's num_samples
            refuse_truncation(info.get("num_samples"), self._searcher.num_trials)
        if self._journal_path is not None and (self._restored or os.path.exists(self._journal_path)):
            self._open_journal(self._journal_path)
        if self._ledger is not None:
            recorded_on = self._ledger.dataset_of(self._search_id)
            if recorded_on not in (None, self._dataset):
                raise PrivacyError(
                    f"This search was recorded in the ledger on dataset {recorded_on!r}, not {self._dataset!r}: "
                    "restore it with the dataset it started on."
                )
            self._update_ledger(force=True)
        self._check_target()

    def on_trial_start(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        if self._journal is None:
            location = self._journal_location(trial)
            if location is not None:
                self._open_journal(location)
        self._configs[trial.trial_id] = _jsonable(trial.config)
        accounted = bool(self._searcher.accounts_trial(trial.config))
        self._record({"type": "started", "trial_id": trial.trial_id, "accounted": accounted})

    def on_trial_result(self, iteration: int, trials: list, trial: Any, result: dict, **info: Any) -> None:
        if trial.trial_id in self._account.trials and not self._account.is_accounted(trial.trial_id):
            return
        trial_plan, spent = self._read_report(trial.trial_id, result)
        if self._account.plan is None:
            self._record({"type": "plan", "plan": trial_plan})
            self._check_target()
        beyond_plan = not (report_covers(trial_plan, spent) and report_covers(self._account.plan, spent))
        if beyond_plan or not self._account.within_charge(trial.trial_id, spent):
            paid = self._account.units_of(trial.trial_id)
            # It ran them: the account charges what it reports (synced) before the run is stopped.
            self._record({"type": "reported", "trial_id": trial.trial_id, "spent": spent, "overrun": True})
            raise PrivacyError(
                f"Trial {trial.trial_id} reported spending {spent}, "
                + (f"above its plan {trial_plan}" if beyond_plan else f"beyond the {paid} time units charged to it")
                + ": the search is stopped, and the guarantee now bounds that trial as it ran."
            )
        if not report_covers(self._account.plan, trial_plan):
            raise PrivacyError(
                f"Trial {trial.trial_id} plans to spend {trial_plan}, which the search's plan {self._account.plan} "
                "does not cover; every trial must satisfy one plan (the guarantee assumes it)."
            )
        self._trial_plans[trial.trial_id] = trial_plan
        self._record({"type": "reported", "trial_id": trial.trial_id, "spent": spent})

    def on_trial_complete(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        self._record({"type": "completed", "trial_id": trial.trial_id})
        if not self._account.is_accounted(trial.trial_id) or self._account.mechanism.kind == "halving":
            return  # a halving search's scheduler stops trials, each charged for what it may have run
        own_plan = self._trial_plans.get(trial.trial_id)
        spent = self._account.attempts_of(trial.trial_id)[-1]["spent"]
        if own_plan is not None and spent is not None and report_covers(spent, own_plan):
            return  # the trial ran its whole plan
        # Tune logs and swallows errors raised while it stops a trial: raise at the next step.
        self._violation = PrivacyError(
            f"Trial {trial.trial_id} ended without error before spending its plan: it was stopped early "
            "(by a scheduler such as ASHA, HyperBand, PBT or median stopping, or by a `stop=` criterion). "
            "Metric-driven early stopping is not covered by any proven bound for a DP searcher; use "
            "ray_dptune.private_tune_config (FIFO) and let every trial run its plan."
        )

    def on_step_begin(self, iteration: int, trials: list, **info: Any) -> None:
        if self._violation is not None:
            raise self._violation

    def on_trial_error(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        self._record({"type": "failed", "trial_id": trial.trial_id})

    def on_trial_recover(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        self._record({"type": "failed", "trial_id": trial.trial_id})

    def on_experiment_end(self, trials: list, **info: Any) -> None:
        if self._violation is not None:
            raise self._violation
        self._update_ledger(force=True)
        path = self._write_report(trials)
        if self._verbose:
            epsilon = self.guarantee(if_stopped_now=True)["epsilon"]
            shown = "n/a (no trial reported a plan)" if epsilon is None else f"{epsilon:.4g}"
            print(
                f"[ray_dptune] search done: (ε = {shown}, δ = {self._account.delta:g}) for the whole search; "
                f"report: {path or 'not written (no trial ran; pass report_path=)'}",
                flush=True,
            )

    def get_state(self) -> dict[str, Any]:
        """Only where the account lives: the journal, not Tune's checkpoint, is the record."""
        return {"search_id": self._search_id, "journal": None if self._journal is None else self._journal.path}

    def set_state(self, state: dict[str, Any]) -> None:
        self._restored = True
        self._search_id = state["search_id"]
        self._journal_path = self._journal_path or state.get("journal")

    # ------------------------------------------------------------------ report
    def report(self) -> PrivacyReport:
        """The privacy report: mechanism, plan, every attempt, the final (ε, δ), coverage."""
        return searcher_report(
            self._searcher,
            self._account,
            search_id=self._search_id,
            guarantee=self.guarantee(if_stopped_now=True),
            configs=self._configs,
            dataset=self._dataset,
            ledger=None if self._ledger is None else {"path": self._ledger.path, "search": self._search_id},
            journal=None if self._journal is None else self._journal.path,
        )

    # ------------------------------------------------------------------ the journal
    def _record(self, event: dict[str, Any]) -> None:
        """Write-ahead: the event reaches the journal (synced when it adds cost) before the account."""
        self._account.admit(event)  # a charge past a halving search's budget is refused before it is written
        if self._journal is not None:
            self._journal.append([event])
        else:
            self._pending.append(event)
        self._account.apply(event)
        self._update_ledger()
        self._log_progress()

    def _journal_location(self, trial: Any) -> str | None:
        if self._journal_path is not None:
            return self._journal_path
        storage = getattr(trial, "storage", None)
        if storage is None:
            return None  # not a Tune trial (unit use): the account stays in memory
        import pyarrow.fs

        if not isinstance(storage.storage_filesystem, pyarrow.fs.LocalFileSystem):
            raise PrivacyError(
                f"The experiment's storage ({type(storage.storage_filesystem).__name__}) is not a local or mounted "
                "filesystem, so the write-ahead journal cannot be synced there: pass journal_path= on a disk the "
                "driver writes to (local or NFS)."
            )
        os.makedirs(storage.experiment_fs_path, exist_ok=True)
        return os.path.join(storage.experiment_fs_path, JOURNAL_FILE)

    def _open_journal(self, path: str) -> None:
        """Starts the journal, or (after a restore) rebuilds the account from it and charges the interrupted."""
        journal = SearchJournal(path)
        existing = journal.search()
        if existing is None or existing["search_id"] != self._search_id:
            journal.begin(self._search_id, self._search_record(), self._pending)  # refuses another search's file
        else:
            account = journal.account(generic=self._account.generic)
            recorded_k = account.mechanism.cover_cap
            recorded, declared = account.mechanism.to_dict(), self._account.mechanism.to_dict()
            if "upper" not in recorded["params"]:  # journaled before C was recorded: its worst case C = C/c stays
                declared["params"].pop("upper", None)
            if recorded != declared:
                raise PrivacyError(
                    f"The restored searcher declares {declared} but the journal recorded "
                    f"{recorded} (K = {recorded_k}): K is never redrawn."
                )
            events = [{"type": "restored"}, *self._pending]
            journal.append(events)
            for event in events:
                account.apply(event)
            self._account = account
        self._pending = []
        self._journal = journal

    def _search_record(self) -> dict[str, Any]:
        return {
            "mechanism": self._account.mechanism.to_dict(),
            "delta": self._account.delta,
            "plan": self._account.plan,
            "searcher": type(self._searcher).__name__,
            "dataset": self._dataset,
        }

    # ------------------------------------------------------------------ ledger and target
    def _update_ledger(self, *, force: bool = False) -> None:
        """Keeps the ledger at the worst case (every live attempt charged), written when it changes."""
        if self._ledger is None:
            return
        account = self._account
        charge = (account.charged_attempts(if_stopped_now=True), account.selections, len(account.releases))
        if charge == self._ledger_charge and not force:
            return
        summary = {
            "searcher": type(self._searcher).__name__,
            "mechanism": account.mechanism.to_dict(),
            "plan": account.plan,
            "trials": account.num_trials_started,
            "charged_attempts": charge[0],
            "journal": None if self._journal is None else self._journal.path,
        }
        guarantee = account.guarantee(if_stopped_now=True)
        self._ledger.record_search(self._search_id, dataset=self._dataset, guarantee=guarantee, summary=summary)
        self._ledger_charge = charge

    def _dataset_epsilon(self, guarantee: Guarantee) -> float | None:
        if self._ledger is None or guarantee.epsilon is None:
            return None
        return self._ledger.dataset_epsilon(
            self._dataset, delta=self._account.delta, exclude=self._search_id, extra=guarantee
        )

    def _check_target(self) -> None:
        if self._target_epsilon is None:
            return
        guarantee = self.guarantee()
        epsilon = guarantee["epsilon"] if guarantee["epsilon_dataset"] is None else guarantee["epsilon_dataset"]
        if epsilon is not None and epsilon > self._target_epsilon:
            scope = "This search's guarantee" if self._ledger is None else f"The dataset {self._dataset!r}'s total"
            raise PrivacyError(
                f"{scope} is ε = {epsilon:.4g} at δ = {self._account.delta:g}, above target_epsilon = "
                f"{self._target_epsilon}. Raise the noise (ray_dptune.calibrate_noise_multiplier finds it) or "
                "lower the expected number of trials."
            )

    # ------------------------------------------------------------------ helpers
    def _write_report(self, trials: list) -> str | None:
        """Writes the report to ``report_path`` or the experiment's storage; returns where.

        With K = 0 no trial exists to locate the experiment's storage; the report
        then goes to ``report_path`` only (the release is data-independent anyway).
        """
        import pyarrow.fs

        if self._report_path:
            write_report(pyarrow.fs.LocalFileSystem(), os.path.abspath(self._report_path), self.report())
            return self._report_path
        if not trials:
            return None
        storage = trials[0].storage  # the experiment's folder on its storage (local or shared)
        path = f"{storage.experiment_fs_path}/{REPORT_FILE}"
        write_report(storage.storage_filesystem, path, self.report())
        return path

    def _read_report(self, trial_id: str, result: dict) -> tuple[dict, dict]:
        records = []
        for key in (PLAN_KEY, SPENT_KEY):
            record = result.get(key)
            try:
                parse_report(record)
            except ValueError as error:
                raise PrivacyError(
                    f"Trial {trial_id} reported a result without a valid {key!r} ({error}). A DP trainable "
                    "must report its plan and what it has spent with every result (ray_dptune.dp_trainable does)."
                ) from error
            records.append(record)
        return records[0], records[1]

    def _log_progress(self) -> None:
        """O(1): the account keeps counters and caches the curve per count of charged attempts."""
        if not self._verbose or self._account.plan is None:
            return
        account = self._account
        guarantee = account.guarantee()
        state = (guarantee.epsilon, account.trials_completed, guarantee.charged_attempts, account.units_charged)
        if state != self._last_logged:
            if account.mechanism.kind == "halving":  # the number of trials is not fixed: the budget is
                done = (
                    f"trials {state[1]} done; {state[3]}/{account.mechanism.params['budget_units']} time units charged"
                )
            else:
                done = (
                    f"trials {state[1]}/{self._searcher.num_trials} done; {state[2]} attempt(s) charged beyond the "
                    "selection bound"
                )
            print(
                f"[ray_dptune] whole search: (ε = {guarantee.epsilon:.4g}, δ = {account.delta:g}); {done}",
                flush=True,
            )
            self._last_logged = state


def _plan_record(plan: TrialSpend | RDPCurve | None) -> dict | None:
    if plan is None:
        return None
    if isinstance(plan, (TrialSpend, RDPCurve)):
        return plan.to_dict()
    raise TypeError(f"plan must be a TrialSpend, an RDPCurve or None, got {type(plan).__name__}.")


def _jsonable(config: dict[str, Any]) -> dict[str, Any]:
    return json.loads(json.dumps(config, default=repr))
