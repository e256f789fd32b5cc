"""The worker's side of a move: its streams' state to another worker, then its
connectors there (:mod:`.handoff` says how and why). A part of
:class:`~.worker_core.WorkerCore`, kept apart because it is one concern."""

from __future__ import annotations

from collections.abc import Iterable

from .codec import Dialect
from .frames import Ack, Frame, Migrate, Restart
from .handoff import Call, Handed, Move
from .states import ConnectionState, Role, StreamMachine, StreamState
from .worker_config import WorkerConfig
from .worker_state import LIVE, Connection, Replies, Send, Stream

__all__ = ["Moving"]

_W = Role.WORKER
_CS = ConnectionState


class Moving:
    """The move's handlers; the state they use is the worker's."""

    config: WorkerConfig
    connections: dict[str, Connection]
    streams: dict[int, Stream]
    move: Move | None
    expected: dict[int, str]

    def _drop(self, conn: str) -> None:
        raise NotImplementedError

    def _encode(self, frames: Iterable[Frame]) -> bytes:
        raise NotImplementedError

    def begin_move(self, host: str, port: int, peer: str) -> Replies:
        """Move every stream to the worker instance ``peer`` at ``host:port``: refuse
        NOTIFYs from now and ask ``peer`` to expect the streams. ValueError if a move is
        under way or done, or ``peer`` is empty."""
        if not peer:
            raise ValueError(
                f"name the worker instance at {host}:{port}, so that each stream's point "
                "goes there with it"
            )
        if self.move is not None:
            raise ValueError(f"the streams are moving to {self.move.address} already")
        self.move = Move(host, port, peer)
        return Replies(calls=(Call(peer, "expect", (sorted(self.streams),)),))

    def expect(self, source: str, stream_ids: list[int]) -> Replies:
        """``source`` will hand these streams over: refuse their NOTIFYs until it does."""
        for sid in stream_ids:
            self.expected[sid] = source
        return Replies(calls=(Call(source, "expecting", (len(stream_ids),)),))

    def expecting(self) -> Replies:
        """The peer expects the streams: send every connector there (MIGRATE in the
        draft, seed 001; in v3 an ACK of every stream's final point, RESTART and a
        close) and hand over the streams no connection holds."""
        m = self.move
        if m is None or m.ready:
            return Replies(problems=("an answer to a move not under way, ignored",))
        m.ready = True
        sends = [
            self._send_away(conn, c)
            for conn, c in list(self.connections.items())
            if c.machine.state is _CS.STREAMING
        ]
        return Replies(
            tuple(sends), (f"moving every stream to {m.peer} at {m.address}",), self._hand_free()
        )

    def adopt(self, source: str, batch: int, streams: list[Handed]) -> Replies:
        """Take over streams from ``source`` (seed 001, step 5) and say so."""
        problems = []
        for sid, name, point, closed in streams:
            s = self.streams.get(sid)
            if s is not None and s.owner is not None:
                problems.append(f"stream {sid} handed over by {source} is open here; kept")
            else:
                s = self.streams[sid] = Stream(sid, name)
                s.point = point
                if closed:
                    s.machine = StreamMachine(_W, sid, StreamState.CLOSED)
            if self.expected.get(sid) == source:
                del self.expected[sid]
        problems.append(f"took over {len(streams)} streams from {source}")
        return Replies((), tuple(problems), (Call(source, "adopted", (batch,)),))

    def adopted(self, batch: int) -> Replies:
        """The peer holds the streams of ``batch``: send the ACKs held back for them
        (seed 001, step 6)."""
        m = self.move
        if m is None or batch not in m.held:
            return Replies(problems=(f"an answer to hand-off {batch}, which is not waiting",))
        conn, acks = m.held.pop(batch)
        done = (f"every stream moved to {m.peer}",) if m.done(len(self.streams)) else ()
        c = self.connections.get(conn) if conn is not None else None
        if conn is None or c is None or not acks or c.machine.state not in LIVE:
            return Replies((), done)
        ack = Ack(0, acks)
        c.machine.send(ack)
        return Replies((Send(conn, self._encode([ack])),), done)

    def _send_away(self, conn: str, c: Connection) -> Send:
        assert self.move is not None
        if self.config.dialect is Dialect.DRAFT:
            migrate = Migrate(self.move.host, self.move.port)
            c.machine.send(migrate)
            return Send(conn, self._encode([migrate]))
        # v3: an ACK of the connection's streams' final points, RESTART, close (reference)
        points = [(sid, s.point) for sid, s in self.streams.items() if s.owner == conn]
        frames: list[Frame] = [Ack(0, [(sid, p) for sid, p in points if p is not None])]
        frames.append(Restart(self.move.address))
        for frame in frames:
            c.machine.send(frame)
        self._drop(conn)
        return Send(conn, self._encode(frames), close=True)

    def _hand_free(self) -> tuple[Call, ...]:
        """Hand over every stream no connection holds, if the peer expects them."""
        m = self.move
        if m is None or not m.ready:
            return ()
        free = [sid for sid, s in self.streams.items() if s.owner is None and sid not in m.handed]
        return (self._hand(free, None, ()),) if free else ()

    def _hand(self, sids: list[int], conn: str | None, acks: tuple[tuple[int, int], ...]) -> Call:
        m = self.move
        assert m is not None
        m.batches += 1
        m.handed.update(sids)
        m.held[m.batches] = (conn, acks)
        streams = [self._handed(sid) for sid in sids]
        return Call(m.peer, "adopt", (m.batches, streams))

    def _handed(self, sid: int) -> Handed:
        s = self.streams[sid]
        return (sid, s.name, s.point, s.machine.state is StreamState.CLOSED)
