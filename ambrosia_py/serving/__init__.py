"""What every server of the project shares at its edge: which connections it admits
(:class:`Admission`, :class:`ConnectionLimits`), back-pressure on what it writes
(:func:`wait_for_room`), and refusal logs a flood cannot grow (:class:`RefusalLog`).

The links, the ingress, the Ockam hub and the Wallaroo worker use these, so one rule
holds on every port; each server chooses its limits' defaults in one place. Nothing
here touches a socket but through the asyncio writer it is given.
"""

from .admission import Admission, ConnectionLimits, Slot, source_of
from .output import OutputStalled, buffered_output, limit_output, reset, wait_for_room
from .refusals import RefusalLog

__all__ = [
    "Admission",
    "ConnectionLimits",
    "OutputStalled",
    "RefusalLog",
    "Slot",
    "buffered_output",
    "limit_output",
    "reset",
    "source_of",
    "wait_for_room",
]
