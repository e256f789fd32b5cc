"""One client connection of the ingress, on the event loop: an ``asyncio.Protocol``.

Each read the loop makes is handed straight to the sans-IO
:class:`~ambrosia_py.ingress.connection.ServerConnection` from ``data_received``, and
the calls it completes straight to the server (:class:`PeerHost`): no task per
connection and no stream in between, which cost a task wake-up and a stream read for
every read (about a fifth of the service's busy time under many callers).

The limits of a stream server hold here as callbacks (``serving.output`` says why they
exist):

- a connection that has not proved the secret within ``handshake_timeout_s`` of its TLS
  handshake (of accept, without TLS) is closed;
- reading pauses (``pause_reading``) while ``max_in_flight`` of its calls wait for
  their outcome, while the transport holds more unsent answers than
  ``max_buffered_output`` (the transport's high-water mark: ``pause_writing``), and
  while calls answered at once from stored outcomes are held back by that bound; it
  resumes when all of these have cleared;
- a connection whose unsent answers stay over the bound for ``output_stall_s`` is
  reset (a close would wait, for ever, to send what it does not read);
- bad input closes it with a line naming what was wrong and where (frame, offset).

Answers queued in one turn of the loop leave in one write.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Protocol, cast

from ..binding.errors import BindingError
from ..serving import ConnectionLimits, Incoming, OutputStalled, Slot
from .connection import ConnectionState, ServerConnection
from .errors import IngressProtocolError
from .frames import Call, Outcome, Refusal

__all__ = ["Peer", "PeerHost"]

log = logging.getLogger("ambrosia_py.ingress")

# An answer frame's bytes besides its value or message: length, kind, request id,
# outcome or reason, tag (26); counted towards the output bound before it is written.
_ANSWER_OVERHEAD = 32


class PeerHost(Protocol):
    """What a :class:`Peer` needs of its server."""

    def new_connection(self) -> ServerConnection:
        """The sans-IO end of a new connection (its HELLO is queued)."""
        ...

    def opened(self, peer: Peer) -> None:
        """``peer`` is connected (TLS done): it may be answered and closed from now on."""
        ...

    def proved(self, peer: Peer) -> None:
        """``peer`` proved the secret."""
        ...

    def take(self, peer: Peer, calls: list[Call]) -> list[Call]:
        """Answer or log ``calls`` in order; return those held back by the output bound."""
        ...

    def ended(self, peer: Peer) -> None:
        """``peer``'s connection is gone: forget what it waited for, free its slot."""
        ...

    def refuse(self, key: str, message: str, *args: object, level: int = logging.WARNING) -> None:
        """Say why a connection was closed, under the count ``key`` of the refusal log."""
        ...


class Peer(asyncio.Protocol):
    """One connection, from ``connection_made`` on (the module says what it does)."""

    def __init__(
        self,
        host: PeerHost,
        incoming: Incoming,
        slot: Slot,
        limits: ConnectionLimits,
        *,
        max_in_flight: int,
        loop: asyncio.AbstractEventLoop,
    ) -> None:
        self._host = host
        self._incoming = incoming
        self.slot = slot
        self.peer = incoming.address
        self.source = incoming.source  # its address, as admission and refusal log count
        self._limits = limits
        self._max_in_flight = max_in_flight
        self._loop = loop  # asked once here: every answer schedules a write on it
        self._conn: ServerConnection | None = None  # once connected
        self._transport: asyncio.Transport | None = None
        self.waiting: set[tuple[bytes, int, int]] = set()  # (key, method id, request id)
        self.closed = False
        self.queued = 0  # bytes of answers queued and not yet written (about: see send)
        self._flush_scheduled = False
        self._held: list[Call] = []  # calls read, not yet taken: over the output bound
        self._writing_paused = False  # the transport is over its high-water mark
        self._reading_paused = False
        self._proved = False
        self._deadline: asyncio.TimerHandle | None = None  # to prove the secret by
        self._stall: asyncio.TimerHandle | None = None  # while over the output bound

    @property
    def started(self) -> bool:
        """Whether the loop made the connection (its end is then :meth:`connection_lost`)."""
        return self._transport is not None

    # -- the transport's callbacks -------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.Transport, transport)
        self._conn = self._host.new_connection()
        self._host.opened(self)
        self._transport.write(self._conn.data_to_send())  # HELLO
        self._deadline = self._loop.call_later(
            self._limits.handshake_timeout_s, self._not_proved_in_time
        )

    def data_received(self, data: bytes) -> None:
        conn = self._conn
        if self.closed or conn is None:
            return
        try:
            calls = conn.receive_data(data)
            if not self._proved and conn.state is ConnectionState.OPEN:
                self._welcome()
            if calls or self._held:
                self._take(calls)
        except IngressProtocolError as exc:
            self._close_for(exc)
        except BindingError as exc:  # the binding is stopping: no more impulses
            log.info("closing the ingress connection from %s: %s", self.peer, exc)
            self.close()

    def eof_received(self) -> bool:
        return False  # the client sends no more calls: the transport closes

    def pause_writing(self) -> None:
        self._writing_paused = True
        if self._stall is None:
            self._stall = self._loop.call_later(self._limits.output_stall_s, self._stalled)
        self._update_reading()

    def resume_writing(self) -> None:
        self._writing_paused = False
        if self._stall is not None:
            self._stall.cancel()
            self._stall = None
        if self._held and not self.closed:
            self._take([])
        else:
            self._update_reading()

    def connection_lost(self, exc: Exception | None) -> None:
        if exc is not None and not self.closed:
            self._host.refuse(
                self.slot.refusal_key("authenticated"),
                "ingress connection from %s lost: %s",
                self.peer,
                exc,
                level=logging.INFO,
            )
        self.closed = True
        for timer in (self._deadline, self._stall):
            if timer is not None:
                timer.cancel()
        self._deadline = self._stall = None
        self._held = []
        self._host.ended(self)

    # -- answers -------------------------------------------------------------------------

    def send(self, request_id: int, answer: Outcome | Refusal) -> None:
        """Queue an answer; everything queued in one loop step goes in one write."""
        if self.closed or self._conn is None:
            return
        self._conn.reply(request_id, answer)
        body = answer.value if isinstance(answer, Outcome) else answer.message.encode()
        self.queued += len(body) + _ANSWER_OVERHEAD
        if not self._flush_scheduled:
            self._flush_scheduled = True
            self._loop.call_soon(self.flush)

    def flush(self) -> None:
        """Write what is queued (once per loop step, or at once before holding calls)."""
        self._flush_scheduled = False
        self.queued = 0
        if not self.closed and self._conn is not None and self._transport is not None:
            self._transport.write(self._conn.data_to_send())

    def answered(self, key: bytes, method_id: int, request_id: int) -> None:
        """A call of this connection was answered: it waits no more (reading may go on)."""
        self.waiting.discard((key, method_id, request_id))
        if self._reading_paused and len(self.waiting) < self._max_in_flight:
            self._update_reading()

    @property
    def unsent(self) -> int:
        """Answers not yet taken by the socket: queued here, or in the transport."""
        if self.closed or self._transport is None:
            return self.queued
        return self.queued + self._transport.get_write_buffer_size()

    def close(self) -> None:
        """Close after what was written leaves; nothing more is read or answered."""
        self.closed = True
        if self._transport is not None:
            self._transport.close()

    # -- inside --------------------------------------------------------------------------

    def _welcome(self) -> None:
        """The client proved the secret: WELCOME goes out, the slot is established (never
        evicted from now on) and the output bound holds."""
        assert self._conn is not None and self._transport is not None
        self._proved = True
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None
        self._transport.write(self._conn.data_to_send())  # WELCOME
        self._host.proved(self)
        self._transport.set_write_buffer_limits(high=self._limits.max_buffered_output)

    def _take(self, calls: list[Call]) -> None:
        """Hand the calls held and ``calls`` to the server in order; those that answers
        at once would put past the output bound wait here until the transport drains."""
        pending = self._held + calls if self._held else calls
        self._held = []
        while pending and not self.closed:
            pending = self._host.take(self, pending)
            if pending:
                self.flush()
                if self._writing_paused:  # resume_writing takes them on
                    self._held = pending
                    break
        self._update_reading()

    def _update_reading(self) -> None:
        """Read only while nothing holds it back (the module lists what does)."""
        if self.closed or self._transport is None or self._transport.is_closing():
            return
        pause = self._writing_paused or bool(self._held) or len(self.waiting) >= self._max_in_flight
        if pause != self._reading_paused:
            self._reading_paused = pause
            if pause:
                self._transport.pause_reading()
            else:
                self._transport.resume_reading()

    def _not_proved_in_time(self) -> None:
        self._deadline = None
        self._host.refuse(
            self.source,
            "closing the ingress connection from %s: no proof of the secret within %g s",
            self.peer,
            self._limits.handshake_timeout_s,
        )
        self.close()

    def _close_for(self, exc: Exception, *, reset: bool = False) -> None:
        """Say why, under the connection's count, and close (or reset) it."""
        self._host.refuse(
            self.slot.refusal_key("authenticated"),
            "closing the ingress connection from %s: %s",
            self.peer,
            exc,
        )
        if not reset:
            self.close()
        elif self._transport is not None:
            self.closed = True
            self._incoming.drop()  # with a reset
            self._transport.abort()  # (drop knows the transport only once connect returned)

    def _stalled(self) -> None:
        """Its answers stayed over the bound for the stall time: reset, not closed (a
        close would wait, for ever, to send what it does not read)."""
        self._stall = None
        if self.closed or self._transport is None:
            return
        stalled = OutputStalled(
            f"the peer left {self._transport.get_write_buffer_size()} bytes of output "
            f"unread for {self._limits.output_stall_s:g} s (the bound is "
            f"{self._limits.max_buffered_output})"
        )
        self._close_for(stalled, reset=True)
