"""The hub's core under its former module name, kept so that older logs and checkpoints
stay readable: they pickle :class:`HubConfig` (a logged ``configure``, and the state)
and :class:`StreamHub` (the state) by this module's path. The core is
:mod:`immortals.ockam.hub_core`; import from there.
"""

from __future__ import annotations

from .hub_core import HubConfig, StreamHub

__all__ = ["HubConfig", "StreamHub"]
