"""The report's plug-ins: how a service built on the framework has its logged calls
decoded into ``ambrosia-py analyze``'s report, the framework never knowing it by name.

A service's package registers one object, a :class:`ServiceReport`, as an entry point of
the group :data:`ENTRY_POINT_GROUP` (``ambrosia_py.report_services``) in its
distribution's metadata, e.g. in ``pyproject.toml``::

    [project.entry-points."ambrosia_py.report_services"]
    ockam = "immortals.ockam.report:REPORT"

:func:`registered` finds them with :mod:`importlib.metadata` (so a plug-in is seen once
its distribution is installed; an editable install is reinstalled to pick up a new one).
The report then, per instance version and in log order (:mod:`.report_services`):

1. reads only the calls the plug-ins name (:meth:`ServiceReport.methods`), and
   unpickles their arguments allowing no global but the classes the plug-ins list
   (:attr:`ServiceReport.allowed_globals`: value classes, each by module and name; a
   listed name that is not a class is refused too, so a hostile pickle cannot name a
   function to call);
2. offers each call to every plug-in's :class:`CallReader` (:meth:`CallReader.claims`):
   a call that says which service the instance runs (its configuration, logged at
   start) makes that plug-in the instance's;
3. hands the instance's other calls to that plug-in's reader (:meth:`CallReader.read`),
   which says what frames they carried (:class:`Frame`) or why not (:class:`Undecodable`);
4. before any call claimed the instance (a log whose start was pruned), a call whose
   frames all decode for exactly one plug-in (a fresh reader of each) decides it; calls
   no plug-in, or more than one, reads whole are reported as not decoded, never guessed at.

Each plug-in's rows become the table ``<name>_streams``, its section "<title> streams"
with a chart of its :attr:`ServiceReport.charted` frames per stream, and the total
``<name>_frames``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from functools import cache
from importlib.metadata import entry_points
from typing import Any, Protocol, runtime_checkable

import attrs

__all__ = [
    "ENTRY_POINT_GROUP",
    "CallReader",
    "Frame",
    "PluginError",
    "ServiceReport",
    "Undecodable",
    "registered",
]

ENTRY_POINT_GROUP = "ambrosia_py.report_services"

# A plug-in's name is part of table, file and column values: lower case, no spaces.
_NAME = re.compile(r"[a-z][a-z0-9_]*")


class PluginError(Exception):
    """A registered report plug-in that cannot be used: which, and why."""


@attrs.frozen
class Frame:
    """One frame a logged call carried, counted under its stream and request."""

    request: str  # the frame's kind (PushRequest, Message, ...)
    stream: str | None = None  # the stream's name; None for frames of no stream
    stream_id: int | None = None  # the service's numeric id of the stream, if it has one
    partition: int | None = None  # the stream's partition, if it has them
    size: int = 0  # the data the frame carries (a message's payload), in bytes


@attrs.frozen
class Undecodable:
    """A call, or one frame of it, that did not decode, and why."""

    reason: str
    frame: int | None = None  # the frame's index in the call; None: the call as a whole


@runtime_checkable
class CallReader(Protocol):
    """One instance version's calls, as one service reads them, fed in log order."""

    @property
    def role(self) -> str | None:
        """What the instance is to its service (``hub``, ``worker``, ...), once a call
        said; None before."""

    def claims(self, method: str, args: tuple[Any, ...]) -> bool:
        """Whether this call (``method`` by name, its unpickled positional arguments)
        says the instance runs this service, e.g. its configuration logged at start. If
        so the reader takes it in (the role, names it gives); if not it changes nothing."""

    def read(self, method: str, args: tuple[Any, ...]) -> Sequence[Frame | Undecodable]:
        """The frames one call carried, each decoded or the reason it was not; for a call
        that is not this service's, one :class:`Undecodable` saying so."""


@runtime_checkable
class ServiceReport(Protocol):
    """A service's part of the report: registered as an entry point (module docstring)."""

    @property
    def name(self) -> str:
        """Short and lower case (``ockam``): the rows' ``service``, the table
        ``<name>_streams`` and the total ``<name>_frames``."""

    @property
    def title(self) -> str:
        """As people write it (``Ockam``): the section "<title> streams" and its chart."""

    @property
    def about(self) -> str:
        """The section's text: which frames are counted, per what."""

    @property
    def charted(self) -> str:
        """The request the section's chart counts per stream (``PushRequest``)."""

    @property
    def restarts_logged(self) -> frozenset[str]:
        """The roles that log a new incarnation at every start, so that a log holding
        such a call began at a restart and one without at a checkpoint
        (:mod:`.report_starts`); empty if none."""

    @property
    def start_method(self) -> str | None:
        """The call those roles log at every start (``start``), one of :meth:`methods`;
        None if :attr:`restarts_logged` is empty."""

    @property
    def allowed_globals(self) -> frozenset[tuple[str, str]]:
        """The classes (module, name) the arguments of its calls may hold: value classes
        whose unpickling sets fields and calls nothing else. Nothing else unpickles."""

    def methods(self) -> Mapping[str, int]:
        """The calls it reads: method name -> id (from the service's classes)."""

    def reader(self) -> CallReader:
        """A fresh reader for one instance version."""


def _check(name: str, plugin: object) -> ServiceReport:
    where = f"report plug-in {name!r} ({ENTRY_POINT_GROUP})"
    if not isinstance(plugin, ServiceReport):
        raise PluginError(f"{where}: {type(plugin).__name__} is not a ServiceReport")
    if not _NAME.fullmatch(plugin.name):
        raise PluginError(f"{where}: name {plugin.name!r} is not lower case letters and digits")
    if (plugin.start_method is None) != (not plugin.restarts_logged) or (
        plugin.start_method is not None and plugin.start_method not in plugin.methods()
    ):
        raise PluginError(f"{where}: start_method must be one of its methods, with roles")
    allowed = plugin.allowed_globals
    if not isinstance(allowed, frozenset) or not all(
        isinstance(g, tuple)
        and len(g) == 2
        and all(isinstance(part, str) and part and "*" not in part for part in g)
        for g in allowed
    ):
        raise PluginError(f"{where}: allowed_globals must be a frozenset of (module, name)")
    return plugin


@cache
def registered() -> tuple[ServiceReport, ...]:
    """The installed report plug-ins, by name; :class:`PluginError` for one that cannot
    be loaded or is not a :class:`ServiceReport`, or for two of one name."""
    found: dict[str, ServiceReport] = {}
    for point in sorted(entry_points(group=ENTRY_POINT_GROUP), key=lambda p: p.name):
        try:
            loaded = point.load()
        except Exception as exc:
            raise PluginError(
                f"report plug-in {point.name!r} ({point.value}) does not load: {exc}"
            ) from exc
        plugin = _check(point.name, loaded)
        if plugin.name in found:
            raise PluginError(f"two report plug-ins are named {plugin.name!r}")
        found[plugin.name] = plugin
    return tuple(found.values())
