"""The sans-IO state machine of one flow connection (seed 004, *ConnectPacket*, *Protocol
compatibility*; reference, *ConnectPacket*, *Compatibility*).

Both sides send a ConnectPacket first: the dialer at once, the acceptor once it has seen
the dialer's and decided to keep the connection. A receiver waits for 14 bytes (length,
version, port), checks the length against the version, then waits for the rest. After it:

* a **compatible** peer's bytes are frames, verified and delivered as :class:`FrameReceived`;
* an **incompatible** peer's connection is kept open (so it does not keep reconnecting) but
  nothing it sends is parsed or delivered (the bytes are counted in ``ignored_bytes``), and
  nothing but pings to the well-known ping endpoint may be sent to it.

The machine is written down once, as a table (:data:`TRANSITIONS`): for each state, the
events (:class:`ConnectionEvent`: what the peer's bytes turned out to be, and what we
send) it admits and the state each leads to. An event a state does not admit raises
:class:`UnexpectedEventError`, a :class:`FlowStateError` naming the state and the event.
Two facts are kept beside the table: whether our ConnectPacket was sent (once, and
before any frame, whichever state the peer's put us in), and the error a failed
connection raises again.

Like h11, :class:`FlowConnection` only turns bytes into events and calls into bytes; the
caller owns the socket. Any :class:`FlowError` from :meth:`FlowConnection.receive_data`
means: close the connection. It is raised at once, so frames completed earlier in the same
chunk are not delivered; they count as in flight, like every frame on a broken connection
(the reference: reliable messages are resent after reconnecting).
"""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from types import MappingProxyType
from typing import Final

from .connect import ConnectPacket, compatible, connect_packet_size
from .constants import CONNECT_PREFIX_LENGTH, PACKET_LIMIT, Buffer, WellKnown
from .errors import FlowError, FlowStateError
from .events import ConnectionClosed, Event, FrameReceived, PeerConnected
from .frames import FrameReader, check_frame_limit, encode_frame, encode_frame_parts
from .tokens import Token

__all__ = [
    "MEANINGS",
    "TRANSITIONS",
    "ConnectionEvent",
    "ConnectionState",
    "FlowConnection",
    "UnexpectedEventError",
    "step",
]

_PING = Token.well_known(WellKnown.PING)


class _Member(enum.Enum):
    """An enum hashed by identity: its members are singletons, and Enum's own
    ``__hash__`` is Python code, run here on every frame sent."""

    __hash__ = object.__hash__


class ConnectionState(_Member):
    """What the connection expects from the peer."""

    AWAIT_PEER = "await-peer"  # reading the peer's ConnectPacket
    COMPATIBLE = "compatible"  # reading frames
    INCOMPATIBLE = "incompatible"  # ignoring everything
    CLOSED = "closed"  # the peer ended the stream
    ERROR = "error"  # the peer broke the protocol; close the connection


class ConnectionEvent(_Member):
    """What moves the machine: what the peer's bytes turned out to be, and what we send.
    (What :meth:`FlowConnection.receive_data` reports are the :mod:`.events` values.)"""

    DATA = "bytes received"
    PEER_COMPATIBLE = "the peer's ConnectPacket, compatible"
    PEER_INCOMPATIBLE = "the peer's ConnectPacket, incompatible"
    END = "the end of the stream"
    BROKEN = "bytes that break the protocol"
    SEND_CONNECT_PACKET = "sending our ConnectPacket"
    SEND_FRAME = "sending a frame"
    SEND_PING = "sending a ping"


S, E = ConnectionState, ConnectionEvent

TRANSITIONS: Final[Mapping[ConnectionState, Mapping[ConnectionEvent, ConnectionState]]] = (
    MappingProxyType(
        {
            S.AWAIT_PEER: MappingProxyType(
                {
                    E.DATA: S.AWAIT_PEER,  # a part of the peer's ConnectPacket
                    E.PEER_COMPATIBLE: S.COMPATIBLE,
                    E.PEER_INCOMPATIBLE: S.INCOMPATIBLE,
                    E.END: S.CLOSED,
                    E.BROKEN: S.ERROR,  # a bad ConnectPacket
                    E.SEND_CONNECT_PACKET: S.AWAIT_PEER,  # the dialer's, or an acceptor's
                }
            ),
            S.COMPATIBLE: MappingProxyType(
                {
                    E.DATA: S.COMPATIBLE,
                    E.END: S.CLOSED,
                    E.BROKEN: S.ERROR,  # a bad frame
                    E.SEND_CONNECT_PACKET: S.COMPATIBLE,  # an acceptor's, after the peer's
                    E.SEND_FRAME: S.COMPATIBLE,
                    E.SEND_PING: S.COMPATIBLE,
                }
            ),
            S.INCOMPATIBLE: MappingProxyType(
                {
                    E.DATA: S.INCOMPATIBLE,  # counted, never parsed: nothing breaks
                    E.END: S.CLOSED,
                    E.SEND_CONNECT_PACKET: S.INCOMPATIBLE,
                    E.SEND_PING: S.INCOMPATIBLE,  # seed 004: only pings to such a peer
                }
            ),
            S.CLOSED: MappingProxyType({}),
            S.ERROR: MappingProxyType({}),
        }
    )
)
"""The whole machine: state -> event -> next state. An event absent from a state's row
is not valid there. CLOSED and ERROR admit nothing: a failed connection raises its error
again instead (:meth:`FlowConnection.receive_data`)."""

MEANINGS: Final[Mapping[ConnectionState, str]] = MappingProxyType(
    {
        S.AWAIT_PEER: "the peer's ConnectPacket has not arrived",
        S.COMPATIBLE: "the peer's ConnectPacket has arrived, and frames follow",
        S.INCOMPATIBLE: "the peer is incompatible: only pings may be sent",
        S.CLOSED: "the peer closed the connection: nothing is valid after the end of the stream",
        S.ERROR: "the connection failed with a protocol error",
    }
)
"""What each state means, for the events it refuses."""


class UnexpectedEventError(FlowStateError):
    """An event the connection's state does not admit: ``state`` and ``event`` name them,
    ``detail`` (e.g. where a frame was going) completes the event's description."""

    def __init__(self, state: ConnectionState, event: ConnectionEvent, detail: str = "") -> None:
        super().__init__(
            f"{event.value}{detail} is not valid in flow connection state {state.name}: "
            f"{MEANINGS[state]}"
        )
        self.state = state
        self.event = event
        self.detail = detail

    def __reduce__(
        self,
    ) -> tuple[type[UnexpectedEventError], tuple[ConnectionState, ConnectionEvent, str]]:
        return (type(self), (self.state, self.event, self.detail))


def step(state: ConnectionState, event: ConnectionEvent, detail: str = "") -> ConnectionState:
    """The state after ``event`` in ``state``; :class:`UnexpectedEventError` if the table
    does not admit it there."""
    after = TRANSITIONS[state].get(event)
    if after is None:
        raise UnexpectedEventError(state, event, detail)
    return after


def _as_bytes(view: memoryview) -> bytes:
    """The bytes of ``view``, without a copy when it already spans a whole ``bytes`` (as
    every message of :class:`FrameReader` does: its one copy is the reader's)."""
    obj = view.obj
    if isinstance(obj, bytes) and len(obj) == view.nbytes:
        return obj
    return view.tobytes()


class FlowConnection:
    """One side of a flow connection: bytes in, events out; calls in, bytes out.

    ``local`` is the ConnectPacket we send (see :meth:`ConnectPacket.current`); ``dialer``
    says whether we opened the connection (informational: both sides behave alike).
    ``max_frame_length`` bounds received and sent frames (default :data:`PACKET_LIMIT`);
    it may be changed later (a link starts small and raises it once the peer has
    authenticated). ``checksum=False`` uses the TLS frame form, without the checksum.
    """

    def __init__(
        self,
        local: ConnectPacket,
        *,
        dialer: bool,
        max_frame_length: int = PACKET_LIMIT,
        checksum: bool = True,
    ) -> None:
        self._local = local
        self._dialer = dialer
        self._max = check_frame_limit(max_frame_length)
        self._checksum = checksum
        self._state = ConnectionState.AWAIT_PEER
        self._connect_sent = False
        self._head = bytearray()  # the peer's ConnectPacket, as it arrives
        self._head_size = 0  # its whole size, once the first 14 bytes are in
        self._peer: ConnectPacket | None = None
        self._compatible: bool | None = None
        self._reader: FrameReader | None = None
        self._ignored = 0
        self._error: FlowError | None = None

    @property
    def local(self) -> ConnectPacket:
        """The ConnectPacket we send."""
        return self._local

    @property
    def dialer(self) -> bool:
        """Whether we opened the connection."""
        return self._dialer

    @property
    def max_frame_length(self) -> int:
        """The largest frame length received or sent."""
        return self._max

    @max_frame_length.setter
    def max_frame_length(self, value: int) -> None:
        self._max = check_frame_limit(value)
        if self._reader is not None:
            self._reader.max_length = value

    @property
    def state(self) -> ConnectionState:
        """The connection's state (see :class:`ConnectionState`)."""
        return self._state

    @property
    def connect_sent(self) -> bool:
        """Whether :meth:`connect_packet_bytes` has handed out our ConnectPacket."""
        return self._connect_sent

    @property
    def peer(self) -> ConnectPacket | None:
        """The peer's ConnectPacket, once it has arrived."""
        return self._peer

    @property
    def compatible(self) -> bool | None:
        """Whether the peer's version can talk to ours; ``None`` until its packet arrived."""
        return self._compatible

    @property
    def buffered(self) -> int:
        """Bytes received and held, not yet delivered: a partial ConnectPacket or frame.

        Never more than the ConnectPacket or a frame header plus ``max_frame_length``:
        a longer declared length is refused as soon as its 4 bytes are in.
        """
        held = len(self._head) if self._state is S.AWAIT_PEER else 0
        return held + (self._reader.buffered if self._reader is not None else 0)

    @property
    def ignored_bytes(self) -> int:
        """Bytes an incompatible peer sent after its ConnectPacket, dropped unread."""
        return self._ignored

    def connect_packet_bytes(self) -> bytes:
        """Our ConnectPacket, to be written before anything else; call it exactly once.

        The dialer sends it at once, the acceptor when it decides to keep the connection
        (at once, or after looking at the peer's packet: either is allowed).
        """
        if self._connect_sent:
            raise FlowStateError("our ConnectPacket was already sent")
        self._step(E.SEND_CONNECT_PACKET)
        self._connect_sent = True
        return self._local.encode()

    def send(self, token: Token, message: Buffer) -> list[bytes | memoryview]:
        """A frame for ``message`` to ``token``, as buffers for ``writelines``.

        Raises :class:`FlowStateError` before our ConnectPacket was sent, and where the
        table refuses it (:class:`UnexpectedEventError`): before the peer's packet
        arrived, after the connection closed or failed, and for anything but a ping to
        the well-known ping endpoint when the peer is incompatible.
        """
        self._may_send(token)
        return encode_frame(token, message, max_length=self._max, checksum=self._checksum)

    def send_parts(self, token: Token, parts: Sequence[Buffer]) -> list[bytes | memoryview]:
        """:meth:`send` of the message ``parts`` make one after the other, without joining
        them: the header, then the parts as they are (large messages: no copy before the
        socket's). The same bytes as ``send(token, b"".join(parts))``."""
        self._may_send(token)
        return encode_frame_parts(token, parts, max_length=self._max, checksum=self._checksum)

    def send_limit(self, token: Token) -> int:
        """The frame length limit, for a sender that builds a checksummed frame to
        ``token`` itself (a C twin of :meth:`send`); 0 where frames go without the
        checksum (over TLS): then :meth:`send` it. Raises as :meth:`send` does."""
        self._may_send(token)
        return self._max if self._checksum else 0

    def receive_limit(self) -> int:
        """The frame length limit when the next byte received begins a checksummed frame
        and nothing is held (a reader of whole frames may then take them itself and say
        so with :meth:`skip_frame`); else 0, and :meth:`receive_data` must read them."""
        reader = self._reader
        if (
            reader is None
            or self._state is not S.COMPATIBLE
            or not self._checksum
            or reader.buffered
            or self._error is not None
        ):
            return 0
        return self._max

    def skip_frame(self, size: int) -> None:
        """Count a whole frame of ``size`` bytes, read and checked by the caller at a
        frame boundary (:meth:`receive_limit`), as if it had come through
        :meth:`receive_data`: offsets in later errors stay right."""
        assert self._reader is not None, "no frames before the peer's ConnectPacket"
        self._reader.skip(size)

    def _may_send(self, token: Token) -> None:
        if E.SEND_FRAME not in TRANSITIONS[self._state]:  # else a ping is a frame like any
            ping = token == _PING
            self._step(E.SEND_PING if ping else E.SEND_FRAME, "" if ping else f" to {token}")
        if not self._connect_sent:
            raise FlowStateError("cannot send a frame before our ConnectPacket")

    def receive_data(self, data: Buffer) -> list[Event]:
        """Bytes from the peer in, events out. ``b""`` means the peer ended the stream.

        Raises the :class:`FlowError` that broke the connection (again on every later
        call), or :class:`FlowStateError` after the stream ended.
        """
        if self._error is not None:
            raise self._error
        with memoryview(data) as mv, mv.cast("B") as buf:
            if not len(buf):
                return [self._close()]
            self._step(E.DATA)
            try:
                return self._receive(data, buf)
            except FlowError as exc:
                self._error = exc
                self._step(E.BROKEN)
                raise

    def _receive(self, data: Buffer, buf: memoryview) -> list[Event]:
        events: list[Event] = []
        pos = 0
        if self._state is S.AWAIT_PEER:
            pos = self._read_connect_packet(buf, events)
        rest = len(buf) - pos
        if not rest:
            return events
        if self._state is S.INCOMPATIBLE:
            self._ignored += rest
        elif self._state is S.COMPATIBLE:
            assert self._reader is not None
            self._reader.feed(data if pos == 0 else buf[pos:])
            events.extend(FrameReceived(f.token, _as_bytes(f.message)) for f in self._reader)
        return events

    def _read_connect_packet(self, buf: memoryview, events: list[Event]) -> int:
        """Take the peer's ConnectPacket bytes from ``buf``; return how many were used."""
        pos = 0
        while pos < len(buf):
            target = self._head_size or CONNECT_PREFIX_LENGTH
            take = min(target - len(self._head), len(buf) - pos)
            self._head += buf[pos : pos + take]
            pos += take
            if len(self._head) < target:
                break
            if not self._head_size:
                self._head_size = connect_packet_size(self._head)
                continue
            peer = ConnectPacket.decode(self._head)
            self._peer = peer
            self._compatible = ok = compatible(self._local.protocol_version, peer.protocol_version)
            events.append(PeerConnected(peer, ok))
            if ok:
                self._reader = FrameReader(
                    max_length=self._max, start_offset=len(self._head), checksum=self._checksum
                )
                self._step(E.PEER_COMPATIBLE)
            else:
                self._step(E.PEER_INCOMPATIBLE)
            break
        return pos

    def _close(self) -> ConnectionClosed:
        """The peer ended the stream: clean only at a boundary we can vouch for."""
        if self._state is S.AWAIT_PEER:
            clean = not self._head
        elif self._state is S.COMPATIBLE:
            assert self._reader is not None
            clean = self._reader.buffered == 0
        else:  # incompatible: unparsed, so clean only if nothing followed the packet
            clean = self._ignored == 0
        self._step(E.END)
        return ConnectionClosed(clean)

    def _step(self, event: ConnectionEvent, detail: str = "") -> None:
        self._state = step(self._state, event, detail)
