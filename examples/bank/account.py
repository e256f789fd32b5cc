"""A bank account immortal: accounts transfer money to each other, exactly once.

    ambrosia-py run examples/bank/account.py --instance a --peers b,c --transfers 1000

Each account is its own instance with its own coordinator (and, in the soak, its own data
directory, linked to the others with ``--link-to`` and one cluster secret). On first start
it forks itself ``open(...)`` with the options that shape its history (peers, number of
transfers, seed, opening balance): from then on they are logged input, not options.

How transfers are driven (and why this way):
- A ``@background`` ticker sends ``tick(batch)`` impulses at a steady pace. Ticks are input
  from the outside world, so the coordinator logs them; a tick's handler makes up to
  ``batch`` transfers. Pacing from outside, rather than a chain of self-calls, spreads the
  transfers over time, so a soak's crashes land in the middle of them.
- Transfer ``i`` of account ``s`` has the id ``s:i``. Its peer and planned amount come from
  a hash of (seed, sender, i) (:func:`plan`); the amount is capped at the balance, so
  balances never go negative (a transfer may carry less than planned, even 0).
- The handler debits itself, records ``(peer, amount)`` as debit ``i`` and forks
  ``peer.credit(sender, i, amount)``. Forks, not awaited calls: a handler waiting on a
  reply keeps every later message in the checkpoint's tail, and an account's peers may be
  down for seconds at a time. Exactly-once delivery of the fork is the framework's job.
- ``credit`` applies a transfer id at most once. A second delivery of an id would be a
  framework bug: it changes no balance but is recorded in ``duplicates`` so it shows.

What the outside sees: a second ``@background`` task writes a report of the state to
``--report`` whenever it changed, atomically, stamped with this process's pid: a JSON line
of figures (balance, debited, credited, duplicated), then a JSON line with every debit,
credit and duplicate. It reads the state between two records, so
a report shows what logged input built; after a restart the new incarnation writes the
recovered state at once. A report written by an effect would not do: effects are
suppressed in replay, so the last one before a crash could be lost for good.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
from pathlib import Path
from typing import Any

from ambrosia_py import Immortal, background, rpc

MAX_AMOUNT = 100  # planned amounts are 1..MAX_AMOUNT
MAX_TICKS_IN_FLIGHT = 4  # ticks sent but not yet handled, at most


def plan(seed: int, sender: str, peers: list[str], index: int) -> tuple[str, int]:
    """Transfer ``index`` of ``sender``: (peer, planned amount), a pure function."""
    digest = hashlib.blake2b(f"{seed}/{sender}/{index}".encode(), digest_size=8).digest()
    h = int.from_bytes(digest, "big")
    return peers[h % len(peers)], 1 + (h >> 32) % MAX_AMOUNT


def _write_report(path: Path, summary: dict[str, Any], ledger: dict[str, Any]) -> None:
    """Write the report atomically: a reader sees the old one or the new one, whole.

    Two JSON lines: the summary first, so a reader polling for progress parses only it,
    then the ledger (every debit and credit), which grows with the transfers.
    """
    tmp = path.with_name(path.name + ".tmp")
    lines = (json.dumps(part, separators=(",", ":")) for part in (summary, ledger))
    tmp.write_text("\n".join(lines) + "\n")
    os.replace(tmp, path)


class Account(Immortal):
    class Options:
        peers: str = ""  # the other accounts' instance names, comma-separated (first start)
        transfers: int = 100  # how many transfers this account makes (first start)
        seed: int = 1  # the seed of the transfer plan (first start)
        opening: int = 10_000  # the opening balance (first start)
        tick_ms: float = 5.0  # the ticker's pace: one tick every tick_ms
        batch: int = 1  # transfers per tick
        report: str = ""  # where the report goes (default: INSTANCE.report.json)
        report_ms: float = 100.0  # how often the report is refreshed, when it changed

    def __init__(self) -> None:
        self.name = ""
        self.peers: list[str] = []
        self.seed = 0
        self.transfers = 0  # how many this account makes in all
        self.opening = 0
        self.balance = 0
        self.debits: list[tuple[str, int]] = []  # debit i: (peer, amount) of transfer name:i
        self.credits: dict[str, dict[int, int]] = {}  # sender -> transfer index -> amount
        self.duplicates: list[str] = []  # transfer ids credited again (must stay empty)
        self.ticks = 0
        self.handled = 0  # messages handled: the report is rewritten when this moves

    def on_first_start(self) -> None:
        o = self.options
        peers = [p for p in o.peers.split(",") if p]
        self.me.open.fork(self.instance_name, peers, o.transfers, o.seed, o.opening)

    @rpc
    def open(self, name: str, peers: list[str], transfers: int, seed: int, opening: int) -> None:
        """The account's shape, fixed once (logged, so replay sees the same)."""
        self.handled += 1
        if not peers and transfers:
            raise ValueError(f"account {name!r} has transfers to make but no peers")
        self.name, self.peers, self.seed = name, peers, seed
        self.transfers, self.opening = transfers, opening
        self.balance += opening  # credits may have arrived first: add, do not set

    @rpc
    def tick(self, batch: int) -> None:
        """Make up to ``batch`` more transfers (an impulse from the ticker)."""
        self.handled += 1
        self.ticks += 1
        for _ in range(batch):
            index = len(self.debits)
            if index >= self.transfers:
                return
            peer, planned = plan(self.seed, self.name, self.peers, index)
            amount = min(planned, self.balance)
            self.balance -= amount
            self.debits.append((peer, amount))
            self.proxy(peer, Account).credit.fork(self.name, index, amount)

    @rpc
    def credit(self, sender: str, index: int, amount: int) -> None:
        """Apply transfer ``sender:index`` unless it already was."""
        self.handled += 1
        received = self.credits.setdefault(sender, {})
        if index in received:
            self.duplicates.append(f"{sender}:{index}")
            return
        received[index] = amount
        self.balance += amount

    # -- the outside world ---------------------------------------------------------------

    def summary(self) -> dict[str, Any]:
        """The report's first line: the figures."""
        return {
            "instance": self.instance_name,
            "pid": os.getpid(),
            "opening": self.opening,
            "transfers": self.transfers,
            "balance": self.balance,
            "debited": len(self.debits),
            "credited": sum(len(c) for c in self.credits.values()),
            "duplicated": len(self.duplicates),
            "ticks": self.ticks,
        }

    def ledger(self) -> dict[str, Any]:
        """The report's second line: every transfer (credits' indices become strings)."""
        return {"debits": self.debits, "credits": self.credits, "duplicates": self.duplicates}

    @background
    async def ticker(self) -> None:
        # Ticks are impulses: handled ones are counted in state, so at most a few are
        # waiting in the coordinator at any time, however slow it is.
        sent, handled_before = 0, self.ticks
        batch, pause = max(1, self.options.batch), self.options.tick_ms / 1000
        while True:
            in_flight = sent - (self.ticks - handled_before)
            if len(self.debits) < self.transfers and in_flight < MAX_TICKS_IN_FLIGHT:
                self.impulse.tick(batch)
                sent += 1
            await asyncio.sleep(pause)

    @background
    async def reporter(self) -> None:
        path = Path(self.options.report or f"{self.instance_name}.report.json")
        written = -1
        while True:
            if self.handled != written:
                written = self.handled
                _write_report(path, self.summary(), self.ledger())
            await asyncio.sleep(self.options.report_ms / 1000)
