"""Spark over logs holding ingress BATCH impulses: ``decoded()`` (and the data source's
``decode`` option) give one row per call, with its key, its place in its batch and the
batch's place in the log; the analytics report counts every call under its method and
none as undecodable; a batch that does not decode is one row that says what and where.

The log is one a real ``ambrosia-py run --ingress`` wrote while sixteen clients called at
once (``tests/ingress_batches.py``); the rows are checked against the calls the test
made, and the report's SQL reading of the envelopes against the envelope's own decoder.
"""

from __future__ import annotations

import collections
import json
import pickle
import random
from pathlib import Path
from typing import Any

import pytest

from ambrosia_py import wire
from ambrosia_py.ingress.envelope import (
    INGRESS_METHOD_ID,
    BatchEnvelope,
    decode_impulse,
    encode_batch_envelope,
    encode_call_envelope,
)
from ambrosia_py.ingress.errors import IngressProtocolError
from ambrosia_py.spark import read_rows
from ambrosia_py.spark.decode import CallDecoder

from .ingress_batches import ADD, NOTE, SERVICE, Recording, hand_built_batch, record, write_log

pytestmark = pytest.mark.timeout(600)


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> Recording:
    return record(tmp_path_factory.mktemp("spark_batches"))


def _service(rec: Recording) -> str:
    return f"{rec.service_file}:Tally"


@pytest.mark.parametrize("how", ["decoded()", "option"])
def test_a_batch_is_a_row_per_call(spark: Any, recorded: Recording, how: str) -> None:
    from ambrosia_py.spark import decoded

    source = spark.read.format("ambrosia")
    if how == "option":
        df = source.options(decode=_service(recorded)).load(str(recorded.data_dir))
    else:
        df = decoded(source.load(str(recorded.data_dir)), _service(recorded))
    rows = [r.asDict() for r in df.collect()]
    calls = recorded.by_key()
    mine = [r for r in rows if r["ingress_key"] is not None]
    keys = collections.Counter(bytes(r["ingress_key"]).decode() for r in mine)
    assert keys == collections.Counter(list(calls))  # every call, once
    for r in mine:
        call = calls[bytes(r["ingress_key"]).decode()]
        assert (r["method"], r["decode_error"]) == (call.method, None)
        assert json.loads(r["args_json"]) == call.arguments
        assert (r["msg_type"], r["rpc_type"], r["method_id"]) == (
            "RPC",
            "impulse",
            INGRESS_METHOD_ID,
        )
    # Each impulse's calls share its place in the log, numbered in order from 0, its
    # payload on the first only; and they are the calls its logged bytes hold.
    places: dict[tuple[str, int, int], list[dict[str, Any]]] = collections.defaultdict(list)
    for r in mine:
        places[(r["log_file"], r["offset"], r["msg_index"])].append(r)
    raw = {(r["log_file"], r["offset"], r["msg_index"]): r for r in read_rows(recorded.data_dir)}
    for place, group in places.items():
        group.sort(key=lambda r: r["ingress_call"])
        assert [r["ingress_call"] for r in group] == list(range(len(group)))
        logged = decode_impulse(raw[place]["payload"])
        assert isinstance(logged, BatchEnvelope)
        assert [bytes(r["ingress_key"]) for r in group] == [c.key for c in logged.calls]
        assert bytes(group[0]["payload"]) == bytes(raw[place]["payload"])
        assert group[0]["payload_size"] == raw[place]["payload_size"]
        assert all(r["payload"] is None and r["payload_size"] is None for r in group[1:])
        assert len({(r["seq"], r["commit_time"]) for r in group}) == 1
    assert any(len(group) > 1 for group in places.values())
    # No message is lost: the other rows are the log's other messages, one each.
    assert len(rows) - len(mine) == len(raw) - len(places)


def test_the_report_counts_each_call_of_a_batch(
    spark: Any, recorded: Recording, tmp_path: Path
) -> None:
    from ambrosia_py.spark.analyze import build_report, method_names

    names = method_names([_service(recorded)])
    report = build_report(spark, recorded.data_dir, tmp_path / "report", names=names)
    made = collections.Counter(call.method for call in recorded.calls)
    over_time = report.tables["calls_over_time"]
    counted = over_time.groupby(["method", "ingress"])["calls"].sum().to_dict()
    calls = {method: n for (method, via), n in counted.items() if via == "call"}
    assert calls == dict(made)
    assert set(over_time["ingress"].dropna()) <= {"call", "retention"}  # none undecodable
    [instance] = report.tables["instances"].to_dict("records")
    retention = sum(n for (_, via), n in counted.items() if via == "retention")
    assert instance["impulse"] == len(recorded.calls) + retention
    assert instance["calls"] == instance["async"] + instance["fork"] + instance["impulse"]
    logged = list(read_rows(recorded.data_dir))
    assert instance["messages"] == len(logged)  # a batch is still one message
    assert sum(1 for r in logged if r["rpc_type"] == "impulse") < len(recorded.calls)
    kinds = report.tables["call_kinds"]
    assert set(kinds["method"]) >= {"add", "note"}
    assert "(ingress: not an envelope)" not in set(kinds["method"])


def _payloads() -> list[bytes]:
    """Envelopes the report's SQL must read as the envelope decoder does: batches whole,
    cut at every byte, with bytes after them, empty keys, counts too large to fit."""
    rng = random.Random(7)
    calls = [
        (b"k", 1, b""),
        (b"x" * 255, -(2**31), bytes(300)),
        (b"\x00\xff", 2**31 - 1, b"\x01\x02\x03"),
        (b"mid", -5, rng.randbytes(40)),
    ]
    whole = encode_batch_envelope(2**64 - 1, calls[:3])
    out = [
        whole,
        encode_batch_envelope(0, []),
        encode_batch_envelope(9, calls[3:]),
        encode_call_envelope(3, b"lone", 11, b"a"),
        whole + b"\x00",
        hand_built_batch(1, [(b"", 5, b"ab")]),  # an empty key
        hand_built_batch(1, calls[:1])[:9] + (2**32 - 1).to_bytes(4, "little") + bytes(20),
        hand_built_batch(1, calls[:1])[:9] + (3).to_bytes(4, "little") + bytes(30),
    ]
    out += [whole[:n] for n in range(len(whole)) if n % 7 == 0 or n < 40 or n > len(whole) - 8]
    for _ in range(40):
        some = [rng.choice(calls) for _ in range(rng.randrange(1, 6))]
        out.append(encode_batch_envelope(rng.randrange(2**40), some))
    return out


def test_the_report_reads_batches_as_the_envelope_decoder_does(spark: Any) -> None:
    from ambrosia_py.spark.report_ingress import with_ingress

    payloads = _payloads()
    rows = [("RPC", "impulse", INGRESS_METHOD_ID, p) for p in payloads]
    schema = "msg_type STRING, rpc_type STRING, method_id INT, payload BINARY"
    got = [
        (r["ingress"], r["called_ids"])
        for r in with_ingress(spark.createDataFrame(rows, schema)).collect()
    ]
    expected = []
    for p in payloads:
        try:
            impulse = decode_impulse(p)
        except IngressProtocolError:
            expected.append(("undecodable", [INGRESS_METHOD_ID]))
            continue
        assert isinstance(impulse, BatchEnvelope)
        expected.append(("call", [c.method_id for c in impulse.calls]))
    assert got == expected
    assert sum(1 for kind, _ in expected if kind == "undecodable") > 20
    assert max(len(ids) for _, ids in expected) >= 3


def test_a_batch_that_does_not_decode_is_one_row_saying_where(spark: Any, tmp_path: Path) -> None:
    service = tmp_path / "tally.py"
    service.write_text(SERVICE)
    add_args = pickle.dumps((("y", 1), {}))
    good = [(b"a", ADD, add_args), (b"b", NOTE, b'{"text":"t"}')]
    cut = encode_batch_envelope(1, good)[:-1]
    # The head, call 0 (key length, key, method id, size, arguments), then call 1's fields.
    cut_at = 13 + (1 + 1 + 4 + 4 + len(add_args)) + (1 + 1 + 4 + 4)
    messages = [
        wire.IncomingRpc(INGRESS_METHOD_ID, wire.RpcType.IMPULSE, cut),
        wire.IncomingRpc(INGRESS_METHOD_ID, wire.RpcType.IMPULSE, encode_batch_envelope(1, good)),
    ]
    write_log(tmp_path / "data", "tally", [messages])
    df = (
        spark.read.format("ambrosia")
        .options(decode=f"{service}:Tally")
        .load(str(tmp_path / "data"))
    )
    rows = sorted((r.asDict() for r in df.collect()), key=lambda r: (r["msg_index"], r["offset"]))
    assert [(r["msg_index"], r["ingress_call"], r["method"]) for r in rows] == [
        (0, None, "(ingress)"),
        (1, 0, "add"),
        (1, 1, "note"),
    ]
    error = rows[0]["decode_error"]
    assert error.startswith("IngressProtocolError: call 1 of a BATCH impulse")
    assert error.endswith(f"(offset {cut_at})")
    assert rows[0]["ingress_key"] is None and rows[0]["args_json"] is None
    assert json.loads(rows[1]["args_json"]) == {"token": "y", "amount": 1}
    assert rows[2]["args_json"] == '{"text": "t"}' and rows[2]["decode_error"] is None
    with pytest.raises(ValueError, match="rows\\(\\) gives one per call"):
        CallDecoder(f"{service}:Tally").row(
            "RPC", "impulse", INGRESS_METHOD_ID, encode_batch_envelope(1, good)
        )
