"""PrivacyReport: the typed, versioned record of a finished search, written atomically."""

from __future__ import annotations

import dataclasses
import json
import uuid
from dataclasses import dataclass
from typing import Any

from ray_dptune.errors import PrivacyError

__all__ = ["REPORT_FILE", "REPORT_VERSION", "PrivacyReport", "read_report", "searcher_report", "write_report"]

REPORT_FILE = "privacy_report.json"
REPORT_VERSION = 2
_WITHHELD = "withheld: chosen from results the guarantee does not release"


@dataclass(frozen=True)
class PrivacyReport:
    """What a search spent, what it releases and what the guarantee covers.

    Attributes:
        search_id: the search's id (its journal holds the same).
        searcher: the searcher's class name.
        mechanism: how the search is bounded (:class:`~ray_dptune.accounting.account.Mechanism` record).
        guarantee: (ε, δ) of the whole search and how it is made up.
        threat_model: what is protected, under which assumption.
        covers: which outputs the guarantee covers.
        trials: per trial, its configuration (or why it is withheld) and its attempts.
        journal: where the write-ahead journal lies.
        restores: how many times a new driver took the search over.
    """

    search_id: str
    searcher: str
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
    schema_version: int = REPORT_VERSION

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, record: dict[str, Any]) -> PrivacyReport:
        version = record.get("schema_version")
        if version != REPORT_VERSION:
            raise PrivacyError(
                f"This privacy report has schema version {version!r}; this ray_dptune reads version "
                f"{REPORT_VERSION}. Read it with the version that wrote it."
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
) -> PrivacyReport:
    """The report of ``searcher``'s search from its account (configurations withheld for adaptive searchers)."""
    public = searcher.configs_public
    trials = {
        trial_id: {
            "config": configs.get(trial_id, "unknown (started by an earlier driver)") if public else _WITHHELD,
            "accounted": record.accounted,
            "attempts": [dict(attempt) for attempt in record.attempts],
        }
        for trial_id, record in account.trials.items()
    }
    run_count = hasattr(searcher, "distribution")
    return PrivacyReport(
        search_id=search_id,
        searcher=type(searcher).__name__,
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
        seed=searcher.seed if searcher.seed is not None else "secure (operating system)",
        dataset=dataset,
        ledger=ledger,
        journal=journal,
        restores=account.restores,
    )


def score_privacy(plan: dict | None) -> str:
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
            return json.loads(stream.read())
    except FileNotFoundError:
        return None
