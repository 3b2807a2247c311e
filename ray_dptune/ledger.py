"""PrivacyLedger: every search ever run on a dataset, composed into one total.

Re-running a private search until K or the results look good is itself a
mechanism on the data: each run's guarantee composes with the previous ones
(Mironov 2017, Prop. 1). The ledger is an embedded SQLite file keyed by a dataset
identifier the user chooses; every experiment records its law, K, plan and δ, and
every started attempt its status and spend. An experiment counts in full from the
moment it is registered, finished or not.

Writers use short ``BEGIN IMMEDIATE`` transactions in WAL mode, so several drivers
can share one ledger; a locked or corrupt file raises
:class:`~ray_dptune.errors.PrivacyError` and nothing is deleted or rewritten.
Records that add privacy cost (a new experiment, a failed attempt) are committed
with ``synchronous=FULL``, durable even through a power loss; routine updates (an
attempt started or completed) with ``synchronous=NORMAL``, durable through any crash
of the driver and ~100× cheaper. Losing one of those to a power loss costs nothing:
the last attempt of each trial is covered by the selection bound whatever its status.
"""

from __future__ import annotations

import contextlib
import json
import sqlite3
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ray_dptune.accounting import RDPCurve, repeat_and_select
from ray_dptune.accounting.spend import curve_from_report
from ray_dptune.distributions import distribution_from_dict
from ray_dptune.errors import PrivacyError

__all__ = ["PrivacyLedger"]

_SCHEMA = """
CREATE TABLE IF NOT EXISTS experiments (
    experiment_id TEXT PRIMARY KEY,
    dataset TEXT NOT NULL,
    created REAL NOT NULL,
    law TEXT NOT NULL,
    num_trials INTEGER NOT NULL,
    density_ratio REAL NOT NULL,
    plan TEXT
);
CREATE TABLE IF NOT EXISTS attempts (
    experiment_id TEXT NOT NULL REFERENCES experiments(experiment_id),
    trial_id TEXT NOT NULL,
    attempt INTEGER NOT NULL,
    status TEXT NOT NULL,
    spent TEXT,
    updated REAL NOT NULL,
    PRIMARY KEY (experiment_id, trial_id, attempt)
);
CREATE INDEX IF NOT EXISTS experiments_by_dataset ON experiments(dataset);
"""


class PrivacyLedger:
    """An SQLite privacy ledger at ``path`` (created on first use).

    Args:
        path: the ledger file; share it (e.g. on NFS) between the drivers of one team.
        timeout: seconds to wait for another writer before raising PrivacyError.
    """

    def __init__(self, path: str | Path, *, timeout: float = 30.0):
        self.path = str(path)
        self._timeout = timeout
        self._db: sqlite3.Connection | None = None
        with self._transaction() as db:
            for statement in filter(str.strip, _SCHEMA.split(";")):
                db.execute(statement)

    # ------------------------------------------------------------------ writing
    def register_experiment(
        self, dataset: str, *, law: dict, num_trials: int, density_ratio: float, plan: dict | None
    ) -> str:
        """Records a new experiment on ``dataset``; returns its id."""
        if not isinstance(dataset, str) or not dataset.strip():
            raise ValueError("dataset must be a non-empty identifier of the private data set, e.g. 'digits-v1'.")
        experiment_id = uuid.uuid4().hex
        with self._transaction() as db:
            db.execute(
                "INSERT INTO experiments VALUES (?, ?, ?, ?, ?, ?, ?)",
                (experiment_id, dataset, time.time(), json.dumps(law), num_trials, density_ratio, _dump(plan)),
            )
        return experiment_id

    def record_plan(self, experiment_id: str, plan: dict) -> None:
        """Sets the experiment's plan (learned from its first trial when not given up front)."""
        with self._transaction() as db:
            self._require(db, experiment_id)
            db.execute("UPDATE experiments SET plan = ? WHERE experiment_id = ?", (_dump(plan), experiment_id))

    def record_attempts(
        self, experiment_id: str, attempts: dict[str, list[dict[str, Any]]], *, durable: bool = True
    ) -> None:
        """Upserts the given trials' attempts (status and spend) in one transaction.

        Args:
            experiment_id: the experiment.
            attempts: trial id -> its attempts, oldest first.
            durable: commit with ``synchronous=FULL``; pass False only when no attempt
                in ``attempts`` newly failed.
        """
        rows = [
            (experiment_id, trial_id, index, attempt["status"], _dump(attempt["spent"]), time.time())
            for trial_id, trial_attempts in attempts.items()
            for index, attempt in enumerate(trial_attempts)
        ]
        with self._transaction(durable=durable) as db:
            self._require(db, experiment_id)
            db.executemany(
                "INSERT INTO attempts VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT(experiment_id, trial_id, attempt) "
                "DO UPDATE SET status = excluded.status, spent = excluded.spent, updated = excluded.updated",
                rows,
            )

    # ------------------------------------------------------------------ reading
    def dataset_of(self, experiment_id: str) -> str:
        """The dataset an experiment was registered on."""
        with self._connection() as db:
            return self._require(db, experiment_id)

    def experiments(self, dataset: str | None = None) -> list[dict[str, Any]]:
        """Every experiment (on ``dataset``, if given) with its attempts, oldest first."""
        with self._connection() as db:
            query = "SELECT * FROM experiments" + (" WHERE dataset = ?" if dataset else "") + " ORDER BY created"
            experiments = [dict(row) for row in db.execute(query, (dataset,) if dataset else ())]
            for experiment in experiments:
                experiment["law"] = json.loads(experiment["law"])
                experiment["plan"] = _load(experiment["plan"])
                experiment["attempts"] = [
                    {
                        "trial_id": r["trial_id"],
                        "attempt": r["attempt"],
                        "status": r["status"],
                        "spent": _load(r["spent"]),
                    }
                    for r in db.execute(
                        "SELECT * FROM attempts WHERE experiment_id = ? ORDER BY trial_id, attempt",
                        (experiment["experiment_id"],),
                    )
                ]
        return experiments

    def datasets(self) -> list[str]:
        """Every dataset identifier in the ledger."""
        with self._connection() as db:
            return [row[0] for row in db.execute("SELECT DISTINCT dataset FROM experiments ORDER BY dataset")]

    def dataset_curve(self, dataset: str, *, exclude: str | None = None, generic: bool = False) -> RDPCurve | None:
        """The composed RDP of every experiment on ``dataset`` (None when there is none).

        Each experiment contributes ``repeat_and_select(plan, law, C/c)`` plus its plan
        once per failed attempt, as in :class:`~ray_dptune.PrivacyAccountantCallback`.
        An experiment registered without a plan and with no trial started has not
        touched the data and contributes nothing.

        Args:
            dataset: the dataset identifier.
            exclude: an experiment id to leave out (the running one, added by its callback).
            generic: also use the numeric P&S Lemma 7 bound.
        """
        total = None
        for experiment in self.experiments(dataset):
            if experiment["experiment_id"] == exclude:
                continue
            curve = experiment_curve(experiment, generic=generic)
            if curve is not None:
                total = curve if total is None else total + curve
        return total

    # ------------------------------------------------------------------ plumbing
    def __getstate__(self) -> dict[str, Any]:
        return {"path": self.path, "_timeout": self._timeout, "_db": None}  # connections do not pickle

    @contextlib.contextmanager
    def _connection(self) -> Iterator[sqlite3.Connection]:
        """The ledger's connection, opened once (closing one checkpoints the WAL: slow)."""
        try:
            if self._db is None:
                self._db = sqlite3.connect(self.path, timeout=self._timeout, isolation_level=None)
                self._db.row_factory = sqlite3.Row
                self._db.execute("PRAGMA journal_mode=WAL")
        except sqlite3.Error as error:
            self._db = None
            raise PrivacyError(f"The privacy ledger {self.path} cannot be opened or is corrupt ({error}).") from error
        db = self._db
        try:
            yield db
        except sqlite3.OperationalError as error:
            raise PrivacyError(
                f"The privacy ledger {self.path} is locked or unreadable ({error}); nothing was recorded "
                "or lost. Retry when the other writer is done."
            ) from error
        except sqlite3.DatabaseError as error:
            raise PrivacyError(
                f"The privacy ledger {self.path} is corrupt ({error}). It was left untouched: restore it "
                "from a backup; do not delete it, since it holds what was already spent."
            ) from error

    @contextlib.contextmanager
    def _transaction(self, *, durable: bool = True) -> Iterator[sqlite3.Connection]:
        with self._connection() as db:
            db.execute(f"PRAGMA synchronous={'FULL' if durable else 'NORMAL'}")
            db.execute("BEGIN IMMEDIATE")
            try:
                yield db
            except BaseException:
                db.execute("ROLLBACK")
                raise
            db.execute("COMMIT")

    @staticmethod
    def _require(db: sqlite3.Connection, experiment_id: str) -> str:
        row = db.execute("SELECT dataset FROM experiments WHERE experiment_id = ?", (experiment_id,)).fetchone()
        if row is None:
            raise ValueError(f"Experiment {experiment_id!r} is not in this ledger.")
        return row[0]


def experiment_curve(experiment: dict[str, Any], *, generic: bool = False) -> RDPCurve | None:
    """The guarantee one recorded experiment spent (None if it never touched the data)."""
    plan = experiment["plan"]
    if plan is None:
        if experiment["attempts"]:
            raise PrivacyError(
                f"Experiment {experiment['experiment_id']} started trials without a recorded plan: its "
                "spend cannot be bounded. Record its plan (PrivacyLedger.record_plan)."
            )
        return None
    plan_curve = curve_from_report(plan)
    law = distribution_from_dict(experiment["law"])
    curve = repeat_and_select(plan_curve, law, density_ratio=experiment["density_ratio"], generic=generic)
    failed = _extra_attempts(experiment["attempts"])
    return curve + failed * plan_curve if failed else curve


def _extra_attempts(attempts: list[dict[str, Any]]) -> int:
    """Attempts beyond the selection bound: failed ones, and any superseded by a later attempt."""
    last = {}
    for attempt in attempts:
        last[attempt["trial_id"]] = max(last.get(attempt["trial_id"], -1), attempt["attempt"])
    return sum(
        1 for attempt in attempts if attempt["status"] == "failed" or attempt["attempt"] < last[attempt["trial_id"]]
    )


def _dump(value: Any) -> str | None:
    return None if value is None else json.dumps(value, sort_keys=True)


def _load(text: str | None) -> Any:
    return None if text is None else json.loads(text)
