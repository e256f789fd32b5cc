"""Secondaries take checkpoints of their own, and one killed in the middle of one loses
nothing: three replicas of the counter share a SQLite registry, their logs roll every
few kilobytes (``AMBROSIA_LOG_TRIGGER_MB``), and callers add to the counter through the
ingress all along.

Replica 2 is armed to SIGKILL its coordinator at ``ic.replica.checkpoint.before_commit``
(``ambrosia_py/crashpoints.py``) the second time it gets there: its checkpoint file is
written, its ``replica-state`` not yet told. Started again, it must follow from the
checkpoint before that one, take checkpoints again, and keep its log short (the files
before its checkpoint dropped). Then the primary's machine is lost, a secondary takes
over, and every call is counted exactly once.
"""

from __future__ import annotations

import os
import re
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from ambrosia_py.coordinator.storage.files import InstanceFiles
from ambrosia_py.coordinator.storage.replica_state import load_replica_state
from ambrosia_py.testing import wait_for
from ambrosia_py.testing.processes import process_gone
from tests.test_replicas_failover import (
    COUNTER,
    DEADLINE,
    Callers,
    Machine,
    counted_once,
    current_term,
    installed,
    newer_term,
    sqlite_machines,
)

pytestmark = pytest.mark.timeout(300)

POINT = "ic.replica.checkpoint.before_commit"
TRIGGER = {"AMBROSIA_LOG_TRIGGER_MB": "0.004"}  # a roll every ~4 KB of log
FOLLOWS = re.compile(r"the binding follows the log from checkpoint (\d+)")
TAKEN = re.compile(r"checkpoint (\d+) taken as a secondary")
ROLLED = re.compile(r"rolled to log (\d+) at seq \d+ for a checkpoint")


def own_checkpoint(machine: Machine) -> int | None:
    """The checkpoint a replica recovers from (its ``replica-state``)."""
    state = load_replica_state(InstanceFiles(machine.data_dir, "counter", 0))
    return None if state is None else state.checkpoint


def log_numbers(machine: Machine) -> list[int]:
    return InstanceFiles(machine.data_dir, "counter", 0).log_numbers()


@pytest.fixture
def machines(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[list[Machine]]:
    monkeypatch.syspath_prepend(str(COUNTER.parent))
    group = sqlite_machines(tmp_path)
    try:
        yield group
    finally:
        for m in group:
            m.stop()


def test_a_secondary_killed_mid_checkpoint_follows_again_and_nothing_is_lost(
    machines: list[Machine], tmp_path: Path
) -> None:
    marker = tmp_path / "crash-marker"
    env = {**os.environ, **TRIGGER}
    armed = {**env, "AMBROSIA_CRASH_AT": f"{POINT}:2", "AMBROSIA_CRASH_MARKER": str(marker)}
    first, second, victim = machines
    first.start(env)
    second.start(env)
    victim.start(armed)
    registry = first.registry
    wait_for("a primary", lambda: current_term(registry) is not None, DEADLINE)
    for m in (second, victim):
        wait_for(f"replica {m.replica} to hold a checkpoint", lambda m=m: installed(m), DEADLINE)
    callers = Callers(registry, first.secret, 4)
    callers.start()
    try:
        # Replica 2 takes one checkpoint of its own, then dies writing the next.
        wait_for("the crash point", lambda: marker.exists() and POINT in marker.read_text(), 120)
        killed = re.search(
            rf"{re.escape(POINT)} reached \(time 2\) in pid (\d+)", marker.read_text()
        )
        assert killed is not None
        wait_for("the armed coordinator to be gone", lambda: process_gone(int(killed[1])), 30)
        crashed = victim.process_output()
        assert len(TAKEN.findall(crashed)) == 1
        uncommitted = int(ROLLED.findall(crashed)[-1])
        committed = own_checkpoint(victim)
        assert committed is not None and committed < uncommitted
        victim.stop()

        # Started again, unarmed: it follows from the checkpoint it had committed.
        victim.start(env)
        wait_for(
            "replica 2 to follow again", lambda: FOLLOWS.search(victim.process_output()), DEADLINE
        )
        found = FOLLOWS.search(victim.process_output())
        assert found is not None and int(found.group(1)) == committed
        wait_for(
            "replica 2 to take a checkpoint again",
            lambda: TAKEN.search(victim.process_output()),
            DEADLINE,
        )
        callers.wait_answers(100)
        # Its log starts at its checkpoint: the files before it are dropped (just after
        # the checkpoint is committed, so looked for until they are).
        now = own_checkpoint(victim)
        assert now is not None and now > committed

        def dropped() -> bool:
            checkpoint = own_checkpoint(victim)  # read first: it only moves on
            return checkpoint is not None and min(log_numbers(victim)) >= checkpoint

        wait_for("replica 2's files before its checkpoint to be dropped", dropped, DEADLINE)

        # The primary's machine is lost; a secondary takes over from its own files.
        term = current_term(registry)
        assert term is not None
        machines[term.replica].lose()
        wait_for("a new primary", lambda: newer_term(registry, term), DEADLINE)
        callers.wait_answers(100)
    finally:
        callers.stop()
    counted_once(callers)


def test_a_lagging_secondary_sent_a_checkpoint_reloads_its_binding(
    machines: list[Machine],
) -> None:
    """Replica 2 is killed while the others go on and replica 1 checkpoints itself past
    where replica 2's log ends. Then replica 1 is paused (SIGSTOP), the primary killed
    and replica 2 started again: alone, its binding follows from its own checkpoint.
    Replica 1 resumed takes over, and its log no longer holds where replica 2's ends, so
    replica 2 is sent replica 1's checkpoint while its binding follows, and reloads it
    (the pause makes that order certain: a replica sent a checkpoint before its binding
    starts only ever loads that one). Replica 2 is then made primary
    (the others killed in turn), and the counter it serves must hold every call exactly
    once."""
    env = {**os.environ, **TRIGGER}
    for m in machines:
        m.start(env)
    first, second, lagging = machines
    registry = first.registry
    wait_for("a primary", lambda: current_term(registry) is not None, DEADLINE)
    for m in (second, lagging):
        wait_for(
            f"replica {m.replica} to follow",
            lambda m=m: FOLLOWS.search(m.process_output()),
            DEADLINE,
        )
    callers = Callers(registry, first.secret, 4)
    callers.start()
    try:
        callers.wait_answers(50)
        assert lagging.process is not None and first.process is not None
        lagging.process.kill("both")
        taken_before = len(TAKEN.findall(second.process_output()))
        wait_for(
            "replica 1 to checkpoint itself three times",
            lambda: len(TAKEN.findall(second.process_output())) >= taken_before + 3,
            DEADLINE,
        )
        term = current_term(registry)
        assert term is not None and term.replica == 0
        assert second.process is not None and second.process.proc is not None
        paused = [second.process.proc.pid, second.process.coordinator_pid()]
        for pid in paused:
            assert pid is not None
            os.kill(pid, signal.SIGSTOP)
        try:
            first.process.kill("both")
            lagging.start(env)
            wait_for(
                "replica 2's binding to follow its own checkpoint",
                lambda: FOLLOWS.search(lagging.process_output()),
                DEADLINE,
            )
        finally:
            for pid in paused:
                assert pid is not None
                os.kill(pid, signal.SIGCONT)

        def second_leads() -> bool:  # its log is longer: replica 2's terms are outranked
            now = current_term(registry)
            return now is not None and now.replica == second.replica and now.epoch > term.epoch

        wait_for("replica 1 to take the role", second_leads, DEADLINE)
        wait_for(
            "replica 2 to reload from a shipped checkpoint",
            lambda: len(FOLLOWS.findall(lagging.process_output())) >= 2,
            DEADLINE,
            context=lambda: "replica 2 printed:\n" + lagging.process_output()[-4000:],
        )
        out = lagging.process_output()
        assert out.index("installed a shipped checkpoint") > FOLLOWS.search(out).start()  # type: ignore[union-attr]
        callers.wait_answers(100)
        first.start(env)
        # Replica 2 takes the role: the others lose theirs in turn.
        for _ in range(6):
            term = current_term(registry)
            assert term is not None
            if term.replica == lagging.replica:
                break
            victim = machines[term.replica]
            assert victim.process is not None
            victim.process.kill("both")
            wait_for("a new primary", lambda t=term: newer_term(registry, t), DEADLINE)
            callers.wait_answers(30)
            victim.start(env)
            wait_for(
                f"replica {victim.replica} to follow again",
                lambda v=victim: FOLLOWS.search(v.process_output()),
                DEADLINE,
            )
        term = current_term(registry)
        assert term is not None and term.replica == lagging.replica
        callers.wait_answers(100)
    finally:
        callers.stop()
    counted_once(callers)


KEPT = re.compile(r"checkpoint (\d+) committed \(taken by a secondary")
ASKED = re.compile(r"rolled to log \d+; asking for checkpoint (\d+)")


def test_the_primary_keeps_what_its_secondaries_take_and_recovers_from_it(
    machines: list[Machine],
) -> None:
    """At its size trigger the primary rolls its log and asks a secondary for the state
    there (its binding does not pause to take it); what comes back becomes its
    checkpoint, recorded in its ``replica-state``. Killed and started again, it
    recovers from such a checkpoint, and every call is counted once."""
    env = {**os.environ, **TRIGGER}
    for m in machines:
        m.start(env)
    registry = machines[0].registry
    wait_for("a primary", lambda: current_term(registry) is not None, DEADLINE)
    for m in machines[1:]:
        wait_for(f"replica {m.replica} to follow", lambda m=m: installed(m), DEADLINE)
    term = current_term(registry)
    assert term is not None
    primary = machines[term.replica]

    def kept() -> set[int]:
        return {int(n) for n in KEPT.findall(primary.process_output())}

    callers = Callers(registry, machines[0].secret, 4)
    callers.start()
    try:
        wait_for(
            "the primary to recover from the third checkpoint its secondaries took",
            lambda: len(kept()) >= 3 and own_checkpoint(primary) in kept(),
            DEADLINE,
            context=lambda: primary.process_output()[-3000:],
        )
    finally:
        callers.stop()  # no more rolls: what the primary recovers from stays put
    asked = ASKED.findall(primary.process_output())
    print(f"the primary kept {len(kept())} checkpoints a secondary took; its binding took {asked}")
    recover_from = own_checkpoint(primary)
    assert recover_from in kept()
    assert primary.process is not None
    primary.process.kill("both")
    wait_for("a new primary", lambda: newer_term(registry, term), DEADLINE)
    primary.start(env)
    wait_for(
        f"replica {primary.replica} to follow again",
        lambda: FOLLOWS.search(primary.process_output()),
        DEADLINE,
    )
    found = FOLLOWS.search(primary.process_output())
    assert found is not None and int(found.group(1)) == recover_from
    later = Callers(registry, machines[0].secret, 4)
    later.start()
    try:
        later.wait_answers(50)
    finally:
        later.stop()
    later.answers += callers.answers
    counted_once(later)


SHIP = "ic.replica.checkpoint.before_ship"


def test_a_secondary_killed_before_sending_the_primary_its_checkpoint_is_asked_again(
    machines: list[Machine], tmp_path: Path
) -> None:
    """Both secondaries are armed to SIGKILL their coordinator the first time they have
    taken a checkpoint for the primary and not yet sent it. Each that dies is started
    again, unarmed; the primary goes on, asks again at a later roll, keeps what comes,
    and every call is counted once."""
    env = {**os.environ, **TRIGGER}
    markers = {r: tmp_path / f"crash-marker-{r}" for r in (1, 2)}
    machines[0].start(env)
    for r in (1, 2):
        armed = {**env, "AMBROSIA_CRASH_AT": f"{SHIP}:1", "AMBROSIA_CRASH_MARKER": str(markers[r])}
        machines[r].start(armed)
    registry = machines[0].registry
    wait_for("a primary", lambda: current_term(registry) is not None, DEADLINE)
    term = current_term(registry)
    assert term is not None and term.replica == 0  # replica 0 founds the instance
    primary = machines[0]
    for m in machines[1:]:
        wait_for(f"replica {m.replica} to follow", lambda m=m: installed(m), DEADLINE)
    crashed: dict[int, int] = {}  # replica -> checkpoints the primary had kept then

    def restart_the_crashed() -> None:
        for r, marker in markers.items():
            if r in crashed or not marker.exists() or SHIP not in marker.read_text():
                continue
            pid = re.search(
                rf"{re.escape(SHIP)} reached \(time 1\) in pid (\d+)", marker.read_text()
            )
            assert pid is not None
            gone = int(pid[1])
            wait_for(f"replica {r}'s coordinator to be gone", lambda p=gone: process_gone(p), 30)
            crashed[r] = len(KEPT.findall(primary.process_output()))
            machines[r].stop()
            machines[r].start(env)

    def kept_after_a_crash() -> bool:
        restart_the_crashed()
        kept = len(KEPT.findall(primary.process_output()))
        return bool(crashed) and kept > min(crashed.values())

    callers = Callers(registry, primary.secret, 4)
    callers.start()
    try:
        wait_for(
            "the primary to keep a checkpoint after a secondary died before sending one",
            kept_after_a_crash,
            DEADLINE,
            context=lambda: primary.process_output()[-3000:],
        )
        callers.wait_answers(50)
        assert current_term(registry) == term  # the primary served throughout
    finally:
        callers.stop()
    counted_once(callers)
