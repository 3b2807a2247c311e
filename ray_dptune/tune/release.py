"""release_best: what a private search may release, and nothing more."""

from __future__ import annotations

import dataclasses
import json
import math
import os
import posixpath
from dataclasses import dataclass
from typing import Any

from ray_dptune.audit.result import released_audit
from ray_dptune.errors import PrivacyError
from ray_dptune.records.journal import JOURNAL_FILE
from ray_dptune.records.report import REPORT_FILE, read_report, write_report
from ray_dptune.records.statement import STATEMENT_FILE, public_statement, write_statement
from ray_dptune.result_keys import AUDIT_KEY, SEARCH_PLAN_KEY

__all__ = ["ReleasedTrial", "release_best"]

# What a purge leaves in the experiment folder besides the released trial's folder: the
# privacy record, which holds no score: the report and the search's journal with SQLite's
# sidecar files.
_SQLITE_SIDECARS = ("", "-wal", "-shm", "-journal")
_PRIVACY_RECORD = frozenset({REPORT_FILE, STATEMENT_FILE, *(JOURNAL_FILE + suffix for suffix in _SQLITE_SIDECARS)})


@dataclass(frozen=True, repr=False)
class ReleasedTrial:
    """The selected trial, the only output the privacy guarantee covers.

    Attributes:
        config: its hyperparameters.
        score: its final reported score (the selection metric).
        checkpoint_path: its last checkpoint, or None.
        guarantee: the whole search's (ε, δ) and how it is made up, from the privacy report: the
            operator's (it counts attempts), not to be published.
        trial_id: the released trial's id (None when the searcher released its own output or K = 0):
            Tune's trial counter, the operator's.
        state: the released trial's final state in the privacy report ("completed").
        statement: what may be published beside the model (:func:`~ray_dptune.records.statement.public_statement`,
            also written to ``public_statement.json``): no K, attempt count, trial state or trial id.
    """

    config: dict[str, Any]
    score: float | None
    checkpoint_path: str | None
    guarantee: dict[str, Any]
    trial_id: str | None = None
    state: str | None = None
    statement: dict[str, Any] | None = None

    def __repr__(self) -> str:
        """The guarantee as its (ε, δ) only: its RDP curve (hundreds of orders) stays in ``guarantee``."""
        guarantee = self.guarantee
        if "epsilon" in guarantee:
            summary = f"(ε={guarantee['epsilon']:.4g}, δ={guarantee['delta']:g}) for the whole search"
        else:
            summary = guarantee.get("note", "none")
        return (
            f"ReleasedTrial(trial_id={self.trial_id!r}, config={self.config!r}, score={self.score!r}, "
            f"checkpoint_path={self.checkpoint_path!r}, guarantee={summary})"
        )


def release_best(
    results_or_path: Any, *, metric: str | None = None, mode: str | None = None, purge: bool = False
) -> ReleasedTrial:
    """Returns only the output a private search may release; ``purge=True`` deletes the rest.

    The output is what the searcher names in the privacy report: the final training
    trial of constant-overhead tuning, or the (λ̃, ṽ) that DP Bayesian optimisation
    released itself (no checkpoint: retrain with λ̃). Otherwise it is the best trial by
    its *last* reported score (the run's output, as in Papernot & Steinke's "return the
    best of the K runs"), among the trials whose run ended as planned: a failed trial's run
    is one of the K with output "failed", and a NaN or ±inf score ranks below every finite
    one. Both are fixed rules on the runs' outputs, so the selection bound still covers the
    choice; neither is ever released.

    Only a complete search within its budget is released. A search that stopped before its
    K trials ended (Ctrl-C, ``time_budget_s``, a killed driver, a retry the budget refused)
    is not: its bound covers the best of K runs, and an operator who stops after seeing good
    scores makes K depend on the data. Finish it with ``tune.Tuner.restore(path, trainable)``
    when its budget allows (the accountant says so when it ends).

    Args:
        results_or_path: a ``ResultGrid`` from ``Tuner.fit()``, ``tune.run``'s ``ExperimentAnalysis``, or
            an experiment folder.
        metric: selection metric: the one the search was tuned on (another is refused).
        mode: "max" or "min": the search's (another is refused).
        purge: leave only what the guarantee covers in the experiment folder: the
            released trial's own folder (none when the searcher released its own output)
            and the privacy record (``privacy_report.json``, ``privacy_journal.db`` and its
            SQLite ``-wal``/``-shm`` files, and a privacy ledger the report names there).
            Everything else in the folder is deleted: the other trials' folders (results,
            checkpoints, configurations) and Ray's experiment state of every session
            (``experiment_state-*.json`` with every trial's config and last results,
            ``searcher-state-*.pkl``, ``callback-states-*.pkl``, ``search_gen_state-*.json``,
            ``basic-variant-state-*.json``, ``tuner.pkl``), which would otherwise keep the
            unreleased trials' scores and (for adaptive searchers) configurations. The
            experiment can then no longer be restored with ``Tuner.restore``; calling
            ``release_best`` on its folder again returns the same release, read back from
            what the purge kept. The copies of the experiment Ray staged on this machine
            (``/tmp/ray/session_*/artifacts/*/<experiment>``, under ``$RAY_TMPDIR`` when set) are
            deleted too; a custom ``ray.init(_temp_dir=...)``, Ray's worker logs and copies on
            other nodes are not touched.

    Raises:
        PrivacyError: no privacy report in the experiment folder (the search ran
            without PrivacyAccountantCallback), so no guarantee can be stated; the search is
            incomplete or ended above its target; no trial ended its run with a finite score; or, with
            ``purge=True``, the released trial's folder is not in the experiment folder
            (then nothing is deleted).
    """
    import pyarrow.fs
    from ray import tune

    if isinstance(results_or_path, tune.ExperimentAnalysis):  # legacy tune.run's result
        results_or_path = results_or_path.experiment_path
    if isinstance(results_or_path, (str, os.PathLike)):
        filesystem, experiment_path = pyarrow.fs.FileSystem.from_uri(os.fspath(results_or_path))
        purged = _purged_release(filesystem, experiment_path)
        if purged is not None:
            return purged
        trials = tune.ExperimentAnalysis(os.fspath(results_or_path)).trials
    else:
        filesystem, experiment_path = results_or_path.filesystem, results_or_path.experiment_path
        trials = list(results_or_path)
    if not trials:
        return ReleasedTrial(
            config={},
            score=None,
            checkpoint_path=None,
            guarantee={"note": "No trial ran (K = 0): the release is independent of the data."},
        )
    report_path = f"{experiment_path}/{REPORT_FILE}"
    written = read_report(filesystem, report_path)  # through local, NFS, S3, GCS
    report = written.to_dict()
    _refuse_unreleasable(report, experiment_path)
    guarantee = _operator_guarantee(report)
    details = report.get("details") or {}
    if "release" in details:  # the searcher released its own output (DP-BO's λ̃ and ṽ)
        if details["release"] is None:
            raise PrivacyError(
                f"{report.get('searcher')} releases its own output when the search ends, and this search did not "
                "finish: nothing may be released (its trials' raw scores are not private)."
            )
        config, score = details["release"]["config"], details["release"]["score"]
        statement = public_statement(report, config=config, score=score)
        released, keep = ReleasedTrial(config, score, None, guarantee, statement=statement), None
    else:
        best, score = _released_trial(trials, report, details, metric, mode)
        trial_id = _trial_id(best)
        state = (report["trials"].get(trial_id) or {}).get("state")
        config = {key: value for key, value in best.config.items() if key != SEARCH_PLAN_KEY}  # the plan is stated
        statement = public_statement(report, config=config, score=score)
        released = ReleasedTrial(config, score, _checkpoint_path(best), guarantee, trial_id, state, statement=statement)
        keep = _trial_path(best)
        if written.released_trial_id not in (None, trial_id):
            raise PrivacyError(
                f"This search already released trial {written.released_trial_id}; releasing {trial_id} too would "
                "release two trials, which the guarantee does not cover."
            )
        audit = written.audit
        if audit is not None:  # the released model's canary counts beside the proven ε; no other trial's
            audit = released_audit(
                audit,
                _last_metrics(best).get(AUDIT_KEY),
                epsilon_upper=report["guarantee"]["epsilon"],
                delta=report["guarantee"]["delta"],
            )
        write_report(filesystem, report_path, dataclasses.replace(written, released_trial_id=trial_id, audit=audit))
    if purge:
        _purge(filesystem, experiment_path, keep, trials, report)
        _purge_ray_staging(experiment_path, trials)
    write_statement(filesystem, f"{experiment_path}/{STATEMENT_FILE}", released.statement or {})
    return released


def _operator_guarantee(report: dict[str, Any]) -> dict[str, Any]:
    """The report's guarantee with what it covers and the target: :attr:`ReleasedTrial.guarantee`."""
    return {**report["guarantee"], "covers": report["covers"], "target": report["target"]}


def _purged_release(filesystem: Any, experiment_path: str) -> ReleasedTrial | None:
    """The release an earlier ``purge=True`` left in the folder, read back; None if it was not purged.

    Tune's state is gone then; the report names the released trial, the statement its
    config and score, and the one folder left is its own (the last ``checkpoint_*`` in it).
    """
    import pyarrow.fs

    root = _fs_path(experiment_path)
    entries = filesystem.get_file_info(pyarrow.fs.FileSelector(root, recursive=False, allow_not_found=True))
    files = {entry.base_name for entry in entries if entry.type == pyarrow.fs.FileType.File}
    if STATEMENT_FILE not in files or any(name.startswith("experiment_state-") for name in files):
        return None
    written = read_report(filesystem, f"{root}/{REPORT_FILE}")
    with filesystem.open_input_stream(f"{root}/{STATEMENT_FILE}") as stream:
        statement = json.loads(stream.read())
    checkpoint = None
    for folder in (entry for entry in entries if entry.type == pyarrow.fs.FileType.Directory):
        inside = filesystem.get_file_info(pyarrow.fs.FileSelector(folder.path, recursive=False))
        checkpoints = sorted(
            entry.path
            for entry in inside
            if entry.type == pyarrow.fs.FileType.Directory and entry.base_name.startswith("checkpoint_")
        )
        checkpoint = checkpoints[-1] if checkpoints else None
    report = written.to_dict()
    trial_id = written.released_trial_id
    return ReleasedTrial(
        statement["released"]["config"],
        statement["released"]["score"],
        checkpoint,
        _operator_guarantee(report),
        trial_id,
        (report["trials"].get(trial_id) or {}).get("state") if trial_id else None,
        statement=statement,
    )


def _purge(filesystem: Any, experiment_path: str, keep: str | None, trials: list[Any], report: dict[str, Any]) -> None:
    """Deletes everything in the experiment folder but ``keep`` (a trial folder) and the privacy record.

    An allow-list, not a list of Ray's file names: whatever Ray (or a searcher, or an
    earlier session) wrote there and is not the release goes.
    """
    import pyarrow.fs

    root = _fs_path(experiment_path)
    entries = filesystem.get_file_info(pyarrow.fs.FileSelector(root, recursive=False))
    keep = None if keep is None else _fs_path(keep)
    folders = {_fs_path(entry.path) for entry in entries if entry.type == pyarrow.fs.FileType.Directory}
    if keep is not None and keep not in folders:
        raise PrivacyError(
            f"The released trial's folder {keep} is not in the experiment folder {root}: nothing was purged "
            "(purging would delete the release). Pass the experiment folder the trial ran in."
        )
    kept = _PRIVACY_RECORD | _ledger_files(report, filesystem, root)
    for trial in trials:  # a trial folder outside the experiment folder (not Ray 2.60's layout)
        path = _trial_path(trial)
        if path and _fs_path(path) != keep and posixpath.dirname(_fs_path(path)) != root:
            try:
                filesystem.delete_dir(path)
            except FileNotFoundError:
                pass
    for entry in entries:
        path = _fs_path(entry.path)
        if path == keep or (entry.type == pyarrow.fs.FileType.File and entry.base_name in kept):
            continue
        if entry.type == pyarrow.fs.FileType.Directory:
            filesystem.delete_dir(entry.path)
        else:
            filesystem.delete_file(entry.path)


def _ledger_files(report: dict[str, Any], filesystem: Any, root: str) -> frozenset[str]:
    """The names of a privacy ledger the report names inside the experiment folder.

    The ledger composes searches on a dataset: deleting it would lose their accounting.
    """
    import pyarrow.fs

    ledger = report.get("ledger")
    path = ledger.get("path") if isinstance(ledger, dict) else None
    if not isinstance(path, str) or not isinstance(filesystem, pyarrow.fs.LocalFileSystem):
        return frozenset()  # a ledger is a local SQLite file
    path = _fs_path(os.path.abspath(path))
    if posixpath.dirname(path) != root:
        return frozenset()
    name = posixpath.basename(path)
    return frozenset(name + suffix for suffix in _SQLITE_SIDECARS)


def _fs_path(path: str) -> str:
    """A path on the storage filesystem, normalised for comparison (no trailing or doubled '/')."""
    return posixpath.normpath(os.fspath(path).replace(os.sep, "/"))


def _refuse_unreleasable(report: dict[str, Any], experiment_path: str) -> None:
    """Raises PrivacyError for a search that is incomplete or ended above its target."""
    if not report["complete"]:
        raise PrivacyError(
            f"The search in {experiment_path} is incomplete ({report['incomplete_reason']}): its bound covers the best "
            "of all K trials, so nothing is released. Finish it with tune.Tuner.restore(path, trainable) if its budget "
            "allows (the accountant printed whether it does when the run ended), or start a new search."
        )
    target = report.get("target")
    if target is not None and not target["held"]:
        raise PrivacyError(
            f"The search in {experiment_path} ended at ε = {report['guarantee']['epsilon']:.4g}, above its target "
            f"ε = {target['epsilon']:g} (a spend past its plan, or attempts of a killed driver): nothing is released."
        )


def _released_trial(
    trials: list[Any], report: dict[str, Any], details: dict[str, Any], metric: str | None, mode: str | None
) -> tuple[Any, float | None]:
    """The trial the searcher names as its output, or else the best by the search's own ``metric`` and ``mode``."""
    for name, given in (("metric", metric), ("mode", mode)):
        if given is not None and given != report.get(name):
            raise PrivacyError(
                f"{name}={given!r} is not the search's {name} ({report.get(name)!r}): the selection rule is part of "
                "the mechanism, fixed when the search starts; one chosen after seeing the results is not covered."
            )
    metric, mode = report.get("metric"), report.get("mode")
    if "released_trial_id" in details:
        named = [trial for trial in trials if _trial_id(trial) == details["released_trial_id"]]
        if not named:
            raise PrivacyError(f"The released trial {details['released_trial_id']} is not in this experiment.")
        state = (report["trials"].get(details["released_trial_id"]) or {}).get("state")
        if state != "completed":
            raise PrivacyError(
                f"The trial the searcher names as its output, {details['released_trial_id']}, ended {state!r}, not "
                "'completed': a failed or unfinished trial is never released."
            )
        score = _last_metrics(named[0]).get(metric) if metric else None
        return named[0], None if score is None else float(score)
    if metric is None or mode not in ("max", "min"):
        raise PrivacyError(
            "The search recorded no selection rule (metric and mode): one chosen after seeing the results is not "
            "covered by the guarantee. Give metric= and mode= to the searcher or TuneConfig before the search."
        )
    ended = {trial_id for trial_id, record in report["trials"].items() if record.get("state") == "completed"}
    scored = [(_last_metrics(trial).get(metric), trial) for trial in trials if _trial_id(trial) in ended]
    candidates = [(s, trial) for s, trial in scored if isinstance(s, (int, float)) and math.isfinite(s)]
    if not candidates:
        raise PrivacyError(
            f"No trial ran its plan to the end with a finite {metric!r} ({len(ended)} of {len(report['trials'])} "
            "ended as planned): the best of the K runs is 'failed', and a failed or non-finite trial is never "
            "released."
        )
    sign = 1.0 if mode == "max" else -1.0
    score, best = max(candidates, key=lambda pair: sign * pair[0])
    return best, float(score)


def _last_metrics(trial: Any) -> dict[str, Any]:
    return getattr(trial, "metrics", None) or getattr(trial, "last_result", None) or {}


def _trial_id(trial: Any) -> str | None:
    return getattr(trial, "trial_id", None) or _last_metrics(trial).get("trial_id")


def _purge_ray_staging(experiment_path: str, trials: list[Any]) -> None:
    """Deletes the copies of this experiment Ray staged on this machine (``<ray temp>/session_*/artifacts``).

    Tune stages the experiment's state (the searcher's, every trial's config and results) and the
    trials' working folders there before it syncs them to storage. A staged folder is this
    experiment's when it bears the experiment's name and holds one of its trials' folders (named
    with a random trial id).
    """
    import glob
    import shutil
    import tempfile

    names = {posixpath.basename(path.rstrip("/")) for path in map(_trial_path, trials) if path}
    if not names:
        return
    temp = {os.environ.get("RAY_TMPDIR"), os.environ.get("TMPDIR"), tempfile.gettempdir(), "/tmp"} - {None, ""}
    experiment = posixpath.basename(_fs_path(experiment_path).rstrip("/"))
    staged_copies = {
        path
        for root in temp
        for path in glob.glob(
            os.path.join(
                glob.escape(os.path.join(str(root), "ray")), "session_*", "artifacts", "*", glob.escape(experiment)
            )
        )
    }
    for staged in staged_copies:
        kinds = ("driver_artifacts", "working_dirs")
        if any(os.path.isdir(os.path.join(staged, kind, name)) for kind in kinds for name in names):
            shutil.rmtree(staged, ignore_errors=True)


def _trial_path(trial: Any) -> str | None:
    """The trial's folder on the experiment's storage filesystem."""
    return getattr(trial, "path", None)


def _checkpoint_path(trial: Any) -> str | None:
    checkpoint = getattr(trial, "checkpoint", None)
    if checkpoint is None and hasattr(trial, "latest_checkpoint_result"):
        result = trial.latest_checkpoint_result
        checkpoint = result.checkpoint if result else None
    return getattr(checkpoint, "path", None)
