"""The instance registry: what the released coordinator kept in cloud tables, on local disk.

An embedded SQLite database at ``<data dir>/registry.sqlite3`` (reference ambrosia.md,
Files on disk: "ours keeps it in an embedded store on local disk") holds, per instance,
its two loopback ports (receive, send), its current version and committer id, and per
version the last committed checkpoint and the log file that goes with it; and where a
running instance accepts links and ingress calls (published at start-up, so a port
another start cannot take can be said to be that instance's: ``port_users.py``).

Several coordinator processes on one machine may share a data directory, so the database
runs in WAL mode with a busy timeout, every change is one short ``BEGIN IMMEDIATE``
transaction (which serialises writers, so checking and taking ports cannot race), and
``synchronous=FULL`` makes a committed checkpoint survive power loss.

The rules for ports, versions and checkpoints are :mod:`.rules`', shared with the etcd
backend. The database may also live outside the data dir (``path``), one file shared by
processes whose data dirs differ (:func:`.backends.open_registry`).

The database and its ``-wal``/``-shm``/``-journal`` files are 0600 and a data directory
it creates 0700 (:mod:`..storage.modes`): the file is made 0600 before SQLite opens it, and
SQLite gives its side files the database's mode. Every SQLite or OS failure surfaces as a
:class:`RegistryError` naming the database, never as a raw ``sqlite3`` exception.
"""

from __future__ import annotations

import os
import sqlite3
import threading
import time
from pathlib import Path

from ..storage.modes import PRIVATE_FILE, create_private, own_data_dir
from ..storage.ownership import OwnershipError, Trusted, check_owned
from .interface import InstanceInfo, RegistryError
from .rules import (
    PORT_RANGE,
    check_checkpoint,
    check_committer_id,
    check_register,
    check_version,
    choose_ports,
)
from .rules import bindable as _bindable  # noqa: F401 (the tests probe ports with it)
from .rules import check_port as _check_port

__all__ = [
    "PORT_RANGE",
    "REGISTRY_FILE",
    "REGISTRY_SIDE_FILES",
    "InstanceInfo",
    "Registry",
    "RegistryError",
]

REGISTRY_FILE = "registry.sqlite3"
REGISTRY_SIDE_FILES = ("-wal", "-shm", "-journal")  # SQLite's, beside the database
_BUSY_TIMEOUT_S = 30.0

_SCHEMA = """
CREATE TABLE IF NOT EXISTS instances (
    name TEXT PRIMARY KEY,
    receive_port INTEGER NOT NULL,
    send_port INTEGER NOT NULL,
    current_version INTEGER NOT NULL,
    committer_id INTEGER
);
CREATE TABLE IF NOT EXISTS versions (
    name TEXT NOT NULL REFERENCES instances(name),
    version INTEGER NOT NULL,
    last_checkpoint INTEGER,
    last_log INTEGER,
    PRIMARY KEY (name, version)
);
CREATE TABLE IF NOT EXISTS links (
    name TEXT PRIMARY KEY REFERENCES instances(name),
    host TEXT NOT NULL,
    port INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS ingresses (
    name TEXT PRIMARY KEY REFERENCES instances(name),
    host TEXT NOT NULL,
    port INTEGER NOT NULL
);
"""

_SELECT = """
SELECT i.name, i.receive_port, i.send_port, i.current_version,
       v.last_checkpoint, v.last_log, i.committer_id
FROM instances AS i
LEFT JOIN versions AS v ON v.name = i.name AND v.version = i.current_version
"""


def _info(row: tuple[object, ...]) -> InstanceInfo:
    name, rp, sp, version, chk, log, committer = row
    assert isinstance(name, str) and isinstance(rp, int) and isinstance(sp, int)
    assert isinstance(version, int)
    assert chk is None or isinstance(chk, int)
    assert log is None or isinstance(log, int)
    assert committer is None or isinstance(committer, int)
    return InstanceInfo(name, rp, sp, version, chk, log, committer)


def _set_wal(db: sqlite3.Connection) -> None:
    """Switch to WAL mode, retrying while another process holds the database.

    Changing the journal mode takes an exclusive lock, and SQLite reports "database is
    locked" for it without calling the busy handler when several processes open a fresh
    database at once; so the busy timeout alone is not enough here.
    """
    deadline = time.monotonic() + _BUSY_TIMEOUT_S
    delay = 0.001
    while True:
        try:
            db.execute("PRAGMA journal_mode = WAL")
            return
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or time.monotonic() >= deadline:
                raise
            time.sleep(delay)
            delay = min(delay * 2, 0.05)


def registry_paths(data_dir: Path) -> list[Path]:
    """The registry database of ``data_dir`` and its SQLite side files (present or not)."""
    return registry_file_paths(Path(data_dir) / REGISTRY_FILE)


def registry_file_paths(path: Path) -> list[Path]:
    """The registry database ``path`` and its SQLite side files (present or not)."""
    return [path, *(path.with_name(path.name + side) for side in REGISTRY_SIDE_FILES)]


class Registry:
    """The registry of one data directory. Thread-safe; share one per process.

    ``path``: the database, if not the data dir's own (its directory is made 0700 if
    missing, and checked to be ours, as a data dir is).
    """

    def __init__(self, data_dir: Path, path: Path | None = None) -> None:
        self.data_dir = Path(data_dir)
        self.path = self.data_dir / REGISTRY_FILE if path is None else Path(path)
        self._lock = threading.Lock()
        self._db: sqlite3.Connection | None = None
        try:  # every command that opens a registry: another user's is not ours to read
            own_data_dir(self.path.parent)
            check_owned(registry_file_paths(self.path), Trusted.DATA_FILE)
        except OwnershipError as exc:
            raise RegistryError(str(exc)) from None
        try:
            # Created 0600 before SQLite sees it: SQLite then creates its -wal, -shm and
            # -journal files with the database's mode.
            os.close(create_private(self.path, os.O_RDWR))
            self._db = sqlite3.connect(
                self.path,
                timeout=_BUSY_TIMEOUT_S,
                isolation_level=None,  # we issue BEGIN/COMMIT ourselves
                check_same_thread=False,
            )
            with self._lock:
                self._setup(self._conn())
            self._private_side_files()
        except (sqlite3.Error, OSError) as exc:
            self.close()
            raise self._error("cannot open", exc) from exc

    def _setup(self, db: sqlite3.Connection) -> None:
        db.execute(f"PRAGMA busy_timeout = {int(_BUSY_TIMEOUT_S * 1000)}")
        _set_wal(db)
        db.execute("PRAGMA synchronous = FULL")
        db.execute("PRAGMA foreign_keys = ON")
        db.execute("BEGIN IMMEDIATE")
        try:
            for statement in _SCHEMA.split(";"):
                if statement.strip():
                    db.execute(statement)
        except BaseException:
            db.execute("ROLLBACK")
            raise
        db.execute("COMMIT")

    def _private_side_files(self) -> None:
        """Belt and braces: SQLite mirrors the database's mode, this states it."""
        for path in registry_file_paths(self.path)[1:]:
            try:
                if path.stat().st_mode & 0o077:
                    os.chmod(path, PRIVATE_FILE)
            except FileNotFoundError:
                continue  # not created (yet), or removed by SQLite at a last close

    def _error(self, doing: str, exc: BaseException) -> RegistryError:
        what = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        return RegistryError(f"{doing} the registry {self.path}: {what}")

    def _conn(self) -> sqlite3.Connection:
        if self._db is None:
            raise RegistryError(f"registry {self.path} is closed")
        return self._db

    def close(self) -> None:
        """Close the database (idempotent)."""
        with self._lock:
            if self._db is not None:
                self._db.close()
                self._db = None

    def __enter__(self) -> Registry:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- reading -----------------------------------------------------------------------

    def _get(self, db: sqlite3.Connection, name: str) -> InstanceInfo | None:
        row = db.execute(_SELECT + " WHERE i.name = ?", (name,)).fetchone()
        return None if row is None else _info(row)

    def get(self, name: str) -> InstanceInfo | None:
        """The instance called ``name``, or ``None``."""
        with self._lock:
            try:
                return self._get(self._conn(), name)
            except sqlite3.Error as exc:
                raise self._error("cannot read", exc) from exc

    def instances(self) -> list[InstanceInfo]:
        """Every registered instance, by name."""
        with self._lock:
            try:
                rows = self._conn().execute(_SELECT + " ORDER BY i.name").fetchall()
            except sqlite3.Error as exc:
                raise self._error("cannot read", exc) from exc
        return [_info(row) for row in rows]

    # --- writing -----------------------------------------------------------------------

    def _write(self) -> _Transaction:
        return _Transaction(self)

    def register(
        self,
        name: str,
        *,
        receive_port: int | None = None,
        send_port: int | None = None,
        version: int = 0,
    ) -> InstanceInfo:
        """Register ``name`` (or return it unchanged if it exists and no port is given).

        Explicit ports replace an existing instance's; missing ones are allocated (new
        instance) or kept (existing one). ``version`` is the current version of a new
        instance; change an existing one's with :meth:`set_current_version`.
        """
        check_register(name, receive_port, send_port, version)
        with self._write() as db:
            existing = self._get(db, name)
            if existing is not None and receive_port is None and send_port is None:
                return existing
            used: dict[int, str] = {}
            for other, rp, sp in db.execute(
                "SELECT name, receive_port, send_port FROM instances WHERE name != ?", (name,)
            ):
                used[rp] = other
                used[sp] = other
            ports = None if existing is None else (existing.receive_port, existing.send_port)
            receive_port, send_port = choose_ports(
                name, ports, receive_port, send_port, used, PORT_RANGE
            )
            if existing is None:
                db.execute(
                    "INSERT INTO instances (name, receive_port, send_port, current_version) "
                    "VALUES (?, ?, ?, ?)",
                    (name, receive_port, send_port, version),
                )
                db.execute(
                    "INSERT OR IGNORE INTO versions (name, version) VALUES (?, ?)",
                    (name, version),
                )
            else:
                db.execute(
                    "UPDATE instances SET receive_port = ?, send_port = ? WHERE name = ?",
                    (receive_port, send_port, name),
                )
            info = self._get(db, name)
        assert info is not None
        return info

    def _require(self, db: sqlite3.Connection, name: str) -> None:
        if db.execute("SELECT 1 FROM instances WHERE name = ?", (name,)).fetchone() is None:
            raise RegistryError(f"unknown instance {name!r} (register it first)")

    def set_current_version(self, name: str, version: int) -> None:
        """Make ``version`` the instance's current version (after an upgrade)."""
        check_version(version)
        with self._write() as db:
            self._require(db, name)
            db.execute("UPDATE instances SET current_version = ? WHERE name = ?", (version, name))
            db.execute(
                "INSERT OR IGNORE INTO versions (name, version) VALUES (?, ?)", (name, version)
            )

    def commit_checkpoint(self, name: str, version: int, checkpoint: int, log: int) -> None:
        """Record that checkpoint ``checkpoint`` (and log ``log``) of ``version`` is durable.

        Checkpoint numbers only grow: recording an older one than the registry already
        has is refused, since recovery would then start from stale state.
        """
        check_checkpoint(name, version, checkpoint, log, None)
        with self._write() as db:
            self._require(db, name)
            row = db.execute(
                "SELECT last_checkpoint FROM versions WHERE name = ? AND version = ?",
                (name, version),
            ).fetchone()
            check_checkpoint(name, version, checkpoint, log, None if row is None else row[0])
            db.execute(
                "INSERT INTO versions (name, version, last_checkpoint, last_log) "
                "VALUES (?, ?, ?, ?) ON CONFLICT (name, version) DO UPDATE SET "
                "last_checkpoint = excluded.last_checkpoint, last_log = excluded.last_log",
                (name, version, checkpoint, log),
            )

    def set_committer_id(self, name: str, committer_id: int) -> None:
        """Record the instance's committer id (a 32-bit signed integer)."""
        check_committer_id(committer_id)
        with self._write() as db:
            self._require(db, name)
            db.execute("UPDATE instances SET committer_id = ? WHERE name = ?", (committer_id, name))

    def set_link_address(self, name: str, host: str, port: int) -> None:
        """Where the instance's coordinator accepts links from other coordinators now."""
        _check_port(port, "link port")
        with self._write() as db:
            self._require(db, name)
            db.execute(
                "INSERT INTO links (name, host, port) VALUES (?, ?, ?) "
                "ON CONFLICT (name) DO UPDATE SET host = excluded.host, port = excluded.port",
                (name, host, port),
            )

    def clear_link_address(self, name: str) -> None:
        """The instance's coordinator accepts no links (yet): senders wait."""
        with self._write() as db:
            db.execute("DELETE FROM links WHERE name = ?", (name,))

    def link_address(self, name: str) -> tuple[str, int] | None:
        """The last link address the instance's coordinator published, or ``None``."""
        with self._lock:
            try:
                row = (
                    self._conn()
                    .execute("SELECT host, port FROM links WHERE name = ?", (name,))
                    .fetchone()
                )
            except sqlite3.Error as exc:
                raise self._error("cannot read", exc) from exc
        return None if row is None else (str(row[0]), int(row[1]))

    def set_ingress_address(self, name: str, host: str, port: int) -> None:
        """Where the instance's ingress (``run --ingress``) listens now."""
        _check_port(port, "ingress port")
        with self._write() as db:
            self._require(db, name)
            db.execute(
                "INSERT INTO ingresses (name, host, port) VALUES (?, ?, ?) "
                "ON CONFLICT (name) DO UPDATE SET host = excluded.host, port = excluded.port",
                (name, host, port),
            )

    def clear_ingress_address(self, name: str, address: tuple[str, int] | None = None) -> None:
        """The instance's ingress stopped listening (``address``: if it is that one)."""
        with self._write() as db:
            if address is None:
                db.execute("DELETE FROM ingresses WHERE name = ?", (name,))
            else:
                db.execute(
                    "DELETE FROM ingresses WHERE name = ? AND host = ? AND port = ?",
                    (name, *address),
                )

    def port_users(self, port: int) -> list[tuple[str, str, str]]:
        """Who registered ``port``, as (instance, what, host): its receive or send port,
        or the port it accepts links or ingress calls on. Registered is not running: an
        instance keeps its ports while stopped, and one killed leaves its addresses."""
        query = (
            "SELECT name, 'receive port', '127.0.0.1' FROM instances WHERE receive_port = ? "
            "UNION ALL SELECT name, 'send port', '127.0.0.1' FROM instances WHERE send_port = ? "
            "UNION ALL SELECT name, 'link port', host FROM links WHERE port = ? "
            "UNION ALL SELECT name, 'ingress', host FROM ingresses WHERE port = ?"
        )
        with self._lock:
            try:
                rows = self._conn().execute(query, (port,) * 4).fetchall()
            except sqlite3.Error as exc:
                raise self._error("cannot read", exc) from exc
        return [(str(name), str(what), str(host)) for name, what, host in rows]

    def restore(
        self, name: str, version: int, committer_id: int | None, checkpoints: dict[int, int]
    ) -> InstanceInfo:
        """Register ``name`` afresh from what its files say (``registry rebuild``).

        ``version`` becomes the current version; ``checkpoints`` maps each version that
        has a usable checkpoint to its newest one (the log that pairs with checkpoint N is
        log N). Ports are allocated anew: the files do not record them. Refused if the
        instance is registered already.
        """
        if self.get(name) is not None:
            raise RegistryError(f"instance {name!r} is registered already")
        self.register(name, version=version)
        with self._write() as db:
            if committer_id is not None:
                db.execute(
                    "UPDATE instances SET committer_id = ? WHERE name = ?", (committer_id, name)
                )
            for v, checkpoint in sorted(checkpoints.items()):
                db.execute(
                    "INSERT INTO versions (name, version, last_checkpoint, last_log) "
                    "VALUES (?, ?, ?, ?) ON CONFLICT (name, version) DO UPDATE SET "
                    "last_checkpoint = excluded.last_checkpoint, last_log = excluded.last_log",
                    (name, v, checkpoint, checkpoint),
                )
            info = self._get(db, name)
        assert info is not None
        return info


class _Transaction:
    """``with registry._write() as db``: one ``BEGIN IMMEDIATE`` ... ``COMMIT``."""

    def __init__(self, registry: Registry) -> None:
        self._registry = registry

    def __enter__(self) -> sqlite3.Connection:
        self._registry._lock.acquire()
        try:
            db = self._registry._conn()
            db.execute("BEGIN IMMEDIATE")
        except sqlite3.Error as exc:
            self._registry._lock.release()
            raise self._registry._error("cannot write", exc) from exc
        except BaseException:
            self._registry._lock.release()
            raise
        self._db = db
        return db

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        try:
            self._db.execute("ROLLBACK" if exc_type is not None else "COMMIT")
        except sqlite3.Error as failure:
            raise self._registry._error("cannot write", failure) from failure
        finally:
            self._registry._lock.release()
        if isinstance(exc, sqlite3.Error):
            raise self._registry._error("cannot write", exc) from exc
