"""Testing immortals with pytest: real coordinators, crashes on demand, replay.

Installed as the pytest plugin ``ambrosia`` (fixtures ``ambrosia`` and
``ambrosia_replay``); the runner can also be used directly (``RunningImmortal.wait_logged``
waits until the impulses sent are durable, before a kill). :class:`ServiceProcess` runs
an immortal as real processes (``ambrosia-py run`` and its coordinator) to SIGKILL;
:func:`wait_for` and :func:`readline_within` wait on them with a deadline.
"""

from ..binding.replay import Divergence, ReplayResult, replay_instance
from .ports import free_port
from .processes import ServiceProcess, readline_within, wait_for
from .runner import ImmortalRunner, RunningImmortal

__all__ = [
    "Divergence",
    "ImmortalRunner",
    "ReplayResult",
    "RunningImmortal",
    "ServiceProcess",
    "free_port",
    "readline_within",
    "replay_instance",
    "wait_for",
]
