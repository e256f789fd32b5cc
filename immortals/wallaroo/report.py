"""The Wallaroo worker's and connector's part of ``ambrosia-py analyze``: a report plug-in
(:mod:`ambrosia_py.spark.report_plugins`), registered in ``pyproject.toml`` under the
entry point group ``ambrosia_py.report_services`` as :data:`REPORT`.

The worker (:mod:`.worker`) and the connector (:mod:`.connector`) log every read from
their peer as one impulse ``frames(conn, now_ms, frames)``, the frames (tag and body)
they read, and ``start(incarnation, config)`` at every start. A ``start`` carrying a
:class:`~.worker_config.WorkerConfig` makes an instance a worker (role ``worker``), one
carrying a :class:`~.connector_actions.ConnectorConfig` a connector (``connector``),
whose received frames are its worker's answers; either gives the dialect the frames are
decoded in, and a connector's its streams' names. Before any (a log whose start was
pruned), frames that decode whole in exactly one dialect are read in it. Each frame is
counted by its stream (named by its NOTIFY or the connector's configuration) and class;
a MESSAGE with no payload is a ``Boundary``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ambrosia_py.spark.report_plugins import Frame, Undecodable

from .codec import Dialect, decode_tagged, stream_id_for
from .connector import WallarooConnector
from .connector_actions import ConnectorConfig
from .errors import WallarooError
from .frames import Message, Notify
from .worker import WallarooWorker
from .worker_config import WorkerConfig

__all__ = ["REPORT", "WallarooReport"]


class _StreamsReader:
    """One worker's or connector's instance version's calls, in log order."""

    def __init__(self) -> None:
        self.role: str | None = None
        self.dialect: Dialect | None = None
        self.names: dict[int, str] = {}  # stream id -> name (NOTIFY, a connector's config)

    def claims(self, method: str, args: tuple[Any, ...]) -> bool:
        config = args[1] if method == "start" and len(args) == 2 else None
        # Unpickling sets fields without the classes' validators: check what is used.
        if not isinstance(config, WorkerConfig | ConnectorConfig) or not isinstance(
            config.dialect, Dialect
        ):
            return False
        self.dialect = config.dialect
        if isinstance(config, WorkerConfig):
            self.role = "worker"
            return True
        self.role = "connector"
        streams = config.streams if isinstance(config.streams, tuple | list) else ()
        for name in streams:
            if isinstance(name, str):
                # The connector sends the NOTIFYs; its config names the streams.
                self.names.setdefault(stream_id_for(name), name)
        return True

    def read(self, method: str, args: tuple[Any, ...]) -> Sequence[Frame | Undecodable]:
        if method == "start":
            return [Undecodable("start without a WorkerConfig or ConnectorConfig")]
        if method != "frames":
            return [Undecodable(f"{method}: not a call a Wallaroo worker or connector logs")]
        if not (
            len(args) == 3
            and isinstance(args[2], list)
            and all(isinstance(f, bytes) for f in args[2])
        ):
            return [Undecodable("not (conn, now_ms, [frames])")]
        frames: list[bytes] = args[2]
        if self.dialect is None and frames:
            fits = [d for d in Dialect if _decodes(frames, d)]
            if len(fits) != 1:
                return [Undecodable(f"frames that decode whole in {len(fits)} dialects")]
            self.dialect = fits[0]
        return [self._frame(frame, i) for i, frame in enumerate(frames)]

    def _frame(self, frame: bytes, index: int) -> Frame | Undecodable:
        """One frame (tag and body), by its stream and class."""
        assert self.dialect is not None  # claimed, or found by read
        try:
            decoded: Any = decode_tagged(frame, self.dialect)
        except WallarooError as exc:
            return Undecodable(str(exc), index)
        sid: int | None = getattr(decoded, "stream_id", None)
        if isinstance(decoded, Notify):
            self.names[decoded.stream_id] = decoded.stream_name
        kind = type(decoded).__name__
        size = 0
        if isinstance(decoded, Message):
            if decoded.payload is None:
                kind = "Boundary"
            else:
                size = len(decoded.payload)
        name = None if sid is None else self.names.get(sid, f"#{sid}")
        return Frame(kind, name, sid, None, size)


def _decodes(frames: list[bytes], dialect: Dialect) -> bool:
    try:
        for frame in frames:
            decode_tagged(frame, dialect)
    except WallarooError:
        return False
    return True


class WallarooReport:
    """The worker's and connector's streams in the report: frames per stream and class."""

    name = "wallaroo"
    title = "Wallaroo"
    about = (
        "Frames a Wallaroo worker received from its connectors (role worker) and a "
        "connector from its worker (role connector), decoded in the dialect of their "
        "logged start: per stream (named by its NOTIFY, or by the connector's "
        "configuration) and frame (Message: messages with a payload; bytes: their payloads)."
    )
    charted = "Message"
    restarts_logged = frozenset({"worker", "connector"})
    start_method = "start"  # logged at every start, with the configuration
    # The configurations and their dialect; WorkerConfig also where logs written before it
    # moved to worker_config name it.
    allowed_globals = frozenset(
        {
            ("immortals.wallaroo.worker_config", "WorkerConfig"),
            ("immortals.wallaroo.worker_core", "WorkerConfig"),
            ("immortals.wallaroo.connector_actions", "ConnectorConfig"),
            ("immortals.wallaroo.codec", "Dialect"),
        }
    )

    def methods(self) -> Mapping[str, int]:
        worker = WallarooWorker.rpc_methods_by_name()
        connector = WallarooConnector.rpc_methods_by_name()
        # One reader for both: their impulses share names, so ids (hashes of the names).
        for method in ("frames", "start"):
            if worker[method].id != connector[method].id:
                raise AssertionError(f"the worker's and the connector's {method} differ in id")
        return {"frames": worker["frames"].id, "start": worker["start"].id}

    def reader(self) -> _StreamsReader:
        return _StreamsReader()


REPORT = WallarooReport()
