"""SearchJournal: the write-ahead record of a search, from which its account is rebuilt.

One SQLite file per experiment (``privacy_journal.db`` in the experiment folder). It
holds the search's record (its id, mechanism, δ, plan) and the append-only list of
account events (:meth:`ray_dptune.accounting.bookkeeping.account.SearchAccount.apply`). Events that
can add privacy cost — a suggestion, an attempt start, a halving charge, a report of units
run past the charge (``overrun``), a failure Tune retries (``retry``: charged from then on),
a restore, a selection or release by the searcher, the plan — are committed with ``synchronous=FULL`` *before* Tune may
hand the trial to a worker; the rest (reports, completions, failures) with ``NORMAL``,
since losing one only leaves an attempt live, and a live attempt of an earlier driver is
charged in full. The journal holds no configuration and no score.

Restoring replays the events into a fresh account and appends a ``restored`` event:
every attempt the killed driver left live is then charged at its full plan.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterable, Mapping
from typing import Any

from ray_dptune.accounting.bookkeeping.account import SearchAccount
from ray_dptune.accounting.bookkeeping.search_mechanism import SearchMechanism
from ray_dptune.errors import PrivacyError
from ray_dptune.records.store import SQLiteStore

__all__ = ["JOURNAL_FILE", "SearchJournal", "existing_journal", "journal_location", "journal_summary"]

JOURNAL_FILE = "privacy_journal.db"
_VERSION = 1
_SCHEMA = """
CREATE TABLE search (
    only_row INTEGER PRIMARY KEY CHECK (only_row = 1),
    search_id TEXT NOT NULL,
    created REAL NOT NULL,
    record TEXT NOT NULL
);
CREATE TABLE events (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    at REAL NOT NULL,
    event TEXT NOT NULL
)
"""
DURABLE_EVENTS = frozenset({"suggested", "started", "charged", "restored", "selection", "release", "plan"})


class SearchJournal:
    """The journal file at ``path`` (created on first write)."""

    def __init__(self, path: str | os.PathLike[str]):
        self._store = SQLiteStore(
            path, kind="privacy journal", version=_VERSION, schema=_SCHEMA, tables=("search", "events")
        )

    @property
    def path(self) -> str:
        """The journal file's path."""
        return self._store.path

    def search(self) -> dict[str, Any] | None:
        """``{"search_id", "created", "record"}`` of the search in this journal, or None."""
        with self._store.reading() as db:
            row = db.execute("SELECT search_id, created, record FROM search").fetchone()
        return None if row is None else {"search_id": row[0], "created": row[1], "record": json.loads(row[2])}

    def begin(self, search_id: str, record: Mapping[str, Any], events: Iterable[Mapping[str, Any]] = ()) -> None:
        """Writes the search's record (and its first events) durably; refuses a second search.

        Raises:
            PrivacyError: the journal already holds another search (a new search into the
                same experiment folder would mix two searches' records).
        """
        with self._store.transaction(durable=True) as db:
            row = db.execute("SELECT search_id FROM search").fetchone()
            if row is not None and row[0] != search_id:
                raise PrivacyError(
                    f"{self.path} already holds the privacy record of search {row[0]}: a new search into the same "
                    "experiment folder would overwrite its report. Give the new run another name "
                    "(tune.RunConfig(name=...)), or continue the old one with tune.Tuner.restore(path, trainable)."
                )
            if row is None:
                db.execute("INSERT INTO search VALUES (1, ?, ?, ?)", (search_id, time.time(), json.dumps(dict(record))))
            self._insert(db, events)

    def append(self, events: Iterable[Mapping[str, Any]]) -> None:
        """Appends events in one transaction, synced to disk when any of them can add cost."""
        events = list(events)
        if not events:
            return
        durable = any(event["type"] in DURABLE_EVENTS or event.get("overrun") or event.get("retry") for event in events)
        with self._store.transaction(durable=durable) as db:
            self._insert(db, events)

    def events(self) -> list[dict[str, Any]]:
        """Every account event in the journal, in the order they were appended."""
        with self._store.reading() as db:
            return [json.loads(row[0]) for row in db.execute("SELECT event FROM events ORDER BY seq")]

    def account(self, *, generic: bool = False) -> SearchAccount:
        """The account rebuilt from the journal's record and events (no ``restored`` event added)."""
        search = self.search()
        if search is None:
            raise PrivacyError(f"{self.path} holds no search record.")
        record = search["record"]
        account = SearchAccount(
            SearchMechanism.from_dict(record["mechanism"]),
            delta=record["delta"],
            plan=record.get("plan"),
            generic=generic,
            reserved_reruns=record.get("reserved_reruns", 0),
        )
        for event in self.events():
            account.apply(event)
        return account

    def open_search(
        self, search_id: str, *, record: Mapping[str, Any], pending: list[Mapping[str, Any]], account: SearchAccount
    ) -> SearchAccount:
        """Begins ``search_id`` here, or resumes it: the account to go on with.

        A new file takes the search's record and the ``pending`` events (those before the
        journal's folder was known); another search's file is refused. A file of this
        search is replayed into a fresh account, which must declare the same mechanism as
        ``account`` (K is never redrawn), and a ``restored`` event then charges every
        attempt the previous driver left live at its full plan.

        Raises:
            PrivacyError: the file holds another search, or this one with another mechanism.
        """
        existing = self.search()
        if existing is None or existing["search_id"] != search_id:
            self.begin(search_id, record, pending)  # refuses another search's file
            return account
        resumed = self.account(generic=account.generic)
        recorded, declared = resumed.mechanism.to_dict(), account.mechanism.to_dict()
        if "upper" not in recorded["params"]:  # journaled before C was recorded: its worst case C = C/c stays
            declared["params"].pop("upper", None)
        if recorded != declared:
            raise PrivacyError(
                f"The restored searcher declares {declared} but the journal recorded "
                f"{recorded} (K = {resumed.mechanism.cover_cap}): K is never redrawn."
            )
        events = [{"type": "restored"}, *pending]
        self.append(events)
        for event in events:
            resumed.apply(event)
        return resumed

    def close(self) -> None:
        """Closes the journal's connection (a later call reopens it)."""
        self._store.close()

    @staticmethod
    def _insert(db: Any, events: Iterable[Mapping[str, Any]]) -> None:
        now = time.time()
        db.executemany(
            "INSERT INTO events (at, event) VALUES (?, ?)", [(now, json.dumps(dict(e), sort_keys=True)) for e in events]
        )


def journal_location(trial: Any) -> str | None:
    """Where a Tune trial's search keeps its journal: its experiment folder (None outside a Tune run).

    Raises:
        PrivacyError: the experiment's storage is not a local or mounted filesystem (no sync there).
    """
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


def existing_journal(path: str | os.PathLike[str]) -> SearchJournal:
    """The journal at ``path``: the journal file, or the experiment folder that holds it (never created).

    Raises:
        PrivacyError: no journal there.
    """
    path = os.fspath(path)
    if os.path.isdir(path):
        path = os.path.join(path, JOURNAL_FILE)
    if not os.path.exists(path):
        raise PrivacyError(f"No privacy journal at {path}.")
    return SearchJournal(path)


def journal_summary(path: str | os.PathLike[str]) -> dict[str, Any]:
    """What a journal proves a search spent, as a new driver would see it: every live attempt charged.

    Args:
        path: the journal file, or the experiment folder that holds it.

    Raises:
        PrivacyError: no journal there, or one this version cannot read.
    """
    journal = existing_journal(path)
    path = journal.path
    try:
        search = journal.search()
        account = journal.account()
    finally:
        journal.close()
    assert search is not None  # account() refuses a journal without a search record
    account.restored()  # read-only: the journal itself is not written
    states: dict[str, int] = {}
    for trial in account.trials.values():
        for attempt in trial.attempts:
            states[attempt["state"]] = states.get(attempt["state"], 0) + 1
    guarantee = account.guarantee(if_stopped_now=True)
    return {
        "journal": path,
        "search_id": search["search_id"],
        "searcher": search["record"].get("searcher"),
        "mechanism": account.mechanism.to_dict(),
        "plan": account.plan,
        "trials": account.num_trials_started,
        "attempts": states,
        "restores": account.restores - 1,
        "guarantee": guarantee.to_dict(with_curve=False),
    }
