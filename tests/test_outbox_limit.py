"""The sender's outbox limit and the forwarding that makes it safe (the bounded outbox:
coordinator/links/protocol.py OutboxBudget, coordinator/core/forwarding.py).

Past ``--max-outbox-mb`` of output not yet confirmed by its destinations, a coordinator
stops reading its binding, which then blocks; it reads again once commits bring the total
below three quarters of the limit. Durable records reach the binding through a forwarder
that never holds up the commit loop and keeps what the binding has not taken in the log,
not in memory: so two instances over their limits towards each other do not deadlock,
and a binding that reads slowly does not grow its coordinator.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import time
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ambrosia_py import Immortal, eventloop, rpc, wire
from ambrosia_py.cli.coordinator import link_argv, link_settings, pop_link_security
from ambrosia_py.coordinator.core.binding_link import BindingLink
from ambrosia_py.coordinator.core.forwarding import Forwarder, LogPlace
from ambrosia_py.coordinator.core.intake import IcState, Intake
from ambrosia_py.coordinator.links.config import MAX_OUTBOX_ENV, LinkSettings
from ambrosia_py.coordinator.links.protocol import Outbox, OutboxBudget
from ambrosia_py.coordinator.storage.files import CorruptLogError, LogWriter, log_bytes_in
from ambrosia_py.coordinator.storage.scan import LogScan
from ambrosia_py.testing import ImmortalRunner
from ambrosia_py.wire import AttachTo, OutgoingRpc, RpcType, encode_message
from tests.fake_binding import DEADLINE, checkpoint, coordinator, frame, incoming_fork, self_fork
from tests.link_peer import COMMIT, REPLAY_FROM, Peer

MiB = 1024 * 1024

# --- sans-IO: the budget -------------------------------------------------------------------


def test_outbox_bytes_are_counted_as_added_committed_and_restored() -> None:
    budget = OutboxBudget(1000)
    a = Outbox(budget=budget)
    b = Outbox(budget=budget)
    for i in range(4):
        a.add(bytes(10 * (i + 1)))  # 10, 20, 30, 40
    b.add(bytes(5))
    assert (a.size, b.size, budget.total) == (100, 5, 105)
    a.connected(0)
    a.take(1 << 20)
    a.commit(2)  # the destination has 10 + 20 durably
    assert (a.size, budget.total) == (70, 75)
    a.commit(2)  # a repeated commit drops nothing more
    assert budget.total == 75
    # A checkpoint keeps what is unconfirmed; restored, it counts again, in a new budget.
    intake = Intake("client", max_outbox_bytes=1000)
    intake.restore_outboxes({"a": (a.next_seq, a.buffered), "b": (b.next_seq, b.buffered)})
    assert intake.outbox_budget.total == 75
    assert {d: box.size for d, box in intake.outboxes.items()} == {"a": 70, "b": 5}
    state = IcState(1, 0, 0, 0, b"", outboxes=intake.outbox_snapshot())
    back = IcState.decode(b"".join(bytes(p) for p in state.encode_parts()), "serverchkpt2")
    again = Intake("client", max_outbox_bytes=1000)
    again.restore_outboxes(back.outboxes)
    assert again.outbox_budget.total == 75


def test_the_binding_pauses_past_the_limit_and_resumes_below_three_quarters() -> None:
    budget = OutboxBudget(100)
    resumed: list[int] = []
    budget.on_resume = lambda: resumed.append(budget.total)
    box = Outbox(budget=budget)
    box.connected(0)
    for _ in range(10):
        box.add(bytes(10))
    assert budget.total == 100 and not budget.paused  # at the limit is not past it
    box.add(bytes(1))
    assert budget.paused
    box.take(1 << 20)
    box.commit(2)  # 81 bytes left: below the limit, not below 75
    box.commit(3)  # 71: resumes
    assert not budget.paused and resumed == [71]
    assert budget.resume_below == 75


def test_output_for_other_instances_pauses_the_intake_past_its_limit() -> None:
    intake = Intake("client", max_outbox_bytes=3 * 1024)
    call = encode_message(OutgoingRpc("server", 7, RpcType.FORK, bytes(1000)))
    intake.receive_data(encode_message(AttachTo("server")) + call * 3)
    assert not intake.outbox_budget.paused
    intake.receive_data(call)
    assert intake.outbox_budget.paused
    assert intake.outbox_budget.total == intake.outboxes["server"].size > 3 * 1024
    with pytest.raises(ValueError, match="above 0 bytes"):
        OutboxBudget(0)


@given(
    st.integers(1, 200),
    st.lists(
        st.tuples(st.sampled_from(["add", "commit"]), st.integers(0, 2), st.integers(0, 60)),
        max_size=120,
    ),
)
def test_the_budget_is_the_sum_of_the_outboxes_and_pauses_with_hysteresis(
    limit: int, ops: list[tuple[str, int, int]]
) -> None:
    """Against a model: total = what the outboxes hold; paused from the first add past the
    limit until the first commit that brings the total below 3/4 of it, and on_resume
    called exactly at those ends."""
    budget = OutboxBudget(limit)
    resumes = []
    budget.on_resume = lambda: resumes.append(budget.total)
    boxes = [Outbox(budget=budget) for _ in range(3)]
    for box in boxes:
        box.connected(0)
    paused = False
    expected_resumes = 0
    for op, which, n in ops:
        box = boxes[which]
        if op == "add":
            box.add(bytes(n))
            paused = paused or budget.total > limit
        else:
            box.take(1 << 20)
            box.commit(min(box.first + n % 5, box.next_seq))
            if paused and budget.total < int(limit * 0.75):
                paused = False
                expected_resumes += 1
        assert budget.total == sum(b.size for b in boxes)
        assert budget.total == sum(len(f) for b in boxes for _, f in b.buffered)
        assert budget.paused == paused
        assert paused or budget.total <= limit
        assert len(resumes) == expected_resumes


def test_the_limit_is_an_option_of_coordinator_and_run_passed_on_by_run() -> None:
    assert LinkSettings().max_outbox_bytes == 256 * MiB
    assert link_settings(max_outbox_mb=0.5).max_outbox_bytes == MiB // 2
    argv = link_argv("127.0.0.1", 0, (), **pop_link_security({"max_outbox_mb": 1.5, "x": 1}))
    assert argv[argv.index("--max-outbox-mb") + 1] == "1.5"


# --- the forwarder: real sockets, a real log -----------------------------------------------


def _append_record(writer: LogWriter, seq: int, body: bytes) -> tuple[list[wire.Payload], LogPlace]:
    """Write one record in disk form (one watermark in its tail); return what to put."""
    wire_header, disk_header = wire.record_headers(42, seq, [body])
    tail = wire.encode_disk_tail([wire.Watermark("peer", seq, seq)])
    place = LogPlace.next_in(writer, [disk_header, body, tail])
    writer.append([disk_header, body, tail])
    return [wire_header, body], place


def _read_records(sock: socket.socket, count: int) -> list[wire.RawRecord]:
    """A binding that reads only now: ``count`` records (control ones included)."""
    reader = wire.RecordReader()
    out: list[wire.RawRecord] = []
    sock.settimeout(DEADLINE)
    while len(out) < count:
        data = sock.recv(64 * 1024)
        assert data, f"the coordinator side closed after {len(out)} records"
        reader.feed(data)
        while (raw := reader.next_raw()) is not None:
            out.append(raw)
    return out


def _body(seq: int) -> bytes:
    return incoming_fork(5, seq.to_bytes(4, "little") * 8192)  # 32 KiB of call


def test_the_forwarder_keeps_what_the_binding_has_not_taken_in_the_log(tmp_path: Path) -> None:
    """600 records of 32 KiB (19 MiB) for a binding that reads nothing until the end, over
    two logs with a control record between them: at most 1 MiB stays in memory, the rest
    is read back from the logs, and the binding gets every record once, in order."""

    async def main() -> tuple[list[wire.RawRecord], int, int]:
        ours, binding_side = socket.socketpair()
        receive, _unused = socket.socketpair()
        receive.setblocking(False)
        link = BindingLink(receive, ours)
        stops: list[int] = []
        forwarder = Forwarder(link, lambda: stops.append(1), memory_bytes=MiB)
        writers = [LogWriter(tmp_path / "serverlog1"), LogWriter(tmp_path / "serverlog2")]
        try:
            for seq in range(600):
                if seq == 300:
                    forwarder.control(42, wire.TakeCheckpoint())
                forwarder.put(*_append_record(writers[seq >= 300], seq, _body(seq)))
                if seq % 50 == 0:
                    await asyncio.sleep(0)  # let the forwarder hand some to the socket
            held = forwarder.max_held_bytes
            records = await asyncio.to_thread(_read_records, binding_side, 601)
            await forwarder.flush()
            assert stops == [] and forwarder.error is None
            return records, held, forwarder.spilled_records
        finally:
            await forwarder.close()
            for w in writers:
                w.close()
            link.close()
            for s in (binding_side, _unused):
                s.close()

    records, held, spilled = asyncio.run(main())
    assert held <= MiB
    assert spilled > 500  # nearly all of them waited in the log
    assert [r.seq for r in records] == [*range(300), -1, *range(300, 600)]
    for r in records:
        if r.seq >= 0:
            assert bytes(r.body) == _body(r.seq)  # check bytes verified by the reader too
        else:
            assert isinstance(wire.RecordReader().decode(r)[0], wire.TakeCheckpoint)


def test_a_log_cut_under_the_forwarder_stops_it_naming_the_file_and_offset(
    tmp_path: Path,
) -> None:
    async def main() -> tuple[BaseException | None, list[int]]:
        ours, binding_side = socket.socketpair()
        receive, _unused = socket.socketpair()
        receive.setblocking(False)
        link = BindingLink(receive, ours)
        stops: list[int] = []
        forwarder = Forwarder(link, lambda: stops.append(1), memory_bytes=64 * 1024)
        path = tmp_path / "serverlog3"
        writer = LogWriter(path)
        try:
            for seq in range(40):
                forwarder.put(*_append_record(writer, seq, _body(seq)))
            os.truncate(path, writer.size - 1000)  # what a rogue process might do
            await asyncio.to_thread(_read_until_it_fails, binding_side, forwarder)
            await forwarder.flush()
            return forwarder.error, stops
        finally:
            await forwarder.close()
            writer.close()
            link.close()
            for s in (binding_side, _unused):
                s.close()

    error, stops = asyncio.run(main())
    assert isinstance(error, CorruptLogError)
    assert "serverlog3" in str(error) and "offset" in str(error)
    assert stops == [1]


def _read_until_it_fails(sock: socket.socket, forwarder: Forwarder) -> None:
    """Read whatever comes until the forwarder has failed (the socket stays open)."""
    sock.settimeout(0.05)
    deadline = time.monotonic() + DEADLINE
    while forwarder.error is None:
        assert time.monotonic() < deadline, "the forwarder never failed"
        with contextlib.suppress(TimeoutError):
            sock.recv(1 << 20)


# --- real coordinators ----------------------------------------------------------------------


class Pump(Immortal):
    """Forks ``count`` calls of ``size`` bytes to ``peer``, ``batch`` per record (each
    record forks the next batch to itself), and keeps the numbers of the calls it
    receives, in order. A batch larger than the socket buffers blocks the binding in its
    ``drain()`` once the coordinator stops reading it."""

    class Options:
        peer: str = "b"
        count: int = 0
        size: int = 16 * 1024
        batch: int = 1

    def __init__(self) -> None:
        self.sent = 0
        self.got: list[int] = []
        self.bad: list[int] = []

    def on_first_start(self) -> None:
        o = self.options
        if o.count:
            self.me.pump.fork(o.peer, o.count, o.size, o.batch, 0)

    @rpc
    def pump(self, peer: str, count: int, size: int, batch: int, start: int) -> None:
        other = self.proxy(peer, Pump)
        for i in range(start, min(start + batch, count)):
            other.take.fork(i, bytes([i % 251]) * size)
            self.sent = i + 1
        if self.sent < count:
            self.me.pump.fork(peer, count, size, batch, self.sent)

    @rpc
    def take(self, i: int, payload: bytes) -> None:
        if payload != bytes([i % 251]) * len(payload):
            self.bad.append(i)
        self.got.append(i)


def _status_kib(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1])
    raise AssertionError(f"no {field} in /proc/{pid}/status")


def _wait_for_line(path: Path, text: str) -> None:
    deadline = time.monotonic() + DEADLINE
    while text not in path.read_text(errors="replace"):
        assert time.monotonic() < deadline, f"{path.name} never said {text!r}"
        time.sleep(0.02)  # polling a log file, with a deadline


PAUSED = "not reading the binding"
COUNT = 3000  # calls of 16 KiB: 47 MiB, against a limit of 1 MiB


def test_a_sender_whose_destination_is_down_waits_in_bounded_memory_then_delivers_all(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(MAX_OUTBOX_ENV, "1")
    runner = ImmortalRunner(tmp_path, timeout=120)
    try:
        a = runner.start(Pump, "a", peer="b", count=COUNT, batch=16)
        _wait_for_line(a.ic_log, PAUSED)  # the binding has not been read for a second
        sent = a.state["sent"]
        rss = _status_kib(a.ic.pid, "VmRSS")
        peak = _status_kib(a.ic.pid, "VmHWM")
        # A's binding is blocked: nothing more was sent meanwhile, and far from all of it.
        assert a.state["sent"] == sent
        assert sent < COUNT // 3, sent
        # A coordinator starts at about 34 MiB; the 47 MiB of calls, unbounded, take it to
        # 80 MiB (docs/security.md, Outbox limit).
        assert peak < 56 * 1024, (rss, peak)
        print(f"\npaused after {sent} calls; coordinator RSS {rss} KiB, peak {peak} KiB")
        b = runner.start(Pump, "b")
        state = b.wait_until(lambda s: len(s["got"]) >= COUNT)
        assert state["got"] == list(range(COUNT)) and state["bad"] == []
        assert a.state["sent"] == COUNT
        peak = _status_kib(a.ic.pid, "VmHWM")
        print(f"all {COUNT} calls delivered; sender's coordinator peak RSS {peak} KiB")
        assert peak < 56 * 1024
    finally:
        runner.close()


@pytest.mark.parametrize("loop", eventloop.LOOPS)
def test_a_coordinator_commits_what_peers_send_while_its_binding_reads_nothing(
    tmp_path: Path, loop: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What rules the deadlock out, deterministically: a peer sends 64 MiB of calls to a
    coordinator whose binding reads nothing (as a binding blocked by its outbox limit
    does), far more than the sockets to the binding hold. The coordinator still logs them
    all and Commits them to the peer, so the peer's outbox drains; in bounded memory.
    (With forwarding awaited in the commit loop, the Commits stop after a few MiB; on
    uvloop, with a busy link read without turns for the commit loop, past 100 MiB.)"""
    if loop == "uvloop":
        pytest.importorskip("uvloop")
    monkeypatch.setenv(eventloop.LOOP_ENV, loop)
    count, per_frame = 4096, 64
    calls = [incoming_fork(5, i.to_bytes(4, "little") * 4096) for i in range(count)]
    with coordinator(tmp_path, "server") as (ic, binding):
        assert binding.record().seq == -1
        binding.send(frame(9, b"init") + checkpoint(b"cp1"))
        assert binding.record().seq == 0
        peer = Peer(tmp_path, "server")
        peer.open()
        assert peer.control() == (REPLAY_FROM, 0, 0)
        for i in range(0, count, per_frame):
            peer.send(b"".join(calls[i : i + per_frame]))
        committed = 0
        while committed < count:
            kind, committed, _ = peer.control()
            assert kind == COMMIT
        peak = _status_kib(ic.proc.pid, "VmHWM")
        print(f"\n64 MiB committed, unread by the binding; coordinator peak RSS {peak} KiB")
        assert peak < 80 * 1024
        got: list[bytes] = []
        while len(got) < count:
            got += [frame(0, data) for _, data in binding.record().messages]
        assert got == calls
        peer.close()


def test_two_instances_over_their_limits_towards_each_other_do_not_deadlock(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Both fork 47 MiB to the other, 2 MiB per record, with a limit of 1 MiB, so each is
    paused again and again, its binding blocked in its drain() and reading no records
    meanwhile; both must finish (the deadline fails the test rather than hanging)."""
    monkeypatch.setenv(MAX_OUTBOX_ENV, "1")
    runner = ImmortalRunner(tmp_path, timeout=180)
    try:
        a = runner.start(Pump, "a", peer="b", count=COUNT, batch=128)
        _wait_for_line(a.ic_log, PAUSED)  # a is paused before b even starts
        b = runner.start(Pump, "b", peer="a", count=COUNT, batch=128)
        for me in (a, b):
            state = me.wait_until(lambda s: len(s["got"]) >= COUNT and s["sent"] == COUNT)
            assert state["got"] == list(range(COUNT)) and state["bad"] == []
    finally:
        runner.close()


def test_a_binding_that_reads_slowly_gets_every_record_in_order_from_a_bounded_coordinator(
    tmp_path: Path,
) -> None:
    """A binding sends 2,560 self-calls of 64 KiB (160 MiB), 4 MiB at a time as the log
    takes them, and reads nothing meanwhile: the coordinator logs them all (over several
    logs, asking for a checkpoint at each roll) without holding them in memory. Then the
    binding reads: every record in order, each checkpoint request right after the last
    record of its log."""
    count, per_send = 2560, 64
    size = 16384  # four-byte words: 64 KiB of arguments per call
    calls = [self_fork(5, i.to_bytes(4, "little") * size) for i in range(count)]
    with coordinator(tmp_path, "slow", "--log-trigger-mb", "16") as (ic, binding):
        assert binding.record().seq == -1
        binding.send(frame(9, b"init") + checkpoint(b"cp1"))
        assert binding.record().seq == 0
        start = _status_kib(ic.proc.pid, "VmRSS")
        logs = tmp_path / "slow_0"
        deadline = time.monotonic() + 4 * DEADLINE
        for i in range(0, count, per_send):
            binding.send(b"".join(calls[i : i + per_send]))
            while log_bytes_in(logs) < (i + per_send) * 4 * size:
                assert time.monotonic() < deadline, f"calls up to {i + per_send} never logged"
                time.sleep(0.005)  # polling the log files, with a deadline
        peak = _status_kib(ic.proc.pid, "VmHWM")
        print(f"\n160 MiB logged, unread; coordinator RSS {start} KiB at start, peak {peak} KiB")
        # 160 MiB went through unread; held in memory it would all be here. Bounded, it
        # is 8 MiB of records and 4 MiB of input, plus the receive buffers held records
        # were cut from (their size depends on how reads fell: 40-55 MiB seen in all).
        assert peak - start < 80 * 1024
        got: list[bytes] = []
        before_requests: list[int] = []  # the last seq before each checkpoint request
        seq = 0
        # Two rolls: to log 2 while nothing was read, to log 3 once checkpoint 2 came.
        while len(got) < count or len(before_requests) < 2:
            rec = binding.record()
            if rec.seq == -1:
                before_requests.append(seq)
                binding.send(checkpoint(f"cp{len(before_requests) + 1}".encode()))
                continue
            assert rec.seq == seq + 1, (rec.seq, seq)
            seq = rec.seq
            got += [frame(0, data) for _, data in rec.messages]
        assert got == [incoming_fork(5, i.to_bytes(4, "little") * size) for i in range(count)]
        # Each request came right after the last record of the log before it.
        scans = [
            LogScan(
                logs / f"serverlog{n}", committer_id=None, next_seq=None, last=True, repair=False
            )
            for n in (1, 2)
        ]
        assert before_requests == [[raw.seq for raw in scan][-1] for scan in scans]
        binding.close()
        assert ic.proc.wait(timeout=DEADLINE) == 0
