"""The sans-IO state machine of one flow connection (seed 004, *ConnectPacket*, *Protocol
compatibility*; reference, *ConnectPacket*, *Compatibility*).

Both sides send a ConnectPacket first: the dialer at once, the acceptor once it has seen
the dialer's and decided to keep the connection. A receiver waits for 14 bytes (length,
version, port), checks the length against the version, then waits for the rest. After it:

* a **compatible** peer's bytes are frames, verified and delivered as :class:`FrameReceived`;
* an **incompatible** peer's connection is kept open (so it does not keep reconnecting) but
  nothing it sends is parsed or delivered (the bytes are counted in ``ignored_bytes``), and
  nothing but pings to the well-known ping endpoint may be sent to it.

Like h11, :class:`FlowConnection` only turns bytes into events and calls into bytes; the
caller owns the socket. Any :class:`FlowError` from :meth:`FlowConnection.receive_data`
means: close the connection. It is raised at once, so frames completed earlier in the same
chunk are not delivered; they count as in flight, like every frame on a broken connection
(the reference: reliable messages are resent after reconnecting).
"""

from __future__ import annotations

import enum
from collections.abc import Sequence

from .connect import ConnectPacket, compatible, connect_packet_size
from .constants import CONNECT_PREFIX_LENGTH, PACKET_LIMIT, Buffer, WellKnown
from .errors import FlowError, FlowStateError
from .events import ConnectionClosed, Event, FrameReceived, PeerConnected
from .frames import FrameReader, check_frame_limit, encode_frame, encode_frame_parts
from .tokens import Token

__all__ = ["ConnectionState", "FlowConnection"]

_PING = Token.well_known(WellKnown.PING)


class ConnectionState(enum.Enum):
    """What the connection expects from the peer."""

    AWAIT_PEER = "await-peer"  # reading the peer's ConnectPacket
    COMPATIBLE = "compatible"  # reading frames
    INCOMPATIBLE = "incompatible"  # ignoring everything
    CLOSED = "closed"  # the peer ended the stream
    ERROR = "error"  # the peer broke the protocol; close the connection


_S = ConnectionState

# The whole state machine: where each state may go next.
_TRANSITIONS: dict[ConnectionState, frozenset[ConnectionState]] = {
    _S.AWAIT_PEER: frozenset({_S.COMPATIBLE, _S.INCOMPATIBLE, _S.CLOSED, _S.ERROR}),
    _S.COMPATIBLE: frozenset({_S.CLOSED, _S.ERROR}),
    _S.INCOMPATIBLE: frozenset({_S.CLOSED}),
    _S.CLOSED: frozenset(),
    _S.ERROR: frozenset(),
}


class _May(enum.Enum):
    SEND_ANY = "any"
    SEND_PINGS = "pings only"
    SEND_NOTHING = "nothing"


# What we may send in each state, and why not when we may not.
_MAY_SEND: dict[ConnectionState, tuple[_May, str]] = {
    _S.AWAIT_PEER: (_May.SEND_NOTHING, "the peer's ConnectPacket has not arrived"),
    _S.COMPATIBLE: (_May.SEND_ANY, ""),
    _S.INCOMPATIBLE: (_May.SEND_PINGS, "the peer is incompatible: only pings may be sent"),
    _S.CLOSED: (_May.SEND_NOTHING, "the peer has closed the connection"),
    _S.ERROR: (_May.SEND_NOTHING, "the connection failed with a protocol error"),
}


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
        held = len(self._head) if self._state is _S.AWAIT_PEER else 0
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
        if self._state in (_S.CLOSED, _S.ERROR):
            raise FlowStateError(f"no ConnectPacket on a connection in state {self._state.name}")
        self._connect_sent = True
        return self._local.encode()

    def send(self, token: Token, message: Buffer) -> list[bytes | memoryview]:
        """A frame for ``message`` to ``token``, as buffers for ``writelines``.

        Raises :class:`FlowStateError` before our ConnectPacket was sent or the peer's
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
            or self._state is not _S.COMPATIBLE
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
        may, why = _MAY_SEND[self._state]
        if may is _May.SEND_NOTHING:
            raise FlowStateError(f"cannot send a frame: {why}")
        if not self._connect_sent:
            raise FlowStateError("cannot send a frame before our ConnectPacket")
        if may is _May.SEND_PINGS and token != _PING:
            raise FlowStateError(f"cannot send a frame to {token}: {why}")

    def receive_data(self, data: Buffer) -> list[Event]:
        """Bytes from the peer in, events out. ``b""`` means the peer ended the stream.

        Raises the :class:`FlowError` that broke the connection (again on every later
        call), or :class:`FlowStateError` after the stream ended.
        """
        if self._error is not None:
            raise self._error
        if self._state is _S.CLOSED:
            raise FlowStateError("data received after the end of the stream")
        with memoryview(data) as mv, mv.cast("B") as buf:
            if not len(buf):
                return [self._close()]
            try:
                return self._receive(data, buf)
            except FlowError as exc:
                self._error = exc
                self._go(_S.ERROR)
                raise

    def _receive(self, data: Buffer, buf: memoryview) -> list[Event]:
        events: list[Event] = []
        pos = 0
        if self._state is _S.AWAIT_PEER:
            pos = self._read_connect_packet(buf, events)
        rest = len(buf) - pos
        if not rest:
            return events
        if self._state is _S.INCOMPATIBLE:
            self._ignored += rest
        elif self._state is _S.COMPATIBLE:
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
                self._go(_S.COMPATIBLE)
            else:
                self._go(_S.INCOMPATIBLE)
            break
        return pos

    def _close(self) -> ConnectionClosed:
        """The peer ended the stream: clean only at a boundary we can vouch for."""
        if self._state is _S.AWAIT_PEER:
            clean = not self._head
        elif self._state is _S.COMPATIBLE:
            assert self._reader is not None
            clean = self._reader.buffered == 0
        else:  # incompatible: unparsed, so clean only if nothing followed the packet
            clean = self._ignored == 0
        self._go(_S.CLOSED)
        return ConnectionClosed(clean)

    def _go(self, new: ConnectionState) -> None:
        if new not in _TRANSITIONS[self._state]:  # pragma: no cover - a bug, not bad input
            raise RuntimeError(f"flow connection cannot go from {self._state} to {new}")
        self._state = new
