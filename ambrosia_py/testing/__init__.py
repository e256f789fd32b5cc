"""Testing immortals with pytest: real coordinators, crashes on demand, replay.

Installed as the pytest plugin ``ambrosia`` (fixtures ``ambrosia`` and
``ambrosia_replay``); the runner can also be used directly.
"""

from ..binding.replay import Divergence, ReplayResult, replay_instance
from .runner import ImmortalRunner, RunningImmortal

__all__ = ["Divergence", "ImmortalRunner", "ReplayResult", "RunningImmortal", "replay_instance"]
