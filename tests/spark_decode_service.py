"""A service whose log test_spark_decode.py decodes: pickle and json methods, arguments
by position, by keyword and by default, values JSON cannot hold (bytes, a dataclass, a
set), and one call whose arguments no longer fit the signature (decoded as an error)."""

from __future__ import annotations

import dataclasses
from typing import Any

from ambrosia_py import Immortal, rpc


@dataclasses.dataclass(frozen=True)
class Memo:
    text: str
    tags: frozenset[str]


class Ledger(Immortal):
    def __init__(self) -> None:
        self.balances: dict[str, int] = {}
        self.notes: list[str] = []
        self.done = False

    def on_first_start(self) -> None:
        self.me.deposit.fork("alice", amount=10)
        self.me.deposit.fork("bob")
        self.me.note.fork("héllo")
        self.me.attach.fork(b"\x00\xff", Memo("m", frozenset({"b", "a"})))
        self.me.finish.fork()

    @rpc
    def deposit(self, who: str, amount: int = 1) -> int:
        self.balances[who] = self.balances.get(who, 0) + amount
        return self.balances[who]

    @rpc(codec="json")
    def note(self, text: str) -> None:
        self.notes.append(text)

    @rpc
    def attach(self, blob: bytes, memo: Memo, *more: Any) -> None:
        self.notes.append(memo.text)

    @rpc
    def finish(self) -> None:
        self.done = True
