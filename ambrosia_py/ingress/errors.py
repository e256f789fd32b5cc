"""Errors of the ingress: its protocol, refused calls, and what a client sees."""

from __future__ import annotations

__all__ = [
    "AuthenticationError",
    "CallRefusedError",
    "CallTimeoutError",
    "ClientClosedError",
    "IngressError",
    "IngressProtocolError",
    "KeyReusedError",
    "ServiceUnreachableError",
]


class IngressError(Exception):
    """Base of the ingress's errors."""


class IngressProtocolError(IngressError, ValueError):
    """Malformed ingress input: the connection is closed.

    ``frame`` (the frame's number on its connection, from 0) and ``offset`` (the byte
    offset in the connection's stream) say where, when known.
    """

    def __init__(self, message: str, *, frame: int | None = None, offset: int | None = None):
        where = []
        if frame is not None:
            where.append(f"frame {frame}")
        if offset is not None:
            where.append(f"offset {offset}")
        super().__init__(f"{message} ({', '.join(where)})" if where else message)
        self.reason = message
        self.frame = frame
        self.offset = offset


class AuthenticationError(IngressProtocolError):
    """The other end does not hold the cluster secret (or is not an ingress at all)."""


class CallRefusedError(IngressError):
    """The service refused a call without running it (``reason`` says why)."""

    def __init__(self, message: str, *, reason: str = "") -> None:
        super().__init__(message)
        self.reason = reason


class KeyReusedError(CallRefusedError):
    """An idempotency key already names a call of another method: nothing was run."""


class CallTimeoutError(IngressError, TimeoutError):
    """No answer within the client's timeout. The call may have run: calling again with
    the same ``key`` returns its result if it did, and runs it once if it did not."""

    def __init__(self, message: str, *, key: bytes, attempts: int) -> None:
        super().__init__(message)
        self.key = key
        self.attempts = attempts


class ServiceUnreachableError(IngressError, ConnectionError):
    """A client that has never reached the service found nothing listening at its
    address. The call was not sent, so it did not run."""


class ClientClosedError(IngressError):
    """A call on a client that was closed."""
