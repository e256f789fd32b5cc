"""Who may hold a connection on a server: a cap, and room for honest peers under a flood.

Every server the project runs (the links, the ingress, the Ockam hub, the Wallaroo
worker) admits connections through one :class:`Admission`. Its rule, in one place:

- A connection is *pending* from accept until it has proved itself (authenticated on
  the links and the ingress; a good HELLO on the worker; a first valid frame on the hub,
  whose protocol has no authentication), then *established*.
- At most ``max_connections`` are open. A newcomer that finds the table full evicts the
  **oldest pending** connection instead of being refused: a flood of connections that
  send nothing then churns through the pending slots, while an honest peer, which
  proves itself within a round trip of connecting, gets in. Only when every slot is
  established is the newcomer refused: an established connection is never evicted for
  one that has proved nothing.
- At most ``max_pending_per_source`` pending connections per source address (the host,
  not the port); past it the source's own oldest pending connection goes, so one
  address cannot take every pending slot from the others.

Sans-IO: the table holds no sockets. Each admitted connection gives a ``close``
callback that the table calls, with the reason, when it evicts the connection; the
adapter closes its transport and later calls :meth:`Admission.release` as it does for
any connection that ends (releasing twice is harmless).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable

import attrs

__all__ = ["Admission", "ConnectionLimits", "Slot", "source_of"]


@attrs.frozen
class ConnectionLimits:
    """The limits of one server's connections; each server sets its defaults in one place.

    ``handshake_timeout_s``: how long a pending connection may take to prove itself.
    ``max_pre_handshake_frame``: the largest frame read before that (a HELLO or a
    proof is a few hundred bytes). ``idle_timeout_s`` (0: none): an established
    connection that sends nothing this long is closed. ``max_buffered_output``: unsent
    bytes a connection may have before the server stops reading it; ``output_stall_s``:
    how long it may stay over that bound before it is closed.
    """

    max_connections: int = 128
    max_pending_per_source: int = 32
    handshake_timeout_s: float = 10.0
    max_pre_handshake_frame: int = 4096
    idle_timeout_s: float = 0.0
    max_buffered_output: int = 4 * 1024 * 1024
    output_stall_s: float = 30.0

    def __attrs_post_init__(self) -> None:
        for name in ("max_connections", "max_pending_per_source", "max_pre_handshake_frame"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, not {getattr(self, name)}")
        if self.max_buffered_output < 1:
            raise ValueError(
                f"max_buffered_output must be at least 1, not {self.max_buffered_output}"
            )
        for name in ("handshake_timeout_s", "output_stall_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be more than 0, not {getattr(self, name)}")
        if self.idle_timeout_s < 0:
            raise ValueError(f"idle_timeout_s must be 0 (none) or more, not {self.idle_timeout_s}")


def source_of(peer: object) -> str:
    """The source address of a peer name (``getpeername()``'s tuple, or ``host:port``)."""
    if isinstance(peer, tuple) and peer:
        return str(peer[0])
    text = str(peer)
    host, colon, port = text.rpartition(":")
    return host.strip("[]") if colon and port.isdigit() else text


class Slot:
    """One admitted connection's place in the table."""

    __slots__ = ("_close", "established", "source")

    def __init__(self, source: str, close: Callable[[str], None]) -> None:
        self.source = source
        self.established = False
        self._close = close

    def refusal_key(self, proved: str) -> str:
        """The count a line about this connection goes to in a :class:`RefusalLog`: its
        address, or, once it has proved itself, ``"<address> (<proved>)"``, so that a
        flood from the same address cannot hide an honest peer's trouble."""
        return f"{self.source} ({proved})" if self.established else self.source


class Admission:
    """The connection table of one server (see the module)."""

    def __init__(self, limits: ConnectionLimits) -> None:
        self.limits = limits
        self._open: set[Slot] = set()
        self._pending: OrderedDict[Slot, None] = OrderedDict()  # oldest first
        self._pending_by_source: dict[str, OrderedDict[Slot, None]] = {}
        self.evicted = 0  # pending connections closed to make room, since start

    @property
    def open(self) -> int:
        return len(self._open)

    @property
    def pending(self) -> int:
        return len(self._pending)

    def admit(self, source: str, close: Callable[[str], None]) -> Slot | None:
        """A slot for a new connection from ``source``, evicting a pending one if need
        be; None when every slot is taken by established connections (refuse it)."""
        limits = self.limits
        mine = self._pending_by_source.get(source)
        if mine is not None and len(mine) >= limits.max_pending_per_source:
            self._evict(
                next(iter(mine)),
                f"{limits.max_pending_per_source} connections from {source} are waiting to "
                "prove themselves already; the oldest goes",
            )
        if len(self._open) >= limits.max_connections:
            if not self._pending:
                return None
            self._evict(
                next(iter(self._pending)),
                f"all {limits.max_connections} connection slots are taken; the oldest "
                "connection that has not proved itself goes",
            )
        slot = Slot(source, close)
        self._open.add(slot)
        self._pending[slot] = None
        self._pending_by_source.setdefault(source, OrderedDict())[slot] = None
        return slot

    def establish(self, slot: Slot) -> None:
        """``slot``'s connection proved itself: it is never evicted from now on."""
        if slot.established or slot not in self._open:
            return
        slot.established = True
        self._unpend(slot)

    def release(self, slot: Slot) -> None:
        """``slot``'s connection ended (by either side, or evicted)."""
        self._open.discard(slot)
        self._unpend(slot)

    def _unpend(self, slot: Slot) -> None:
        if slot in self._pending:
            del self._pending[slot]
            mine = self._pending_by_source[slot.source]
            del mine[slot]
            if not mine:
                del self._pending_by_source[slot.source]

    def _evict(self, slot: Slot, why: str) -> None:
        self.release(slot)
        self.evicted += 1
        slot._close(why)
