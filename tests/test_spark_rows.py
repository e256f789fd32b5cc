"""The log reader behind the Spark data source, in pure Python (no Spark needed).

Its rows are checked against an independent reference: records read by the test oracle
(tests/log_oracle.py, written from reference/ambrosia.md with nothing from
``ambrosia_py``, and held to hand-laid bytes by test_log_oracle.py), turned into rows by
the code here, index times parsed here with ``struct``. Logs are generated with the
project's encoders (the coordinator's ``LogWriter``) and, for the released on-disk form,
raw bytes written from reference/ambrosia.md's layout. The Spark tests
(test_spark_source.py, test_spark_stream.py, ...) import the generators and the
reference from here.
"""

from __future__ import annotations

import datetime
import os
import re
import struct
import tempfile
from pathlib import Path
from typing import Any

import pytest
import xxhash
from hypothesis import given, settings
from hypothesis import strategies as st

from ambrosia_py import wire
from ambrosia_py.coordinator.storage.files import LogWriter
from ambrosia_py.coordinator.storage.index import INDEX_MAGIC, IndexEntry, encode_entry
from ambrosia_py.spark import LogDamageError, LogFormatError, NoLogsError, find_logs, read_rows
from ambrosia_py.spark.plan import plan
from ambrosia_py.wire.messages import frame_parts
from tests import log_oracle as oracle
from tests import strategies
from tests.fake_binding import frame, incoming_fork, incoming_impulse, zz

COMMITTER = 11


# --- generating logs ----------------------------------------------------------------------


def sample(seq: int) -> tuple[list[wire.Message], bytes]:
    """The messages of record ``seq`` (every kind a log can hold, in turn), and the
    checkpoint blob that follows the record, if it holds a Checkpoint."""
    args = bytes((seq * 7 + i) % 256 for i in range(seq % 5 * 9))
    calls: list[wire.RpcMessage] = [
        wire.IncomingRpc(3, wire.RpcType.FORK, args),
        wire.IncomingRpc(-7, wire.RpcType.IMPULSE, b"{}"),
        wire.IncomingRpc(300, wire.RpcType.ASYNC_AWAIT, args, "caller", seq * 2),
        wire.IncomingReturnValue(wire.ReturnType.VALUE, "callee", seq, b"v" + args),
        wire.IncomingReturnValue(wire.ReturnType.NO_VALUE, "callee", seq + 1),
        wire.IncomingReturnValue(wire.ReturnType.EXCEPTION, "callee", seq + 2, b"boom"),
    ]
    kind = seq % 10
    if kind < 6:
        return [calls[kind], calls[(kind + 1) % 6]], b""
    if kind == 6:
        return [wire.RpcBatch(tuple(calls[:4])), calls[5]], b""
    if kind == 7:
        return [wire.CountReplayableRpcBatch((calls[1], calls[0]), 1)], b""
    if kind == 8:
        return [wire.AttachTo("peer"), wire.InitialMessage(b"init" + args), wire.TrimTo(4)], b""
    blob = b"checkpoint-" + args
    return [wire.TakeCheckpoint(), wire.Checkpoint(blob), wire.Ping(b"p")], blob


def disk_record(seq: int, committer: int = COMMITTER) -> bytes:
    messages, blob = sample(seq)
    body = b"".join(b"".join(bytes(p) for p in frame_parts(m)) for m in messages)
    marks = [wire.Watermark("peer", seq, seq)] if seq % 3 else []
    return wire.encode_disk_record(committer, seq, body, marks, [wire.TrimWatermark("x", 1)]) + blob


def write_log(path: Path, seqs: range, *, index_every: int = 0) -> list[int]:
    """Records ``seqs`` in log ``path`` (a sidecar index every ``index_every`` bytes, if
    given); returns each record's offset."""
    path.parent.mkdir(parents=True, exist_ok=True)
    offsets = []
    with LogWriter(path, index_every_bytes=index_every) as log:
        for seq in seqs:
            offsets.append(log.size)
            log.write([disk_record(seq)])
    return offsets


def make_data_dir(root: Path) -> Path:
    """Two instances: alpha (three logs, indexed every 500 bytes) and beta (no index),
    and things a data dir holds that are not logs."""
    write_log(root / "alpha_0" / "serverlog1", range(0, 30), index_every=500)
    write_log(root / "alpha_0" / "serverlog2", range(30, 55), index_every=500)
    write_log(root / "alpha_0" / "serverlog3", range(55, 70), index_every=500)
    write_log(root / "beta_2" / "serverlog1", range(100, 125))
    (root / "alpha_0" / "serverchkpt1").write_bytes(b"state")
    (root / "registry.sqlite3").write_bytes(b"not a log")
    (root / "notes").mkdir()
    return root


# --- the independent reference -----------------------------------------------------------


def index_times(log: Path) -> dict[int, tuple[int, int]]:
    """offset -> (seq, time in µs) of the entries of ``log``'s index, parsed here."""
    index = log.with_name(log.name.replace("serverlog", "serverindex"))
    if not index.exists():
        return {}
    data = index.read_bytes()
    assert data[:8] == b"AMBIDX01"
    out = {}
    for at in range(8, len(data) - 31, 32):
        offset, seq, ns, check = struct.unpack_from("<QqqQ", data, at)
        if xxhash.xxh64_intdigest(data[at : at + 24]) == check:
            out[offset] = (seq, ns // 1000)
    return out


def flat(msg: oracle.Message, instance: str) -> dict[str, Any]:
    """The message columns of one (non-batch) message, as docs/spark.md's *Rows* names
    them."""
    row: dict[str, Any] = dict.fromkeys(
        ("method_id", "rpc_type", "sender", "destination", "call_seq", "payload", "return_type")
    )
    row["msg_type"] = msg.name
    f = msg.fields
    if msg.name == "RPC" and f["call"]:
        row.update(method_id=f["method_id"], rpc_type=f["rpc_type"], destination=instance)
        row.update(sender=f["sender"], call_seq=f["call_seq"], payload=f["args"])
    elif msg.name == "RPC":
        row.update(rpc_type="return", sender=f["sender"], call_seq=f["call_seq"])
        row.update(return_type=f["return_type"], destination=instance, payload=f["value"])
    elif msg.name == "AttachTo":
        row["destination"] = f["destination"]
    elif msg.name in ("InitialMessage", "Ping", "PingReturn"):
        row["payload"] = f["data"]
    elif msg.name == "Checkpoint":
        row["payload"] = f["blob"]
    row["payload_size"] = None if row["payload"] is None else len(row["payload"])
    return row


def reference_log(log: Path, instance: str, version: int | None, level: str) -> list[dict]:
    times = index_times(log)
    rows: list[dict[str, Any]] = []
    time = None
    for record in oracle.records(log.read_bytes()):
        if times.get(record.offset, (None,))[0] == record.seq:
            time = times[record.offset][1]
        head = {
            "instance": instance,
            "version": version,
            "log_file": str(log),
            "offset": record.offset,
            "seq": record.seq,
            "committer": record.committer,
            "commit_time": time,
            "check_ok": True,
        }
        messages = oracle.flatten(record.messages)
        if level == "record":
            size = record.end - record.offset
            rows.append(head | {"size": size, "msg_count": len(messages), "body": record.body})
        else:
            rows += [head | {"msg_index": i} | flat(m, instance) for i, m in enumerate(messages)]
    return rows


def reference_rows(root: Path, level: str = "message") -> list[dict]:
    """Every row of every log under the data dir ``root``, read independently."""
    rows = []
    for d in sorted(root.iterdir()):
        m = re.fullmatch(r"(.+)_(\d+)", d.name)
        if not (d.is_dir() and m):
            continue
        logs = [p for p in d.iterdir() if re.fullmatch(r"serverlog[1-9][0-9]*", p.name)]
        for log in sorted(logs, key=lambda p: int(p.name[9:])):
            rows += reference_log(log, m.group(1), int(m.group(2)), level)
    return rows


def normal(rows: Any) -> list[dict]:
    """Rows with ``commit_time`` in µs since the epoch (as the reference gives it)."""
    out = []
    for row in rows:
        row = dict(row)
        t = row["commit_time"]
        if isinstance(t, datetime.datetime):
            row["commit_time"] = (t - datetime.datetime(1970, 1, 1, tzinfo=datetime.UTC)) // (
                datetime.timedelta(microseconds=1)
            )
        out.append(row)
    return out


# --- tests ---------------------------------------------------------------------------------


def test_rows_match_the_reference_with_and_without_splits(tmp_path: Path) -> None:
    root = make_data_dir(tmp_path / "data")
    expected = reference_rows(root)
    assert len(expected) > 150 and {r["instance"] for r in expected} == {"alpha", "beta"}
    assert all(r["commit_time"] is not None for r in expected if r["instance"] == "alpha")
    assert all(r["commit_time"] is None for r in expected if r["instance"] == "beta")
    for split in (1 << 30, 600, 1):
        assert normal(read_rows(root, split_bytes=split)) == expected
    assert len(plan(find_logs(root), 600)) > 8  # the indexed logs were split
    assert len(plan(find_logs(root), 1 << 30)) == 4  # one piece per log


def test_record_level_rows_match_the_reference(tmp_path: Path) -> None:
    root = make_data_dir(tmp_path / "data")
    expected = reference_rows(root, "record")
    assert normal(read_rows(root, level="record", split_bytes=700)) == expected
    with pytest.raises(ValueError, match="level"):
        next(read_rows(root, level="nope"))


def test_an_instance_dir_or_one_log_file_reads_on_its_own(tmp_path: Path) -> None:
    root = make_data_dir(tmp_path / "data")
    expected = reference_rows(root)
    alpha = [r for r in expected if r["instance"] == "alpha"]
    assert normal(read_rows(root / "alpha_0")) == alpha
    log2 = str(root / "alpha_0" / "serverlog2")
    assert normal(read_rows(log2)) == [r for r in alpha if r["log_file"] == log2]
    (other := tmp_path / "elsewhere").mkdir()
    (other / "copied.log").write_bytes(Path(log2).read_bytes())
    rows = list(read_rows(other / "copied.log"))
    assert {(r["instance"], r["version"]) for r in rows} == {("elsewhere", None)}
    assert len(rows) == len([r for r in alpha if r["log_file"] == log2])
    with pytest.raises(NoLogsError, match="no log files"):
        next(read_rows(other))
    with pytest.raises(NoLogsError, match="no such file"):
        next(read_rows(tmp_path / "missing"))


def test_a_torn_tail_ends_the_file_s_rows_wherever_the_write_was_cut(tmp_path: Path) -> None:
    log = tmp_path / "svc_0" / "serverlog1"
    offsets = write_log(log, range(0, 6), index_every=1)
    whole = log.read_bytes()
    expected = reference_rows(tmp_path)
    kept = [r for r in expected if r["offset"] < offsets[-1]]
    for cut in range(offsets[-1] + 1, len(whole)):
        log.write_bytes(whole[:cut])
        assert normal(read_rows(tmp_path)) == kept, cut
        assert normal(read_rows(tmp_path, on_damage="fail", split_bytes=1)) == kept, cut
    log.write_bytes(whole[: offsets[-1]] + bytes(300))  # extended, never written: zeros
    assert normal(read_rows(tmp_path)) == kept


def _flipped(log: Path, whole: bytes, at: int) -> None:
    data = bytearray(whole)
    data[at] ^= 0x40
    log.write_bytes(bytes(data))


def test_a_flipped_byte_in_a_record_is_reported_never_returned_as_good_rows(
    tmp_path: Path,
) -> None:
    log = tmp_path / "svc_0" / "serverlog1"
    offsets = write_log(log, range(0, 8), index_every=1)
    whole = log.read_bytes()
    expected = reference_rows(tmp_path)
    ends = [*offsets[1:], len(whole)]
    for k in (0, 3, 7):  # the first, a middle and the last record
        length = -struct.unpack_from("<i", whole, offsets[k] + 4)[0] - 1
        others = [r for r in expected if r["offset"] != offsets[k]]
        for at in range(offsets[k], ends[k]):
            _flipped(log, whole, at)
            for split in (1, 1 << 20):  # pieces of one record each (neighbours from the index)
                got = normal(read_rows(tmp_path, split_bytes=split))
                good = [r for r in got if r["check_ok"]]
                bad = [r for r in got if not r["check_ok"]]
                where = (k, at - offsets[k], split)
                assert all(r in expected for r in good), where
                assert all(r["msg_type"] is None and r["payload"] is None for r in bad), where
                if at - offsets[k] < length:  # the header or the messages
                    assert good == others, where
                    assert bad and {r["offset"] for r in bad} <= set(range(offsets[k], ends[k]))
                    if not 4 <= at - offsets[k] < 8:  # not the length: one damaged record
                        assert [r["offset"] for r in bad] == [offsets[k]], where
                else:
                    # The watermarks: not covered by the check bytes (the released format);
                    # a flip that breaks their framing makes the record no valid record (as
                    # recovery sees it), or shifts where the next record seems to start and
                    # damages that one. In the last record, a count that runs past the end
                    # of the file looks like a write cut inside the watermarks: a torn tail.
                    lost = {r["offset"] for r in expected} - {r["offset"] for r in good}
                    assert lost <= set(offsets[k : k + 2]), where
            if bad:
                with pytest.raises(LogDamageError, match=f"serverlog1, offset {bad[0]['offset']}"):
                    list(read_rows(tmp_path, on_damage="fail"))


def test_damage_in_the_middle_is_not_a_torn_tail(tmp_path: Path) -> None:
    log = tmp_path / "svc_0" / "serverlog1"
    offsets = write_log(log, range(0, 6))
    expected = reference_rows(tmp_path)
    whole = bytearray(log.read_bytes())
    whole[offsets[2] : offsets[2] + 24] = bytes(24)  # a header zeroed
    log.write_bytes(bytes(whole))
    got = normal(read_rows(tmp_path))
    assert [r for r in got if r["check_ok"]] == [r for r in expected if r["offset"] != offsets[2]]
    region = {"log_file": str(log), "offset": offsets[2], "instance": "svc", "version": 0}
    assert [r for r in got if not r["check_ok"]] == [
        dict.fromkeys(got[0]) | region | {"check_ok": False}  # a region: no committer, no seq
    ]
    with pytest.raises(LogDamageError, match=f"offset {offsets[2]}: damaged region of"):
        list(read_rows(tmp_path, on_damage="fail"))


@pytest.mark.parametrize(
    ("body", "why"),
    [
        (frame(42, b"what is this"), "unknown message type 42"),
        (frame(0, b"\x00" + zz(3) + b"\x05" + b"{}"), "unknown RPC type 5"),
        (frame(0, b"\x00" + zz(3) + b"\x00" + zz(2) + b"\xff\xfe" + zz(1)), "not valid UTF-8"),
        (frame(0, b"\x01" + zz(1) + b"s" + zz(1) + zz(1) + b"vx"), "trailing bytes"),
        (frame(0, b"\x07" + zz(1) + b"s"), "unknown RPC return type 7"),
        (frame(0, b"\x00" + b"\xff" * 6 + b"\x01"), "longer than 5 bytes"),
        (incoming_fork(3, b"{}") + b"\x10\x00", "runs"),
    ],
)
def test_a_record_that_verifies_but_does_not_decode_is_a_format_error(
    tmp_path: Path, body: bytes, why: str
) -> None:
    log = tmp_path / "svc_0" / "serverlog1"
    write_log(log, range(0, 2))
    with log.open("ab") as f:
        f.write(wire.encode_disk_record(COMMITTER, 2, body))
    with pytest.raises(LogFormatError, match=rf"offset \d+, seq 2: .*{why}"):
        list(read_rows(tmp_path))
    with pytest.raises(LogFormatError, match=rf"offset \d+, seq 2: .*{why}"):
        list(read_rows(tmp_path, level="record"))


def test_a_damaged_stale_or_foreign_index_never_misleads_the_reader(tmp_path: Path) -> None:
    log = tmp_path / "svc_0" / "serverlog1"
    offsets = write_log(log, range(0, 40), index_every=1)
    expected = reference_rows(tmp_path)
    index = tmp_path / "svc_0" / "serverindex1"
    lies = [
        IndexEntry(offsets[5] + 3, 5, 1),  # not where a record starts
        IndexEntry(offsets[10], 99, 2),  # a record starts there, with another seq
        IndexEntry(len(log.read_bytes()) + 100, 40, 3),  # past the end
    ]
    for entry in lies:
        index.write_bytes(INDEX_MAGIC + encode_entry(entry))
        got = normal(read_rows(tmp_path, split_bytes=1))
        assert got == [r | {"commit_time": None} for r in expected]
        assert [p.span.start for p in plan(find_logs(tmp_path), 1)] == [0]
    index.write_bytes(os.urandom(1000))
    assert normal(read_rows(tmp_path, split_bytes=1)) == [
        r | {"commit_time": None} for r in expected
    ]
    # A good entry in the middle gives the times from there on, and a split there.
    t = 1_700_000_000_000_000_000
    index.write_bytes(INDEX_MAGIC + encode_entry(IndexEntry(offsets[20], 20, t)))
    got = normal(read_rows(tmp_path, split_bytes=1))
    assert [r["commit_time"] for r in got] == [
        None if r["offset"] < offsets[20] else t // 1000 for r in expected
    ]
    assert [p.span.start for p in plan(find_logs(tmp_path), 1)] == [0, offsets[20]]


def released_log() -> tuple[bytes, list[dict[str, Any]]]:
    """A log in the released AMBROSIA's on-disk form, written byte by byte from
    reference/ambrosia.md (no project code), and the rows it must give."""

    def record(
        seq: int, body: bytes, marks: list[tuple[str, int, int]], trims: list[tuple[str, int]]
    ) -> bytes:
        length = 24 + len(body)
        header = struct.pack("<iiQq", 5, -length - 1, xxhash.xxh64_intdigest(body), seq)
        tail = zz(len(marks)) + b"".join(
            zz(len(n)) + n.encode() + struct.pack("<qq", a, b) for n, a, b in marks
        )
        tail += zz(len(trims)) + b"".join(
            zz(len(n)) + n.encode() + struct.pack("<q", s) for n, s in trims
        )
        return header + body + tail

    initial = frame(9, b'{"hello":1}')
    call = frame(0, b"\x00" + zz(12) + b"\x00" + zz(6) + b"client" + zz(41) + b"\x7b\x7d")
    ret = frame(0, b"\x03" + zz(6) + b"server" + zz(9) + zz(3) + b"err")
    batch = frame(5, zz(2) + incoming_fork(3, b"{}") + incoming_impulse(-4, b"\xff\x01\x02"))
    data = (
        record(0, initial, [], [])
        + record(1, call + ret, [("client", 7, 6)], [("server", 2)])
        + record(2, batch, [("client", 8, 7), ("other", 1, 1)], [])
    )
    base = {
        "instance": "server",
        "version": 3,
        "committer": 5,
        "commit_time": None,
        "check_ok": True,
        "return_type": None,
    }
    none = dict.fromkeys(("method_id", "rpc_type", "sender", "destination", "call_seq"))
    at1 = len(record(0, initial, [], []))
    at2 = at1 + len(record(1, call + ret, [("client", 7, 6)], [("server", 2)]))
    rows = [
        base | none | {"offset": 0, "seq": 0, "msg_index": 0, "msg_type": "InitialMessage",
                       "payload": b'{"hello":1}', "payload_size": 11},
        base | {"offset": at1, "seq": 1, "msg_index": 0, "msg_type": "RPC", "method_id": 12,
                "rpc_type": "async", "sender": "client", "destination": "server", "call_seq": 41,
                "payload": b"{}", "payload_size": 2},
        base | {"offset": at1, "seq": 1, "msg_index": 1, "msg_type": "RPC", "method_id": None,
                "rpc_type": "return", "sender": "server", "destination": "server", "call_seq": 9,
                "payload": b"err", "payload_size": 3, "return_type": "exception"},
        base | {"offset": at2, "seq": 2, "msg_index": 0, "msg_type": "RPC", "method_id": 3,
                "rpc_type": "fork", "sender": None, "destination": "server", "call_seq": None,
                "payload": b"{}", "payload_size": 2},
        base | {"offset": at2, "seq": 2, "msg_index": 1, "msg_type": "RPC", "method_id": -4,
                "rpc_type": "impulse", "sender": None, "destination": "server", "call_seq": None,
                "payload": b"\xff\x01\x02", "payload_size": 3},
    ]  # fmt: skip
    return data, rows


def test_a_log_in_the_released_on_disk_form_reads(tmp_path: Path) -> None:
    data, rows = released_log()
    log = tmp_path / "server_3" / "serverlog1"
    log.parent.mkdir()
    log.write_bytes(data)
    expected = [r | {"log_file": str(log)} for r in rows]
    assert normal(read_rows(tmp_path)) == expected
    assert reference_rows(tmp_path) == expected  # and so does the oracle, from the same bytes


def _log_of(bodies: list[list[wire.Message]], directory: Path) -> Path:
    """A log holding one record per body (seqs 0, 1, ...), blobs behind their records."""
    log = directory / "prop_0" / "serverlog1"
    log.parent.mkdir(parents=True, exist_ok=True)
    data = b""
    for seq, messages in enumerate(bodies):
        body = b"".join(b"".join(bytes(p) for p in frame_parts(m)) for m in messages)
        blobs = b"".join(bytes(m.blob) for m in messages if isinstance(m, wire.Checkpoint))
        data += wire.encode_disk_record(COMMITTER, seq, body, [wire.Watermark("w", seq, 0)])
        data += blobs
    log.write_bytes(data)
    return log


@settings(max_examples=80, deadline=None)
@given(
    st.lists(
        st.one_of(
            strategies.logged_bodies(with_checkpoints=True),
            st.lists(strategies.rpc_messages(wire.Direction.TO_BINDING), min_size=1, max_size=6),
        ),
        min_size=1,
        max_size=6,
    )
)
def test_any_logged_messages_give_the_reference_rows(bodies: list[list[wire.Message]]) -> None:
    """Every message form (calls and returns read straight from the bytes, the rest
    decoded into objects, batches, checkpoints with their blobs) against the reference."""
    with tempfile.TemporaryDirectory() as d:
        _log_of(bodies, Path(d))
        assert normal(read_rows(d)) == reference_rows(Path(d))
        assert normal(read_rows(d, level="record")) == reference_rows(Path(d), "record")
