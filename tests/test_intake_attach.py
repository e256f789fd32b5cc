"""Attach before send (seed 002), sans-IO: what :class:`Intake` requires of the binding's
calls to other instances, and how the coordinator's checkpoint file keeps attachments.

The binding's messages are laid out here from the seed (*Message Formats*: AttachTo is
``size | 01 | name``; an outgoing RPC ``size | 00 | ZigZagInt dest length | dest |``
the incoming body), and the checkpoint file from the layout in ``checkpoint.IcState``.
"""

from __future__ import annotations

import struct

import attrs
import pytest

from ambrosia_py import wire
from ambrosia_py.coordinator.core.checkpoint import IcState, StateFormatError
from ambrosia_py.coordinator.core.intake import CheckpointArrived, Intake
from tests.fake_binding import checkpoint, frame, zz


def attach(name: str) -> bytes:
    return frame(1, name.encode())


def fork_to(dest: str, args: bytes = b"x") -> bytes:
    raw = dest.encode()
    return frame(0, zz(len(raw)) + raw + b"\x00" + zz(5) + b"\x01" + args)


def reply_to(dest: str) -> bytes:
    raw = dest.encode()
    return frame(0, zz(len(raw)) + raw + b"\x02" + zz(2) + b"me" + zz(4))  # no value


def _general(intake: Intake) -> Intake:
    """``intake`` with the fast path of ``receive_data`` switched off (test_intake_fastpath.py)."""
    intake._reader.take_rpc_frames = lambda out: intake.offset  # type: ignore[method-assign]
    return intake


def _refusal(intake: Intake, data: bytes) -> tuple[str, int | None]:
    with pytest.raises(wire.MalformedMessageError) as info:
        intake.receive_data(data)
    return str(info.value), info.value.offset


def test_a_call_needs_an_attach_to_first_on_both_paths() -> None:
    for make in (lambda: Intake("me"), lambda: _general(Intake("me"))):
        intake = make()
        intake.receive_data(attach("server") + fork_to("server", b"1") + fork_to("server", b"2"))
        assert [f for _, f in intake.outboxes["server"].buffered] == [
            frame(0, b"\x00" + zz(5) + b"\x01" + b"1"),
            frame(0, b"\x00" + zz(5) + b"\x01" + b"2"),
        ]
        why, offset = _refusal(intake, fork_to("other"))
        assert "a call for instance 'other' before any AttachTo 'other'" in why
        assert "Attach-before-send" in why
        assert offset == len(attach("server") + fork_to("server") * 2)
        assert "other" not in intake.outboxes


def test_a_name_seen_in_a_reply_is_still_refused_a_call_on_the_fast_path() -> None:
    """A return value needs no AttachTo, and leaves its destination's name cached for
    the fast path: a call to it must still be refused there, as the general path does."""
    data = reply_to("caller") + fork_to("caller")
    fast, general = Intake("me"), _general(Intake("me"))
    assert _refusal(fast, data) == _refusal(general, data)
    assert [f for _, f in fast.outboxes["caller"].buffered] == [
        frame(0, b"\x02" + zz(2) + b"me" + zz(4))
    ]


def test_self_calls_and_calls_in_a_batch() -> None:
    intake = Intake("me")
    self_call = frame(0, zz(0) + b"\x00" + zz(5) + b"\x01" + b"s")
    named_self = frame(0, zz(2) + b"me" + b"\x00" + zz(5) + b"\x01" + b"n")
    intake.receive_data(self_call + named_self)  # the local instance needs no AttachTo
    assert len(intake.pending) == 2
    batch = frame(5, zz(2) + self_call + fork_to("server"))
    why, _ = _refusal(intake, batch)
    assert "before any AttachTo 'server'" in why
    intake = Intake("me")
    intake.receive_data(attach("server") + batch)
    assert len(intake.outboxes["server"].buffered) == 1


def test_the_checkpoint_event_carries_the_attachments_and_recovery_restores_them() -> None:
    intake = Intake("me")
    intake.receive_data(attach("a") + attach("b") + attach("a") + checkpoint(b"blob"))
    event = intake.next_event()
    assert intake.next_event() is None
    assert isinstance(event, CheckpointArrived) and event.attached == frozenset({"a", "b"})
    restored = Intake("me")
    restored.restore_attached(event.attached)
    restored.receive_data(
        fork_to("a") + fork_to("b")
    )  # no AttachTo again: the binding's checkpoint
    assert set(restored.outboxes) == {"a", "b"}
    with pytest.raises(wire.MalformedMessageError, match="'c' before any AttachTo"):
        restored.receive_data(fork_to("c"))


def test_a_checkpoint_that_did_not_record_them_requires_none_ever_after() -> None:
    intake = Intake("me")
    intake.restore_attached(None)
    intake.receive_data(fork_to("a"))
    intake.receive_data(attach("b") + checkpoint(b"blob"))
    event = intake.next_event()
    assert isinstance(event, CheckpointArrived) and event.attached is None


# --- the checkpoint file, format 3 ---------------------------------------------------------


def _name(text: str) -> bytes:
    raw = text.encode()
    return struct.pack("<I", len(raw)) + raw


def _file(version: int, links: bytes, blob: bytes) -> bytes:
    """magic | u16 version | i32 committer 5 | i64 next seq 10 | i64 logged 3 | i64 sent 4
    | u64 link section length | u64 blob length | link section | blob"""
    head = struct.pack("<6sHiqqqQQ", b"AMBRIC", version, 5, 10, 3, 4, len(links), len(blob))
    return head + links + blob


_NO_LINKS = struct.pack("<III", 0, 0, 0)  # no inbox, no outboxes, no senders


def test_format_3_holds_the_attachments_byte_for_byte() -> None:
    links = _NO_LINKS + b"\x01" + struct.pack("<I", 2) + _name("a") + _name("ünï")
    data = _file(3, links, b"blob")
    state = IcState(5, 10, 3, 4, b"blob", attached=frozenset({"ünï", "a"}))
    assert b"".join(bytes(p) for p in state.encode_parts()) == data
    assert IcState.decode(data, "serverchkpt3").attached == frozenset({"a", "ünï"})
    not_recorded = _file(3, _NO_LINKS + b"\x00", b"blob")
    unrecorded = attrs.evolve(state, attached=None)
    assert b"".join(bytes(p) for p in unrecorded.encode_parts()) == not_recorded
    assert IcState.decode(not_recorded, "serverchkpt3").attached is None


def test_format_2_reads_as_not_recorded_and_bad_sections_are_refused() -> None:
    assert IcState.decode(_file(2, _NO_LINKS, b"b"), "serverchkpt2").attached is None
    with pytest.raises(StateFormatError, match=r"serverchkpt3: attachments flag 2 \(0 or 1\)"):
        IcState.decode(_file(3, _NO_LINKS + b"\x02", b""), "serverchkpt3")
    with pytest.raises(StateFormatError, match="truncated in attachments flag"):
        IcState.decode(_file(3, _NO_LINKS, b""), "serverchkpt3")
    cut = _NO_LINKS + b"\x01" + struct.pack("<I", 2) + _name("a")
    with pytest.raises(StateFormatError, match="truncated in attached"):
        IcState.decode(_file(3, cut, b""), "serverchkpt3")
    with pytest.raises(StateFormatError, match="unknown checkpoint format version 4"):
        IcState.decode(_file(4, _NO_LINKS + b"\x00", b""), "serverchkpt4")
