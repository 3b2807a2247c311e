"""Durable SQLite stores (the search journal, the ledger): opening, schema versions, transactions.

Both stores hold privacy records, so opening one never modifies a file it does not
recognise: a 0-byte file, another program's database or another schema version raise
:class:`StoreError` before anything is written. Writes use short ``BEGIN IMMEDIATE``
transactions in WAL mode; ``durable=True`` commits with ``synchronous=FULL`` (the
record survives a power loss), otherwise ``NORMAL`` (it survives any crash of the
process, e.g. SIGKILL).
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import uuid
from collections.abc import Iterator
from typing import Any

from ray_dptune.errors import PrivacyError

__all__ = ["SQLiteStore", "StoreError"]


class StoreError(PrivacyError):
    """A privacy store is unreadable, foreign, of another schema version, locked or corrupt."""


class SQLiteStore:
    """One SQLite file with a versioned schema, opened lazily once per process.

    Args:
        path: the file (created with ``schema`` when absent).
        kind: what the file is, for messages ("privacy journal", "privacy ledger").
        version: this code's schema version, kept in ``PRAGMA user_version``.
        schema: ``CREATE TABLE`` statements run when the file is new.
        tables: the tables a file of this kind must have.
        timeout: seconds to wait for another writer.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        kind: str,
        version: int,
        schema: str,
        tables: tuple[str, ...],
        timeout: float = 30.0,
    ):
        self.path = os.fspath(path)
        self.kind = kind
        self._version = version
        self._schema = schema
        self._tables = tables
        self._timeout = timeout
        self._db: sqlite3.Connection | None = None

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_db": None}  # connections do not pickle

    # ------------------------------------------------------------------ opening
    def _open(self) -> sqlite3.Connection:
        if self._db is not None:
            return self._db
        if not os.path.exists(self.path):
            self._create_file()
        if os.path.getsize(self.path) == 0:
            raise StoreError(
                f"The {self.kind} {self.path} is an empty (0-byte) file, not a {self.kind}: it may have been "
                "truncated. Restore it from a backup; if it never held records, delete it to start afresh."
            )
        try:
            db = sqlite3.connect(self.path, timeout=self._timeout, isolation_level=None)
            db.row_factory = sqlite3.Row
            self._check_existing(db)
            db.execute("PRAGMA journal_mode=WAL")
        except sqlite3.DatabaseError as error:
            raise StoreError(f"The {self.kind} {self.path} cannot be opened or is not a database ({error}).") from error
        self._db = db
        return db

    def _create_file(self) -> None:
        """Builds the schema under a temporary name, then links it into place atomically.

        Two drivers creating the same store at once both succeed: the second link fails
        with FileExistsError and that driver opens the first one's file.
        """
        temporary = f"{self.path}.{uuid.uuid4().hex}.new"
        try:
            db = sqlite3.connect(temporary, isolation_level=None)
            try:
                self._create(db)
            finally:
                db.close()
            try:
                os.link(temporary, self.path)
            except FileExistsError:
                pass
        except (OSError, sqlite3.Error) as error:
            raise StoreError(f"The {self.kind} {self.path} cannot be created ({error}).") from error
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(temporary)

    def _check_existing(self, db: sqlite3.Connection) -> None:
        version = db.execute("PRAGMA user_version").fetchone()[0]
        names = {row[0] for row in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        if version != self._version or not set(self._tables) <= names:
            db.close()
            found = f"schema version {version}" if version else "no ray_dptune schema version"
            raise StoreError(
                f"{self.path} is not a {self.kind} this version of ray_dptune reads: it has {found} and tables "
                f"{sorted(names)}, expected version {self._version} with {sorted(self._tables)}. It was left "
                "untouched; open it with the ray_dptune version that wrote it."
            )

    def _create(self, db: sqlite3.Connection) -> None:
        db.execute("BEGIN IMMEDIATE")
        try:
            for statement in filter(str.strip, self._schema.split(";")):
                db.execute(statement)
            db.execute(f"PRAGMA user_version = {int(self._version)}")
        except BaseException:
            db.execute("ROLLBACK")
            raise
        db.execute("COMMIT")

    # ------------------------------------------------------------------ use
    @contextlib.contextmanager
    def reading(self) -> Iterator[sqlite3.Connection]:
        """The connection, with SQLite errors turned into :class:`StoreError`."""
        db = self._open()
        try:
            yield db
        except sqlite3.OperationalError as error:
            raise StoreError(
                f"The {self.kind} {self.path} is locked or unreadable ({error}); nothing was recorded or lost. "
                "Retry when the other writer is done."
            ) from error
        except sqlite3.DatabaseError as error:
            raise StoreError(
                f"The {self.kind} {self.path} is corrupt ({error}). It was left untouched: restore it from a backup; "
                "do not delete it, since it holds what was already spent."
            ) from error

    @contextlib.contextmanager
    def transaction(self, *, durable: bool = True) -> Iterator[sqlite3.Connection]:
        """A write transaction, committed with ``synchronous=FULL`` when ``durable``."""
        with self.reading() as db:
            db.execute(f"PRAGMA synchronous={'FULL' if durable else 'NORMAL'}")
            db.execute("BEGIN IMMEDIATE")
            try:
                yield db
            except BaseException:
                db.execute("ROLLBACK")
                raise
            db.execute("COMMIT")

    def close(self) -> None:
        """Closes the connection, if open; the next use reopens it."""
        if self._db is not None:
            self._db.close()
            self._db = None
