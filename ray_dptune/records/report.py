"""PrivacyReport: the typed, versioned record of a finished search, written atomically."""

from __future__ import annotations

import dataclasses
import datetime
import json
import time
import uuid
from dataclasses import dataclass
from importlib import metadata
from typing import Any

from ray_dptune.errors import PrivacyError
from ray_dptune.records.statement import OPERATOR_RECORD

__all__ = [
    "REPORT_FILE",
    "REPORT_VERSION",
    "PrivacyReport",
    "read_report",
    "searcher_report",
    "write_report",
    "write_search_report",
]

REPORT_FILE = "privacy_report.json"
REPORT_VERSION = 4
READABLE_VERSIONS = (2, 3, 4)
"""Version 2 reports (before targets and completeness were recorded) still read; see :meth:`PrivacyReport.from_dict`."""
_VERSIONED = ("ray_dptune", "ray", "torch", "opacus", "dp-accounting")
_WITHHELD = "withheld: chosen from results the guarantee does not release"


@dataclass(frozen=True)
class PrivacyReport:
    """What a search spent, what it releases and what the guarantee covers.

    The fields a person reads come first; the RDP curve (hundreds of orders) comes last.

    Attributes:
        search_id: the search's id (its journal holds the same).
        target: the budget ``{"epsilon", "delta", "held"}`` (None: the search had none).
        complete: True when every trial ran to its end; otherwise ``incomplete_reason`` says why
            and nothing may be released.
        released_trial_id: the trial :func:`~ray_dptune.release_best` released (None until then).
        searcher: the searcher's class name.
        mechanism: how the search is bounded (:class:`~ray_dptune.accounting.bookkeeping.search_mechanism.SearchMechanism` record).
        guarantee: (ε, δ) of the whole search and how it is made up.
        threat_model: what is protected, under which assumption.
        covers: which outputs the guarantee covers.
        trials: per trial, its configuration (or why it is withheld) and its attempts.
        journal: where the write-ahead journal lies.
        restores: how many times a new driver took the search over.
        audit: the one-run canary audit's record (:mod:`ray_dptune.audit`): canaries, guesses,
            method and commitment; :func:`~ray_dptune.release_best` adds the released model's
            correct guesses and ε_lower. None: no audit.
    """

    search_id: str
    searcher: str
    target: dict[str, Any] | None
    complete: bool
    incomplete_reason: str | None
    released_trial_id: str | None
    mechanism: dict[str, Any]
    guarantee: dict[str, Any]
    threat_model: str
    covers: str
    details: dict[str, Any]
    plan: dict[str, Any] | None
    score_privacy: str
    trials: dict[str, Any]
    num_trials_planned: int
    num_trials_started: int
    unaccounted_trials: list[str]
    metric: str | None
    mode: str | None
    law: dict[str, Any] | None
    density_ratio: float | None
    seed: Any
    dataset: str | None
    ledger: dict[str, Any] | None
    journal: str | None
    restores: int
    started_at: str | None
    ended_at: str | None
    versions: dict[str, str | None]
    curve: dict[str, Any] | None
    audit: dict[str, Any] | None = None
    schema_version: int = REPORT_VERSION

    def to_dict(self) -> dict[str, Any]:
        """The record, first saying whose it is (``operator_record``: it is not to be published)."""
        return {"operator_record": OPERATOR_RECORD, **dataclasses.asdict(self)}

    @classmethod
    def from_dict(cls, record: dict[str, Any]) -> PrivacyReport:
        """Reads this version's reports, version 3's and version 2's.

        Version 3 keeps times in Unix seconds; version 2 keeps the curve inside ``guarantee`` and no target
        (written at the end of a search of unknown completeness, such reports read as incomplete).
        """
        version = record.get("schema_version")
        if version not in READABLE_VERSIONS:
            raise PrivacyError(
                f"This privacy report has schema version {version!r}; this ray_dptune reads versions "
                f"{READABLE_VERSIONS}. Read it with the version that wrote it."
            )
        record = dict(record)
        if version in (2, 3):  # times as Unix seconds
            for key in ("started_at", "ended_at"):
                if isinstance(record.get(key), (int, float)):
                    record[key] = iso_time(record[key])
        if version == 2:
            guarantee = dict(record["guarantee"])
            record.update(
                guarantee=guarantee,
                curve=guarantee.pop("curve", None),
                target=None,
                complete=False,
                incomplete_reason="written by a version that did not record completeness (report schema 2)",
                released_trial_id=None,
                started_at=None,
                ended_at=None,
                versions={},
            )
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{key: value for key, value in record.items() if key in names})


def searcher_report(
    searcher: Any,
    account: Any,
    *,
    search_id: str,
    guarantee: dict[str, Any],
    configs: dict[str, Any],
    dataset: str | None,
    ledger: dict[str, Any] | None,
    journal: str | None,
    target: dict[str, Any] | None = None,
    complete: bool = False,
    incomplete_reason: str | None = None,
    started_at: float | None = None,
    audit: dict[str, Any] | None = None,
) -> PrivacyReport:
    """The report of ``searcher``'s search from its account (configurations withheld for adaptive searchers)."""
    public = searcher.configs_public
    trials = {
        trial_id: {
            "state": _final_state(record.attempts),
            "config": configs.get(trial_id, "unknown (started by an earlier driver)") if public else _WITHHELD,
            "accounted": record.accounted,
            "attempts": [dict(attempt) for attempt in record.attempts],
        }
        for trial_id, record in account.trials.items()
    }
    run_count = hasattr(searcher, "distribution")
    guarantee = dict(guarantee)
    curve = guarantee.pop("curve", None)
    return PrivacyReport(
        search_id=search_id,
        searcher=type(searcher).__name__,
        target=target,
        complete=complete,
        incomplete_reason=incomplete_reason,
        released_trial_id=None,
        mechanism=account.mechanism.to_dict(),
        guarantee=guarantee,
        threat_model=searcher.threat_model,
        covers=searcher.coverage,
        details=searcher.privacy_details(),
        plan=account.plan,
        score_privacy=score_privacy(account.plan),
        trials=trials,
        num_trials_planned=searcher.num_trials,
        num_trials_started=account.num_trials_started,
        unaccounted_trials=sorted(t for t, record in account.trials.items() if not record.accounted),
        metric=getattr(searcher, "metric", None),
        mode=getattr(searcher, "mode", None),
        law=searcher.distribution.to_dict() if run_count else None,
        density_ratio=float(searcher.density_ratio) if run_count else None,
        seed=searcher.reported_seed,
        dataset=dataset,
        ledger=ledger,
        journal=journal,
        restores=account.restores,
        started_at=None if started_at is None else iso_time(started_at),
        ended_at=iso_time(time.time()),
        versions=_versions(),
        curve=curve,
        audit=audit,
    )


def iso_time(seconds: float) -> str:
    """Unix seconds as an ISO 8601 UTC time, to the second."""
    return datetime.datetime.fromtimestamp(seconds, datetime.timezone.utc).isoformat(timespec="seconds")


def _final_state(attempts: list[dict[str, Any]]) -> str:
    """A trial's state as a person reads it: its last attempt's, or "refused" (a retry the budget refused)."""
    if not attempts:
        return "unknown"
    last = attempts[-1]
    return "refused" if last.get("refused") else last["state"]


def _versions() -> dict[str, str | None]:
    versions: dict[str, str | None] = {}
    for name in _VERSIONED:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    return versions


def score_privacy(plan: dict[str, Any] | None) -> str:
    """What the reported scores' privacy is, read from the plan."""
    if plan is None or plan.get("kind") != "dpsgd":
        return "unknown: the trainable reported a bare RDP curve"
    if plan.get("score_releases"):
        return "private: each reported score carries Gaussian noise, composed into the plan"
    return "public validation data: scores are not protected (training-set privacy)"


def write_report(filesystem: Any, path: str, report: PrivacyReport) -> None:
    """Writes ``report`` to ``path`` on a pyarrow filesystem: a temporary file, then a rename.

    Raises:
        PrivacyError: ``path`` holds the report of another search (never overwritten).
    """
    existing = _read(filesystem, path)
    if existing is not None and existing.get("search_id") != report.search_id:
        raise PrivacyError(
            f"{path} holds the privacy report of search {existing.get('search_id')!r}; it is not overwritten by "
            f"search {report.search_id!r}. Give this search its own experiment name or report_path."
        )
    temporary = f"{path}.{uuid.uuid4().hex}.tmp"
    with filesystem.open_output_stream(temporary) as stream:
        stream.write(json.dumps(report.to_dict(), indent=2).encode())
    filesystem.move(temporary, path)


def write_search_report(
    report: PrivacyReport, *, report_path: str | None, trials: list[Any], storage: Any = None
) -> str | None:
    """Writes ``report`` to ``report_path`` or the experiment's storage (local or shared); returns where.

    The storage is the trials' (Tune's ``StorageContext``), or ``storage`` when no trial ran (K = 0);
    without either the report is not written (None).
    """
    import os

    import pyarrow.fs

    if report_path:
        write_report(pyarrow.fs.LocalFileSystem(), os.path.abspath(report_path), report)
        return report_path
    storage = trials[0].storage if trials else storage
    if storage is None:
        return None
    path = f"{storage.experiment_fs_path}/{REPORT_FILE}"
    write_report(storage.storage_filesystem, path, report)
    return path


def read_report(filesystem: Any, path: str) -> PrivacyReport:
    """The report at ``path`` on a pyarrow filesystem.

    Raises:
        PrivacyError: no report there (the search has not finished, or ran without the
            accountant) or one of another schema version.
    """
    record = _read(filesystem, path)
    if record is None:
        raise PrivacyError(
            f"No {REPORT_FILE} at {path}: the search ran without PrivacyAccountantCallback or has not finished "
            "(restore it with tune.Tuner.restore and let it end), so it has no privacy guarantee to release with."
        )
    return PrivacyReport.from_dict(record)


def _read(filesystem: Any, path: str) -> dict[str, Any] | None:
    try:
        with filesystem.open_input_stream(path) as stream:
            record: dict[str, Any] = json.loads(stream.read())
            return record
    except FileNotFoundError:
        return None
