"""The worker's side of the connector protocol, sans-IO: its state and its handlers.

:class:`WorkerCore` is the whole state of a Wallaroo worker (its configuration, its
connections, its streams and the application's state) and the handlers that change it:
the bytes of whole frames and the events of a connection in, the frames to write out.
It touches no socket, clock or randomness, so the worker immortal
(:mod:`immortals.wallaroo.worker`) replays it exactly. The rules are the seed's (000,
001) and, where the seed is vague, the released worker's (reference):

- HELLO must carry the dialect's version (draft: :data:`.codec.DRAFT_VERSION`; v3:
  ``"0.0.1"``) and the configured cookie, exactly; otherwise ERROR ("Unknown protocol
  version: ..." / "Bad cookie") and a close (the rule, with the configuration, is in
  :mod:`.worker_config`). OK grants ``max_credits``; the draft's OK
  also lists (stream id, point of reference) for every stream with a point (seed 000,
  C1), as many as fit in a frame.
- Every frame after OK costs one credit; a frame with none left is an ERROR. At the end
  of each read's frames, an ACK tops the credits back up to ``max_credits`` once they
  have fallen to ``refill_credits``, and carries (stream id, point) for every stream a
  MESSAGE or EOS moved in that read (credits 0 when no refill is due).
- A stream has one owner across all connections. NOTIFY is answered NOTIFY_ACK in both
  dialects (the draft with the addendum's tag 4): ``(true, point)`` when the stream is
  free or already this connection's (a reintroduction, seed 000), ``(false, point)``
  when another connection holds it or the connection is migrating. The point is the
  last message id the worker took (durable, as everything it handled is), or
  ``NOTHING_SEEN`` for a stream never seen; the connector resumes after it. In the
  draft NOTIFY_ACK is ours, not the seed's, so a connector need not wait for it: the
  stream's MESSAGEs may follow its NOTIFY at once (seed 000, *Overview*). So a draft
  NOTIFY that resumes from another point than the worker's (0 for a stream never seen,
  the seed's "undefined") is answered with a NACK to the worker's point as well: the
  stream ignores MESSAGEs until the NOTIFY at that point (seed 000, *Acks and Nacks*),
  and the MESSAGEs of a refused NOTIFY are ignored, not an error.
- The point is the last message id taken in transmission order. v3 drops a MESSAGE
  whose id is at or below it (the released worker's de-duplication, reference); the
  draft takes every one, since "Wallaroo does not make any assumptions around
  monotonicity of message ids" (seed 000, *Streaming*): what keeps a replay out there
  is the NACK above, by position rather than by id. One flagged EPHEMERAL or
  UNSTABLE_REFERENCE (draft) carries no identity, so it is applied as it comes and
  leaves the point alone. A boundary (no payload) moves the point without calling the
  application. A MESSAGE for a stream not open on this connection (never notified,
  closed by EOS, held elsewhere) is an ERROR; for a stream this worker NACKed, it is
  ignored until the NOTIFY (seed 000).
- EOS (draft: a MESSAGE flagged EOS, applied first; v3: EOS_MESSAGE) closes the stream,
  releases it and acknowledges its final point.
- Any frame not valid in its connection's or stream's state (a second HELLO, a frame
  only a worker sends), a frame that does not decode or is over the size limit: ERROR
  naming what and where, then close. The ERROR is preceded by an ACK of whatever the
  read moved before the bad frame, so the connector knows what is safe.
- :meth:`WorkerCore.nack` resets a stream to a point (draft: NACK, to any point; v3 has
  none, so an ACK with a lower point, which the released connector takes as a rewind).
  :meth:`WorkerCore.begin_move` moves every stream to another worker, its state first
  (:mod:`.handoff`), then its connector: MIGRATE (draft, seed 001), or RESTART (v3)
  after an ACK of every stream's final point. While the worker moves, NOTIFYs are
  refused, and so are those of streams another worker is handing over here.

ACKs are replies, and replies leave only through the immortal's effects, which run after
the record holding the frames is durable: an ACKed point is never ahead of the log.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Final

from .codec import (
    DEFAULT_MAX_FRAME_BYTES,
    LENGTH_PREFIX_BYTES,
    NOTHING_SEEN,
    Dialect,
    decode_tagged,
    encode,
)
from .errors import FrameTooLargeError, ProtocolError
from .frames import (
    Ack,
    EosMessage,
    Error,
    Frame,
    Hello,
    Message,
    MessageFlags,
    Migrate,
    Nack,
    Notify,
    NotifyAck,
    Ok,
    Restart,
)
from .handoff import Call, Move
from .states import (
    ConnectionState,
    FrameKind,
    Role,
    StreamMachine,
    StreamState,
    UnexpectedFrameError,
    kind_of,
)
from .worker_config import App, WorkerConfig, hello_refusal, load_app
from .worker_move import Moving
from .worker_state import (
    LIVE,
    NOTHING,
    Batch,
    Connection,
    NoCreditsError,
    Replies,
    Send,
    Stream,
    StreamNotOpenError,
)

__all__ = [
    "App",
    "NoCreditsError",
    "Replies",
    "Send",
    "StreamNotOpenError",
    "WorkerConfig",
    "WorkerCore",
    "hello_refusal",
    "load_app",
]

_W = Role.WORKER
_CS, _SS, _K = ConnectionState, StreamState, FrameKind
_NO_IDENTITY: Final = MessageFlags.EPHEMERAL | MessageFlags.UNSTABLE_REFERENCE
_MAX_REASON: Final = 2000  # characters of an ERROR reason (the seed: "a short reason")
_OK_POINTS: Final = (DEFAULT_MAX_FRAME_BYTES - 5) // 16  # pairs that fit a default-size OK


_Connection, _Stream, _Batch = Connection, Stream, Batch  # what checkpoints before the split name


class WorkerCore(Moving):
    """The worker's state and handlers (see the module docstring)."""

    def __init__(self, config: WorkerConfig | None = None) -> None:
        self.config = config or WorkerConfig()
        self.incarnation = ""
        self.connections: dict[str, Connection] = {}
        self.streams: dict[int, Stream] = {}
        self.app_state: dict[str, Any] = {}
        self.applied = 0  # messages given to the application
        self.duplicates = 0  # messages dropped by de-duplication
        self.move: Move | None = None  # this worker's streams going elsewhere (handoff.py)
        self.expected: dict[int, str] = {}  # streams coming from another worker: from whom
        self._app: App | None = None
        self._app_spec: str | None = None  # what _app was loaded from; a cache

    def __getstate__(self) -> dict[str, object]:
        state = self.__dict__.copy()
        state.pop("_app", None)  # a function: loaded again from config.app
        state.pop("_app_spec", None)
        return state

    def __setstate__(self, state: dict[str, object]) -> None:
        self.move, self.expected = None, {}  # not in checkpoints from before them
        self.__dict__.update(state)
        self._app = None
        self._app_spec = None

    # -- connection events ---------------------------------------------------------------

    def start(self, incarnation: str, config: WorkerConfig) -> Replies:
        """A new incarnation: connections of earlier ones are gone, their streams free."""
        dropped = len(self.connections)
        for conn in list(self.connections):
            self._drop(conn)
        self.incarnation = incarnation
        self.config = config
        calls = self._hand_free()
        if not dropped:
            return Replies(calls=calls) if calls else NOTHING
        return Replies((), (f"the last incarnation's connections dropped: {dropped}",), calls)

    def opened(self, conn: str, peer: str) -> Replies:
        """A connection was accepted (seed 000: state CONNECTED)."""
        again = conn in self.connections
        self._drop(conn)
        self.connections[conn] = Connection(peer)
        return (
            Replies((), (f"connection {conn} opened twice; the first dropped",))
            if again
            else NOTHING
        )

    def closed(self, conn: str) -> Replies:
        """The connection's transport is gone: its streams are free again."""
        self._drop(conn)
        calls = self._hand_free()
        return Replies(calls=calls) if calls else NOTHING

    def too_large(self, conn: str, offset: int, size: int) -> Replies:
        """The transport refused a length over the limit (seed 000, B1): ERROR, close."""
        c = self.connections.get(conn)
        if c is None:
            return NOTHING
        cfg = self.config
        err = FrameTooLargeError(cfg.dialect.value, offset, size, cfg.max_frame_bytes)
        batch = Batch()
        self._fail(c, batch, str(err))
        return self._finish(conn, c, batch)

    def frames(self, conn: str, frames: list[bytes]) -> Replies:
        """Handle the frames one read brought on ``conn`` (each its tag and body, as the
        transport split them); the replies go out in one write.

        Frames for a connection already closed are discarded (seed 000: data after an
        ERROR is discarded).
        """
        c = self.connections.get(conn)
        if c is None:
            return NOTHING
        cfg = self.config
        dialect, limit = cfg.dialect, cfg.max_frame_bytes
        batch = Batch()
        for raw in frames:
            offset = c.offset  # of the length prefix: where the frame starts
            c.offset += LENGTH_PREFIX_BYTES + len(raw)
            try:
                if len(raw) > limit:
                    raise FrameTooLargeError(dialect.value, offset, len(raw), limit)
                frame = decode_tagged(raw, dialect, offset + LENGTH_PREFIX_BYTES)
                self._frame(conn, c, frame, offset, batch)
            except UnexpectedFrameError as err:
                self._fail(c, batch, f"{err} (frame at stream offset {offset})")
            except ProtocolError as err:
                self._fail(c, batch, str(err))
            if batch.close:
                break
        return self._finish(conn, c, batch)

    # -- operators' commands -------------------------------------------------------------

    def nack(self, stream_id: int, point: int | None) -> Replies:
        """Rewind ``stream_id`` to ``point`` (None: to its start): later ids are taken again.

        Draft: a NACK to the connection holding the stream (it must NOTIFY again; seed
        000, *Acks and Nacks*), to any point, since ids have no order there (seed 000,
        *Streaming*). v3: an ACK with the lower point (reference). A stream no
        connection holds just resumes from ``point`` at its next NOTIFY. ValueError for
        an unknown stream, or in v3 a point ahead of the stream's.
        """
        s = self.streams.get(stream_id)
        if s is None:
            raise ValueError(f"no stream {stream_id}")
        if self.move is not None and stream_id in self.move.handed:
            raise ValueError(f"stream {stream_id} moved to {self.move.peer}")
        ahead = point is not None and (s.point is None or point > s.point)
        if ahead and self.config.dialect is Dialect.V3:
            raise ValueError(f"stream {stream_id} is at {s.point}; cannot NACK ahead to {point}")
        owner = self.connections.get(s.owner) if s.owner is not None else None
        if owner is None or s.owner is None:
            s.point = point
            return NOTHING
        if owner.machine.state is not _CS.STREAMING:
            raise ValueError(f"stream {stream_id}'s connection is {owner.machine.state.value}")
        grant = self.config.max_credits - owner.credits
        frame: Frame
        if self.config.dialect is Dialect.DRAFT:
            frame = Nack(grant, stream_id, 0 if point is None else point)
            s.machine.send(frame)
        else:
            frame = Ack(grant, ((stream_id, NOTHING_SEEN if point is None else point),))
        owner.machine.send(frame)
        owner.credits += grant
        s.point = point
        return Replies((Send(s.owner, self._encode([frame])),))

    # -- reading the state (for operators; not a handler) -----------------------------------

    def status(self) -> dict[str, Any]:
        """A summary for operators: configuration, connections, streams, app state."""
        return {
            "incarnation": self.incarnation,
            "dialect": self.config.dialect.value,
            "applied": self.applied,
            "duplicates": self.duplicates,
            "connections": {
                conn: {"peer": c.peer, "state": c.machine.state.value, "credits": c.credits}
                for conn, c in self.connections.items()
            },
            "streams": {
                str(sid): {
                    "name": s.name,
                    "owner": s.owner,
                    "state": s.machine.state.value,
                    "point": s.point,
                }
                for sid, s in self.streams.items()
            },
            "app_state": self.app_state,
            "move": None if self.move is None else self.move.status(len(self.streams)),
            "expected": len(self.expected),
        }

    # -- one frame ---------------------------------------------------------------------------

    def _frame(self, conn: str, c: Connection, frame: Frame, offset: int, batch: Batch) -> None:
        kind = kind_of(frame)
        if c.machine.state in LIVE and kind is not _K.ERROR:
            if c.credits <= 0:
                raise NoCreditsError(self.config.dialect.value, type(frame).__name__, offset)
            c.credits -= 1
        c.machine.receive(kind)  # what a worker never receives stops here
        if isinstance(frame, Message):
            self._message(conn, frame, kind, offset, batch)
        elif isinstance(frame, Notify):
            self._notify(conn, c, frame, batch)
        elif isinstance(frame, EosMessage):
            s = self._owned(conn, frame.stream_id, kind, offset)
            if s.machine.receive(kind) is _SS.CLOSED:
                self._close_stream(frame.stream_id, s, batch)
        elif isinstance(frame, Hello):
            self._hello(c, frame, batch)
        elif isinstance(frame, Error):
            batch.problems.append(f"{conn} ({c.peer}) sent ERROR: {frame.reason}")
            batch.close = True
        else:  # MIGRATION_ACK: the connector is on its new worker (seed 001, step 10)
            batch.close = True

    def _hello(self, c: Connection, hello: Hello, batch: Batch) -> None:
        cfg = self.config
        if (refusal := hello_refusal(hello, cfg)) is not None:
            self._fail(c, batch, refusal)
        elif self.move is not None and self.move.ready:  # gone: sent where the streams are
            c.name = f"{hello.program_name}/{hello.instance_name}"
            if cfg.dialect is Dialect.DRAFT:  # seed 001: MIGRATE in the handshake too
                c.credits = cfg.max_credits  # for its MIGRATION_ACK; none are granted
                migrate = Migrate(self.move.host, self.move.port)
                c.machine.send(migrate)
                batch.frames.append(migrate)
            else:  # v3 has RESTART only while streaming: OK first, then a close
                for frame in (Ok(cfg.max_credits, ()), Restart(self.move.address)):
                    c.machine.send(frame)
                    batch.frames.append(frame)
                batch.close = True
        else:
            c.name = f"{hello.program_name}/{hello.instance_name}"
            c.credits = cfg.max_credits
            points: tuple[tuple[int, int], ...] = ()
            if cfg.dialect is Dialect.DRAFT:  # seed 000, C1: as many as fit in a frame
                known = ((sid, s.point) for sid, s in self.streams.items())
                points = tuple((sid, p) for sid, p in known if p is not None)[:_OK_POINTS]
            ok = Ok(cfg.max_credits, points)
            c.machine.send(ok)
            batch.frames.append(ok)

    def _notify(self, conn: str, c: Connection, notify: Notify, batch: Batch) -> None:
        sid = notify.stream_id
        draft = self.config.dialect is Dialect.DRAFT
        s = self.streams.get(sid)
        if (
            c.machine.state is _CS.MIGRATING
            or (s is not None and s.owner not in (None, conn))
            or self.move is not None  # its streams go elsewhere (handoff.py)
            or sid in self.expected  # its state is on the way from another worker
        ):
            refusal = NotifyAck(False, sid, NOTHING_SEEN if s is None else s.wire_point)
            c.machine.send(refusal)
            batch.frames.append(refusal)
            if draft and (s is None or s.owner != conn):  # its MESSAGEs may follow: ignored
                c.refused.add(sid)
            return
        if s is None:
            s = self.streams[sid] = Stream(sid, notify.stream_name)
            nothing = 0 if draft else NOTHING_SEEN
            if self.config.adopt_points and notify.point_of_reference != nothing:
                s.point = notify.point_of_reference
        c.refused.discard(sid)
        s.machine.receive(notify)
        s.owner = conn
        if notify.stream_name != s.name:
            batch.problems.append(f"stream {sid} renamed from {s.name!r} to {notify.stream_name!r}")
            s.name = notify.stream_name
        ack = NotifyAck(True, sid, s.wire_point)
        s.machine.send(ack)
        c.machine.send(ack)
        batch.frames.append(ack)
        here = 0 if s.point is None else s.point  # the draft's 0: "undefined", the start
        if draft and s.machine.state is _SS.OPEN and notify.point_of_reference != here:
            # It resumes elsewhere than the worker's point, and its MESSAGEs follow at
            # once: reset it there (seed 000, *Acks and Nacks*), so nothing is taken twice.
            nack = Nack(0, sid, here)
            s.machine.send(nack)
            c.machine.send(nack)
            batch.frames.append(nack)

    def _message(self, conn: str, m: Message, kind: FrameKind, offset: int, batch: Batch) -> None:
        sid = m.stream_id
        if sid in self.connections[conn].refused:  # sent before the refusal came (draft)
            return
        s = self._owned(conn, sid, kind, offset)
        if s.machine.state is _SS.RESET:  # NACKed: ignored until the NOTIFY (seed 000)
            s.machine.receive(kind)
            return
        if m.flags and m.flags & _NO_IDENTITY:  # IntFlag's & is slow: most flags are 0
            if m.payload is not None:
                self._apply(m.payload, batch)
        elif (
            s.point is not None
            and m.message_id <= s.point
            and self.config.dialect is Dialect.V3  # the draft assumes no order (seed 000)
        ):
            self.duplicates += 1
        else:
            if m.payload is not None:
                self._apply(m.payload, batch)
            s.point = m.message_id
            batch.acks[sid] = m.message_id
        if s.machine.receive(kind) is _SS.CLOSED:
            self._close_stream(sid, s, batch)

    def _owned(self, conn: str, sid: int, kind: FrameKind, offset: int) -> Stream:
        """The stream ``sid`` if it is open on ``conn``; else StreamNotOpenError."""
        s = self.streams.get(sid)
        if s is not None and s.owner == conn:
            return s
        if s is None:
            why = "never notified"
        elif s.owner is not None:
            why = "open on another connection"
        elif s.machine.state is _SS.CLOSED:
            why = "closed by EOS; a NOTIFY reopens it"
        else:
            why = "not notified on this connection"
        frame = "EosMessage" if kind is _K.EOS_MESSAGE else "Message"
        at = offset + LENGTH_PREFIX_BYTES + 1  # the stream id leads both bodies
        raise StreamNotOpenError(self.config.dialect.value, frame, at, sid, why)

    def _close_stream(self, sid: int, s: Stream, batch: Batch) -> None:
        s.owner = None  # released: free for any connection's NOTIFY
        if self.move is not None and self.move.ready:  # its ACK waits for the hand-off
            batch.acks.pop(sid, None)
            batch.closed.append(sid)
        elif s.point is not None:
            batch.acks[sid] = s.point

    def _apply(self, payload: bytes, batch: Batch) -> None:
        app = self._app
        if self._app_spec != self.config.app:
            app = self._app = load_app(self.config.app)
            self._app_spec = self.config.app
        self.applied += 1
        if app is None:
            return
        try:
            app(self.app_state, payload)
        except Exception as exc:  # the message counts as handled: a poison one never wedges
            batch.problems.append(f"the application raised {exc!r}; the message is skipped")

    # -- ends of a batch -------------------------------------------------------------------

    def _fail(self, c: Connection, batch: Batch, reason: str) -> None:
        """Answer ERROR (after an ACK of what the read moved) and close (seed 000)."""
        if len(reason) > _MAX_REASON:
            reason = reason[: _MAX_REASON - 3] + "..."
        if batch.acks and c.machine.state in LIVE:
            ack = Ack(0, tuple(batch.acks.items()))
            c.machine.send(ack)
            batch.frames.append(ack)
            batch.acks.clear()
        batch.frames.append(Error(reason))
        if c.machine.state not in (_CS.ERROR, _CS.DISCONNECTED):
            c.machine.send(_K.ERROR)
        batch.problems.append(f"{c.peer}: ERROR {reason}")
        batch.close = True

    def _finish(self, conn: str, c: Connection, batch: Batch) -> Replies:
        if not batch.close and c.machine.state in LIVE:
            cfg = self.config
            grant = cfg.max_credits - c.credits if c.credits <= cfg.refill_credits else 0
            if grant or batch.acks:
                ack = Ack(grant, tuple(batch.acks.items()))
                c.machine.send(ack)
                c.credits += grant
                batch.frames.append(ack)
        calls: tuple[Call, ...] = ()
        if batch.closed:  # seed 001, steps 4-6: the state goes first, then the ACK
            held = [(sid, p) for sid in batch.closed if (p := self.streams[sid].point) is not None]
            calls = (self._hand(batch.closed, conn, tuple(held)),)
        if batch.close:
            self._drop(conn)
            calls += self._hand_free()
        if not batch.frames and not batch.close:
            if batch.problems or calls:
                return Replies((), tuple(batch.problems), calls)
            return NOTHING
        send = Send(conn, self._encode(batch.frames), batch.close)
        return Replies((send,), tuple(batch.problems), calls)

    def _drop(self, conn: str) -> None:
        if self.connections.pop(conn, None) is None:
            return
        for s in self.streams.values():
            if s.owner == conn:
                s.owner = None
                s.machine = StreamMachine(_W, s.machine.stream_id)  # its session ended

    def _encode(self, frames: Iterable[Frame]) -> bytes:
        # What we send is bounded by the default limit (a peer's), not by what we accept.
        d, limit = self.config.dialect, max(self.config.max_frame_bytes, DEFAULT_MAX_FRAME_BYTES)
        return b"".join(encode(f, d, max_frame_bytes=limit) for f in frames)
