"""The analytics report's view into the services of ``immortals/``: messages per Ockam
stream and per Wallaroo stream, decoded from the logged impulses.

The Ockam hub (:mod:`immortals.ockam.hub`), the Wallaroo worker
(:mod:`immortals.wallaroo.worker`) and the Wallaroo connector
(:mod:`immortals.wallaroo.connector`) log every read from a TCP peer as one impulse
``frames(peer_or_conn, now_ms, frames)``, the raw frames of their protocols; the hub also
logs ``configure(HubConfig)`` (its service names), the worker ``start(incarnation,
WorkerConfig)`` (its dialect) and the connector ``start(incarnation, ConnectorConfig)``
(its dialect and stream names), these two at every start. Their arguments are pickled by
the binding (:mod:`ambrosia_py.binding.codec`), so decoding them means unpickling what
the log holds. That runs only when asked (``ambrosia-py analyze --decode-services``, or
by default for logs this user's coordinators wrote: see :func:`own_logs`), and then
through :class:`_Unpickler`, which refuses every global but the three configuration
classes and the dialect enum (:data:`_ALLOWED_GLOBALS`, each by module and name): the
arguments are strings, integers and lists of bytes, so nothing else is ever needed, and
a hostile pickle cannot name a function to call. Unpickling untrusted bytes is still
parsing untrusted input: decode only logs you trust.

Which service an instance runs is read from the log itself, in log order: a
``configure`` carrying a ``HubConfig`` makes it an Ockam hub (role ``hub``), a ``start``
carrying a ``WorkerConfig`` a Wallaroo worker (``worker``) of that dialect, one carrying
a ``ConnectorConfig`` a Wallaroo connector (``connector``), whose received frames are the
worker's answers, its streams named from the config. Before any (a log whose start was
pruned), the first ``frames`` call that decodes whole as Ockam routing messages, or as
Wallaroo frames of exactly one dialect, decides the protocol (the role stays unknown).
Calls named like these of other services are reported as not decoded, never guessed at.
"""

from __future__ import annotations

import io
import os
import pickle
from collections.abc import Iterable, Iterator
from functools import cache
from pathlib import Path
from typing import Any

__all__ = [
    "SERVICE_COLUMNS",
    "STARTS_LOGGED",
    "ServiceDecoder",
    "decode_partition",
    "load_args",
    "own_logs",
    "service_method_ids",
]

# The classes a transport impulse may carry (module, name), all of them this project's
# own value classes (attrs, frozen; unpickling one sets its fields and calls nothing
# else); nothing else is unpickled, and no module is allowed whole.
_ALLOWED_GLOBALS = frozenset(
    {
        ("immortals.ockam.service", "HubConfig"),
        ("immortals.wallaroo.worker_config", "WorkerConfig"),
        ("immortals.wallaroo.worker_core", "WorkerConfig"),  # where logs before it say
        ("immortals.wallaroo.connector_actions", "ConnectorConfig"),
        ("immortals.wallaroo.codec", "Dialect"),
    }
)

# The role of each instance whose service logs a new incarnation at every start (its
# ``start`` impulse): :mod:`.report_starts` tells its restarts from its checkpoints.
STARTS_LOGGED = ("worker", "connector")

# (name, Spark SQL type): one row per (instance, version, service, stream, request).
SERVICE_COLUMNS: tuple[tuple[str, str], ...] = (
    ("instance", "STRING"),
    ("version", "INT"),
    ("service", "STRING"),  # ockam, wallaroo, or unknown (calls not decoded)
    ("role", "STRING"),  # hub, worker, connector; null where no start or configure said
    ("stream", "STRING"),  # the stream's name; null for frames of no stream
    ("stream_id", "STRING"),  # Wallaroo's u64 stream id, in decimal (over a BIGINT)
    ("partition", "INT"),  # Ockam's partition
    ("request", "STRING"),  # the frame's class (PushRequest, Message, ...), or undecodable
    ("frames", "BIGINT"),
    ("bytes", "BIGINT"),  # the data a frame carries: a push's data, a message's payload
    ("problem", "STRING"),  # the first reason, with where, for undecodable rows
)


class _Unpickler(pickle.Unpickler):
    """Unpickles built-in values and the allowed configuration classes only."""

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in _ALLOWED_GLOBALS:
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"the global {module}.{name} is not allowed here")


def load_args(data: bytes) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """A call's pickled ``(args, kwargs)``, through the restricted unpickler.

    Raises ``pickle.UnpicklingError`` (or ValueError, EOFError, ...) for anything else.
    """
    obj = _Unpickler(io.BytesIO(data)).load()
    if not (
        isinstance(obj, tuple)
        and len(obj) == 2
        and isinstance(obj[0], tuple | list)
        and isinstance(obj[1], dict)
    ):
        raise ValueError("not the binding's (args, kwargs) pair")
    return tuple(obj[0]), obj[1]


@cache
def service_method_ids() -> dict[str, int]:
    """The method ids of the transport impulses, read from the immortals' classes."""
    from immortals.ockam.hub import OckamHub
    from immortals.wallaroo.connector import WallarooConnector
    from immortals.wallaroo.worker import WallarooWorker

    hub = OckamHub.rpc_methods_by_name()
    worker = WallarooWorker.rpc_methods_by_name()
    connector = WallarooConnector.rpc_methods_by_name()
    # The transports share their impulses' names, so their ids (hashes of the names).
    if not hub["frames"].id == worker["frames"].id == connector["frames"].id:
        raise AssertionError("the services' frames impulses differ in id")
    if worker["start"].id != connector["start"].id:
        raise AssertionError("the worker's and the connector's start impulses differ in id")
    return {
        "frames": hub["frames"].id,
        "configure": hub["configure"].id,
        "start": worker["start"].id,
    }


def own_logs(paths: Iterable[str | Path]) -> bool:
    """Whether every file in ``paths`` belongs to this user and no other user can write
    it: the logs of this user's own coordinators (which make them 0600), the default
    for decoding."""
    uid = os.getuid()
    for path in paths:
        st = os.stat(path)
        if st.st_uid != uid or st.st_mode & 0o022:
            return False
    return True


Key = tuple[str, str | None, str | None, int | None, str]  # service, stream, id, part, request


class ServiceDecoder:
    """Counts the frames of one instance version's transport impulses, fed in log order."""

    def __init__(self) -> None:
        self.kind: str | None = None  # "ockam" or "wallaroo", once known
        self.role: str | None = None  # "hub", "worker" or "connector", once a config says
        self.hub_config: Any = None
        self.dialect: Any = None
        self.names: dict[int, str] = {}  # Wallaroo stream id -> name (from NOTIFY)
        self.counts: dict[Key, list[int]] = {}
        self.problems: dict[str, str] = {}  # service -> the first problem

    def _count(self, key: Key, size: int) -> None:
        entry = self.counts.get(key)
        if entry is None:
            self.counts[key] = [1, size]
        else:
            entry[0] += 1
            entry[1] += size

    def _problem(self, service: str, where: str, reason: str) -> None:
        self._count((service, None, None, None, "undecodable"), 0)
        self.problems.setdefault(service, f"{where}: {reason}")

    def feed(self, method_id: int, payload: bytes, where: str) -> None:
        """One logged call to ``method_id`` (a transport impulse's id) with its pickled
        arguments; ``where`` (log file, offset, message index) names it in problems."""
        ids = service_method_ids()
        try:
            args, kwargs = load_args(payload)
        except Exception as exc:  # any failure to unpickle is the same finding
            self._problem(self.kind or "unknown", where, f"arguments not decoded ({exc})")
            return
        if kwargs:
            self._problem(self.kind or "unknown", where, "keyword arguments: not a transport")
            return
        if method_id == ids["configure"]:
            self._configure(args, where)
        elif method_id == ids["start"]:
            self._start(args, where)
        else:
            self._frames(args, where)

    def _configure(self, args: tuple[Any, ...], where: str) -> None:
        from immortals.ockam.service import HubConfig

        if len(args) == 1 and isinstance(args[0], HubConfig):
            self.kind, self.role, self.hub_config = "ockam", "hub", args[0]
        else:
            self._problem(self.kind or "unknown", where, "configure without a HubConfig")

    def _start(self, args: tuple[Any, ...], where: str) -> None:
        from immortals.wallaroo.codec import Dialect, stream_id_for
        from immortals.wallaroo.connector_actions import ConnectorConfig
        from immortals.wallaroo.worker_config import WorkerConfig

        config = args[1] if len(args) == 2 else None
        # Unpickling sets fields without the classes' validators: check what is used.
        if not isinstance(config, WorkerConfig | ConnectorConfig) or not isinstance(
            config.dialect, Dialect
        ):
            problem = "start without a WorkerConfig or ConnectorConfig"
            self._problem(self.kind or "unknown", where, problem)
            return
        self.kind, self.dialect = "wallaroo", config.dialect
        if isinstance(config, WorkerConfig):
            self.role = "worker"
            return
        self.role = "connector"
        streams = config.streams if isinstance(config.streams, tuple | list) else ()
        for name in streams:
            if isinstance(name, str):
                # The connector sends the NOTIFYs; its config names the streams.
                self.names.setdefault(stream_id_for(name), name)

    def _frames(self, args: tuple[Any, ...], where: str) -> None:
        if not (
            len(args) == 3
            and isinstance(args[2], list)
            and all(isinstance(f, bytes) for f in args[2])
        ):
            self._problem(self.kind or "unknown", where, "not (peer, now_ms, [frames])")
            return
        frames: list[bytes] = args[2]
        if self.kind is None:
            self._infer(frames)
        if self.kind == "ockam":
            for i, frame in enumerate(frames):
                self._ockam(frame, f"{where}, frame {i}")
        elif self.kind == "wallaroo":
            for i, frame in enumerate(frames):
                self._wallaroo(frame, f"{where}, frame {i}")
        else:
            self._problem("unknown", where, "frames of neither Ockam nor a Wallaroo dialect")

    def _infer(self, frames: list[bytes]) -> None:
        """Take the protocol the frames decode in whole (see the module docstring)."""
        from immortals.ockam.errors import OckamError
        from immortals.ockam.routing import decode_message
        from immortals.wallaroo.codec import Dialect, decode_tagged
        from immortals.wallaroo.errors import WallarooError

        if not frames:
            return
        try:
            for frame in frames:
                decode_message(frame)
        except OckamError:
            pass
        else:
            self.kind = "ockam"
            return
        fits = []
        for dialect in Dialect:
            try:
                for frame in frames:
                    decode_tagged(frame, dialect)
            except WallarooError:
                continue
            fits.append(dialect)
        if len(fits) == 1:
            self.kind, self.dialect = "wallaroo", fits[0]

    def _ockam(self, frame: bytes, where: str) -> None:
        """Count one Ockam TransportMessage by the stream it addresses and its request."""
        from immortals.ockam import codec
        from immortals.ockam.errors import OckamError
        from immortals.ockam.routing import AddressType, decode_message
        from immortals.ockam.service import HubConfig

        try:
            msg = decode_message(frame)
        except OckamError as exc:
            self._problem("ockam", where, str(exc))
            return
        if not msg.onward_route or msg.onward_route[0].type != AddressType.LOCAL:
            self._problem("ockam", where, "not addressed to a local worker of the hub")
            return
        config = self.hub_config or HubConfig()
        name = msg.onward_route[0].text
        try:
            request: Any = codec.decode_request(msg.payload)
        except OckamError as exc:
            self._problem("ockam", where, f"to {name}: {exc}")
            return
        kind = type(request).__name__
        stream: str | None
        partition: int | None = None
        if name in (config.stream_service, config.index_service):
            stream = getattr(request, "stream_name", None)
            partition = getattr(request, "partition", 0)
            if isinstance(request, codec.CreatePartitionedRequest):
                partition = None  # it creates partitions 0..n-1
        else:
            # A stream worker's address: "<stream service>.<partition>.<stream>".
            head, _, rest = name.partition(".")
            number, _, stream = rest.partition(".")
            if head != config.stream_service or not number.isdigit():
                self._problem("ockam", where, f"{kind} to unknown worker {name!r}")
                return
            partition = int(number)
        size = len(request.data) if isinstance(request, codec.PushRequest) else 0
        self._count(("ockam", stream, None, partition, kind), size)

    def _wallaroo(self, frame: bytes, where: str) -> None:
        """Count one Wallaroo frame (tag and body) by its stream and class."""
        from immortals.wallaroo.codec import decode_tagged
        from immortals.wallaroo.errors import WallarooError
        from immortals.wallaroo.frames import Message, Notify

        try:
            decoded: Any = decode_tagged(frame, self.dialect)
        except WallarooError as exc:
            self._problem("wallaroo", where, str(exc))
            return
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
        self._count(("wallaroo", name, None if sid is None else str(sid), None, kind), size)

    def rows(self, instance: str | None, version: int | None) -> Iterator[tuple[Any, ...]]:
        """The counts as rows of :data:`SERVICE_COLUMNS`."""
        for (service, stream, sid, partition, request), (n, size) in self.counts.items():
            problem = self.problems.get(service) if request == "undecodable" else None
            role = self.role if service == self.kind else None
            yield (instance, version, service, role, stream, sid, partition, request, n, size,
                   problem)  # fmt: skip


def decode_partition(batches: Iterator[Any]) -> Iterator[Any]:
    """``mapInPandas`` over transport impulses sorted by instance, version and log
    position: the counts of :class:`ServiceDecoder`, one DataFrame per partition."""
    import pandas as pd  # type: ignore[import-untyped]

    decoders: dict[tuple[Any, Any], ServiceDecoder] = {}
    for batch in batches:
        for row in batch.itertuples(index=False):
            key = (row.instance, None if pd.isna(row.version) else int(row.version))
            decoder = decoders.get(key)
            if decoder is None:
                decoder = decoders[key] = ServiceDecoder()
            where = f"{row.log_file}, offset {row.offset}, message {row.msg_index}"
            decoder.feed(int(row.method_id), bytes(row.payload), where)
    rows = [r for (i, v), d in decoders.items() for r in d.rows(i, v)]
    yield pd.DataFrame(rows, columns=[name for name, _ in SERVICE_COLUMNS])


def service_counts(messages: Any) -> Any:
    """The decoded counts (a pandas DataFrame of :data:`SERVICE_COLUMNS`) of the message
    rows ``messages`` (the data source's DataFrame, with payloads)."""
    from pyspark.sql import functions as F

    ids = list(service_method_ids().values())
    calls = (
        messages.where(
            (F.col("msg_type") == "RPC")
            & (F.col("rpc_type") != "return")
            & F.col("method_id").isin(ids)
            & F.col("check_ok")
        )
        .select("instance", "version", "log_file", "offset", "msg_index", "method_id", "payload")
        .withColumn(
            "log_number",
            F.regexp_extract("log_file", r"serverlog([0-9]+)$", 1).cast("long"),
        )
        # One instance version's calls in one partition, in log order.
        .repartition("instance", "version")
        .sortWithinPartitions("instance", "version", "log_number", "offset", "msg_index")
    )
    schema = ", ".join(f"`{name}` {kind}" for name, kind in SERVICE_COLUMNS)
    decoded = calls.mapInPandas(decode_partition, schema)
    keys = [name for name, _ in SERVICE_COLUMNS if name not in ("frames", "bytes", "problem")]
    out = (
        decoded.groupBy(*keys)
        .agg(
            F.sum("frames").alias("frames"),
            F.sum("bytes").alias("bytes"),
            F.first("problem", ignorenulls=True).alias("problem"),
        )
        .orderBy(*keys)
    )
    from .report_tables import to_pandas

    return to_pandas(out)
