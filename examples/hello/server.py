"""The hello server: answers greetings, counts them, and refuses one name.

    ambrosia-py run examples/hello/server.py --instance server

Its state is how often it greeted each name. A call to ``hello`` returns a value to the
caller's ``await``; a call to ``hello("nobody")`` raises, and the exception travels back
and is raised at the caller's ``await`` (return type 3 on the wire).
"""

from __future__ import annotations

from ambrosia_py import Immortal, rpc


class Refused(Exception):
    """The server does not greet this name."""


class HelloServer(Immortal):
    def __init__(self) -> None:
        self.greeted: dict[str, int] = {}
        self.calls = 0

    @rpc
    def hello(self, name: str) -> str:
        self.calls += 1
        if name == "nobody":
            raise Refused(f"no greeting for {name!r}")
        self.greeted[name] = self.greeted.get(name, 0) + 1
        return f"Hello, {name}! (greeting #{self.calls})"
