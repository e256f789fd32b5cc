"""The bank soak: transfers between account immortals while their processes are SIGKILLed.

    python -m examples.bank.soak --transfers 20000 --kills 30

Three accounts (``examples/bank/account.py``), as on three machines: each runs under
``ambrosia-py run`` with its own data directory and coordinator, a fixed ``--link-port``,
``--link-to`` for the other two, and its own copy of one cluster secret (mode 0600); or,
with ``--registry etcd://...``, with neither: they find each other by name in etcd. While
the transfers run, the soak SIGKILLs a random account's service process, its coordinator,
or both, waits until both are gone, and runs the same command again (up once its
coordinator is ready). Kills are spaced by
progress (the number of transfers credited, from the accounts' reports), at points drawn
from a seeded ``random.Random``, so they land in the middle of the transfers.

Once every transfer has been credited, every account is SIGKILLed once more and restarted,
and its recovered state must equal the state it reported before. Then the audit
(:func:`audit`), from the reports alone: every transfer id debited exactly once and
credited exactly once, at the peer and with the amount its sender debited; none lost,
none twice; each balance the opening plus credits minus debits; the total unchanged.

Every wait has a deadline; a missed one raises :class:`SoakError` quoting the end of each
account's log (its coordinator's and binding's output). The test
``tests/test_bank_soak.py`` is a short run of this same code.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import attrs
import click

from ambrosia_py.testing import ServiceProcess, free_port
from ambrosia_py.testing.processes import Victim, wait_for

ACCOUNT_PY = Path(__file__).resolve().with_name("account.py")
NAMES = ("a", "b", "c")
KILL_KINDS: tuple[Victim, ...] = ("service", "coordinator", "both")
# What an account's recovered state must repeat (its tick count may still move after the
# last transfer: ticks already sent are handled, and change nothing else).
LEDGER = ("opening", "transfers", "balance", "debits", "credits", "duplicates")

Report = dict[str, Any]  # an account's report (its two JSON lines in one), see account.py


class SoakError(AssertionError):
    """A wait missed its deadline, or a process did not start or stop."""


@attrs.frozen
class Settings:
    """One soak's shape. ``transfers`` is the total over all accounts."""

    transfers: int = 3000
    kills: int = 6
    seed: int = 1
    opening: int = 10_000
    tick_ms: float = 10.0  # each account's pace: one tick every tick_ms ...
    batch: int = 1  # ... making this many transfers (a few hundred a second in all)
    max_down_s: float = 0.3  # an account stays down up to this long after a kill
    deadline_s: float = 60.0  # for each wait
    final_restart: bool = True  # kill and restart all once settled, compare their state
    registry: str | None = None  # a registry all share (etcd://...): no link ports given
    cluster: str = "ambrosia"  # its prefix


@attrs.frozen
class Kill:
    """One kill done: which account, which process(es), at what progress."""

    account: str
    kind: str
    credited: int
    down_s: float


@attrs.frozen
class Audit:
    """What the reports say about every transfer id (all lists must be empty)."""

    transfers: int
    debited: int
    credited: int
    lost: list[str]  # debited, never credited
    duplicated: list[str]  # credited more than once
    unexpected: list[str]  # credited, never debited, or at another account
    wrong_amount: list[str]  # credited with another amount than debited
    unbalanced: list[str]  # accounts whose balance is not opening + credits - debits
    total_before: int
    total_after: int

    @property
    def ok(self) -> bool:
        return (
            self.debited == self.credited == self.transfers
            and not (self.lost or self.duplicated or self.unexpected)
            and not (self.wrong_amount or self.unbalanced)
            and self.total_before == self.total_after
        )


@attrs.frozen
class SoakResult:
    audit: Audit
    kills: list[Kill]
    final_restarts: int
    wall_s: float


def audit(reports: dict[str, Report], transfers: dict[str, int]) -> Audit:
    """Check every transfer id in the accounts' reports; ``transfers``: per account."""
    expected: dict[str, tuple[str, int]] = {}  # transfer id -> (peer, amount)
    for name, r in reports.items():
        for index, (peer, amount) in enumerate(r["debits"]):
            expected[f"{name}:{index}"] = (peer, amount)
    credited: dict[str, tuple[str, int]] = {}
    duplicated: list[str] = []
    unexpected: list[str] = []
    wrong_amount: list[str] = []
    for name, r in reports.items():
        duplicated += r["duplicates"]
        for sender, by_index in r["credits"].items():
            for index, amount in by_index.items():
                tid = f"{sender}:{index}"
                credited[tid] = (name, amount)
                if tid not in expected or expected[tid][0] != name:
                    unexpected.append(tid)
                elif expected[tid][1] != amount:
                    wrong_amount.append(tid)
    unbalanced = []
    for name, r in reports.items():
        received = sum(sum(c.values()) for c in r["credits"].values())
        paid = sum(amount for _, amount in r["debits"])
        if r["balance"] != r["opening"] + received - paid:
            unbalanced.append(name)
    return Audit(
        transfers=sum(transfers.values()),
        debited=len(expected),
        credited=sum(r["credited"] for r in reports.values()),
        lost=sorted(set(expected) - set(credited)),
        duplicated=duplicated,
        unexpected=unexpected,
        wrong_amount=wrong_amount,
        unbalanced=unbalanced,
        total_before=sum(r["opening"] for r in reports.values()),
        total_after=sum(r["balance"] for r in reports.values()),
    )


def _wait_for(
    what: str, condition: Callable[[], bool], deadline_s: float, tails: Callable[[], str]
) -> None:
    try:
        wait_for(what, condition, deadline_s)
    except TimeoutError:
        raise SoakError(f"{what}: not within {deadline_s:.0f} s\n{tails()}") from None


class AccountProcess(ServiceProcess):
    """One account under ``ambrosia-py run``: its service process and its coordinator,
    with the soak's deadlines, and :class:`SoakError` for a missed one."""

    def __init__(self, name: str, root: Path, args: list[str]) -> None:
        self.name = name
        self.report_path = root / f"{name}.report.json"
        super().__init__(
            str(ACCOUNT_PY),
            name,
            root / name,
            [*args, "--report", str(self.report_path)],
            log=root / f"{name}.log",
        )

    def start(self, deadline_s: float = 60.0) -> None:
        """Run the same command again; wait until its coordinator is ready (its pid is
        needed to kill it). Kills land anywhere after that: while the binding attaches
        (between its two connections), during recovery, or later.
        """
        with self.log.open("ab") as log:
            log.write(f"=== soak: start {self.starts + 1} of {self.name} ===\n".encode())
        super().start()

        def ready() -> bool:
            if self.exited() is not None:
                raise SoakError(f"{self.name} exited ({self.exited()})\n{self.tail()}")
            return any(line.startswith("ready ") for line in self.output().splitlines())

        _wait_for(f"{self.name}'s coordinator ready", ready, deadline_s, self.tail)

    def kill(self, which: Victim = "both", timeout: float = 60.0) -> None:
        """SIGKILL the service process, the coordinator or both; wait until both are gone."""
        try:
            super().kill(which, timeout)
        except TimeoutError as exc:
            raise SoakError(f"{self.name} after SIGKILL of its {which}: {exc}") from None

    def read_report(self, ledger: bool = False) -> Report | None:
        """The account's report: its summary line, and with ``ledger`` every transfer."""
        try:
            with self.report_path.open() as f:
                data: Report = json.loads(f.readline())
                if ledger:
                    data.update(json.loads(f.readline()))
        except FileNotFoundError:
            return None
        return data

    def exited(self) -> int | None:
        """The exit status of the service process, if it ended (None: running)."""
        return None if self.proc is None else self.proc.poll()

    def tail(self, n: int = 4000) -> str:
        return f"--- {self.name}: the end of {self.log} ---\n" + (super().tail(n) or "(no log yet)")


def _per_account(total: int) -> dict[str, int]:
    share, extra = divmod(total, len(NAMES))
    return {name: share + (1 if i < extra else 0) for i, name in enumerate(NAMES)}


def _secret(root: Path) -> bytes:
    """The cluster secret; each account gets its own copy, as on its own machine."""
    secret = os.urandom(32)
    for name in NAMES:
        fd = os.open(root / f"{name}.secret", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        os.write(fd, secret)
        os.close(fd)
    return secret


class Bank:
    """The three accounts of one soak, and the waits on their reports."""

    def __init__(self, root: Path, settings: Settings) -> None:
        self.settings = settings
        self.transfers = _per_account(settings.transfers)
        ports = {} if settings.registry else {name: free_port() for name in NAMES}
        _secret(root)
        self.accounts: dict[str, AccountProcess] = {}
        for name in NAMES:
            others = [n for n in NAMES if n != name]
            if settings.registry is not None:  # by name, each on a port of its choosing
                args = ["--registry", settings.registry, "--cluster", settings.cluster]
            else:
                args = ["--link-port", str(ports[name])]
                for other in others:
                    args += ["--link-to", f"{other}=127.0.0.1:{ports[other]}"]
            args += ["--secret-file", str(root / f"{name}.secret")]
            args += ["--peers", ",".join(others), "--transfers", str(self.transfers[name])]
            args += ["--seed", str(settings.seed), "--opening", str(settings.opening)]
            args += ["--tick-ms", str(settings.tick_ms), "--batch", str(settings.batch)]
            self.accounts[name] = AccountProcess(name, root, args)

    def tails(self) -> str:
        return "\n".join(a.tail() for a in self.accounts.values())

    def reports(self, ledger: bool = False) -> dict[str, Report | None]:
        return {name: a.read_report(ledger) for name, a in self.accounts.items()}

    def credited(self) -> int:
        return sum(r["credited"] for r in self.reports().values() if r is not None)

    def settled(self) -> bool:
        """Every transfer made and credited, as the reports say."""
        reports = self.reports()
        made = all(r is not None and r["debited"] == self.transfers[n] for n, r in reports.items())
        return made and self.credited() >= sum(self.transfers.values())

    def wait(self, what: str, condition: Callable[[], bool]) -> None:
        """Wait for ``condition``; an account that exits meanwhile (unkilled) is a failure."""

        def check() -> bool:
            for name, account in self.accounts.items():
                status = account.exited()
                if status is not None:
                    raise SoakError(f"{name} exited by itself (status {status})\n{self.tails()}")
            return condition()

        _wait_for(what, check, self.settings.deadline_s, self.tails)

    def close(self) -> None:
        for account in self.accounts.values():
            account.stop()


def run_soak(root: Path, settings: Settings, progress: Callable[[str], None] = print) -> SoakResult:
    """Run one soak in ``root`` (it must be empty or absent); see the module docstring."""
    started = time.monotonic()
    root.mkdir(parents=True, exist_ok=True)
    rng = random.Random(settings.seed)
    bank = Bank(root, settings)
    try:
        for account in bank.accounts.values():
            account.start(settings.deadline_s)
        kills = _kill_while_transferring(bank, rng, progress)
        bank.wait("every transfer credited", bank.settled)
        final_restarts = _restart_all_and_compare(bank, rng) if settings.final_restart else 0
        reports = {n: r for n, r in bank.reports(ledger=True).items() if r is not None}
        result = audit(reports, bank.transfers)
    finally:
        bank.close()
    return SoakResult(result, kills, final_restarts, time.monotonic() - started)


def _kill_while_transferring(
    bank: Bank, rng: random.Random, progress: Callable[[str], None]
) -> list[Kill]:
    """SIGKILL random accounts at random points of progress, restarting each at once."""
    settings = bank.settings
    total = sum(bank.transfers.values())
    # Between 5% and 90% credited: early enough that transfers are still running.
    span = range(total // 20, max(total // 20 + settings.kills, total * 9 // 10))
    # Victims and kinds in turn, shuffled: every account and every kind of kill comes up
    # (given enough kills), in an order and at moments the seed decides.
    # (Nine kills make every pair of account and kind once.)
    victims = [(NAMES[i % 3], KILL_KINDS[(i + i // 3) % 3]) for i in range(settings.kills)]
    rng.shuffle(victims)
    kills = []
    for threshold, (name, kind) in zip(
        sorted(rng.choices(span, k=settings.kills)), victims, strict=True
    ):
        bank.wait(f"{threshold} transfers credited", _at_least(bank, threshold))
        down_s = rng.uniform(0, settings.max_down_s)
        credited = bank.credited()
        bank.accounts[name].kill(kind, settings.deadline_s)
        time.sleep(down_s)  # pacing: the others carry on without it for a while
        bank.accounts[name].start(settings.deadline_s)
        kills.append(Kill(name, kind, credited, down_s))
        progress(f"kill {len(kills)}: {name}'s {kind} at {credited} credited")
    return kills


def _at_least(bank: Bank, credited: int) -> Callable[[], bool]:
    return lambda: bank.credited() >= credited


def _restart_all_and_compare(bank: Bank, rng: random.Random) -> int:
    """Kill and restart every account; each must recover the state it last reported."""
    before = bank.reports(ledger=True)
    for name, account in bank.accounts.items():
        account.kill(rng.choice(KILL_KINDS), bank.settings.deadline_s)
        account.start(bank.settings.deadline_s)
        bank.wait(f"{name}'s report from its new incarnation", _reported_by(account))
        old, new = before[name] or {}, account.read_report(ledger=True) or {}
        changed = [k for k in LEDGER if old.get(k) != new.get(k)]
        if changed:
            raise SoakError(f"{name}'s recovered state differs from its last report in {changed}")
    return len(bank.accounts)


def _reported_by(account: AccountProcess) -> Callable[[], bool]:
    """Its report comes from the process running now (written once it is primary)."""
    pid = account.proc.pid if account.proc is not None else 0
    return lambda: (account.read_report() or {}).get("pid") == pid


_DEFAULT = attrs.fields(Settings)


@click.command()
@click.option("--transfers", default=20_000, show_default=True, help="Transfers in all.")
@click.option("--kills", default=30, show_default=True, help="SIGKILLs during the transfers.")
@click.option("--seed", default=_DEFAULT.seed.default, show_default=True, help="Kills, transfers.")
@click.option("--tick-ms", default=_DEFAULT.tick_ms.default, show_default=True, help="Tick pace.")
@click.option("--batch", default=_DEFAULT.batch.default, show_default=True, help="Per tick.")
@click.option("--keep", type=click.Path(path_type=Path), help="Run in this folder, keep it.")
@click.option("--registry", help="A registry all share (etcd://...), instead of --link-to.")
@click.option("--cluster", default=_DEFAULT.cluster.default, show_default=True, help="Its prefix.")
def main(keep: Path | None, **options: Any) -> None:
    """Run the bank soak and print its figures; exit status 1 if any transfer went wrong."""
    root = keep or Path(tempfile.mkdtemp(prefix="bank-soak-"))
    settings = Settings(**options)  # each option is the setting of its name
    try:
        result = run_soak(root, settings)
    finally:
        if keep is None:
            shutil.rmtree(root, ignore_errors=True)
    a = result.audit
    print(
        f"transfers {a.credited}/{a.transfers} credited, {a.debited} debited; "
        f"kills survived {len(result.kills)} (+{result.final_restarts} final restarts); "
        f"lost {len(a.lost)}, duplicated {len(a.duplicated)}, unexpected {len(a.unexpected)}, "
        f"wrong amount {len(a.wrong_amount)}, unbalanced {len(a.unbalanced)}; "
        f"total {a.total_before} -> {a.total_after}; wall {result.wall_s:.1f} s"
    )
    sys.exit(0 if a.ok else 1)


if __name__ == "__main__":
    main()
