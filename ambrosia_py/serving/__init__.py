"""What every server of the project shares at its edge: which connections it admits
(:class:`Admission`, :class:`ConnectionLimits`), accepting them so that each counts from
accept on, TLS handshake included (:class:`Listener`, :class:`Incoming`), back-pressure
on what it writes (:func:`wait_for_room`), and refusal logs a flood cannot grow
(:class:`RefusalLog`).

The links, the ingress, the Ockam hub and the Wallaroo worker use these, so one rule
holds on every port; each server chooses its limits' defaults in one place. The busiest
connections (the binding's two sockets, the links) are read and written through one
stream interface (:mod:`.stream`) with two backends: a raw non-blocking socket
(:mod:`.socket_stream`) and an asyncio transport, TLS included (:mod:`.transport_stream`).
"""

from .accept import Incoming, Listener
from .admission import Admission, ConnectionLimits, Slot, source_of
from .output import OutputStalled, buffered_output, limit_output, reset, wait_for_room
from .refusals import RefusalLog

__all__ = [
    "Admission",
    "ConnectionLimits",
    "Incoming",
    "Listener",
    "OutputStalled",
    "RefusalLog",
    "Slot",
    "buffered_output",
    "limit_output",
    "reset",
    "source_of",
    "wait_for_room",
]
