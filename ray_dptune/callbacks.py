"""PrivacyAccountantCallback: the single source of truth for a search's privacy."""

from __future__ import annotations

import json
import logging
from typing import Any

from ray.tune import Callback

from ray_dptune.accounting import RDPCurve, repeat_and_select
from ray_dptune.accounting.spend import TrialSpend, curve_from_report, parse_report
from ray_dptune.errors import PrivacyError, UnsupportedBoundError
from ray_dptune.ledger import PrivacyLedger
from ray_dptune.search.base import PrivateSearcher, RunCountSearcher, refuse_truncation

__all__ = ["PLAN_KEY", "REPORT_FILE", "SPENT_KEY", "PrivacyAccountantCallback"]

logger = logging.getLogger(__name__)

REPORT_FILE = "privacy_report.json"
PLAN_KEY = "dp_plan"
SPENT_KEY = "dp_spent"
_WITHHELD = "withheld: chosen from results the guarantee does not release"


class PrivacyAccountantCallback(Callback):
    """Composes every trial's Rényi DP into one (ε, δ) for the whole search.

    The searcher says how (:class:`~ray_dptune.search.base.PrivateSearcher`): the
    trials it accounts all satisfy one plan, and the whole search's curve is
    ``searcher.search_curve(plan)`` — ``repeat_and_select(plan, law, density_ratio)``
    for random-count and DP-HyPO searches (P&S Thm 2/6, DP-HyPO Thm 1), SVT rounds
    plus the final training for constant-overhead tuning — composed with the plan of
    every accounted attempt that failed or was interrupted and retried: such an
    attempt touched the data, and it may have spent up to its plan before failing.
    A searcher whose guarantee comes from its own release (DP Bayesian optimisation,
    validation-set privacy) states it through ``searcher.release_guarantee()``.

    Checks, each raising :class:`~ray_dptune.errors.PrivacyError`: a finite
    ``num_samples`` below K; a plan above ``target_epsilon`` (before any trial
    when ``plan`` is given); a result without a well-formed ``dp_plan`` and
    ``dp_spent``; a trial whose plan is not covered by the search's plan; spending
    above the plan.

    Args:
        searcher: the DP searcher (a :class:`~ray_dptune.search.base.PrivateSearcher`).
        delta: δ of the reported (ε, δ); a searcher with its own release guarantee
            must not need a larger one.
        plan: the most one trial may spend (a :class:`TrialSpend`, e.g. from
            ``trainable.privacy_plan(param_space)``, or an :class:`RDPCurve`); when
            None, the first trial's reported plan becomes the search's plan and
            every later trial must report a plan it covers.
        target_epsilon: refuse to run a search whose guarantee would exceed it.
        generic: also use the numeric P&S Lemma 7 bound (tighter, ~0.5 s per call).
        report_path: where ``privacy_report.json`` goes (default: the experiment folder).
        ledger: a :class:`~ray_dptune.ledger.PrivacyLedger`; the search is recorded in it
            and its guarantee composed with every earlier search on ``dataset``
            (``epsilon_dataset`` in the report; ``target_epsilon`` then applies to it).
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
        generic: bool = False,
        report_path: str | None = None,
        ledger: PrivacyLedger | None = None,
        dataset: str | None = None,
        verbose: bool = True,
    ):
        if not isinstance(searcher, PrivateSearcher):
            raise TypeError(
                "searcher must be a ray_dptune DP searcher (RandomCountSearcher, DPHyPOSearcher, "
                f"ConstantOverheadSearcher, DPBOSearcher), got {type(searcher).__name__}."
            )
        if not 0.0 < float(delta) < 1.0:
            raise ValueError(f"delta must lie strictly between 0 and 1, got {delta}.")
        self._searcher = searcher  # read for metric, mode and its details, which change as it runs
        run_count = isinstance(searcher, RunCountSearcher)
        self._law = searcher.distribution.to_dict() if run_count else None
        self._density_ratio = float(searcher.density_ratio) if run_count else None
        self._num_trials = int(searcher.num_trials)
        self._seed = searcher.seed
        self._delta = float(delta)
        self._release = searcher.release_guarantee()
        if self._release is not None and self._release["delta"] > self._delta:
            raise PrivacyError(
                f"{type(searcher).__name__} releases at δ = {self._release['delta']:g}, above this callback's "
                f"delta = {self._delta:g}: lower the searcher's δ or raise the callback's."
            )
        self._plan = _plan_record(plan)
        self._target_epsilon = target_epsilon
        self._generic = generic
        self._report_path = report_path
        self._attempts: dict[str, list[dict[str, Any]]] = {}
        self._configs: dict[str, dict[str, Any]] = {}
        self._trial_plans: dict[str, dict] = {}  # each trial's own plan (≤ the search's)
        self._verbose = verbose
        self._violation: PrivacyError | None = None
        self._restored = False
        self._last_logged: tuple | None = None
        self._selection_cache: tuple[str, RDPCurve, RDPCurve] | None = None
        if (ledger is None) != (dataset is None):
            raise ValueError("ledger and dataset go together: pass both (or neither).")
        if ledger is not None and not run_count:
            raise UnsupportedBoundError(
                f"The ledger composes random-count and DP-HyPO searches; {type(searcher).__name__}'s guarantee "
                "is not recorded there yet. Run it without ledger= and compose its report by hand."
            )
        self._unaccounted: set[str] = set()  # trials the searcher's guarantee covers without a plan
        self._ledger = ledger
        self._dataset = dataset
        self._experiment_id: str | None = None
        self._earlier: RDPCurve | None = None  # what earlier searches on the dataset spent
        if self._plan is not None:
            self._selection()  # the plan is known: bound the search before Tune starts
        if self._release is not None:
            self._check_target()

    # ------------------------------------------------------------------ the guarantee
    def guarantee(self) -> dict[str, Any]:
        """The current (ε, δ) of the whole search and how it is made up."""
        if self._release is not None:
            return {**self._release, "epsilon_dataset": None, "failed_attempts": len(self._failed_attempts())}
        if self._plan is None:
            return {"epsilon": None, "delta": self._delta, "reason": "no trial has reported its plan yet"}
        plan_curve, selection = self._selection()
        failed = self._failed_attempts()
        total = selection + len(failed) * plan_curve if failed else selection
        epsilon = total.epsilon(self._delta)
        epsilon_selection = selection.epsilon(self._delta)
        adaptivity = None
        if self._density_ratio is not None and self._density_ratio > 1.0:
            law = self._searcher.distribution
            non_adaptive = repeat_and_select(plan_curve, law, generic=self._generic).epsilon(self._delta)
            adaptivity = epsilon_selection - non_adaptive
        dataset_total = None
        if self._ledger is not None:
            dataset_total = (total + self._earlier if self._earlier is not None else total).epsilon(self._delta)
        return {
            "epsilon": epsilon,
            "delta": self._delta,
            "epsilon_dataset": dataset_total,
            "epsilon_selection": epsilon_selection,
            "epsilon_one_trial": plan_curve.epsilon(self._delta),
            "epsilon_adaptivity": adaptivity,
            "failed_attempts": len(failed),
            "curve": total.to_dict(),
        }

    def _selection(self) -> tuple[RDPCurve, RDPCurve]:
        """(plan curve, selection bound), recomputed only when the plan changes."""
        key = json.dumps(self._plan, sort_keys=True)
        if self._selection_cache is None or self._selection_cache[0] != key:
            plan_curve = curve_from_report(self._plan)
            selection = self._searcher.search_curve(plan_curve, generic=self._generic)
            self._selection_cache = (key, plan_curve, selection)
        return self._selection_cache[1], self._selection_cache[2]

    def _failed_attempts(self) -> list[dict[str, Any]]:
        """Failed attempts of accounted trials (the others are covered by the searcher's own bound)."""
        return [
            attempt
            for trial_id, attempts in self._attempts.items()
            if trial_id not in self._unaccounted
            for attempt in attempts
            if attempt["status"] == "failed"
        ]

    # ------------------------------------------------------------------ Tune hooks
    def setup(self, **info: Any) -> None:
        if not self._restored:  # a restored experiment's spec no longer carries the user's num_samples
            refuse_truncation(info.get("num_samples"), self._num_trials)
        if self._ledger is not None:
            self._join_ledger()
        self._check_target()

    def on_trial_start(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        attempts = self._attempts.setdefault(trial.trial_id, [])
        interrupted = [attempt for attempt in attempts if attempt["status"] == "running"]
        for attempt in interrupted:  # restarted without an error event: interrupted
            attempt["status"] = "failed"
        attempts.append({"status": "running", "spent": None})
        self._configs[trial.trial_id] = _jsonable(trial.config)
        if not self._searcher.accounts_trial(trial.config):
            self._unaccounted.add(trial.trial_id)
        self._record(trial.trial_id, durable=bool(interrupted))
        self._log_progress()

    def on_trial_result(self, iteration: int, trials: list, trial: Any, result: dict, **info: Any) -> None:
        if trial.trial_id in self._unaccounted:
            return
        trial_plan, spent = self._read_report(trial.trial_id, result)
        if self._plan is None:
            self._plan = trial_plan
            if self._ledger is not None:
                self._ledger.record_plan(self._experiment_id, trial_plan)
            self._check_target()
        elif not _covers(self._plan, trial_plan):
            raise PrivacyError(
                f"Trial {trial.trial_id} plans to spend {trial_plan}, which the search's plan {self._plan} "
                "does not cover; every trial must satisfy one plan (the guarantee assumes it)."
            )
        if not _covers(trial_plan, spent):
            raise PrivacyError(
                f"Trial {trial.trial_id} reported spending {spent}, above its plan {trial_plan}: "
                "the guarantee no longer holds."
            )
        self._current_attempt(trial.trial_id)["spent"] = spent
        self._trial_plans[trial.trial_id] = trial_plan

    def on_trial_complete(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        attempt = self._current_attempt(trial.trial_id)
        attempt["status"] = "completed"
        self._record(trial.trial_id, durable=False)
        self._log_progress()
        if trial.trial_id in self._unaccounted:
            return
        own_plan = self._trial_plans.get(trial.trial_id)
        if own_plan is not None and attempt["spent"] is not None and _covers(attempt["spent"], own_plan):
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
        self._mark_failed(trial.trial_id)

    def on_trial_recover(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        self._mark_failed(trial.trial_id)

    def on_experiment_end(self, trials: list, **info: Any) -> None:
        if self._violation is not None:
            raise self._violation
        self._record()
        if self._ledger is not None:  # other drivers may have added searches meanwhile
            self._earlier = self._ledger.dataset_curve(self._dataset, exclude=self._experiment_id)
        path = self._write_report(trials)
        guarantee = self.guarantee()
        if self._verbose:
            epsilon = (
                "n/a (no trial reported a plan)" if guarantee["epsilon"] is None else f"{guarantee['epsilon']:.4g}"
            )
            print(
                f"[ray_dptune] search done: (ε = {epsilon}, δ = {self._delta:g}) for the whole search; "
                f"report: {path or 'not written (no trial ran; pass report_path=)'}",
                flush=True,
            )

    def get_state(self) -> dict[str, Any]:
        return {
            "plan": self._plan,
            "attempts": self._attempts,
            "configs": self._configs,
            "trial_plans": self._trial_plans,
            "unaccounted": sorted(self._unaccounted),
            "experiment_id": self._experiment_id,
        }

    def set_state(self, state: dict[str, Any]) -> None:
        self._restored = True
        self._experiment_id = state.get("experiment_id")
        self._trial_plans = state.get("trial_plans", {})
        self._unaccounted = set(state.get("unaccounted", []))
        self._plan = state["plan"]
        self._attempts = state["attempts"]
        self._configs = state["configs"]

    # ------------------------------------------------------------------ report
    def report(self) -> dict[str, Any]:
        """The privacy report: law, K, plan, per-trial spend, failures, final (ε, δ), coverage."""
        public = self._searcher.configs_public
        started = {
            trial_id: {"config": self._configs.get(trial_id) if public else _WITHHELD, "attempts": attempts}
            for trial_id, attempts in self._attempts.items()
        }
        return {
            "guarantee": self.guarantee(),
            "searcher": type(self._searcher).__name__,
            "threat_model": self._searcher.threat_model,
            "details": self._searcher.privacy_details(),
            "dataset": self._dataset,
            "ledger": None if self._ledger is None else {"path": self._ledger.path, "experiment": self._experiment_id},
            "metric": getattr(self._searcher, "metric", None),
            "mode": getattr(self._searcher, "mode", None),
            "law": self._law,
            "num_trials_planned": self._num_trials,
            "num_trials_started": len(self._attempts),
            "unaccounted_trials": sorted(self._unaccounted),
            "seed": self._seed if self._seed is not None else "secure (operating system)",
            "density_ratio": self._density_ratio,
            "plan": self._plan,
            "trials": started,
            "covers": self._searcher.coverage,
            "score_privacy": _score_privacy(self._plan),
        }

    # ------------------------------------------------------------------ helpers
    def _write_report(self, trials: list) -> str | None:
        """Writes the report to ``report_path`` or the experiment's storage; returns where.

        With K = 0 no trial exists to locate the experiment's storage; the report
        then goes to ``report_path`` only (the release is data-independent anyway).
        """
        text = json.dumps(self.report(), indent=2)
        if self._report_path:
            with open(self._report_path, "w") as file:
                file.write(text)
            return self._report_path
        if not trials:
            return None
        storage = trials[0].storage  # the experiment's folder on its storage (local or shared)
        path = f"{storage.experiment_fs_path}/{REPORT_FILE}"
        with storage.storage_filesystem.open_output_stream(path) as stream:
            stream.write(text.encode())
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

    def _current_attempt(self, trial_id: str) -> dict[str, Any]:
        attempts = self._attempts.setdefault(trial_id, [{"status": "running", "spent": None}])
        return attempts[-1]

    def _mark_failed(self, trial_id: str) -> None:
        attempt = self._current_attempt(trial_id)
        if attempt["status"] == "running":
            attempt["status"] = "failed"
        self._record(trial_id)
        self._log_progress()

    def _join_ledger(self) -> None:
        """Registers this search (or, after a restore, checks it is the same dataset's)."""
        if self._experiment_id is None:
            self._experiment_id = self._ledger.register_experiment(
                self._dataset,
                law=self._law,
                num_trials=self._num_trials,
                density_ratio=self._density_ratio,
                plan=self._plan,
            )
        elif self._ledger.dataset_of(self._experiment_id) != self._dataset:
            raise PrivacyError(
                f"This search was recorded in the ledger on dataset "
                f"{self._ledger.dataset_of(self._experiment_id)!r}, not {self._dataset!r}: restore it with "
                "the dataset it started on."
            )
        self._earlier = self._ledger.dataset_curve(self._dataset, exclude=self._experiment_id)

    def _record(self, trial_id: str | None = None, *, durable: bool = True) -> None:
        """Writes one trial's attempts (or, without ``trial_id``, all) to the ledger."""
        if self._ledger is not None and self._experiment_id is not None:
            attempts = self._attempts if trial_id is None else {trial_id: self._attempts[trial_id]}
            self._ledger.record_attempts(self._experiment_id, attempts, durable=durable)

    def _check_target(self) -> None:
        if self._target_epsilon is None:
            return
        guarantee = self.guarantee()
        epsilon = guarantee["epsilon"] if guarantee["epsilon_dataset"] is None else guarantee["epsilon_dataset"]
        if epsilon is None:  # no plan known yet
            return
        if epsilon > self._target_epsilon:
            scope = (
                "This search's guarantee"
                if self._ledger is None
                else (f"The dataset {self._dataset!r}'s total with this search")
            )
            raise PrivacyError(
                f"{scope} is ε = {epsilon:.4g} at δ = {self._delta:g}, above target_epsilon = "
                f"{self._target_epsilon}. Raise the noise (ray_dptune.calibrate_noise_multiplier finds it) or "
                "lower the expected number of trials."
            )

    def _log_progress(self) -> None:
        if self._plan is None or not self._verbose:
            return
        epsilon = self.guarantee()["epsilon"]
        done = sum(1 for attempts in self._attempts.values() if attempts[-1]["status"] == "completed")
        failures = len(self._failed_attempts())
        if (epsilon, done, failures) != self._last_logged:
            print(
                f"[ray_dptune] whole search: (ε = {epsilon:.4g}, δ = {self._delta:g}); "
                f"trials {done}/{self._num_trials} done; {failures} failed attempt(s) composed",
                flush=True,
            )
            self._last_logged = (epsilon, done, failures)


def _plan_record(plan: TrialSpend | RDPCurve | None) -> dict | None:
    if plan is None:
        return None
    if isinstance(plan, (TrialSpend, RDPCurve)):
        return plan.to_dict()
    raise TypeError(f"plan must be a TrialSpend, an RDPCurve or None, got {type(plan).__name__}.")


def _covers(plan: dict, spent: dict) -> bool:
    """True when the ``spent`` record costs no more than ``plan`` at any order."""
    if plan.get("kind") == "dpsgd" and spent.get("kind") == "dpsgd":
        return TrialSpend.from_dict(plan).covers(TrialSpend.from_dict(spent))
    return curve_from_report(plan).dominates(curve_from_report(spent))


def _score_privacy(plan: dict | None) -> str:
    if plan is None or plan.get("kind") != "dpsgd":
        return "unknown: the trainable reported a bare RDP curve"
    if plan.get("score_releases"):
        return "private: each reported score carries Gaussian noise, composed into the plan"
    return "public validation data: scores are not protected (training-set privacy)"


def _jsonable(config: dict[str, Any]) -> dict[str, Any]:
    return json.loads(json.dumps(config, default=repr))
