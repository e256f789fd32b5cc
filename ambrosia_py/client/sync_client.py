"""The blocking client: an :class:`AsyncClient` on an event loop in a thread of its own,
and once the service has been reached, a connection the calling threads use directly.

Any number of threads may call through one :class:`Client` at once; their calls share
its connection. A call goes out on the :class:`~.blocking.BlockingLink` (the calling
thread sends and reads; no hop to the loop's thread and back, which cost more than the
rest of the call) when it can: the service was reached before, the client has no TLS
and its address is fixed. Everything else goes through the event loop: the first
contact (with its errors), TLS, a service found by name, and every call whose
connection failed, sent again with its key by the loop's retrying, which reconnects
with backoff. Whichever way a call went, it is the same call: same key, same answer.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .. import eventloop
from ..ingress.errors import ClientClosedError, IngressError
from ..ingress.frames import DEFAULT_MAX_REPLY_FRAME, ServiceInfo
from . import calls
from .asyncio_client import (
    DEFAULT_FIRST_CONTACT_TIMEOUT,
    DEFAULT_HANDSHAKE_TIMEOUT,
    DEFAULT_TIMEOUT,
    AsyncClient,
)
from .blocking import BlockingLink, LinkLost
from .by_name import IngressLookup, lookup_for

__all__ = ["Client"]


class Client:
    """Calls to an immortal's ``@rpc`` methods through its ingress; blocking.

    Use it as a context manager (or call :meth:`close`). The arguments are
    :class:`AsyncClient`'s: ``address`` the service's ``--ingress``, the secret from
    ``secret_file`` or the service's ``data_dir``, ``timeout`` per call with retries.
    :meth:`connect` makes one that finds the service by its instance name.
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
        self._client = AsyncClient(
            address,
            secret_file=secret_file,
            data_dir=data_dir,
            timeout=timeout,
            max_backoff=max_backoff,
            handshake_timeout=handshake_timeout,
            max_reply_frame=max_reply_frame,
            tls=tls,
            first_contact_timeout=first_contact_timeout,
        )
        # The calling threads' own connection: for a fixed address without TLS, once the
        # event loop's connection has reached the service (first contact says why it
        # fails), and again after a call through the loop found it reachable.
        fixed = None if isinstance(address, IngressLookup) else calls.client_address(address)
        self._direct = tls is None and fixed is not None
        self._host, self._port = fixed or ("", 0)
        self._secret, _ = calls.client_secret(secret_file, data_dir)
        self._max_reply_frame = max_reply_frame
        self._handshake_timeout = handshake_timeout
        self._link: BlockingLink | None = None
        self._link_lock = threading.Lock()
        self._link_allowed = True  # false after a failed connect, until the loop's works
        self._loop = eventloop.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, name=f"ambrosia client {self.address}", daemon=True
        )
        self._thread.start()
        self._closed = False

    @classmethod
    def connect(
        cls, *, instance: str, registry: str | Path | None = None, **options: Any
    ) -> Client:
        """As :meth:`AsyncClient.connect`: the service running as ``instance``, found in
        ``registry`` before every connection; blocking calls."""
        return cls(lookup_for(instance, registry, options), **options)

    @property
    def address(self) -> str:
        return self._client.address

    @property
    def info(self) -> ServiceInfo | None:
        link = self._link
        return link.info if link is not None and link.open else self._client.info

    @property
    def resent(self) -> int:
        """Calls sent again after their connection failed."""
        return self._client.resent

    def call(
        self,
        method: Callable[..., Any],
        /,
        *args: Any,
        key: str | bytes | None = None,
        **kwargs: Any,
    ) -> Any:
        """As :meth:`AsyncClient.call`, blocking until the answer (or the timeout)."""
        if self._closed:
            raise ClientClosedError(f"the client for {self.address} is closed")
        spec, label = calls.method_spec(method)
        data = calls.encode_call(spec, label, args, kwargs)
        raw_key = calls.call_key(key)
        started = time.monotonic()
        timeout = self._client.timeout
        attempts = 0
        link = self._direct_link()
        if link is not None:
            calls.check_size(label, raw_key, data, link.info)
            try:
                answer = link.call(raw_key, spec.id, data, started + timeout)
            except TimeoutError:
                raise self._client.timed_out(label, raw_key, 1, None) from None
            except LinkLost as exc:  # it may have been sent: again, with its key
                if self._closed:
                    raise ClientClosedError(f"the client for {self.address} is closed") from None
                self._client.connection_lost(label, exc)
                attempts = 1
            else:
                return calls.result_of(spec, label, raw_key, answer, self.address)
        remaining = timeout - (time.monotonic() - started)
        future = asyncio.run_coroutine_threadsafe(
            self._client.send_encoded(
                spec, label, data, raw_key, timeout=remaining, attempts=attempts
            ),
            self._loop,
        )
        try:
            return future.result()
        except BaseException:
            future.cancel()  # a KeyboardInterrupt here must not leave the call retrying
            raise
        finally:
            if self._client.connected:  # the service answers: try the direct way again
                self._link_allowed = True

    def _direct_link(self) -> BlockingLink | None:
        """The calling threads' connection, made if it may be (see ``__init__``); None:
        call through the event loop."""
        link = self._link
        if link is not None and link.open:
            return link
        if not (self._direct and self._link_allowed and self._client.reached):
            return None
        with self._link_lock:
            link = self._link
            if link is not None and link.open:
                return link
            try:
                link = BlockingLink.connect(
                    self._host,
                    self._port,
                    self._secret,
                    self._max_reply_frame,
                    self._handshake_timeout,
                )
            except (OSError, IngressError):  # the loop's connection retries and says why
                self._link_allowed = False
                return None
            if self._closed:
                link.close()
                return None
            self._link = link
            with contextlib.suppress(RuntimeError):  # a loop closed meanwhile: nothing to do
                self._loop.call_soon_threadsafe(self._client.close_idle)  # one connection
            return link

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        with self._link_lock:
            if self._link is not None:
                self._link.close()
        if self._loop.is_running():
            asyncio.run_coroutine_threadsafe(self._client.close(), self._loop).result(10)
            self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
