"""Hypothesis strategies for the wire core: every message type, records and watermarks.

Values are generated so that they survive an encode/decode round trip: incoming RPC
forms go to the binding, outgoing ones to the coordinator; fork and impulse calls carry
no sender or call sequence number; a NO_VALUE return value carries no value. At the end,
byte-level helpers the wire tests share (cutting buffers, building raw records).
"""

from __future__ import annotations

import struct

from hypothesis import strategies as st

from ambrosia_py.wire import (
    HEADER_SIZE,
    AttachTo,
    BecomingPrimary,
    Checkpoint,
    Commit,
    CountReplayableRpcBatch,
    Direction,
    IncomingReturnValue,
    IncomingRpc,
    InitialMessage,
    LogRecord,
    Message,
    OutgoingReturnValue,
    OutgoingRpc,
    Ping,
    PingReturn,
    ReplayFrom,
    ReturnType,
    RpcBatch,
    RpcMessage,
    RpcType,
    TakeBecomingPrimaryCheckpoint,
    TakeCheckpoint,
    TrimTo,
    TrimWatermark,
    UpgradeService,
    UpgradeTakeCheckpoint,
    Watermark,
    check_bytes,
)

INT_MIN = -(2**31)
INT_MAX = 2**31 - 1
LONG_MIN = -(2**63)
LONG_MAX = 2**63 - 1

ints32 = st.integers(INT_MIN, INT_MAX)
ints64 = st.integers(LONG_MIN, LONG_MAX)
# Names are UTF-8 on the wire; ``st.text`` never yields lone surrogates.
names = st.text(max_size=24)
payloads = st.binary(max_size=64)
counts = st.integers(0, 5)


# --- RPC forms --------------------------------------------------------------------------


@st.composite
def _call_fields(draw: st.DrawFn) -> tuple[int, RpcType, bytes, str, int]:
    """method id, rpc type, args, sender, call seq; only async/await has a sender."""
    rpc_type = draw(st.sampled_from(RpcType))
    if rpc_type is RpcType.ASYNC_AWAIT:
        sender, call_seq = draw(names), draw(ints64)
    else:
        sender, call_seq = "", 0
    return draw(ints32), rpc_type, draw(payloads), sender, call_seq


@st.composite
def _return_fields(draw: st.DrawFn) -> tuple[ReturnType, str, int, bytes]:
    """return type, sender, call seq, value; NO_VALUE carries no value."""
    return_type = draw(
        st.sampled_from([ReturnType.VALUE, ReturnType.NO_VALUE, ReturnType.EXCEPTION])
    )
    value = b"" if return_type is ReturnType.NO_VALUE else draw(payloads)
    return return_type, draw(names), draw(ints64), value


incoming_rpcs = _call_fields().map(lambda f: IncomingRpc(*f))
incoming_return_values = _return_fields().map(lambda f: IncomingReturnValue(*f))


@st.composite
def outgoing_rpcs(draw: st.DrawFn) -> OutgoingRpc:
    return OutgoingRpc(draw(names), *draw(_call_fields()))


@st.composite
def outgoing_return_values(draw: st.DrawFn) -> OutgoingReturnValue:
    return OutgoingReturnValue(draw(names), *draw(_return_fields()))


def rpc_messages(direction: Direction) -> st.SearchStrategy[RpcMessage]:
    """The RPC forms (calls and return values) that travel in ``direction``."""
    if direction is Direction.TO_BINDING:
        return st.one_of(incoming_rpcs, incoming_return_values)
    return st.one_of(outgoing_rpcs(), outgoing_return_values())


def replayable_count(messages: tuple[RpcMessage, ...]) -> int:
    """How many of ``messages`` are not impulses (seed 002, CountReplayableRPCBatch)."""
    return sum(
        1
        for m in messages
        if not (isinstance(m, IncomingRpc | OutgoingRpc) and m.rpc_type is RpcType.IMPULSE)
    )


def rpc_batches(direction: Direction) -> st.SearchStrategy[RpcBatch]:
    return st.lists(rpc_messages(direction), max_size=5).map(lambda ms: RpcBatch(tuple(ms)))


def count_replayable_batches(direction: Direction) -> st.SearchStrategy[CountReplayableRpcBatch]:
    return st.lists(rpc_messages(direction), max_size=5).map(
        lambda ms: CountReplayableRpcBatch(tuple(ms), replayable_count(tuple(ms)))
    )


# --- the other message types ------------------------------------------------------------

attach_tos = names.map(AttachTo)
commits = st.builds(Commit, ints64, ints64)
replay_froms = st.builds(ReplayFrom, ints64, ints64)
trim_tos = st.builds(TrimTo, ints64)
pings = payloads.map(Ping)
ping_returns = payloads.map(PingReturn)
checkpoints = st.binary(max_size=256).map(Checkpoint)
initial_messages = payloads.map(InitialMessage)
empty_messages: st.SearchStrategy[Message] = st.sampled_from(
    [
        TakeCheckpoint(),
        UpgradeTakeCheckpoint(),
        TakeBecomingPrimaryCheckpoint(),
        UpgradeService(),
        BecomingPrimary(),
    ]
)

# Every message type, each with the strategy that makes it, for per-type tests.
MESSAGE_STRATEGIES: dict[str, st.SearchStrategy[Message]] = {
    "IncomingRpc": incoming_rpcs,
    "IncomingReturnValue": incoming_return_values,
    "OutgoingRpc": outgoing_rpcs(),
    "OutgoingReturnValue": outgoing_return_values(),
    "AttachTo": attach_tos,
    "TakeCheckpoint": st.just(TakeCheckpoint()),
    "Commit": commits,
    "ReplayFrom": replay_froms,
    "RpcBatch(to binding)": rpc_batches(Direction.TO_BINDING),
    "RpcBatch(to coordinator)": rpc_batches(Direction.TO_COORDINATOR),
    "CountReplayableRpcBatch(to binding)": count_replayable_batches(Direction.TO_BINDING),
    "CountReplayableRpcBatch(to coordinator)": count_replayable_batches(Direction.TO_COORDINATOR),
    "Ping": pings,
    "PingReturn": ping_returns,
    "Checkpoint": checkpoints,
    "InitialMessage": initial_messages,
    "UpgradeTakeCheckpoint": st.just(UpgradeTakeCheckpoint()),
    "TakeBecomingPrimaryCheckpoint": st.just(TakeBecomingPrimaryCheckpoint()),
    "UpgradeService": st.just(UpgradeService()),
    "BecomingPrimary": st.just(BecomingPrimary()),
    "TrimTo": trim_tos,
}

# The direction each entry of MESSAGE_STRATEGIES must be decoded with (type 0 layouts
# differ by direction; every other type decodes the same either way).
MESSAGE_DIRECTIONS: dict[str, Direction] = {
    name: (
        Direction.TO_COORDINATOR
        if name.startswith("Outgoing") or "coordinator" in name
        else Direction.TO_BINDING
    )
    for name in MESSAGE_STRATEGIES
}


def _non_rpc_messages() -> st.SearchStrategy[Message]:
    return st.one_of(
        attach_tos,
        commits,
        replay_froms,
        trim_tos,
        pings,
        ping_returns,
        initial_messages,
        empty_messages,
    )


def messages(direction: Direction, *, with_checkpoints: bool = True) -> st.SearchStrategy[Message]:
    """Any message that travels in ``direction``."""
    options: list[st.SearchStrategy[Message]] = [
        rpc_messages(direction),
        rpc_batches(direction),
        count_replayable_batches(direction),
        _non_rpc_messages(),
    ]
    if with_checkpoints:
        options.append(checkpoints)
    return st.one_of(options)


# --- records ----------------------------------------------------------------------------

committer_ids = ints32
control_messages: st.SearchStrategy[Message] = st.sampled_from(
    [
        TakeCheckpoint(),
        TakeBecomingPrimaryCheckpoint(),
        UpgradeTakeCheckpoint(),
        UpgradeService(),
        BecomingPrimary(),
    ]
)


def logged_bodies(*, with_checkpoints: bool = False) -> st.SearchStrategy[list[Message]]:
    """The messages of one logged record, as the coordinator forwards them to a binding."""
    return st.lists(
        messages(Direction.TO_BINDING, with_checkpoints=with_checkpoints), min_size=1, max_size=4
    )


@st.composite
def log_records(draw: st.DrawFn) -> LogRecord:
    """One record: logged (seq >= 0), control (seq -1) or recovery checkpoint (seq -2)."""
    committer = draw(committer_ids)
    kind = draw(st.sampled_from(["logged", "control", "checkpoint"]))
    if kind == "control":
        return LogRecord(committer, -1, (draw(control_messages),))
    if kind == "checkpoint":
        return LogRecord(committer, -2, (draw(checkpoints),))
    return LogRecord(committer, draw(st.integers(0, LONG_MAX)), tuple(draw(logged_bodies())))


@st.composite
def record_streams(draw: st.DrawFn) -> tuple[int, list[tuple[int, list[Message]]]]:
    """A committer id and a list of ``(seq, messages)`` as a coordinator would send them.

    Always a recovery checkpoint record first (seq -2, a Checkpoint whose blob follows
    the record), then at least one control record (seq -1) and at least two logged
    records with consecutive seqs, in a drawn order.
    """
    committer = draw(committer_ids)
    seq = draw(st.integers(0, 2**40))
    extra = draw(st.lists(st.sampled_from(["control", "logged"]), max_size=4))
    kinds = draw(st.permutations(["control", "logged", "logged", *extra]))
    records: list[tuple[int, list[Message]]] = [(-2, [draw(checkpoints)])]
    for kind in kinds:
        if kind == "control":
            records.append((-1, [draw(control_messages)]))
        else:
            records.append((seq, draw(logged_bodies())))
            seq += 1
    return committer, records


watermarks = st.builds(Watermark, names, ints64, ints64)
trim_watermarks = st.builds(TrimWatermark, names, ints64)
watermark_lists = st.lists(watermarks, max_size=4)
trim_watermark_lists = st.lists(trim_watermarks, max_size=4)


def split_points(data_len: int) -> st.SearchStrategy[list[int]]:
    """Sorted cut positions inside a buffer of ``data_len`` bytes."""
    return st.lists(st.integers(0, data_len), max_size=12).map(sorted)


def chunks(data: bytes, cuts: list[int]) -> list[bytes]:
    """``data`` cut at ``cuts`` (sorted positions); empty chunks included."""
    out = []
    prev = 0
    for cut in [*cuts, len(data)]:
        out.append(data[prev:cut])
        prev = cut
    return out


def raw_record(
    seq: int,
    body: bytes,
    *,
    committer: int = 1,
    length: int | None = None,
    check: int | None = None,
) -> bytes:
    """A wire record with correct length and check bytes unless told otherwise."""
    if length is None:
        length = HEADER_SIZE + len(body)
    if check is None:
        check = 0 if seq == -2 else check_bytes(body)
    return struct.pack("<iiQq", committer, length, check, seq) + body
