"""The blocking client: an :class:`AsyncClient` on an event loop in a thread of its own.

Any number of threads may call through one :class:`Client` at once; their calls share
its connection.
"""

from __future__ import annotations

import asyncio
import ssl
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .. import eventloop
from ..ingress.errors import ClientClosedError
from ..ingress.frames import DEFAULT_MAX_REPLY_FRAME, ServiceInfo
from .asyncio_client import (
    DEFAULT_FIRST_CONTACT_TIMEOUT,
    DEFAULT_HANDSHAKE_TIMEOUT,
    DEFAULT_TIMEOUT,
    AsyncClient,
)
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
        return self._client.info

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
        future = asyncio.run_coroutine_threadsafe(
            self._client.call(method, *args, key=key, **kwargs), self._loop
        )
        try:
            return future.result()
        except BaseException:
            future.cancel()  # a KeyboardInterrupt here must not leave the call retrying
            raise

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._loop.is_running():
            asyncio.run_coroutine_threadsafe(self._client.close(), self._loop).result(10)
            self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
