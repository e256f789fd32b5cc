"""The primary role (:mod:`.primary`) on one machine: replicas sharing one SQLite registry
file, a lock file per role beside it, and an epoch counter row.

Beside the registry file, in ``<registry file>.roles/`` (0700, its files 0600)::

    primary.<name>        locked by the primary of <name> while its term lasts; holds the
                          term's epoch once the term has begun
    replica.<N>.<name>    locked by the process that registered replica N of <name>

and in the registry file itself::

    primaries(name, epoch, replica, log_position)   the last term begun; epoch the counter
    replicas(name, replica, host, port, host_name, log_position)
    groups(name, version, record)                   the replica group (:mod:`.groups`);
                                                    version: 1, then one more each write

The locks are Linux's open-file-description locks (``fcntl`` ``F_OFD_SETLK``): like
``flock`` they belong to an open file, so two holders in one process exclude each other,
and the kernel drops them when their holder dies, however it dies; unlike ``flock`` they
can be tested without being taken (``F_OFD_GETLK``), so asking who is primary never makes
a campaign fail.

A new term: lock ``primary.<name>`` without waiting, empty it, then in one ``BEGIN
IMMEDIATE`` transaction add one to the instance's epoch (1 for its first term) and record
the replica, if the group's version is still the one the candidate read; then write the
epoch into the file. A term is current while its file is
locked and holds its epoch: so between a new primary's lock and its epoch, and after a
resignation (which empties the file before unlocking), nobody is said to hold the role.

A primary that dies loses its lock at once. One that is paused (SIGSTOP, a machine under
load) keeps it: ``take_over`` succeeds, like ``campaign``, only once the old holder's lock
is free, and then only if the last term begun is still the one the caller saw. There is
no faster path on one machine without a lease: nobody can take a lock the kernel says a
living process holds. (Nor is one needed against losing a machine: these replicas share
one.)
"""

from __future__ import annotations

import asyncio
import errno
import fcntl
import os
import socket
import sqlite3
import struct
import threading
from collections.abc import AsyncGenerator
from pathlib import Path

from ..replication.group import Group
from ..storage.modes import create_private, make_private_dir
from .groups import changed, decode_group, encode_group
from .interface import Endpoint, RegistryError
from .primary import Replica, Term, check_replica
from .sqlite import SqliteRegistry

__all__ = ["SqlitePrimaryElection"]

_SCHEMA = (
    """CREATE TABLE IF NOT EXISTS primaries (
        name TEXT PRIMARY KEY REFERENCES instances(name),
        epoch INTEGER NOT NULL,
        replica INTEGER NOT NULL,
        log_position INTEGER NOT NULL
    )""",
    """CREATE TABLE IF NOT EXISTS replicas (
        name TEXT NOT NULL REFERENCES instances(name),
        replica INTEGER NOT NULL,
        host TEXT NOT NULL,
        port INTEGER NOT NULL,
        host_name TEXT NOT NULL,
        log_position INTEGER NOT NULL,
        recovering INTEGER NOT NULL DEFAULT 0,
        PRIMARY KEY (name, replica)
    )""",
    """CREATE TABLE IF NOT EXISTS groups (
        name TEXT PRIMARY KEY REFERENCES instances(name),
        version INTEGER NOT NULL,
        record BLOB NOT NULL
    )""",
)
# A registry file made before replicas said whether they recover gains the column.
_RECOVERING_COLUMN = "ALTER TABLE replicas ADD COLUMN recovering INTEGER NOT NULL DEFAULT 0"
# struct flock: l_type, l_whence, l_start, l_len, l_pid (64-bit Linux); the whole file.
_FLOCK = struct.Struct("hhqqi")
_BUSY = (errno.EAGAIN, errno.EACCES)


class SqlitePrimaryElection:
    """The primary role of instances in ``registry``'s file, for this process."""

    def __init__(self, registry: SqliteRegistry) -> None:
        self._registry = registry
        self.roles = registry.path.with_name(registry.path.name + ".roles")
        self._lock = threading.Lock()
        self._terms: dict[str, tuple[int, Term]] = {}  # instance: its file, our term
        self._replicas: dict[tuple[str, int], int] = {}  # (instance, replica): its file
        try:
            make_private_dir(self.roles)
        except OSError as exc:
            raise RegistryError(f"cannot make {self.roles}: {exc.strerror}") from exc
        with registry._write() as db:
            for statement in _SCHEMA:
                db.execute(statement)
            columns = {row[1] for row in db.execute("PRAGMA table_info(replicas)")}
            if "recovering" not in columns:
                db.execute(_RECOVERING_COLUMN)

    @property
    def where(self) -> str:
        return self._registry.where

    def close(self) -> None:
        with self._lock:
            for fd, _ in self._terms.values():
                _release(fd)
            for fd in self._replicas.values():
                os.close(fd)
            self._terms.clear()
            self._replicas.clear()

    def _path(self, kind: str, instance: str) -> Path:
        if not instance or "/" in instance or instance in (".", ".."):
            raise RegistryError(f"instance name {instance!r} cannot name a lock file")
        return self.roles / f"{kind}.{instance}"

    def _read(self, query: str, args: tuple[object, ...]) -> list[tuple[object, ...]]:
        with self._registry._lock:
            try:
                rows: list[tuple[object, ...]] = (
                    self._registry._conn().execute(query, args).fetchall()
                )
            except sqlite3.Error as exc:
                raise self._registry._error("cannot read", exc) from exc
        return rows

    # --- replicas ----------------------------------------------------------------------

    def register_replica(
        self,
        instance: str,
        replica: int,
        address: Endpoint,
        log_position: int,
        recovering: bool = False,
    ) -> None:
        check_replica(replica, log_position, address)
        path = self._path(f"replica.{replica}", instance)
        with self._lock:
            fd = self._replicas.get((instance, replica))
            if fd is None:
                fd = _try_lock(path)
                if fd is None:
                    raise RegistryError(
                        f"replica {replica} of {instance!r} is registered by another live "
                        f"process ({path} is locked)"
                    )
            try:
                with self._registry._write() as db:
                    self._registry._require(db, instance)
                    db.execute(
                        "INSERT INTO replicas (name, replica, host, port, host_name, "
                        "log_position, recovering) VALUES (?, ?, ?, ?, ?, ?, ?) "
                        "ON CONFLICT (name, replica) DO UPDATE SET host = excluded.host, "
                        "port = excluded.port, host_name = excluded.host_name, "
                        "log_position = excluded.log_position, "
                        "recovering = excluded.recovering",
                        (
                            instance,
                            replica,
                            address.host,
                            address.port,
                            socket.gethostname(),
                            log_position,
                            int(recovering),
                        ),
                    )
            except BaseException:
                if (instance, replica) not in self._replicas:
                    os.close(fd)
                raise
            self._replicas[instance, replica] = fd

    def replicas(self, instance: str) -> list[Replica]:
        rows = self._read(
            "SELECT replica, host, port, log_position, host_name, recovering FROM replicas "
            "WHERE name = ? ORDER BY replica",
            (instance,),
        )
        found = []
        for replica, host, port, log_position, host_name, recovering in rows:
            assert isinstance(replica, int) and isinstance(port, int)
            assert isinstance(log_position, int)
            if _locked(self._path(f"replica.{replica}", instance)):
                address = Endpoint(str(host), port)
                found.append(
                    Replica(replica, address, log_position, str(host_name), bool(recovering))
                )
        return found

    # --- the term ----------------------------------------------------------------------

    def campaign(
        self, instance: str, replica: int, log_position: int, *, group_version: int
    ) -> Term | None:
        return self._begin(instance, replica, log_position, None, group_version)

    def take_over(
        self, instance: str, replica: int, seen: Term, log_position: int, *, group_version: int
    ) -> Term | None:
        if seen.instance != instance:
            raise RegistryError(f"a term of {seen.instance!r} is not one of {instance!r}")
        return self._begin(instance, replica, log_position, seen.epoch, group_version)

    def _begin(
        self, instance: str, replica: int, log_position: int, seen: int | None, group: int
    ) -> Term | None:
        """A new term if the role's lock is free, the group is of version ``group`` (and,
        with ``seen``, the last term begun has that epoch)."""
        check_replica(replica, log_position)
        with self._lock:
            if (instance, replica) not in self._replicas:
                raise RegistryError(
                    f"replica {replica} of {instance!r}: register it in this process first"
                )
            fd = _try_lock(self._path("primary", instance))
            if fd is None:
                return None
            try:
                os.ftruncate(fd, 0)  # no term here until ours has its epoch
                with self._registry._write() as db:
                    self._registry._require(db, instance)
                    row = db.execute(
                        "SELECT epoch FROM primaries WHERE name = ?", (instance,)
                    ).fetchone()
                    last = 0 if row is None else int(row[0])
                    stored = db.execute(
                        "SELECT version FROM groups WHERE name = ?", (instance,)
                    ).fetchone()
                    if (seen is not None and last != seen) or (
                        (0 if stored is None else int(stored[0])) != group
                    ):
                        _release(fd)
                        return None
                    db.execute(
                        "INSERT INTO primaries VALUES (?, ?, ?, ?) ON CONFLICT (name) DO "
                        "UPDATE SET epoch = excluded.epoch, replica = excluded.replica, "
                        "log_position = excluded.log_position",
                        (instance, last + 1, replica, log_position),
                    )
                os.pwrite(fd, f"{last + 1}\n".encode(), 0)
            except BaseException:
                _release(fd)
                raise
            term = Term(instance, replica, last + 1, log_position)
            self._terms[instance] = (fd, term)
            return term

    def current(self, instance: str) -> Term | None:
        path = self._path("primary", instance)
        rows = self._read(
            "SELECT epoch, replica, log_position FROM primaries WHERE name = ?", (instance,)
        )
        if not rows:
            return None
        epoch, replica, log_position = rows[0]
        assert isinstance(epoch, int) and isinstance(replica, int)
        assert isinstance(log_position, int)
        try:
            holds = path.read_bytes().strip() == str(epoch).encode()
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise RegistryError(f"cannot read {path}: {exc.strerror}") from exc
        if not holds or not _locked(path):
            return None
        return Term(instance, replica, epoch, log_position)

    def still_primary(self, term: Term) -> bool:
        return self.current(term.instance) == term

    def renew(self, term: Term, log_position: int, *, group_version: int) -> Term | None:
        check_replica(term.replica, log_position)
        instance = term.instance
        with self._lock:
            held = self._terms.get(instance)
            if held is None or held[1] != term:
                return None
            with self._registry._write() as db:
                row = db.execute(
                    "SELECT epoch FROM primaries WHERE name = ?", (instance,)
                ).fetchone()
                stored = db.execute(
                    "SELECT version FROM groups WHERE name = ?", (instance,)
                ).fetchone()
                version = 0 if stored is None else int(stored[0])
                if row is None or int(row[0]) != term.epoch or version != group_version:
                    return None
                db.execute(
                    "UPDATE primaries SET epoch = ?, log_position = ? WHERE name = ?",
                    (term.epoch + 1, log_position, instance),
                )
            # Still locked by us; a longer number over a shorter one: never a mix.
            os.pwrite(held[0], f"{term.epoch + 1}\n".encode(), 0)
            renewed = Term(instance, term.replica, term.epoch + 1, log_position)
            self._terms[instance] = (held[0], renewed)
            return renewed

    # --- the group ---------------------------------------------------------------------

    def _stored(self, db: sqlite3.Connection, instance: str) -> Group | None:
        row = db.execute(
            "SELECT version, record FROM groups WHERE name = ?", (instance,)
        ).fetchone()
        if row is None:
            return None
        where = f"{self._registry.where}: the group of {instance!r}"
        return decode_group(bytes(row[1]), int(row[0]), where)

    def _store(self, db: sqlite3.Connection, instance: str, group: Group) -> Group:
        """``group`` written over the stored one, under its own version: the next one
        (``Group.changed`` and ``Group.settled`` count it up, the first is 1)."""
        db.execute(
            "INSERT INTO groups VALUES (?, ?, ?) ON CONFLICT (name) DO UPDATE SET "
            "version = excluded.version, record = excluded.record",
            (instance, group.version, encode_group(group)),
        )
        return group

    def group(self, instance: str) -> Group | None:
        with self._registry._lock:
            try:
                return self._stored(self._registry._conn(), instance)
            except sqlite3.Error as exc:
                raise self._registry._error("cannot read", exc) from exc

    def found_group(self, instance: str, group: Group) -> Group:
        with self._registry._write() as db:
            self._registry._require(db, instance)
            stored = self._stored(db, instance)
            if stored is not None:
                return stored
            return self._store(db, instance, Group.of(group.replicas, group.k, version=1))

    def change_group(
        self, instance: str, replicas: frozenset[int], k: int | None, *, from_version: int
    ) -> Group:
        with self._registry._write() as db:
            stored = self._stored(db, instance)
            return self._store(db, instance, changed(stored, instance, replicas, k, from_version))

    def settle_group(self, term: Term, group: Group) -> Group | None:
        instance = term.instance
        with self._lock:
            held = self._terms.get(instance)
            if held is None or held[1] != term or group.previous is None:
                return None
            with self._registry._write() as db:
                row = db.execute(
                    "SELECT epoch FROM primaries WHERE name = ?", (instance,)
                ).fetchone()
                if row is None or int(row[0]) != term.epoch or self._stored(db, instance) != group:
                    return None
                return self._store(db, instance, group.settled)

    def resign(self, term: Term) -> None:
        with self._lock:
            held = self._terms.get(term.instance)
            if held is None or held[1] != term:
                return
            del self._terms[term.instance]
            _release(held[0])

    async def watch_primary(self, instance: str) -> AsyncGenerator[Term | None, None]:
        self._path("primary", instance)
        last: Term | str | None = "nothing yet"
        while True:
            term = await asyncio.to_thread(self.current, instance)
            if term != last:
                last = term
                yield term
            await asyncio.sleep(self._registry.poll_interval)


def _lock_op(fd: int, command: int, kind: int) -> int:
    """``fcntl`` on the whole file with an open-file-description lock; the answer's type."""
    answer = fcntl.fcntl(fd, command, _FLOCK.pack(kind, os.SEEK_SET, 0, 0, 0))
    return int(_FLOCK.unpack(answer)[0])


def _try_lock(path: Path) -> int | None:
    """``path`` open and locked, or ``None`` if a live holder has it locked."""
    try:
        fd = create_private(path, os.O_RDWR | os.O_CLOEXEC)
    except OSError as exc:
        raise RegistryError(f"cannot open {path}: {exc.strerror}") from exc
    try:
        _lock_op(fd, fcntl.F_OFD_SETLK, fcntl.F_WRLCK)
    except OSError as exc:
        os.close(fd)
        if exc.errno in _BUSY:
            return None
        raise RegistryError(f"cannot lock {path}: {exc.strerror}") from exc
    return fd


def _release(fd: int) -> None:
    """Empty a role's file (it names no term any more), then unlock it by closing it."""
    try:
        os.ftruncate(fd, 0)
    finally:
        os.close(fd)


def _locked(path: Path) -> bool:
    """Whether a live process holds ``path``'s lock (tested without taking it)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return False
    except OSError as exc:
        raise RegistryError(f"cannot open {path}: {exc.strerror}") from exc
    try:
        return _lock_op(fd, fcntl.F_OFD_GETLK, fcntl.F_WRLCK) != fcntl.F_UNLCK
    except OSError as exc:
        raise RegistryError(f"cannot test the lock of {path}: {exc.strerror}") from exc
    finally:
        os.close(fd)
