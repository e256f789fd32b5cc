"""One etcd lease per process, kept alive, and what the process published under it.

A coordinator's addresses are put under its process's lease (:meth:`LeaseKeeper.publish`)
and this keeps the lease alive: a keep-alive every third of the TTL etcd granted. If the
process dies (or is cut off from etcd for longer than the TTL) the keep-alives stop, etcd
ends the lease and deletes its keys: a dead coordinator's addresses are gone within the
TTL, and watchers see them go.

When etcd is unreachable the keeper keeps trying (the client says so, once), and an
address published meanwhile is held, to be put once etcd answers (a coordinator that
recovered during the outage serves all the same). Once it answers again:

- if etcd no longer has the lease (it ran out meanwhile), or none was ever granted, a new
  one is granted and every address held is published again under it;
- if it has (etcd extends every lease when it restarts), each address held is read back
  and put again if it is missing or under another lease (a store restored from an older
  snapshot).

Either way an address someone else published meanwhile is left alone, and no longer
held: a replica that took the primary role over from this process, or an incarnation of
the instance elsewhere, publishes its own, which a process back from a pause must never
overwrite.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

from .etcd_client import EtcdClient, EtcdError, EtcdUnavailable, compare, delete_op, put_op

__all__ = ["LeaseKeeper"]

log = logging.getLogger("ambrosia_py.coordinator")


class LeaseKeeper:
    """The lease of one process and the keys it holds; runs on one event loop."""

    def __init__(self, client: EtcdClient, ttl: int) -> None:
        self._client = client
        self._ttl = ttl
        self._lease = 0
        self._granted = ttl
        self._held: dict[str, bytes] = {}
        self._lock = asyncio.Lock()
        self._task: asyncio.Task[None] | None = None
        self._outage: str | None = None
        self.renewals = 0  # keep-alive rounds etcd answered
        self.regrants = 0  # times the lease was found gone and granted anew

    @property
    def lease(self) -> int:
        """The lease's id (0 before the first publication)."""
        return self._lease

    @property
    def granted_ttl(self) -> int:
        return self._granted

    async def publish(self, key: str, value: bytes, require: str) -> bool:
        """Put ``key`` under the lease if the key ``require`` exists (the instance is
        registered); whether it did."""
        async with self._lock:
            try:
                if not self._lease:
                    await self._grant()
                done, _ = await self._client.txn(
                    [compare(require, "VERSION", "GREATER", 0)],
                    [put_op(key, value, self._lease)],
                )
            except EtcdUnavailable as exc:
                # Put by the keep-alive once etcd answers (the instance was registered
                # when this process started, which etcd had to answer for).
                self._held[key] = value
                self._outage = str(exc)
                self._start()
                return True
            if done:
                self._held[key] = value
            return done

    async def withdraw(self, key: str) -> None:
        async with self._lock:
            self._held.pop(key, None)
            await self._client.delete(key)

    async def withdraw_own(self, key: str) -> None:
        """Delete ``key`` if it is still under this process's lease: an address another
        process published over it since is left alone."""
        async with self._lock:
            self._held.pop(key, None)
            if self._lease:
                await self._client.txn(
                    [compare(key, "LEASE", "EQUAL", self._lease)], [delete_op(key)]
                )

    async def stop(self, *, revoke: bool) -> None:
        """Stop keeping the lease alive; with ``revoke``, end it now (its keys go at once)."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        if revoke and self._lease:
            try:
                await self._client.revoke(self._lease)
            except EtcdError as exc:
                log.info(
                    "could not revoke the etcd lease %x (it ends by itself): %s", self._lease, exc
                )
        self._lease = 0
        self._held.clear()

    async def _grant(self) -> None:
        self._lease, self._granted = await self._client.grant(self._ttl)
        if self._granted != self._ttl:
            log.info("etcd granted a %d s lease (asked for %d s)", self._granted, self._ttl)
        self._start()

    def _start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._keep(), name="etcd lease keep-alive")

    async def _keep(self) -> None:
        while True:
            await asyncio.sleep(self._granted / 3)
            try:
                async with self._lock:
                    await self._renew()
            except EtcdError as exc:  # the client logged the outage; etcd refusing, here
                if self._outage is None and not isinstance(exc, EtcdUnavailable):
                    log.warning("cannot keep the etcd lease %x alive: %s", self._lease, exc)
                self._outage = str(exc)

    async def _renew(self) -> None:
        # No lease yet: etcd was unreachable when the first address was published.
        if not self._lease or await self._client.keepalive(self._lease) <= 0:
            if self._lease:
                log.warning(
                    "the etcd lease %x ran out, withdrawing what it held; publishing %d "
                    "addresses again under a new lease",
                    self._lease,
                    len(self._held),
                )
                self.regrants += 1
            self._lease, self._granted = await self._client.grant(self._ttl)
            for key, value in list(self._held.items()):
                await self._put_back(key, value, None)
        elif self._outage is not None:
            for key, value in list(self._held.items()):
                _, found = await self._client.range(key)
                if not found:
                    await self._put_back(key, value, None)
                elif found[0].value == value and found[0].lease != self._lease:
                    await self._put_back(key, value, found[0].mod_revision)
                elif found[0].value != value:
                    self._gave_up(key)
        self._outage = None
        self.renewals += 1

    async def _put_back(self, key: str, value: bytes, modified: int | None) -> None:
        """Put an address held back under the lease, unless someone else published the
        key meanwhile (``modified``: the revision it was read at; None: it was gone).
        Another's address is never overwritten: a replica that took over from this
        process, or a new incarnation elsewhere, published its own."""
        done, _ = await self._client.txn(
            [compare(key, "MOD", "EQUAL", modified or 0)], [put_op(key, value, self._lease)]
        )
        if not done:
            self._gave_up(key)

    def _gave_up(self, key: str) -> None:
        self._held.pop(key, None)
        log.info("%s was published by another process meanwhile; left to it", key)
