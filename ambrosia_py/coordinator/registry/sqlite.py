"""The SQLite registry (:mod:`.store`) as an :class:`.interface.InstanceRegistry`: with
live addresses, and a watch that polls.

The addresses are what ``set_link_address``/``set_ingress_address`` store (the ``links``
and ``ingresses`` tables); they count as live while the instance's lock is held
(:func:`..storage.running.running_pid`), so a killed coordinator's addresses stop
counting the moment the kernel drops its lock. The lock lives in the data dir of the
process that published them, which, when several data dirs share one registry file, is
not the one this registry was opened with: so each publication also records its data dir
(the ``owners`` table, added to an older file when it is first opened here; older code
ignores it, and an address with no owner row is looked up in this registry's data dir).
"""

from __future__ import annotations

import asyncio
import socket
import sqlite3
from collections.abc import AsyncGenerator
from pathlib import Path

from ..storage.errors import StorageError
from ..storage.files import InstanceFiles
from ..storage.running import running_pid
from .interface import Addresses, Endpoint, RegistryError
from .store import Registry

__all__ = ["SqliteRegistry"]

_OWNERS = """
CREATE TABLE IF NOT EXISTS owners (
    name TEXT PRIMARY KEY REFERENCES instances(name),
    data_dir TEXT NOT NULL
)
"""


class SqliteRegistry(Registry):
    """The registry in the SQLite file ``path`` (default: the data dir's own).

    ``poll_interval``: how often :meth:`watch` looks again, in seconds.
    """

    def __init__(
        self, data_dir: Path, path: Path | None = None, *, poll_interval: float = 0.5
    ) -> None:
        super().__init__(data_dir, path)
        self.poll_interval = poll_interval
        try:
            with self._write() as db:
                db.execute(_OWNERS)
        except BaseException:
            self.close()
            raise

    @property
    def where(self) -> str:
        return str(self.path)

    def __enter__(self) -> SqliteRegistry:
        return self

    def _own(self, name: str) -> None:
        """Record that ``name``'s addresses are this data dir's instance's."""
        with self._write() as db:
            self._require(db, name)
            db.execute(
                "INSERT INTO owners (name, data_dir) VALUES (?, ?) "
                "ON CONFLICT (name) DO UPDATE SET data_dir = excluded.data_dir",
                (name, str(self.data_dir.resolve())),
            )

    def set_link_address(self, name: str, host: str, port: int) -> None:
        self._own(name)
        super().set_link_address(name, host, port)

    def set_ingress_address(self, name: str, host: str, port: int) -> None:
        self._own(name)
        super().set_ingress_address(name, host, port)

    def addresses(self, name: str) -> Addresses:
        query = (
            "SELECT i.current_version, o.data_dir, l.host, l.port, g.host, g.port "
            "FROM instances AS i LEFT JOIN owners AS o ON o.name = i.name "
            "LEFT JOIN links AS l ON l.name = i.name "
            "LEFT JOIN ingresses AS g ON g.name = i.name WHERE i.name = ?"
        )
        with self._lock:  # one statement: one snapshot of the four tables
            try:
                row = self._conn().execute(query, (name,)).fetchone()
            except sqlite3.Error as exc:
                raise self._error("cannot read", exc) from exc
        if row is None:
            return Addresses()
        version, owner, link_host, link_port, ingress_host, ingress_port = row
        if link_host is None and ingress_host is None:
            return Addresses()
        data_dir = Path(owner) if owner is not None else self.data_dir
        try:
            alive = running_pid(InstanceFiles(data_dir, name, int(version))) is not None
        except (OSError, StorageError) as exc:
            raise RegistryError(f"cannot tell whether {name!r} runs ({data_dir}): {exc}") from exc
        if not alive:
            return Addresses()
        return Addresses(
            None if link_host is None else Endpoint(str(link_host), int(link_port)),
            None if ingress_host is None else Endpoint(str(ingress_host), int(ingress_port)),
            socket.gethostname(),
        )

    async def watch(self, name: str) -> AsyncGenerator[Addresses, None]:
        last = None
        while True:
            current = await asyncio.to_thread(self.addresses, name)
            if current != last:
                last = current
                yield current
            await asyncio.sleep(self.poll_interval)
