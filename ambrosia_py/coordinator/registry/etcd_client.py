"""etcd's v3 API as its JSON gateway serves it (``/v3/kv/...``, ``/v3/lease/...``,
``/v3/watch``), over httpx: the few calls the etcd registry makes.

Why the gateway and not a gRPC client: the maintained asyncio client on PyPI (``aetcd``
1.0) installs here and supports Python 3.11, but it only opens plaintext channels (no
TLS), talks to one endpoint, and ships no type information; the gateway is part of every
etcd since 3.4 (same API, same semantics: keys and values base64, 64-bit numbers as
strings), and httpx gives TLS with client certificates, timeouts, streaming and typing.
No protocol is written by hand here: JSON bodies in, JSON bodies out.

Several endpoints: a request goes to the one that answered last and moves on to the next
when one cannot be reached (:class:`EtcdUnavailable` once none can). With a user name,
the client authenticates (``/v3/auth/authenticate``) and sends the token in the
``Authorization`` header, authenticating again when etcd says the token expired.
Connections use TCP keep-alive, so a watch on a machine that vanished without closing
its connections ends within about half a minute instead of hanging.

Outages: once etcd has answered a client, the first request that finds no endpoint
answering logs one line, and the first that is answered again logs one more (with how
long etcd was unreachable); the requests in between fail with :class:`EtcdUnavailable`
and say nothing. A client that never reached etcd logs nothing: its caller refuses.
"""

from __future__ import annotations

import base64
import json
import logging
import socket
import ssl
import time
from collections.abc import AsyncIterator
from typing import Any

import attrs
import httpx

from .interface import RegistryError, RegistryUnavailable

__all__ = [
    "EtcdClient",
    "EtcdError",
    "EtcdSettings",
    "EtcdUnavailable",
    "KeyValue",
    "WatchEvent",
    "prefix_end",
]

log = logging.getLogger("ambrosia_py.coordinator")
# httpx logs every request at INFO: with a coordinator's INFO lines, its lease keep-alives
# alone would be three lines a second. Left as set if the application set a level.
if logging.getLogger("httpx").level == logging.NOTSET:
    logging.getLogger("httpx").setLevel(logging.WARNING)

_UNAVAILABLE = 14  # gRPC code: the member cannot serve now (no leader, shutting down)
_NOT_FOUND = 5
_KEEPALIVE: list[tuple[int, int, int]] = [(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)]
if hasattr(socket, "TCP_KEEPIDLE"):  # Linux: probe after 10 s idle, every 5 s, 3 times
    _KEEPALIVE += [
        (socket.IPPROTO_TCP, socket.TCP_KEEPIDLE, 10),
        (socket.IPPROTO_TCP, socket.TCP_KEEPINTVL, 5),
        (socket.IPPROTO_TCP, socket.TCP_KEEPCNT, 3),
    ]


class EtcdError(RegistryError):
    """etcd refused a request, or answered with something that is not its API; ``code``
    is etcd's (gRPC's) status code when it gave one."""

    def __init__(self, message: str, code: int | None = None) -> None:
        super().__init__(message)
        self.code = code


class EtcdUnavailable(EtcdError, RegistryUnavailable):
    """No endpoint could be reached (or none could serve): worth trying again later."""


class WatchCanceled(EtcdUnavailable):
    """etcd ended a watch (compacted past its start): read afresh and watch again."""


@attrs.frozen
class EtcdSettings:
    """How to reach etcd: endpoints (``http://HOST:PORT`` or ``https://...``), TLS files,
    a user and password, the request timeout and the TTL of the process's lease."""

    endpoints: tuple[str, ...]
    ca_file: str | None = None
    cert_file: str | None = None
    key_file: str | None = None
    user: str | None = None
    password: str | None = attrs.field(default=None, repr=False)
    timeout: float = 5.0
    lease_ttl: int = 5

    def verify(self) -> ssl.SSLContext | bool:
        """What httpx checks the server with: a context for TLS, else the default."""
        if not any(e.startswith("https://") for e in self.endpoints):
            return True
        try:
            context = ssl.create_default_context(cafile=self.ca_file)
            if self.cert_file is not None:
                context.load_cert_chain(self.cert_file, self.key_file)
        except (OSError, ssl.SSLError) as exc:
            raise RegistryError(f"cannot load the etcd TLS files: {exc}") from None
        return context


@attrs.frozen
class KeyValue:
    """One key as etcd holds it."""

    key: str
    value: bytes
    create_revision: int
    mod_revision: int
    lease: int


@attrs.frozen
class WatchEvent:
    """A change under a watched prefix, at ``revision``; ``value`` is empty for a
    deletion."""

    revision: int
    deleted: bool
    key: str
    value: bytes


def _b64(data: str | bytes) -> str:
    raw = data.encode() if isinstance(data, str) else data
    return base64.b64encode(raw).decode("ascii")


def prefix_end(prefix: str) -> str:
    """The end of the key range holding every key that starts with ``prefix`` (the prefix
    with its last character incremented; our prefixes end in ``/``)."""
    return prefix[:-1] + chr(ord(prefix[-1]) + 1)


def _int(body: dict[str, Any], field: str, where: str) -> int:
    """A 64-bit number of a gateway answer (a string; absent means 0)."""
    raw = body.get(field, 0)
    try:
        return int(raw)
    except (TypeError, ValueError):
        raise EtcdError(f"etcd {where}: field {field!r} is not a number: {raw!r}") from None


def _key_value(raw: dict[str, Any], where: str) -> KeyValue:
    try:
        key = base64.b64decode(raw["key"], validate=True).decode("utf-8")
        value = base64.b64decode(raw.get("value", ""), validate=True)
    except (KeyError, TypeError, ValueError) as exc:
        raise EtcdError(f"etcd {where}: a key or value that does not decode ({exc})") from None
    return KeyValue(
        key,
        value,
        _int(raw, "create_revision", where),
        _int(raw, "mod_revision", where),
        _int(raw, "lease", where),
    )


def put_op(key: str, value: bytes, lease: int = 0) -> dict[str, Any]:
    """A put, as a transaction's operation."""
    put: dict[str, Any] = {"key": _b64(key), "value": _b64(value)}
    if lease:
        put["lease"] = str(lease)
    return {"request_put": put}


def delete_op(key: str) -> dict[str, Any]:
    """A delete of one key, as a transaction's operation."""
    return {"request_delete_range": {"key": _b64(key)}}


def range_op(key: str) -> dict[str, Any]:
    """A read of one key, as a transaction's operation."""
    return {"request_range": {"key": _b64(key)}}


def compare(
    key: str, target: str, result: str, number: int, *, prefix: bool = False
) -> dict[str, Any]:
    """A transaction's condition: ``target`` (``VERSION``, ``CREATE``, ``MOD``, ``LEASE``)
    of ``key`` (of every key under it, with ``prefix``) ``result`` (``EQUAL``,
    ``GREATER``, ``LESS``) ``number``. A missing key's numbers are 0."""
    field = {
        "VERSION": "version",
        "CREATE": "create_revision",
        "MOD": "mod_revision",
        "LEASE": "lease",
    }[target]
    condition: dict[str, Any] = {
        "key": _b64(key),
        "target": target,
        "result": result,
        field: str(number),
    }
    if prefix:
        condition["range_end"] = _b64(prefix_end(key))
    return condition


class EtcdClient:
    """The calls the registry makes, on one event loop (httpx binds its connections to
    the loop that first uses them: make one per loop)."""

    def __init__(self, settings: EtcdSettings) -> None:
        if not settings.endpoints:
            raise RegistryError("no etcd endpoint given")
        self.settings = settings
        transport = httpx.AsyncHTTPTransport(
            verify=settings.verify(), trust_env=False, socket_options=_KEEPALIVE
        )
        self._http = httpx.AsyncClient(
            transport=transport, timeout=settings.timeout, trust_env=False
        )
        self._current = 0  # the endpoint that answered last
        self._token: str | None = None
        self._answered = False  # etcd answered this client once
        self._down_since: float | None = None  # monotonic time of the first failure

    async def aclose(self) -> None:
        await self._http.aclose()

    # --- requests ----------------------------------------------------------------------

    def _headers(self) -> dict[str, str]:
        return {"Authorization": self._token} if self._token else {}

    async def _authenticate(self) -> None:
        body = {"name": self.settings.user, "password": self.settings.password}
        answer = await self._post("/v3/auth/authenticate", body, authenticated=False)
        token = answer.get("token")
        if not isinstance(token, str) or not token:
            raise EtcdError(f"etcd user {self.settings.user!r}: authentication gave no token")
        self._token = token

    async def _post(
        self, path: str, body: dict[str, Any], *, authenticated: bool = True
    ) -> dict[str, Any]:
        try:
            answer = await self._post_authenticated(path, body, authenticated)
        except EtcdUnavailable as exc:
            if self._answered and self._down_since is None:
                self._down_since = time.monotonic()
                log.warning(
                    "the registry in etcd is unreachable (%s); going on with what is known, "
                    "and trying again",
                    exc,
                )
            raise
        except EtcdError:
            self._reached()  # it answered, with a refusal
            raise
        self._reached()
        return answer

    def _reached(self) -> None:
        if self._down_since is not None:
            log.info(
                "the registry in etcd answers again (%s), after %.1f s unreachable",
                self.settings.endpoints[self._current],
                time.monotonic() - self._down_since,
            )
            self._down_since = None
        self._answered = True

    async def _post_authenticated(
        self, path: str, body: dict[str, Any], authenticated: bool
    ) -> dict[str, Any]:
        if authenticated and self.settings.user is not None and self._token is None:
            await self._authenticate()
        try:
            return await self._post_once(path, body)
        except EtcdError as exc:
            if not authenticated or self.settings.user is None or "auth token" not in str(exc):
                raise
        await self._authenticate()  # the token expired (etcd restarted, or its TTL passed)
        return await self._post_once(path, body)

    async def _post_once(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        failures = []
        endpoints = self.settings.endpoints
        for i in range(len(endpoints)):
            index = (self._current + i) % len(endpoints)
            url = endpoints[index] + path
            try:
                response = await self._http.post(url, json=body, headers=self._headers())
            except (httpx.TransportError, ssl.SSLError) as exc:
                # (A TLS 1.3 server refuses a client certificate after the handshake: the
                # alert comes with the first read, past httpx's mapping of errors.)
                failures.append(f"{endpoints[index]}: {exc or type(exc).__name__}")
                continue
            answer = _answer(url, response.status_code, response.content)
            self._current = index
            return answer
        raise EtcdUnavailable(f"no etcd endpoint answers ({'; '.join(failures)})")

    # --- keys --------------------------------------------------------------------------

    async def range(
        self, key: str, *, prefix: bool = False, revision: int = 0
    ) -> tuple[int, list[KeyValue]]:
        """The store's revision and the key (every key under ``key``, with ``prefix``),
        as of ``revision`` (0: now)."""
        body: dict[str, Any] = {"key": _b64(key)}
        if prefix:
            body["range_end"] = _b64(prefix_end(key))
        if revision:
            body["revision"] = str(revision)
        answer = await self._post("/v3/kv/range", body)
        where = f"read of {key}"
        kvs = [_key_value(raw, where) for raw in answer.get("kvs", [])]
        return _int(answer.get("header", {}), "revision", where), kvs

    async def ping(self, key: str) -> None:
        """Check that etcd answers (and lets us read ``key``), reading at most one key."""
        await self._post("/v3/kv/range", {"key": _b64(key), "limit": "1", "keys_only": True})

    async def put(self, key: str, value: bytes, lease: int = 0) -> None:
        await self._post("/v3/kv/put", put_op(key, value, lease)["request_put"])

    async def delete(self, key: str) -> None:
        await self._post("/v3/kv/deleterange", {"key": _b64(key)})

    async def txn(
        self, compares: list[dict[str, Any]], success: list[dict[str, Any]]
    ) -> tuple[bool, list[list[KeyValue]]]:
        """Run ``success`` if every comparison holds; whether it did, and what each read
        among ``success`` returned."""
        answer = await self._post("/v3/kv/txn", {"compare": compares, "success": success})
        if not answer.get("succeeded", False):
            return False, []
        reads = []
        for response in answer.get("responses", []):
            found = response.get("response_range")
            if found is not None:
                reads.append([_key_value(raw, "transaction") for raw in found.get("kvs", [])])
        return True, reads

    # --- leases ------------------------------------------------------------------------

    async def grant(self, ttl: int) -> tuple[int, int]:
        """A new lease: its id and the TTL etcd granted (never below etcd's minimum)."""
        answer = await self._post("/v3/lease/grant", {"TTL": str(ttl), "ID": "0"})
        lease, granted = _int(answer, "ID", "lease grant"), _int(answer, "TTL", "lease grant")
        if not lease or granted <= 0:
            raise EtcdError(f"etcd granted no lease: {answer.get('error', answer)}")
        return lease, granted

    async def keepalive(self, lease: int) -> int:
        """Renew ``lease``: its TTL again, or 0 if etcd no longer has it."""
        answer = await self._post("/v3/lease/keepalive", {"ID": str(lease)})
        return _int(answer.get("result", {}), "TTL", "lease keep-alive")

    async def revoke(self, lease: int) -> None:
        """End ``lease`` now, deleting its keys (a lease etcd no longer has is fine)."""
        try:
            await self._post("/v3/lease/revoke", {"ID": str(lease)})
        except EtcdError as exc:
            if exc.code != _NOT_FOUND:
                raise

    # --- watching ----------------------------------------------------------------------

    async def watch(self, prefix: str, start_revision: int) -> AsyncIterator[list[WatchEvent]]:
        """Every change under ``prefix`` from ``start_revision`` on, a batch at a time, on
        the endpoint that answered last. Ends with :class:`EtcdUnavailable` when the
        stream breaks, :class:`WatchCanceled` when etcd ends it."""
        if self.settings.user is not None:
            await self._authenticate()  # afresh: a watch may be reopened long after
        create = {
            "key": _b64(prefix),
            "range_end": _b64(prefix_end(prefix)),
            "start_revision": str(start_revision),
        }
        url = self.settings.endpoints[self._current] + "/v3/watch"
        timeout = httpx.Timeout(self.settings.timeout, read=None)  # a quiet watch is fine
        try:
            async with self._http.stream(
                "POST",
                url,
                json={"create_request": create},
                headers=self._headers(),
                timeout=timeout,
            ) as response:
                if response.status_code != 200:
                    _answer(url, response.status_code, await response.aread())
                async for line in response.aiter_lines():
                    if line.strip():
                        events = _watch_events(url, line)
                        if events:
                            yield events
        except (httpx.TransportError, ssl.SSLError) as exc:
            raise EtcdUnavailable(
                f"the watch on {url} broke: {exc or type(exc).__name__}"
            ) from None
        raise EtcdUnavailable(f"the watch on {url} ended")


def _answer(url: str, status: int, content: bytes) -> dict[str, Any]:
    """The JSON body of a gateway answer, or the :class:`EtcdError` it says."""
    try:
        body = json.loads(content)
    except ValueError:
        body = None
    if not isinstance(body, dict):
        raise EtcdError(f"etcd {url} answered HTTP {status} with no JSON object: {content[:200]!r}")
    if status == 200 and "error" not in body:
        return body
    message = body.get("message") or body.get("error") or f"HTTP {status}"
    code = body.get("code")
    code = code if isinstance(code, int) else None
    kind = EtcdUnavailable if code == _UNAVAILABLE or status == 503 else EtcdError
    raise kind(f"etcd {url}: {message}", code)


def _watch_events(url: str, line: str) -> list[WatchEvent]:
    """The events of one message of a watch stream (none for its "created" message)."""
    try:
        message = json.loads(line)
    except ValueError:
        raise EtcdError(f"etcd {url}: a watch message that is not JSON: {line[:200]!r}") from None
    if not isinstance(message, dict):
        raise EtcdError(f"etcd {url}: a watch message that is not an object: {line[:200]!r}")
    if "error" in message:
        error = message["error"]
        what = error.get("message", error) if isinstance(error, dict) else error
        raise EtcdUnavailable(f"etcd {url}: the watch failed: {what}")
    result = message.get("result", {})
    if result.get("canceled"):
        raise WatchCanceled(f"etcd {url} ended the watch: {result.get('cancel_reason', '')}")
    where = f"watch on {url}"
    return [
        WatchEvent(kv.mod_revision, event.get("type") == "DELETE", kv.key, kv.value)
        for event in result.get("events", [])
        for kv in [_key_value(event.get("kv", {}), where)]
    ]
