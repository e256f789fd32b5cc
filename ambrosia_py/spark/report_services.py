"""The analytics report's view into the services built on the framework: messages per
stream, decoded from the calls their instances logged, by the services' own plug-ins.

Which services there are, which of their calls to read and how is each service's report
plug-in (:mod:`.report_plugins`, found by entry point): this module never names one.
A service's transport logs each read from a TCP peer as an impulse (its raw frames), and
its configuration at start; their arguments are pickled by the binding
(:mod:`ambrosia_py.binding.codec`), so decoding them means unpickling what the log holds.
That runs only when asked (``ambrosia-py analyze --decode-services``, or by default for
logs this user's coordinators wrote: see :func:`own_logs`), and then through
:class:`_Unpickler`, which refuses every global but the value classes the plug-ins list
(each by module and name, and only if it is a class): the arguments are strings,
integers, lists of bytes and those classes, so nothing else is ever needed, and a hostile
pickle cannot name a function to call. Unpickling untrusted bytes is still parsing
untrusted input: decode only logs you trust.

Which service an instance runs is read from the log itself, in log order
(:class:`ServiceDecoder`, as :mod:`.report_plugins` says): a call a plug-in claims (a
configuration) makes it the instance's; before any, the first call whose frames all
decode for exactly one plug-in decides. Calls no plug-in reads whole are reported as not
decoded, never guessed at.
"""

from __future__ import annotations

import io
import os
import pickle
from collections.abc import Iterable, Iterator, Sequence
from functools import cache
from pathlib import Path
from typing import Any

from .report_plugins import CallReader, Frame, ServiceReport, Undecodable, registered

# Also ``STARTS_LOGGED`` (:func:`starts_logged`), read from the plug-ins when imported.
__all__ = [
    "SERVICE_COLUMNS",
    "ServiceDecoder",
    "decode_partition",
    "load_args",
    "own_logs",
    "service_counts",
    "service_method_ids",
    "start_method_ids",
    "starts_logged",
]

# (name, Spark SQL type): one row per (instance, version, service, stream, request).
SERVICE_COLUMNS: tuple[tuple[str, str], ...] = (
    ("instance", "STRING"),
    ("version", "INT"),
    ("service", "STRING"),  # a plug-in's name, or unknown (calls not decoded)
    ("role", "STRING"),  # what the instance is to its service; null where no call said
    ("stream", "STRING"),  # the stream's name; null for frames of no stream
    ("stream_id", "STRING"),  # the service's numeric stream id, in decimal (u64 fits)
    ("partition", "INT"),  # the stream's partition, where the service has them
    ("request", "STRING"),  # the frame's class (PushRequest, Message, ...), or undecodable
    ("frames", "BIGINT"),
    ("bytes", "BIGINT"),  # the data a frame carries: a push's data, a message's payload
    ("problem", "STRING"),  # the first reason, with where, for undecodable rows
)


def __getattr__(name: str) -> Any:
    # STARTS_LOGGED is read from the plug-ins, so only once asked for.
    if name == "STARTS_LOGGED":
        return starts_logged()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def starts_logged(services: Sequence[ServiceReport] | None = None) -> tuple[str, ...]:
    """The roles whose service logs a new incarnation at every start (the plug-ins'
    :attr:`~.report_plugins.ServiceReport.restarts_logged`): :mod:`.report_starts` tells
    their restarts from their checkpoints. Also ``STARTS_LOGGED``."""
    plugins = registered() if services is None else services
    return tuple(sorted({role for s in plugins for role in s.restarts_logged}))


@cache
def _allowed(services: tuple[ServiceReport, ...]) -> frozenset[tuple[str, str]]:
    return frozenset(g for s in services for g in s.allowed_globals)


class _Unpickler(pickle.Unpickler):
    """Unpickles built-in values and the allowed classes only."""

    def __init__(self, data: bytes, allowed: frozenset[tuple[str, str]]) -> None:
        super().__init__(io.BytesIO(data))
        self.allowed = allowed

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) not in self.allowed:
            raise pickle.UnpicklingError(f"the global {module}.{name} is not allowed here")
        found = super().find_class(module, name)
        if not isinstance(found, type):  # a plug-in listed a function: never call it
            raise pickle.UnpicklingError(f"the global {module}.{name} is not a class")
        return found


def load_args(
    data: bytes, services: Sequence[ServiceReport] | None = None
) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """A call's pickled ``(args, kwargs)``, through the restricted unpickler allowing the
    classes of ``services`` (default: the registered plug-ins).

    Raises ``pickle.UnpicklingError`` (or ValueError, EOFError, ...) for anything else.
    """
    allowed = _allowed(tuple(registered() if services is None else services))
    obj = _Unpickler(data, allowed).load()
    if not (
        isinstance(obj, tuple)
        and len(obj) == 2
        and isinstance(obj[0], tuple | list)
        and isinstance(obj[1], dict)
    ):
        raise ValueError("not the binding's (args, kwargs) pair")
    return tuple(obj[0]), obj[1]


def _names(services: tuple[ServiceReport, ...]) -> dict[int, str]:
    """Method id -> name of every call the plug-ins read; one name means one method."""
    names: dict[int, str] = {}
    ids: dict[str, int] = {}
    for service in services:
        for name, method_id in service.methods().items():
            if names.setdefault(method_id, name) != name:
                raise ValueError(
                    f"method id {method_id} is {names[method_id]!r} to one report plug-in "
                    f"and {name!r} to {service.name!r}"
                )
            if ids.setdefault(name, method_id) != method_id:
                raise ValueError(f"the report plug-ins' {name!r} calls differ in id")
    return names


_method_names = cache(_names)


@cache
def service_method_ids() -> dict[str, int]:
    """The method ids of the calls the registered plug-ins read, by name."""
    return {name: method_id for method_id, name in _method_names(registered()).items()}


def start_method_ids(services: Sequence[ServiceReport] | None = None) -> list[int]:
    """The ids of the calls services log at every start (:func:`starts_logged`'s roles):
    a log holding one began at a restart (:mod:`.report_starts`)."""
    plugins = registered() if services is None else services
    return sorted({s.methods()[s.start_method] for s in plugins if s.start_method})


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
    """Counts the frames of one instance version's service calls, fed in log order, as
    the plug-ins read them (``services``; default: the registered ones)."""

    def __init__(self, services: Sequence[ServiceReport] | None = None) -> None:
        self.services = tuple(registered() if services is None else services)
        self.names = _method_names(self.services)
        self.service: ServiceReport | None = None  # the instance's, once known
        self.readers: dict[str, CallReader] = {}  # plug-in name -> its reader
        self.counts: dict[Key, list[int]] = {}
        self.problems: dict[str, str] = {}  # service -> the first problem

    @property
    def kind(self) -> str:
        """The instance's service's name, or ``unknown``."""
        return "unknown" if self.service is None else self.service.name

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
        """One logged call to ``method_id`` (one the plug-ins read) with its pickled
        arguments; ``where`` (log file, offset, message index) names it in problems."""
        method = self.names.get(method_id, f"#{method_id}")
        try:
            args, kwargs = load_args(payload, self.services)
        except Exception as exc:  # any failure to unpickle is the same finding
            self._problem(self.kind, where, f"arguments not decoded ({exc})")
            return
        if kwargs:
            self._problem(self.kind, where, "keyword arguments: not a logged transport call")
            return
        if self._claim(method, args):
            return
        if self.service is not None:
            reader = self.readers[self.service.name]
            self._record(self.service.name, reader.read(method, args), where)
            return
        fits = []
        for service in self.services:
            reader = service.reader()
            reading = reader.read(method, args)
            if reading and not any(isinstance(r, Undecodable) for r in reading):
                fits.append((service, reader, reading))
        if len(fits) == 1:
            service, reader, reading = fits[0]
            self.service, self.readers[service.name] = service, reader
            self._record(service.name, reading, where)
        elif fits:
            named = ", ".join(s.name for s, _, _ in fits)
            self._problem("unknown", where, f"{method}: decodes whole for several ({named})")
        else:
            self._problem("unknown", where, f"{method}: decodes whole for no service's report")

    def _claim(self, method: str, args: tuple[Any, ...]) -> bool:
        """Offer the call to the instance's service first, then to the others."""
        first = [] if self.service is None else [self.service]
        for service in first + [s for s in self.services if s is not self.service]:
            reader = self.readers.get(service.name) or service.reader()
            if reader.claims(method, args):
                self.service, self.readers[service.name] = service, reader
                return True
        return False

    def _record(self, service: str, reading: Iterable[Frame | Undecodable], where: str) -> None:
        for item in reading:
            if isinstance(item, Undecodable):
                at = where if item.frame is None else f"{where}, frame {item.frame}"
                self._problem(service, at, item.reason)
            else:
                sid = None if item.stream_id is None else str(item.stream_id)
                self._count((service, item.stream, sid, item.partition, item.request), item.size)

    def rows(self, instance: str | None, version: int | None) -> Iterator[tuple[Any, ...]]:
        """The counts as rows of :data:`SERVICE_COLUMNS`."""
        role = None if self.service is None else self.readers[self.service.name].role
        for (service, stream, sid, partition, request), (n, size) in self.counts.items():
            problem = self.problems.get(service) if request == "undecodable" else None
            mine = role if service == self.kind else None
            yield (instance, version, service, mine, stream, sid, partition, request, n, size,
                   problem)  # fmt: skip


def decode_partition(batches: Iterator[Any]) -> Iterator[Any]:
    """``mapInPandas`` over service calls sorted by instance, version and log position:
    the counts of :class:`ServiceDecoder`, one DataFrame per partition."""
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
