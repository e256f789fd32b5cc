"""``ambrosia-py demo``: a pipeline of immortals SIGKILLed mid-stream, checked for
exactly once, analysed with Spark (:mod:`.command`)."""

from .command import demo

__all__ = ["demo"]
