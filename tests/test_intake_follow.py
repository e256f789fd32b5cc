"""A secondary's intake while its binding replays the log another replica writes
(``Intake.follow``, ``replayed``, ``trim_outboxes``), sans-IO.

The binding's bytes are laid out from seed 002 (*Message Formats*: an outgoing RPC is
``size | 00 | ZigZagInt dest length | dest |`` the incoming body, whose first byte is 0
for a call, then the method id, 1 for a fork, and the arguments), as in
test_intake_attach.py. The scenario: the checkpoint says the binding had sent 10
replayable outputs, 8 of them logged; the replay's records then show more logged as the
primary logged them.
"""

from __future__ import annotations

from ambrosia_py.coordinator.core.checkpoint import IcState
from ambrosia_py.coordinator.core.intake import Intake
from tests.fake_binding import frame, zz


def self_fork(arg: bytes) -> bytes:
    return frame(0, zz(0) + b"\x00" + zz(5) + b"\x01" + arg)


def fork_to(dest: str, arg: bytes) -> bytes:
    raw = dest.encode()
    return frame(0, zz(len(raw)) + raw + b"\x00" + zz(5) + b"\x01" + arg)


def attach(name: str) -> bytes:
    return frame(1, name.encode())


def checkpoint_state(**changes: object) -> IcState:
    fields: dict[str, object] = {
        "committer_id": 7,
        "next_seq": 100,
        "logged_outputs": 8,
        "binding_outputs": 10,
        "blob": b"state",
        "inbox": {"peer": 4},
        "outboxes": {"server": (3, [(2, b"two")])},
        "senders": {"peer": 99},
        "attached": frozenset({"server"}),
    }
    fields.update(changes)
    return IcState(**fields)  # type: ignore[arg-type]


def args_pending(intake: Intake) -> list[bytes]:
    """The last byte of each pending message: the argument the test gave it."""
    return [bytes(parts[-1])[-1:] for parts, _, _, _ in intake.pending]


def test_follow_starts_over_from_the_checkpoint() -> None:
    intake = Intake("me")
    intake.receive_data(self_fork(b"x") + attach("old") + fork_to("old", b"y"))
    intake.follow(checkpoint_state())
    assert (intake.committer_id, intake.next_seq) == (7, 100)
    assert intake.pending == [] and intake.pending_bytes == 0
    assert intake.enqueued == intake.dequeued
    assert list(intake.outboxes) == ["server"]
    assert intake.outboxes["server"].buffered == [(2, b"two")]
    assert intake.outbox_budget.total == len(b"two")
    assert intake.attached == {"server"}
    assert intake.inbox.expect("peer") == 4


def test_regenerated_self_calls_wait_until_the_log_shows_them() -> None:
    intake = Intake("me")
    intake.follow(checkpoint_state())
    # Outputs 10, 11, 12 (the checkpoint's binding had sent 0..9): none is logged yet.
    intake.receive_data(self_fork(b"a") + self_fork(b"b") + self_fork(b"c"))
    assert args_pending(intake) == [b"a", b"b", b"c"]
    # Records replayed hold 3 more outputs: 8 and 9 (sent before the checkpoint) and 10.
    intake.replayed(110, 3)
    assert args_pending(intake) == [b"b", b"c"]
    assert intake.next_seq == 110 and intake.skip_below == 11
    # 11 and 12 are logged before the binding regenerates 13: that one is kept, once.
    intake.replayed(112, 2)
    assert args_pending(intake) == []
    intake.receive_data(self_fork(b"d"))
    assert args_pending(intake) == [b"d"]
    assert intake.queued_outputs == 1
    assert intake.enqueued - intake.dequeued == 1
    assert intake.pending_bytes == len(self_fork(b"d")) - 1  # the incoming form: no name


def test_outputs_logged_before_they_are_regenerated_are_dropped_as_they_come() -> None:
    intake = Intake("me")
    intake.follow(checkpoint_state())
    intake.replayed(105, 5)  # outputs 8..12 logged; the binding regenerates 10..12 later
    intake.receive_data(self_fork(b"a") + self_fork(b"b") + self_fork(b"c") + self_fork(b"d"))
    assert args_pending(intake) == [b"d"]
    assert intake.dropped == 3


def test_trims_forget_output_the_destination_has_now_and_later() -> None:
    intake = Intake("me")
    intake.follow(checkpoint_state(outboxes={}, attached=frozenset({"server"})))
    intake.receive_data(fork_to("server", b"0") + fork_to("server", b"1"))
    assert [seq for seq, _ in intake.outboxes["server"].buffered] == [0, 1]
    points = (("server", 3), ("elsewhere", 9))
    intake.trim_outboxes(points)  # a destination not seen yet is skipped
    assert intake.outboxes["server"].buffered == []
    intake.receive_data(fork_to("server", b"2") + fork_to("server", b"3"))
    intake.trim_outboxes(points)  # applied again after more replay: seq 2 goes
    assert [seq for seq, _ in intake.outboxes["server"].buffered] == [3]
    assert intake.outbox_trims() == (("server", 3),)
    assert intake.outbox_budget.total == len(intake.outboxes["server"].buffered[0][1])
