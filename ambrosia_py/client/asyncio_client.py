"""The asyncio client: calls over one connection, retried with their key until answered.

All calls of a client share one connection (the protocol numbers them, answers come in
any order). When it fails (the service or its coordinator crashed, restarted, the
network dropped) every call waiting on it connects again, with backoff, and sends the
same key again: the immortal runs a key's call once and keeps its outcome, so the
retry gets the first run's answer (``docs/ingress.md``). A client made by name
(:meth:`AsyncClient.connect`) asks the registry where the ingress is before each
connection (:mod:`.by_name`), so it follows a service that restarted elsewhere.
"""

from __future__ import annotations

import asyncio
import logging
import random
import ssl
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..binding.immortal import MethodSpec
from ..ingress.connection import ClientConnection, ConnectionState
from ..ingress.errors import (
    AuthenticationError,
    CallTimeoutError,
    ClientClosedError,
    IngressError,
    IngressProtocolError,
    ServiceUnreachableError,
)
from ..ingress.frames import DEFAULT_MAX_REPLY_FRAME, Outcome, Refusal, Reply, ServiceInfo
from ..ingress.keys import describe_key
from .by_name import IngressLookup, NotPublished, lookup_for
from .calls import (
    call_key,
    check_size,
    client_address,
    client_secret,
    encode_call,
    method_spec,
    result_of,
    tls_refused,
)

__all__ = ["DEFAULT_FIRST_CONTACT_TIMEOUT", "DEFAULT_TIMEOUT", "AsyncClient"]

log = logging.getLogger("ambrosia_py.client")

DEFAULT_TIMEOUT = 60.0  # seconds a call keeps trying, across restarts of the service
DEFAULT_HANDSHAKE_TIMEOUT = 10.0
# Seconds a client that has never reached the service keeps trying before it says what it
# found there: nothing listening, or something that is not an ingress. A service that
# was reached once and then went away (a crash, a restart) is retried for ``timeout``.
DEFAULT_FIRST_CONTACT_TIMEOUT = 3.0
_FIRST_BACKOFF = 0.05
_READ_SIZE = 256 * 1024
_HIGH_WATER = 1024 * 1024  # bytes waiting to be sent before a call waits for the socket
# The service closing the connection right after the client's proof, this many times in a
# row, means the proof failed (a server says nothing to a client that does not prove).
_CLOSES_AFTER_PROOF = 2


class _Lost(ConnectionError):
    """The connection went while a call waited: send the call again."""


class _ClosedAfterProof(ConnectionError):
    pass


class _ClosedAfterTls(ConnectionError):
    """Closed after the TLS handshake, before the HELLO: how a service refuses a client
    certificate under TLS 1.3 (asyncio closes without sending the alert)."""


class _NotConnected(ConnectionError):
    """The connection could not be made at all (refused, unreachable): nothing was sent."""


class _NoHello(ConnectionError):
    """The connection was accepted, but no byte of a HELLO came in time."""


class _Link:
    """One authenticated connection and the calls waiting on it."""

    def __init__(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        conn: ClientConnection,
        info: ServiceInfo,
    ) -> None:
        self._reader = reader
        self._writer = writer
        self._conn = conn
        self.info = info
        self.open = True
        self._pending: dict[int, asyncio.Future[Outcome | Refusal]] = {}
        self._next_id = 0
        self._flush_scheduled = False
        self._task = asyncio.ensure_future(self._read())

    @classmethod
    async def connect(
        cls,
        host: str,
        port: int,
        secret: bytes,
        max_reply_frame: int,
        handshake_timeout: float,
        tls: ssl.SSLContext | None,
        hello_timeout: float,
    ) -> _Link:
        try:
            reader, writer = await asyncio.open_connection(
                host, port, ssl=tls, ssl_handshake_timeout=handshake_timeout if tls else None
            )
        except ConnectionRefusedError as exc:
            raise _NotConnected(f"nothing listens on {host}:{port} ({exc.strerror})") from exc
        except OSError as exc:
            if tls_refused(exc):
                raise
            raise _NotConnected(f"cannot connect to {host}:{port}: {exc}") from exc
        conn = ClientConnection(secret, max_reply_frame=max_reply_frame)
        heard = False  # any byte from the service yet
        try:
            async with asyncio.timeout(handshake_timeout):
                while conn.state is not ConnectionState.OPEN:
                    if not heard:
                        try:  # the service writes its HELLO as it accepts
                            async with asyncio.timeout(hello_timeout):
                                data = await reader.read(_READ_SIZE)
                        except TimeoutError:
                            raise _NoHello(
                                f"it accepted the connection but sent no HELLO within "
                                f"{hello_timeout:g} s"
                            ) from None
                    else:
                        data = await reader.read(_READ_SIZE)
                    heard = True
                    if not data:
                        if conn.state is ConnectionState.AWAIT_WELCOME:
                            raise _ClosedAfterProof(f"{host}:{port} closed after our proof")
                        if tls is not None:
                            raise _ClosedAfterTls(f"{host}:{port} closed after TLS, before HELLO")
                        raise ConnectionResetError(f"{host}:{port} closed before its HELLO")
                    conn.receive_data(data)
                    writer.write(conn.data_to_send())
        except BaseException:
            writer.close()
            raise
        assert conn.info is not None
        return cls(reader, writer, conn, conn.info)

    async def call(self, key: bytes, method_id: int, args: bytes) -> Outcome | Refusal:
        if not self.open:
            raise _Lost("the connection closed")
        request_id = self._next_id
        self._next_id = (self._next_id + 1) & 0xFFFF_FFFF
        future: asyncio.Future[Outcome | Refusal] = asyncio.get_running_loop().create_future()
        self._pending[request_id] = future
        try:
            self._conn.call(request_id, key, method_id, args)
            if not self._flush_scheduled:  # calls made in one loop step: one write
                self._flush_scheduled = True
                asyncio.get_running_loop().call_soon(self._flush)
            if self._writer.transport.get_write_buffer_size() > _HIGH_WATER:
                await self._writer.drain()
            return await future
        finally:
            self._pending.pop(request_id, None)

    def _flush(self) -> None:
        self._flush_scheduled = False
        if self.open:
            self._writer.write(self._conn.data_to_send())

    async def _read(self) -> None:
        why: BaseException = _Lost("the service closed the connection")
        try:
            while data := await self._reader.read(_READ_SIZE):
                for event in self._conn.receive_data(data):
                    if isinstance(event, Reply):
                        future = self._pending.pop(event.request_id, None)
                        if future is not None and not future.done():
                            future.set_result(event.answer)
        except (IngressProtocolError, OSError) as exc:
            why = _Lost(f"the connection failed: {exc}")
        finally:
            self.open = False
            self._writer.close()
            for future in self._pending.values():
                if not future.done():
                    future.set_exception(why)
            self._pending.clear()

    @property
    def idle(self) -> bool:
        """No call waits on it."""
        return not self._pending

    def close(self) -> None:
        self.open = False
        self._task.cancel()
        self._writer.close()


class AsyncClient:
    """Calls to an immortal's ``@rpc`` methods through its ingress, on asyncio.

    ``address`` is the service's ``--ingress`` (``"host:port"`` or a pair), or an
    :class:`~.by_name.IngressLookup` (:meth:`connect` makes one: by name). The secret is
    the cluster's (see :func:`~ambrosia_py.client.calls.client_secret`): ``secret_file``
    or the service's ``data_dir``. ``timeout`` bounds each call, retries included;
    ``max_backoff`` the wait between attempts. ``tls``: for a service run with
    ``--tls-cert`` (:func:`~ambrosia_py.client.tls_context`). Use it from one event loop.

    Until it has reached the service once, a client tries for ``first_contact_timeout``
    seconds, then says what it found: nothing listening
    (:class:`~ambrosia_py.client.ServiceUnreachableError`), or something that is not an
    ingress (:class:`~ambrosia_py.client.IngressProtocolError`). Once it has, a lost
    connection is a crash or a restart: calls are sent again, with their keys, until
    ``timeout``, and the first retry of each outage is logged (``ambrosia_py.client``).
    """

    def __init__(
        self,
        address: str | tuple[str, int] | IngressLookup,
        *,
        secret_file: str | Path | None = None,
        data_dir: str | Path | None = None,
        timeout: float = DEFAULT_TIMEOUT,
        max_backoff: float = 2.0,
        handshake_timeout: float = DEFAULT_HANDSHAKE_TIMEOUT,
        max_reply_frame: int = DEFAULT_MAX_REPLY_FRAME,
        tls: ssl.SSLContext | None = None,
        first_contact_timeout: float = DEFAULT_FIRST_CONTACT_TIMEOUT,
    ) -> None:
        if timeout <= 0 or max_backoff <= 0 or first_contact_timeout <= 0:
            raise ValueError("timeout, max_backoff and first_contact_timeout must be positive")
        self._lookup: IngressLookup | None = None
        if isinstance(address, IngressLookup):
            self._lookup, self._host, self._port = address, "", 0
        else:
            self._host, self._port = client_address(address)
        self._secret, self.secret_path = client_secret(secret_file, data_dir)
        self.timeout = timeout
        self.max_backoff = max_backoff
        self._handshake_timeout = handshake_timeout
        self._max_reply_frame = max_reply_frame
        self._tls = tls
        self.first_contact_timeout = first_contact_timeout
        self._reached = False  # a handshake with the service has completed, ever
        self._retrying = False  # an outage's first retry was logged
        self._link: _Link | None = None
        self._lock = asyncio.Lock()
        self._closes_after_proof = 0
        self._closes_after_tls = 0
        self._closed = False
        self.resent = 0  # calls sent again after their connection failed (for tests, benches)

    @classmethod
    def connect(
        cls, *, instance: str, registry: str | Path | None = None, **options: Any
    ) -> AsyncClient:
        """A client of the service running as ``instance``, found by name in ``registry``
        (a SQLite file, ``etcd://HOST:PORT[,...]`` or ``etcds://...``; ``None``: the
        registry of ``data_dir``) and looked up again before every connection, so it
        follows the instance wherever it restarts. ``cluster=`` names the etcd cluster
        (default ``"ambrosia"``); the other ``options`` (``secret_file``, ``data_dir``,
        ``timeout``, ...) are the constructor's. Nothing is contacted until the first call."""
        return cls(lookup_for(instance, registry, options), **options)

    @property
    def address(self) -> str:
        """Where the service is (by name: the instance, and where it was found last)."""
        where = f"{self._host}:{self._port}"
        if self._lookup is None:
            return where
        name = self._lookup.instance
        return f"{name} at {where}" if self._port else f"instance {name!r}"

    @property
    def info(self) -> ServiceInfo | None:
        """What the service said when it last welcomed this client (instance, class)."""
        return self._link.info if self._link is not None else None

    async def call(
        self,
        method: Callable[..., Any],
        /,
        *args: Any,
        key: str | bytes | None = None,
        **kwargs: Any,
    ) -> Any:
        """Call ``method`` (``Service.method``) with these arguments; return its result or
        raise its exception. ``key`` names the call (default: 16 random bytes): a call
        made again with the same key is not run again, it gets the first one's outcome.
        A method parameter named ``key`` must be passed positionally."""
        spec, label = method_spec(method)
        data = encode_call(spec, label, args, kwargs)
        return await self.send_encoded(spec, label, data, call_key(key))

    async def send_encoded(
        self,
        spec: MethodSpec,
        label: str,
        data: bytes,
        raw_key: bytes,
        *,
        timeout: float | None = None,
        attempts: int = 0,
    ) -> Any:
        """:meth:`call` once its arguments are encoded and its key made: sent, and sent
        again on every failed connection, until answered or ``timeout`` (default: the
        client's) runs out. ``attempts``: how often it was sent already (by
        :class:`~.sync_client.Client`'s own connection), so that a timeout says it may
        have run, and a first try counts as a resend."""
        loop = asyncio.get_running_loop()
        started = loop.time()
        deadline = started + (self.timeout if timeout is None else timeout)
        failures = 0
        last: BaseException | None = None
        while True:
            if self._closed:
                raise ClientClosedError(f"the client for {self.address} is closed")
            remaining = deadline - loop.time()
            if remaining <= 0:
                raise self._timed_out(label, raw_key, attempts, last)
            try:
                async with asyncio.timeout(remaining):
                    link = await self._connected()
                    check_size(label, raw_key, data, link.info)
                    attempts += 1
                    if attempts > 1:
                        self.resent += 1
                    answer = await link.call(raw_key, spec.id, data)
            except TimeoutError as exc:
                if loop.time() < deadline:  # a socket's own timeout: try again
                    last = exc
                    continue
                raise self._timed_out(label, raw_key, attempts, last) from None
            except (ConnectionError, OSError) as exc:
                if tls_refused(exc):
                    raise IngressError(f"{label}: TLS with {self.address} refused: {exc}") from None
                last = exc
                failures += 1
                if not self._reached and attempts == 0:
                    if loop.time() - started >= self.first_contact_timeout:
                        raise self._never_reached(label, exc, failures) from None
                else:
                    self.connection_lost(label, exc)
                delay = min(self.max_backoff, _FIRST_BACKOFF * 2 ** min(failures - 1, 16))
                delay = min(delay * random.uniform(0.5, 1.0), max(0.0, remaining))
                if not self._reached:  # the last try of first contact comes on time
                    delay = min(delay, max(0.0, started + self.first_contact_timeout - loop.time()))
                await asyncio.sleep(delay)
                continue
            return result_of(spec, label, raw_key, answer, self.address)

    @property
    def connected(self) -> bool:
        """Whether the client has a connection to the service open now."""
        return self._link is not None and self._link.open

    def close_idle(self) -> None:
        """Close the connection if no call waits on it (a :class:`~.sync_client.Client`
        whose calling threads have a connection of their own: the service's connection
        slots are not held twice). The next call connects again."""
        link = self._link
        if link is not None and link.idle:
            link.close()
            self._link = None

    @property
    def reached(self) -> bool:
        """Whether a handshake with the service has completed, ever."""
        return self._reached

    def connection_lost(self, label: str, exc: BaseException) -> None:
        """A connection with calls on it failed: said once per outage (the next
        connection made says the service is back)."""
        if not self._retrying:
            self._retrying = True
            log.warning(
                "%s: the connection to %s failed (%s); sending calls again with their "
                "keys for up to %g s",
                label,
                self.address,
                exc,
                self.timeout,
            )

    def timed_out(
        self, label: str, key: bytes, attempts: int, last: BaseException | None
    ) -> CallTimeoutError:
        """The error of a call that got no answer in time (see :meth:`_timed_out`)."""
        return self._timed_out(label, key, attempts, last)

    async def _connected(self) -> _Link:
        link = self._link
        if link is not None and link.open:
            return link
        async with self._lock:  # one connection attempt at a time; the others wait for it
            link = self._link
            if link is not None and link.open:
                return link
            try:
                if self._lookup is not None:  # where it is now: it may have moved
                    self._host, self._port = await self._lookup.resolve()
                link = await _Link.connect(
                    self._host,
                    self._port,
                    self._secret,
                    self._max_reply_frame,
                    self._handshake_timeout,
                    self._tls,
                    self._handshake_timeout
                    if self._reached
                    else min(self._handshake_timeout, self.first_contact_timeout),
                )
            except _ClosedAfterProof:
                self._closes_after_proof += 1
                if self._closes_after_proof >= _CLOSES_AFTER_PROOF:
                    raise AuthenticationError(
                        f"the service at {self.address} closed the connection after this "
                        f"client's proof {self._closes_after_proof} times in a row: the secret "
                        f"from {self.secret_path} is not its cluster secret"
                    ) from None
                raise
            except _ClosedAfterTls:
                self._closes_after_tls += 1
                if self._closes_after_tls >= _CLOSES_AFTER_PROOF:
                    raise IngressError(
                        f"TLS with {self.address} refused: the service closed "
                        f"{self._closes_after_tls} connections in a row after TLS, before its "
                        "HELLO: it refuses this client's certificate (with --tls-ca it needs "
                        "one from that CA; its log says why)"
                    ) from None
                raise
            except AuthenticationError as exc:
                raise AuthenticationError(
                    f"the service at {self.address} failed to prove it holds the secret from "
                    f"{self.secret_path}: {exc.reason}",
                    frame=exc.frame,
                    offset=exc.offset,
                ) from None
            except IngressProtocolError as exc:
                raise IngressProtocolError(
                    f"{self.address} does not speak the ambrosia ingress protocol as this client "
                    f"does: {exc.reason}",
                    frame=exc.frame,
                    offset=exc.offset,
                ) from None
            self._closes_after_proof = self._closes_after_tls = 0
            self._reached = True
            if self._retrying:
                self._retrying = False
                log.warning("the connection to %s is back", self.address)
            self._link = link
            return link

    def _never_reached(self, label: str, exc: BaseException, tries: int) -> IngressError:
        """What a client that has never reached the service found at its address."""
        waited = f"{tries} {'try' if tries == 1 else 'tries'} in {self.first_contact_timeout:g} s"
        if isinstance(exc, NotPublished):
            return ServiceUnreachableError(
                f"{label}: {exc} ({waited}); start it with --ingress and the same "
                "--registry. The call was not sent: it did not run"
            )
        if isinstance(exc, _NoHello):
            return IngressProtocolError(
                f"{label}: {self.address} is not an ambrosia-py ingress: {exc} ({waited}); "
                "give the port the service's --ingress names. The call was not sent"
            )
        if isinstance(exc, _NotConnected):
            return ServiceUnreachableError(
                f"{label}: {exc} ({waited}); start the service with --ingress "
                f"{self._port}, or give its address. The call was not sent: it did not run"
            )
        return IngressProtocolError(
            f"{label}: {self.address} closed every connection before the handshake ended "
            f"({exc}; {waited}): it is not an ambrosia-py ingress, or one that refuses this "
            "client (its log says why). The call was not sent"
        )

    def _timed_out(
        self, label: str, key: bytes, attempts: int, last: BaseException | None
    ) -> CallTimeoutError:
        why = f"; last error: {last}" if last is not None else ""
        if not attempts:
            return CallTimeoutError(
                f"{label} was never sent to {self.address} within {self.timeout:g} s"
                f"{why}. It did not run",
                key=key,
                attempts=attempts,
            )
        return CallTimeoutError(
            f"{label} got no answer from {self.address} within {self.timeout:g} s "
            f"({attempts} attempts{why}). It may have run: call again with the same key "
            f"({describe_key(key)}, the error's .key) to get its outcome without running it twice",
            key=key,
            attempts=attempts,
        )

    async def close(self) -> None:
        """Close the connection; calls still waiting raise :class:`ClientClosedError`."""
        self._closed = True
        if self._link is not None:
            self._link.close()
            self._link = None
        if self._lookup is not None:
            await asyncio.to_thread(self._lookup.close)

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
