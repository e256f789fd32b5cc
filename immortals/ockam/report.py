"""The Ockam hub's part of ``ambrosia-py analyze``: a report plug-in
(:mod:`ambrosia_py.spark.report_plugins`), registered in ``pyproject.toml`` under the
entry point group ``ambrosia_py.report_services`` as :data:`REPORT`.

The hub (:mod:`.hub`) logs every read from a client as one impulse ``frames(peer,
now_ms, frames)``, the Ockam routing messages it read, and ``configure(HubConfig)`` (its
service names) when its configuration changes. A ``configure`` carrying a
:class:`~.hub_core.HubConfig` makes an instance a hub; each frame is then counted by the
stream it addresses and its request (its partition, and for a push the bytes of its
data). Unpickling a logged call allows :class:`~.hub_core.HubConfig` alone (under its
path, or its former one in older logs: :mod:`.service`), which pickles its dialect as a
string for that reason.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ambrosia_py.spark.report_plugins import Frame, Undecodable

from . import codec
from .errors import OckamError
from .hub import OckamHub
from .hub_core import HubConfig
from .routing import AddressType, decode_message

__all__ = ["REPORT", "OckamReport"]


class _HubReader:
    """One hub instance version's calls, in log order."""

    def __init__(self) -> None:
        self.role: str | None = None
        self.config: HubConfig | None = None

    def claims(self, method: str, args: tuple[Any, ...]) -> bool:
        if method == "configure" and len(args) == 1 and isinstance(args[0], HubConfig):
            self.role, self.config = "hub", args[0]
            return True
        return False

    def read(self, method: str, args: tuple[Any, ...]) -> Sequence[Frame | Undecodable]:
        if method == "configure":
            return [Undecodable("configure without a HubConfig")]
        if method != "frames":
            return [Undecodable(f"{method}: not a call the Ockam hub logs")]
        if not (
            len(args) == 3
            and isinstance(args[2], list)
            and all(isinstance(f, bytes) for f in args[2])
        ):
            return [Undecodable("not (peer, now_ms, [frames])")]
        return [self._frame(frame, i) for i, frame in enumerate(args[2])]

    def _frame(self, frame: bytes, index: int) -> Frame | Undecodable:
        """One Ockam TransportMessage, by the stream it addresses and its request."""
        try:
            msg = decode_message(frame)
        except OckamError as exc:
            return Undecodable(str(exc), index)
        if not msg.onward_route or msg.onward_route[0].type != AddressType.LOCAL:
            return Undecodable("not addressed to a local worker of the hub", index)
        config = self.config or HubConfig()
        name = msg.onward_route[0].text
        try:
            request: Any = codec.decode_request(msg.payload)
        except OckamError as exc:
            return Undecodable(f"to {name}: {exc}", index)
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
                return Undecodable(f"{kind} to unknown worker {name!r}", index)
            partition = int(number)
        size = len(request.data) if isinstance(request, codec.PushRequest) else 0
        return Frame(kind, stream, None, partition, size)


class OckamReport:
    """The hub's streams in the report: frames per stream, partition and request."""

    name = "ockam"
    title = "Ockam"
    about = (
        "Frames the Ockam hub received, decoded from its logged frames impulses: per "
        "stream and partition and request (PushRequest: messages stored; bytes: their data)."
    )
    charted = "PushRequest"
    restarts_logged: frozenset[str] = frozenset()  # configure is logged on a change only
    start_method = None
    allowed_globals = frozenset(
        {
            ("immortals.ockam.hub_core", "HubConfig"),
            ("immortals.ockam.service", "HubConfig"),  # its path in logs written before
        }
    )

    def methods(self) -> Mapping[str, int]:
        hub = OckamHub.rpc_methods_by_name()
        return {"frames": hub["frames"].id, "configure": hub["configure"].id}

    def reader(self) -> _HubReader:
        return _HubReader()


REPORT = OckamReport()
