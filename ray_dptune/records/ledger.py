"""PrivacyLedger: every search ever run on a dataset, composed into one total.

Re-running a private search until the results look good is itself a mechanism on the
data, so the searches on one dataset compose: their RDP curves add (Mironov 2017,
Prop. 1) and their approximate-DP releases add in ε and δ (basic composition, Dwork &
Roth 2014, Thm 3.16); :func:`~ray_dptune.accounting.bookkeeping.guarantee.compose_with_releases`
joins the two parts at a δ.

Each search's driver upserts the composed
:class:`~ray_dptune.accounting.bookkeeping.guarantee.Guarantee` of its
:class:`~ray_dptune.accounting.bookkeeping.account.SearchAccount` (:class:`LedgerEntry`), with the ε
its account computed at its δ. A dataset's total composes the stored guarantees: one
indexed upsert per record and one scan of float64 blobs per total, whatever the searches
were. A search read alone at its own δ shows its account's ε (which may be tighter than
its curve's, e.g. private halving's); composed with others, its curve is what adds.

The file is a :class:`~ray_dptune.records.store.SQLiteStore` (schema version 2): several
drivers on one machine may share it (WAL, short ``BEGIN IMMEDIATE`` writes); records
commit with ``synchronous=FULL``. A locked, corrupt, foreign, 0-byte or older-schema
file raises :class:`~ray_dptune.errors.PrivacyError` and is left byte-identical.
Totals are cached per connection until another connection commits (``PRAGMA
data_version``) or this one records a search they include, so a driver that re-reads
its dataset's total after each of its own records pays for one scan only when
another driver wrote.
"""

from __future__ import annotations

import functools
import json
import math
import operator
import os
import time
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np

from ray_dptune.accounting.bookkeeping.guarantee import Guarantee, compose_with_releases
from ray_dptune.accounting.curves.rdp import RDPCurve
from ray_dptune.errors import PrivacyError
from ray_dptune.records.store import SQLiteStore, StoreError

__all__ = ["LEDGER_SCHEMA_VERSION", "LedgerEntry", "PrivacyLedger"]

LEDGER_SCHEMA_VERSION = 2
_MAX_CACHED = 64  # cached (dataset, exclude) totals per connection
_FLOAT = np.dtype("<f8")  # curves are stored as little-endian float64 blobs
_SCHEMA = """
CREATE TABLE IF NOT EXISTS searches (
    search_id TEXT PRIMARY KEY,
    dataset TEXT NOT NULL,
    created REAL NOT NULL,
    updated REAL NOT NULL,
    orders BLOB,
    epsilons BLOB,
    release_epsilon REAL NOT NULL,
    release_delta REAL NOT NULL,
    charged_attempts INTEGER NOT NULL,
    summary TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS searches_by_dataset ON searches(dataset, created);
"""
_UPSERT = """
INSERT INTO searches VALUES (:search_id, :dataset, :now, :now, :orders, :epsilons,
                             :release_epsilon, :release_delta, :charged_attempts, :summary)
ON CONFLICT(search_id) DO UPDATE SET
    updated = excluded.updated, orders = excluded.orders, epsilons = excluded.epsilons,
    release_epsilon = excluded.release_epsilon, release_delta = excluded.release_delta,
    charged_attempts = excluded.charged_attempts, summary = excluded.summary
"""
_TOTAL = """
SELECT search_id, orders, epsilons, release_epsilon, release_delta, charged_attempts
FROM searches WHERE dataset = ? AND search_id IS NOT ?
"""


class PrivacyLedger:
    """An SQLite privacy ledger at ``path``, created on first use, opened at once.

    Args:
        path: the ledger file, shared by the drivers of one machine (SQLite's WAL mode
            needs shared memory: not on a network file system).
        timeout: seconds to wait for another writer before raising PrivacyError.

    Raises:
        PrivacyError: the file is empty, corrupt, not a ledger or of another schema version.
    """

    def __init__(self, path: str | os.PathLike[str], *, timeout: float = 30.0):
        self.path = os.fspath(path)
        self._store = SQLiteStore(
            self.path,
            kind="privacy ledger",
            version=LEDGER_SCHEMA_VERSION,
            schema=_SCHEMA,
            tables=("searches",),
            timeout=timeout,
        )
        self._totals: dict[tuple[str, str | None], tuple[RDPCurve | None, float, float]] = {}
        self._seen_version: int | None = None  # PRAGMA data_version when self._totals was filled
        with self._store.reading():  # fail now, not in the middle of a search
            pass

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_totals": {}, "_seen_version": None}  # versions are per connection

    # ------------------------------------------------------------------ writing
    def record_search(self, search_id: str, *, dataset: str, guarantee: Guarantee, summary: Mapping[str, Any]) -> None:
        """Upserts one search's composed guarantee, durably (``synchronous=FULL``).

        A later record of the same search replaces the earlier one: the account's
        guarantee already covers everything the search did. A guarantee without a curve
        and without releases contributes nothing, unless it charged attempts (see
        :meth:`dataset_total`).

        Args:
            search_id: the search's identifier, unique in the ledger.
            dataset: the private data set the search ran on.
            guarantee: ``SearchAccount.guarantee(if_stopped_now=True)`` of the search.
            summary: JSON-ready description for people (searcher, mechanism, plan, attempts).

        Raises:
            PrivacyError: the search is recorded on another dataset, or the ledger is locked.
            ValueError: an empty identifier or an invalid release.
            TypeError: ``guarantee`` is not a :class:`~ray_dptune.accounting.bookkeeping.guarantee.Guarantee`.
        """
        row = _search_row(search_id, dataset, guarantee, summary)
        self._forget(dataset, search_id)
        with self._store.transaction(durable=True) as db:
            found = db.execute("SELECT dataset FROM searches WHERE search_id = ?", (search_id,)).fetchone()
            if found is not None and found[0] != dataset:
                raise PrivacyError(
                    f"Search {search_id!r} is recorded in the ledger on dataset {found[0]!r}, not {dataset!r}: "
                    "a search runs on one dataset. Resume it with its own dataset, or start a new search."
                )
            db.execute(_UPSERT, row)

    def record_account(self, search_id: str, *, dataset: str, account: Any, searcher: str, journal: str | None) -> None:
        """Records a search's account as it stands: its worst case (every live attempt charged) and a summary."""
        guarantee = account.guarantee(if_stopped_now=True)
        summary = {
            "epsilon": guarantee.epsilon,
            "delta": guarantee.delta,
            "searcher": searcher,
            "mechanism": account.mechanism.to_dict(),
            "plan": account.plan,
            "trials": account.num_trials_started,
            "charged_attempts": guarantee.charged_attempts,
            "journal": journal,
        }
        self.record_search(search_id, dataset=dataset, guarantee=guarantee, summary=summary)

    # ------------------------------------------------------------------ reading
    def dataset_of(self, search_id: str) -> str | None:
        """The dataset ``search_id`` is recorded on, or None if it is not recorded."""
        with self._store.reading() as db:
            found = db.execute("SELECT dataset FROM searches WHERE search_id = ?", (search_id,)).fetchone()
        return None if found is None else found[0]

    def datasets(self) -> list[str]:
        """Every dataset in the ledger, sorted."""
        with self._store.reading() as db:
            return [row[0] for row in db.execute("SELECT DISTINCT dataset FROM searches ORDER BY dataset")]

    def dataset_total(self, dataset: str, *, exclude: str | None = None) -> tuple[RDPCurve | None, float, float]:
        """(Σ curves or None, Σ release ε, Σ release δ) of the searches on ``dataset``.

        Curves add (Mironov 2017, Prop. 1): those on one grid of orders are summed at
        once, and grids are joined by ``RDPCurve.__add__``, which reads each curve at
        the next order up (conservative). Releases add in ε and δ (Dwork & Roth 2014,
        Thm 3.16).

        Args:
            dataset: the dataset.
            exclude: a search to leave out (the running one, added by its driver).

        Raises:
            PrivacyError: a search charged attempts before its plan was known, so its
                spend, and the total, have no bound yet.
        """
        key = (dataset, exclude)
        with self._store.reading() as db:
            version = db.execute("PRAGMA data_version").fetchone()[0]  # before the scan: never stale
            if version != self._seen_version or len(self._totals) > _MAX_CACHED:
                self._totals.clear()
                self._seen_version = version
            if key not in self._totals:
                self._totals[key] = _total(db.execute(_TOTAL, key).fetchall(), dataset)
        return self._totals[key]

    def dataset_epsilon(
        self, dataset: str, *, delta: float, exclude: str | None = None, extra: Guarantee | None = None
    ) -> float:
        """ε at ``delta`` of every search on ``dataset``, plus ``extra`` (the running search, as is).

        The RDP and approximate-DP parts are joined by ``compose_with_releases``
        (basic composition; CKS 2020, Prop. 12 for the RDP part).

        Raises:
            PrivacyError: as :meth:`dataset_total`, or the releases need δ >= ``delta``.
        """
        curve, release_epsilon, release_delta = self.dataset_total(dataset, exclude=exclude)
        if extra is None:
            return compose_with_releases(
                curve, release_epsilon=release_epsilon, release_delta=release_delta, delta=delta
            )
        composed = compose_with_releases(
            _add(curve, extra.curve),
            release_epsilon=release_epsilon + extra.release_epsilon,
            release_delta=release_delta + extra.release_delta,
            delta=delta,
        )
        alone = curve is None and release_epsilon == 0 and release_delta == 0
        if alone and extra.delta == delta and extra.epsilon is not None:
            return min(composed, extra.epsilon)  # nothing else on the dataset: the search's own account's ε holds
        return composed

    def searches(
        self, dataset: str | None = None, *, delta: float | None = None, curves: bool = False
    ) -> list[dict[str, Any]]:
        """Every recorded search (on ``dataset``, if given), oldest first.

        Each is a dict with search_id, dataset, created, updated (Unix times), summary,
        charged_attempts, release_epsilon, release_delta, rdp (whether it has a curve);
        with ``delta``, also ``epsilon``, its own ε at ``delta`` (None where it has no
        bound there); with ``curves``, also ``curve`` (``RDPCurve.to_dict()`` or None).
        """
        query = "SELECT * FROM searches" + (" WHERE dataset = ?" if dataset is not None else "")
        with self._store.reading() as db:
            rows = db.execute(query + " ORDER BY created, rowid", () if dataset is None else (dataset,)).fetchall()
        return [_search_record(row, delta=delta, curves=curves) for row in rows]

    def dataset_summary(self, dataset: str, *, delta: float, curves: bool = False) -> dict[str, Any]:
        """``dataset``'s total at ``delta`` and its searches, JSON-ready (``ray-dptune ledger``).

        Keys: epsilon (:meth:`dataset_epsilon`; None, with the reason in ``note``, where
        the total has no bound at ``delta``), note, num_searches, charged_attempts,
        release_epsilon, release_delta (basic composition, Dwork & Roth 2014, Thm 3.16),
        searches (:meth:`searches`, non-finite ε as None).

        Raises:
            StoreError: the file cannot be read.
        """
        searches = self.searches(dataset, delta=delta, curves=curves)
        for search in searches:
            search["epsilon"] = _finite_or_none(search["epsilon"])
        epsilon, note = None, None
        try:
            epsilon = _finite_or_none(self.dataset_epsilon(dataset, delta=delta))
        except StoreError:
            raise
        except PrivacyError as error:
            note = str(error)
        if epsilon is not None and len(searches) == 1 and searches[0]["epsilon"] is not None:
            epsilon = min(epsilon, searches[0]["epsilon"])  # one search: its own account's ε is the total
        if epsilon is None and note is None:
            note = f"the searches' curves give no finite ε at δ = {delta:g}."
        return {
            "epsilon": epsilon,
            "note": note,
            "num_searches": len(searches),
            "charged_attempts": sum(search["charged_attempts"] for search in searches),
            "release_epsilon": math.fsum(search["release_epsilon"] for search in searches),
            "release_delta": math.fsum(search["release_delta"] for search in searches),
            "searches": searches,
        }

    def close(self) -> None:
        """Closes this process's connection (the next call reopens it)."""
        self._store.close()
        self._totals.clear()
        self._seen_version = None

    def _forget(self, dataset: str, search_id: str) -> None:
        """Drops the cached totals a new record of ``search_id`` changes.

        This connection's own commits leave ``PRAGMA data_version`` unchanged.
        """
        for key in [key for key in self._totals if key[0] == dataset and key[1] != search_id]:
            del self._totals[key]


class LedgerEntry:
    """One running search's entry in a ledger, kept at its worst case (every live attempt charged).

    Args:
        ledger: the ledger.
        search_id: the search.
        dataset: the private data set it runs on.
        searcher: the searcher's name, for people reading the ledger.
    """

    def __init__(self, ledger: PrivacyLedger, *, search_id: str, dataset: str, searcher: str):
        self.ledger, self.search_id, self.dataset, self._searcher = ledger, search_id, dataset, searcher
        self._recorded: tuple[Any, ...] | None = None  # what the last record charged

    def check_dataset(self) -> None:
        """Raises PrivacyError if the search was recorded on another dataset (a restore on the wrong data)."""
        recorded_on = self.ledger.dataset_of(self.search_id)
        if recorded_on not in (None, self.dataset):
            raise PrivacyError(
                f"This search was recorded in the ledger on dataset {recorded_on!r}, not {self.dataset!r}: "
                "restore it with the dataset it started on."
            )

    def update(self, account: Any, *, journal: str | None, force: bool = False) -> None:
        """Records ``account`` (a :class:`~ray_dptune.accounting.bookkeeping.account.SearchAccount`) when its charge changed."""
        charge = (account.charged_attempts(if_stopped_now=True), account.selections, len(account.releases))
        if charge != self._recorded or force:
            self.ledger.record_account(
                self.search_id, dataset=self.dataset, account=account, searcher=self._searcher, journal=journal
            )
            self._recorded = charge

    def dataset_epsilon(self, guarantee: Guarantee, *, delta: float) -> float | None:
        """ε at ``delta`` of every search on the dataset, this one as ``guarantee`` says; None without an ε."""
        if guarantee.epsilon is None:
            return None
        return self.ledger.dataset_epsilon(self.dataset, delta=delta, exclude=self.search_id, extra=guarantee)


# ---------------------------------------------------------------------- rows
def _search_row(search_id: str, dataset: str, guarantee: Guarantee, summary: Mapping[str, Any]) -> dict[str, Any]:
    """The SQL parameters of one record, validated."""
    for name, value in (("search_id", search_id), ("dataset", dataset)):
        if not isinstance(value, str) or not value.strip():
            raise ValueError(f"{name} must be a non-empty identifier (e.g. dataset='digits-v1'), got {value!r}.")
    if not isinstance(guarantee, Guarantee):
        raise TypeError(f"guarantee must be a SearchAccount's Guarantee, got {type(guarantee).__name__}.")
    release_epsilon, release_delta = float(guarantee.release_epsilon), float(guarantee.release_delta)
    if not (math.isfinite(release_epsilon) and release_epsilon >= 0 and 0 <= release_delta < 1):
        raise ValueError(f"A release needs ε >= 0 finite and δ in [0, 1), got ({release_epsilon}, {release_delta}).")
    curve = guarantee.curve
    return {
        "search_id": search_id,
        "dataset": dataset,
        "now": time.time(),
        "orders": None if curve is None else curve.orders.astype(_FLOAT).tobytes(),
        "epsilons": None if curve is None else curve.epsilons.astype(_FLOAT).tobytes(),
        "release_epsilon": release_epsilon,
        "release_delta": release_delta,
        "charged_attempts": int(guarantee.charged_attempts),
        "summary": json.dumps(dict(summary), sort_keys=True),
    }


def _is_unbounded(row: Mapping[str, Any]) -> bool:
    """No curve, no release, yet attempts charged: they spent an unknown amount."""
    return row["orders"] is None and row["release_epsilon"] == 0 and row["charged_attempts"] > 0


def _check_bounded(rows: Iterable[Mapping[str, Any]], dataset: str) -> None:
    unbounded = [row["search_id"] for row in rows if _is_unbounded(row)]
    if unbounded:
        raise PrivacyError(
            f"Search(es) {', '.join(map(repr, unbounded))} on dataset {dataset!r} charged attempts before their "
            "plan was known: what they spent has no bound, so neither has the dataset's total. The total is "
            "bounded again once each records a guarantee with its plan."
        )


def _total(rows: list[Mapping[str, Any]], dataset: str) -> tuple[RDPCurve | None, float, float]:
    _check_bounded(rows, dataset)
    return (
        _sum_curves(rows),
        math.fsum(row["release_epsilon"] for row in rows),
        math.fsum(row["release_delta"] for row in rows),
    )


def _curve_of(row: Mapping[str, Any]) -> RDPCurve | None:
    if row["orders"] is None:
        return None
    try:
        return RDPCurve(np.frombuffer(row["orders"], _FLOAT), np.frombuffer(row["epsilons"], _FLOAT))
    except (TypeError, ValueError) as error:
        raise PrivacyError(f"The ledger's record of search {row['search_id']!r} is corrupt ({error}).") from error


def _sum_curves(rows: Iterable[Mapping[str, Any]]) -> RDPCurve | None:
    """Σ of the rows' curves: one numpy sum per grid of orders, grids joined conservatively."""
    by_grid: dict[bytes, list[bytes]] = {}
    for row in rows:
        if row["orders"] is not None:
            by_grid.setdefault(row["orders"], []).append(row["epsilons"])
    sums = []
    for orders, epsilons in by_grid.items():
        try:
            if any(len(blob) != len(orders) for blob in epsilons):
                raise ValueError("a curve's orders and epsilons differ in length")
            stacked = np.frombuffer(b"".join(epsilons), _FLOAT).reshape(len(epsilons), -1)
            sums.append(RDPCurve(np.frombuffer(orders, _FLOAT), stacked.sum(axis=0)))
        except ValueError as error:
            raise PrivacyError(f"The ledger holds a corrupt curve ({error}); restore it from a backup.") from error
    return functools.reduce(operator.add, sums) if sums else None


def _add(left: RDPCurve | None, right: RDPCurve | None) -> RDPCurve | None:
    if left is None or right is None:
        return right if left is None else left
    return left + right


def _search_record(row: Mapping[str, Any], *, delta: float | None, curves: bool) -> dict[str, Any]:
    """One stored search as a JSON-ready dict (see :meth:`PrivacyLedger.searches`)."""
    curve = _curve_of(row)
    record = {
        "search_id": row["search_id"],
        "dataset": row["dataset"],
        "created": row["created"],
        "updated": row["updated"],
        "summary": json.loads(row["summary"]),
        "charged_attempts": row["charged_attempts"],
        "release_epsilon": row["release_epsilon"],
        "release_delta": row["release_delta"],
        "rdp": curve is not None,
    }
    if delta is not None:
        record["epsilon"] = _own_epsilon(row, curve, delta)
    if curves:
        record["curve"] = None if curve is None else curve.to_dict()
    return record


def _own_epsilon(row: Mapping[str, Any], curve: RDPCurve | None, delta: float) -> float | None:
    """One search's ε at ``delta``, or None when it has no bound there.

    Its account's own at its δ, else read from its stored curve and releases.
    """
    if _is_unbounded(row) or row["release_delta"] >= delta:
        return None
    derived = compose_with_releases(
        curve, release_epsilon=row["release_epsilon"], release_delta=row["release_delta"], delta=delta
    )
    summary = json.loads(row["summary"])
    if summary.get("delta") == delta and summary.get("epsilon") is not None:
        own: float = summary["epsilon"]
        return min(derived, own)  # two valid bounds: the account's may hold a tightening the curve lacks
    return derived


def _finite_or_none(value: float | None) -> float | None:
    return None if value is None or not math.isfinite(value) else value
