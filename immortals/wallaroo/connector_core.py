"""The connector's side of the connector protocol, sans-IO: its state and its handlers.

:class:`ConnectorCore` is the whole logged state of a source connector: its
configuration, the worker it talks to (moved by RESTART and MIGRATE), its connections'
state machines and, per stream, the point of reference the worker last acknowledged.
Handlers take the events of the outside world (a connection made or lost, the frames a
worker sent, where the source reader stopped) and return :class:`Actions`: frames to
write, connections to dial or close, and orders for the source reader (``Go``, ``Stop``,
``Halt``); credits are the edge's to count (:func:`granted`). It touches no socket,
clock, file or randomness, so the connector immortal (:mod:`immortals.wallaroo.connector`)
replays it exactly.

What is decided here, and so logged, and what is not
----------------------------------------------------
The worker is the system of record for points of reference (seed 000, *Handshake*: OK
and, in our worker, NOTIFY_ACK give "points of reference that belonged to prior
sessions"); the connector's durable progress is whatever the worker acknowledged. So
the core decides, from logged input only: which streams to introduce and with which
point, where each stream resumes, where it rewinds (a NACK, or in v3 an ACK below the
last one), when a stream ends (the reader reached the end of the source: EOS), where to
connect and when to migrate. It does not see MESSAGE frames: the source reader (outside
the determinism boundary) reads the payloads again from the source by point of
reference and writes them while credits allow. Payloads are never logged; the source is
replayable by point (a file by line, an Ockam stream by index, a generator by count).
After a crash of either side the stream resumes after the worker's point, and nothing
is lost or repeated.

Where a stream resumes differs by dialect, each true to its source. v3 waits for
NOTIFY_ACK and resumes after its point (reference); the worker drops ids at or below its
point. The draft starts a stream right after its NOTIFY (seed 000, *Overview*: once the
notification has been sent, "the open stream can have any number of messages"), with
the point the OK listed for it (seed 000, C1) or else the last acknowledged one, since
the seed has no NOTIFY_ACK: ours is optional and never waited for. A worker that wants
the stream elsewhere NACKs it (seed 000, *Acks and Nacks*), and ours does whenever a
NOTIFY's point is not its own, which is what keeps a replay from being taken twice
there: a draft worker assumes no order among ids, so it cannot drop them by id.

Points of reference are message ids and count records consumed from the source: the
record at position ``k`` (1-based) is sent with message id ``k``, and a stream at point
``p`` resumes with record ``p + 1``. So 0 (the draft's "undefined") means "nothing
consumed" and needs no special case; ``NOTHING_SEEN`` from the worker means it never saw
the stream, and the stream starts at the source's origin (``Go.start is None``).

The rules where the seeds leave room (NOTIFY and resume, rewinds, stacked NACKs, the end
of a stream, RESTART, MIGRATE in the addendum's order, bad input, back-off) are written
down once, in ``docs/wallaroo_connector.md``, *The protocol as the connector plays it*;
the handlers below cite them.
"""

from __future__ import annotations

from typing import Any, Final

from .codec import (
    DRAFT_VERSION,
    LENGTH_PREFIX_BYTES,
    NOTHING_SEEN,
    V3_VERSION,
    Dialect,
    decode_tagged,
    encode,
    end_of_stream,
    stream_id_for,
)
from .connector_actions import (
    Actions,
    Close,
    Commit,
    ConnectorConfig,
    Dial,
    Go,
    Halt,
    RetryLater,
    Stop,
    Write,
    format_address,
    parse_address,
)
from .connector_state import MAIN, MIGRATION, Batch, Conn, Migration, Stream
from .errors import FrameTooLargeError, ProtocolError, UnknownStreamError
from .frames import (
    Ack,
    Error,
    Frame,
    Hello,
    Migrate,
    MigrationAck,
    Nack,
    Notify,
    NotifyAck,
    Ok,
    Restart,
)
from .states import ConnectionState, StreamState

__all__ = ["ConnectorCore", "UnknownStreamError"]  # the error lives in errors.py

_CS, _SS = ConnectionState, StreamState
_MAX_REASON: Final = 2000  # characters of an ERROR reason we send (seed 000: "short")
_NOTHING: Final = Actions()
_Conn, _Stream, _Migration = Conn, Stream, Migration  # what checkpoints before the split name


class ConnectorCore:
    """The connector's state and handlers (see the module docstring)."""

    alternate: str | None = None  # for checkpoints from before it (set in __init__)

    def __init__(self) -> None:
        self.config: ConnectorConfig | None = None
        self.incarnation = ""
        self.target = ""  # where the connector connects: moved by RESTART and MIGRATE
        self.failures = 0  # sessions in a row that ended before OK
        self.dials = 0  # the last dial number handed out
        self.wanted: dict[int, str] = {}  # dial -> purpose, not yet connected
        self.conns: dict[str, Conn] = {}
        self.active: str | None = None
        self.migration: Migration | None = None
        self.streams: dict[int, Stream] = {}
        self.moves = 0  # RESTARTs followed and migrations completed
        self.hints: dict[int, int] = {}  # the draft OK's points: where streams resume (C1)
        self.alternate: str | None = None  # a migration's other worker, until it completes

    # -- the incarnation ----------------------------------------------------------------

    def start(self, incarnation: str, config: ConnectorConfig) -> Actions:
        """A new incarnation: connections of earlier ones are gone. Dial the target.

        The target is the worker a RESTART or a migration moved the connector to, unless
        the configured worker changed: an operator's new ``--worker`` wins.
        """
        if self.config is None or self.config.worker != config.worker:
            self.target = config.worker
        self.config = config
        self.incarnation = incarnation
        self.conns.clear()
        self.wanted.clear()
        self.active = None
        self.migration = None
        self.failures = 0
        for s in self.streams.values():
            s.configured = False
        for name in config.streams:
            sid = stream_id_for(name)
            known = self.streams.get(sid)
            if known is None or known.name != name:
                known = self.streams[sid] = Stream(sid, name)
            known.configured = True
            known.broken = None  # a restart is the operator's repair (seed 000, D5)
        for s in self.streams.values():
            s.reset_session()
        batch = Batch()
        self._dial(batch, MAIN, self.target, 0)
        return batch.done()

    # -- the edge's reports -------------------------------------------------------------

    def connected(self, dial: int, conn: str, address: str) -> Actions:
        """A dial succeeded: say HELLO (seed 000, *Handshake*)."""
        purpose = self.wanted.pop(dial, None)
        if purpose is None:  # no longer wanted (a migration abandoned meanwhile)
            return Actions((Close(conn),))
        cfg = self._config
        if purpose == MAIN and address == self.alternate:  # the other one answered
            self.target, self.alternate = address, self.target
        c = self.conns[conn] = Conn(address, purpose)
        version = DRAFT_VERSION if cfg.dialect is Dialect.DRAFT else V3_VERSION
        hello = Hello(version, cfg.cookie, cfg.program_name, cfg.instance_name)
        c.machine.send(hello)
        if purpose == MAIN:
            self.active = conn
        elif self.migration is not None:
            self.migration.new = conn
        return Actions((Write(conn, (self._encode(hello),), charged=False),))

    def closed(self, conn: str) -> Actions:
        """The connection's transport is gone."""
        c = self.conns.pop(conn, None)
        if c is None:
            return _NOTHING
        batch = Batch()
        self._lost(batch, conn, c)
        return batch.done()

    def too_large(self, conn: str, offset: int, size: int) -> Actions:
        """The edge refused a length over the limit (seed 000, B1): ERROR and close."""
        c = self.conns.get(conn)
        if c is None:
            return _NOTHING
        cfg = self._config
        err = FrameTooLargeError(cfg.dialect.value, offset, size, cfg.max_frame_bytes)
        batch = Batch()
        self._fail(batch, conn, c, str(err))
        return batch.done()

    def frames(self, conn: str, frames: list[bytes]) -> Actions:
        """Handle the frames one read brought on ``conn`` (each its tag and body)."""
        c = self.conns.get(conn)
        if c is None:
            return _NOTHING
        dialect = self._config.dialect
        batch = Batch()
        for raw in frames:
            offset = c.offset
            c.offset += LENGTH_PREFIX_BYTES + len(raw)
            if c.machine.state is _CS.DISCONNECTED:
                break  # after MIGRATION_ACK the old worker closes; late frames are moot
            try:
                frame = decode_tagged(raw, dialect, offset + LENGTH_PREFIX_BYTES)
                self._frame(batch, conn, c, frame, offset)
            except ProtocolError as err:
                self._fail(batch, conn, c, f"{err} (frame at stream offset {offset})")
            if conn not in self.conns:
                break
        return batch.done()

    def halted(self, conn: str, stream_id: int, generation: int, point: int, end: bool) -> Actions:
        """The reader of ``stream_id`` stopped after sending up to ``point``: at the end of
        the source (``end``) or because a Halt told it to. Either way, EOS at ``point``."""
        s = self._current(conn, stream_id, generation)
        if s is None:
            return _NOTHING
        c = self.conns[conn]
        s.running = s.halting = False
        if end:
            s.end = point
        eos = end_of_stream(self._config.dialect, stream_id, point)
        s.machine.send(eos)
        c.machine.send(eos)
        s.eos_at = point
        batch = Batch()
        batch.actions.append(Write(conn, (self._encode(eos),)))
        self._settle_migration(batch)
        return batch.done()

    def failed(self, conn: str, stream_id: int, generation: int, reason: str) -> Actions:
        """The source cannot go on with ``stream_id`` from where the worker said (seed 000,
        D5): ERROR and close; the stream is not introduced again in this incarnation."""
        s = self._current(conn, stream_id, generation)
        if s is None:
            return _NOTHING
        s.broken = reason
        batch = Batch()
        self._fail(batch, conn, self.conns[conn], f"stream {s.name!r}: {reason}")
        return batch.done()

    def retry(self, conn: str, stream_id: int) -> Actions:
        """The back-off after a refused NOTIFY is over: NOTIFY again if still wanted."""
        c = self.conns.get(conn)
        s = self.streams.get(stream_id)
        if (
            c is None
            or s is None
            or conn != self.active
            or c.machine.state is not _CS.STREAMING
            or s.conn != conn
            or s.machine.state is not _SS.INTRO
            or s.notifies
            or not self._eligible(s)
        ):
            return _NOTHING
        batch = Batch()
        self._introduce(batch, conn, c, [s])
        return batch.done()

    # -- one frame from the worker ------------------------------------------------------

    def _frame(self, batch: Batch, conn: str, c: Conn, frame: Frame, offset: int) -> None:
        c.machine.receive(frame)  # what a connector never receives, or not now, stops here
        if isinstance(frame, Ack):
            self._ack(batch, conn, c, frame, offset)
        elif isinstance(frame, NotifyAck):
            self._notify_ack(batch, conn, c, frame, offset)
        elif isinstance(frame, Ok):
            self._ok(batch, conn, c, frame)
        elif isinstance(frame, Nack):
            self._nack(batch, conn, c, frame, offset)
        elif isinstance(frame, Migrate):
            self._migrate(batch, conn, c, frame)
        elif isinstance(frame, Restart):
            self._restart(batch, conn, c, frame)
        elif isinstance(frame, Error):
            batch.problems.append(f"worker {c.address} sent ERROR: {frame.reason}")
            batch.actions.append(Close(conn))
            del self.conns[conn]
            self._lost(batch, conn, c)

    def _ok(self, batch: Batch, conn: str, c: Conn, ok: Ok) -> None:
        c.streamed = True
        if c.purpose == MIGRATION:
            self._settle_migration(batch)
            return
        self.failures = 0
        self.hints = dict(ok.points_of_reference)
        self._notify_all(batch, conn, c)

    def _notify_all(self, batch: Batch, conn: str, c: Conn) -> None:
        self._introduce(batch, conn, c, [s for s in self.streams.values() if self._eligible(s)])

    def _introduce(
        self,
        batch: Batch,
        conn: str,
        c: Conn,
        streams: list[Stream],
        point: int | None = None,
        *,
        nacked: bool = False,
    ) -> None:
        """NOTIFY ``streams`` on ``conn`` in one write. v3: each starts when its NOTIFY_ACK
        comes. Draft: each starts now, after the point its NOTIFY carries (0: the seed's
        "undefined", the source's origin), unless NACKs are still stacked on it. After a
        NACK (``nacked``) a NOTIFY that opens the stream leaves with its reader, once the
        source could read from the point (seed 000, D5: :class:`Go`'s ``lead``)."""
        notifies = [self._notify(c, s, conn, point) for s in streams]
        draft = self._config.dialect is Dialect.DRAFT
        now: list[bytes] = []
        starts: list[tuple[Stream, Notify]] = []
        for s, n in zip(streams, notifies, strict=True):
            opens = draft and s.machine.state is _SS.OPEN
            if opens:
                starts.append((s, n))
            if not (opens and nacked):
                now.append(self._encode(n))
        if now:
            batch.actions.append(Write(conn, tuple(now)))
        for s, n in starts:
            lead = self._encode(n) if nacked else b""
            self._go(batch, conn, s, n.point_of_reference or None, lead)

    def _eligible(self, s: Stream) -> bool:
        return s.configured and s.broken is None and not s.done

    def _notify(self, c: Conn, s: Stream, conn: str, point: int | None = None) -> Notify:
        if point is None:
            hint = self.hints.pop(s.machine.stream_id, None)
            if hint is not None:  # the worker's own point, lower or higher (seed 000, C1)
                s.acked = hint
            point = s.acked
        if point is None:
            point = 0 if self._config.dialect is Dialect.DRAFT else NOTHING_SEEN
        notify = Notify(s.machine.stream_id, s.name, point)
        s.machine.send(notify)
        c.machine.send(notify)
        s.conn = conn
        s.notifies += 1
        return notify

    def _notify_ack(self, batch: Batch, conn: str, c: Conn, na: NotifyAck, offset: int) -> None:
        s = self._named(conn, na.stream_id, "NotifyAck", offset)
        if not s.notifies:
            reason = f"stream {na.stream_id} has no NOTIFY awaiting a NOTIFY_ACK"
            raise ProtocolError(self._config.dialect.value, "NotifyAck", None, offset, reason)
        s.machine.receive(na)
        s.notifies -= 1
        point = None if na.point_of_reference == NOTHING_SEEN else na.point_of_reference
        draft = self._config.dialect is Dialect.DRAFT
        if not na.success:
            if draft:  # it started with its NOTIFY: stop it (the worker ignored what it sent)
                if s.running or s.halting:
                    batch.actions.append(Stop(conn, na.stream_id))
                s.running = s.halting = False
                s.generation += 1
                s.eos_at = None
            if point is not None:
                s.acked = point  # the worker's own point: the one to resume from elsewhere
            if c.machine.state is _CS.MIGRATING:
                self._settle_migration(batch)
            else:
                batch.problems.append(f"stream {s.name!r} is held elsewhere; NOTIFY again later")
                batch.actions.append(RetryLater(conn, na.stream_id, s.refusals))
                s.refusals += 1
            return
        s.refusals = 0
        if draft:  # it runs since its NOTIFY; a worker that wants another point NACKs
            return
        s.acked = point
        if s.notifies == 0 and s.machine.state is _SS.OPEN:
            self._go(batch, conn, s, point)

    def _go(self, batch: Batch, conn: str, s: Stream, start: int | None, lead: bytes = b"") -> None:
        s.generation += 1
        s.running = True
        s.quiet = start is not None and start == s.end
        batch.actions.append(Go(conn, s.machine.stream_id, s.name, s.generation, start, lead))

    def _ack(self, batch: Batch, conn: str, c: Conn, ack: Ack, offset: int) -> None:
        # A draft ACK lists ids processed, and ids have no order there (seed 000,
        # *Streaming*); a draft worker rewinds with a NACK. Only v3 rewinds by ACK.
        v3 = self._config.dialect is Dialect.V3
        for sid, point in ack.acks:
            s = self._named(conn, sid, "Ack", offset)
            s.machine.receive(ack)
            if v3 and (point == NOTHING_SEEN or (s.acked is not None and point < s.acked)):
                self._rewind(batch, conn, s, None if point == NOTHING_SEEN else point)
            elif point != s.acked:
                s.acked = point
                batch.actions.append(Commit(s.name, point))
            if s.quiet and s.eos_at is not None and point == s.eos_at == s.end:
                s.close_seen = True  # no MESSAGE of it here: the EOS's ACK (Stream.done)
        self._settle_migration(batch)

    def _rewind(self, batch: Batch, conn: str, s: Stream, point: int | None) -> None:
        """v3's rewind: an ACK below the last one (reference, *What the released worker
        does*). Messages in flight past it are taken once by the worker; the reader
        starts again after ``point`` and the worker drops what it already has."""
        batch.problems.append(f"worker rewound stream {s.name!r} from {s.acked} to {point}")
        s.acked = point
        if s.running and s.conn == conn:
            self._go(batch, conn, s, point)

    def _nack(self, batch: Batch, conn: str, c: Conn, nack: Nack, offset: int) -> None:
        s = self._named(conn, nack.stream_id, "Nack", offset)
        s.machine.receive(nack)  # RESET, one more on the stack
        if s.running:
            batch.actions.append(Stop(conn, nack.stream_id))
            s.running = False
        s.generation += 1
        s.acked = nack.point_of_reference
        s.eos_at = None
        batch.problems.append(f"worker NACKed stream {s.name!r} to {nack.point_of_reference}")
        # Pops the one pushed; the NOTIFY that opens it waits on its source (D5).
        self._introduce(batch, conn, c, [s], nack.point_of_reference, nacked=True)

    def _restart(self, batch: Batch, conn: str, c: Conn, restart: Restart) -> None:
        if conn != self.active or self.migration is not None:
            reason = "a RESTART while migrating"
            raise ProtocolError(self._config.dialect.value, "Restart", None, c.offset, reason)
        try:
            parse_address(restart.address)
        except ValueError as exc:
            batch.problems.append(f"RESTART from {c.address} ignored: {exc}")
        else:
            self.target = restart.address
            self.moves += 1
        batch.problems.append(f"worker {c.address} sent RESTART to {restart.address}")
        batch.actions.append(Close(conn))
        del self.conns[conn]
        for s in self.streams.values():
            if s.conn == conn and s.quiet:  # the ACK before a RESTART closes nothing
                s.close_seen = False
        self._reset_streams(conn)
        self.active = None
        self.failures = 0
        self._dial(batch, MAIN, self.target, 0)

    # -- migration (seed 001) -------------------------------------------------------------

    def _migrate(self, batch: Batch, conn: str, c: Conn, m: Migrate) -> None:
        to = format_address(m.host, m.port)
        if conn != self.active or self.migration is not None:
            raise ProtocolError(
                self._config.dialect.value, "Migrate", None, c.offset, "a MIGRATE while migrating"
            )
        batch.problems.append(f"worker {c.address} asked to MIGRATE to {to}")
        self.migration = Migration(conn, to, self._dial(batch, MIGRATION, to, 0))
        self.alternate = to  # if the old one goes first and does not come back (001, Notes)
        for sid, s in self.streams.items():
            if s.conn == conn and s.running:
                s.running, s.halting = False, True
                batch.actions.append(Halt(conn, sid, s.name, s.generation))
        self._settle_migration(batch)

    def _settle_migration(self, batch: Batch) -> None:
        """MIGRATION_ACK on the old connection once the new worker said OK and the old
        acknowledged every stream through its EOS (seed 001, steps 6 to 9); then the
        streams are introduced on the new connection (step 11)."""
        m = self.migration
        if m is None or m.new is None or not self.conns[m.new].streamed:
            return
        for s in self.streams.values():
            if s.conn != m.old:
                continue
            if s.running or s.halting:  # a NOTIFY unanswered is not waited for (draft)
                return
            if s.eos_at is not None and (s.acked is None or s.acked < s.eos_at):
                return
        old, new = self.conns[m.old], self.conns[m.new]
        ack = MigrationAck()
        old.machine.send(ack)
        # A MIGRATE in the handshake came before any OK, so before any credit: the ACK
        # cannot wait for one (the worker that sent it does not charge it either).
        batch.actions.append(Write(m.old, (self._encode(ack),), charged=old.streamed))
        self._reset_streams(m.old)
        self.hints.clear()  # the old worker's points (seed 000, C1), not the new one's
        self.migration = None
        self.target, self.alternate = m.to, None
        self.active = m.new
        new.purpose = MAIN
        self.moves += 1
        self.failures = 0
        batch.problems.append(f"migrated to {m.to}")
        self._notify_all(batch, m.new, new)

    # -- losing a connection --------------------------------------------------------------

    def _fail(self, batch: Batch, conn: str, c: Conn, reason: str) -> None:
        """ERROR with ``reason`` and close (seed 000, *Protocol State Machine*)."""
        if len(reason) > _MAX_REASON:
            reason = reason[: _MAX_REASON - 3] + "..."
        batch.problems.append(f"ERROR to worker {c.address}: {reason}")
        batch.actions.append(Write(conn, (self._encode(Error(reason)),), charged=False))
        batch.actions.append(Close(conn))
        self.conns.pop(conn, None)
        self._lost(batch, conn, c)

    def _lost(self, batch: Batch, conn: str, c: Conn) -> None:
        """``conn`` is gone (already out of ``conns``): what now depends on its role."""
        self._reset_streams(conn)
        m = self.migration
        if m is not None and conn == m.old:
            batch.problems.append(f"migration to {m.to} abandoned: {c.address} went first")
            self.migration = None
            self.wanted.pop(m.dial, None)
            if m.new is not None and self.conns.pop(m.new, None) is not None:
                batch.actions.append(Close(m.new))
            self.active = None
            self._redial(batch, c)
        elif m is not None and conn == m.new:
            m.new = None
            m.failures += 1
            m.dial = self._dial(batch, MIGRATION, m.to, m.failures)
        elif conn == self.active:
            self.active = None
            self._redial(batch, c)

    def _redial(self, batch: Batch, c: Conn) -> None:
        self.failures = 0 if c.streamed else self.failures + 1
        other = self.alternate
        others = (other,) if other is not None and other != self.target else ()
        self._dial(batch, MAIN, self.target, self.failures, others)

    def _reset_streams(self, conn: str) -> None:
        for s in self.streams.values():
            if s.conn == conn:
                s.reset_session()  # the reader's reports for it are ignored from now

    def _dial(
        self, batch: Batch, purpose: str, address: str, attempt: int, others: tuple[str, ...] = ()
    ) -> int:
        self.dials += 1
        self.wanted[self.dials] = purpose
        batch.actions.append(Dial(self.dials, address, attempt, others))
        return self.dials

    # -- helpers ----------------------------------------------------------------------------

    @property
    def _config(self) -> ConnectorConfig:
        if self.config is None:
            raise RuntimeError("the connector core has not been started")
        return self.config

    def _named(self, conn: str, sid: int, frame: str, offset: int) -> Stream:
        s = self.streams.get(sid)
        if s is None or s.conn != conn:
            raise UnknownStreamError(self._config.dialect.value, frame, offset, sid)
        return s

    def _current(self, conn: str, sid: int, generation: int) -> Stream | None:
        """The stream a reader reports on, unless the report is stale."""
        s = self.streams.get(sid)
        if s is None or s.generation != generation or s.conn != conn or conn not in self.conns:
            return None
        return s

    def _encode(self, frame: Frame) -> bytes:
        return encode(frame, self._config.dialect)

    # -- reading the state (for operators and tests; not a handler) ---------------------------

    def status(self) -> dict[str, Any]:
        """A summary: the target, connections, migration, each stream's progress."""
        m = self.migration
        return {
            "incarnation": self.incarnation,
            "target": self.target,
            "active": self.active,
            "failures": self.failures,
            "moves": self.moves,
            "migration": None if m is None else {"old": m.old, "to": m.to, "new": m.new},
            "connections": {
                conn: {"address": c.address, "state": c.machine.state.value, "role": c.purpose}
                for conn, c in self.conns.items()
            },
            "streams": {
                s.name: {
                    "id": sid,
                    "acked": s.acked,
                    "end": s.end,
                    "finished": s.finished,
                    "state": s.machine.state.value,
                    "running": s.running,
                    "broken": s.broken,
                }
                for sid, s in self.streams.items()
            },
        }
