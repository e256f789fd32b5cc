"""Opt-in decoding of logged arguments into columns (``ambrosia_py.spark.decoded``), held
to ``log show --service``'s own decoder (``binding/log_decode.py``) on a log a real
coordinator recorded, in Python and under Spark."""

from __future__ import annotations

import json
import pickle
from pathlib import Path
from typing import Any

import pytest

from ambrosia_py.binding.log_decode import ServiceDecoder
from ambrosia_py.spark import read_rows
from ambrosia_py.spark.decode import DECODED_COLUMNS, CallDecoder
from ambrosia_py.testing import ImmortalRunner
from tests.spark_decode_service import Ledger

SERVICE = f"{Path(__file__).with_name('spark_decode_service.py')}:Ledger"


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> Path:
    data = tmp_path_factory.mktemp("decode") / "data"
    runner = ImmortalRunner(data)
    try:
        ledger = runner.start(Ledger, "ledger")
        ledger.wait_until(lambda s: s["done"])
        ledger.stop()
    finally:
        runner.close()
    return data


def expected(rows: list[dict[str, Any]]) -> list[tuple[Any, ...]]:
    """(method, arguments) of each row, by log_decode's ``ServiceDecoder`` alone."""
    decoder = ServiceDecoder(Ledger)
    out: list[tuple[Any, ...]] = []
    for r in rows:
        calls = r["msg_type"] == "RPC" and r["rpc_type"] != "return"
        found = decoder.arguments(r["method_id"], r["payload"]) if calls else None
        out.append((None, None) if found is None else found)
        if found is not None:  # and the call reads as log show prints it
            assert decoder.call(r["method_id"], r["payload"]).startswith(found[0] + "(")
    return out


def test_calls_decode_as_log_show_decodes_them(recorded: Path) -> None:
    rows = list(read_rows(recorded))
    decoder = CallDecoder(Ledger)
    got = [decoder.row(r["msg_type"], r["rpc_type"], r["method_id"], r["payload"]) for r in rows]
    want = expected(rows)
    assert [g[0] for g in got] == [w[0] for w in want]
    assert [g[2] for g in got] == [None] * len(rows)
    methods = [g[0] for g in got if g[0] is not None]
    assert methods == ["deposit", "deposit", "note", "attach", "finish"]
    args = [json.loads(g[1]) for g in got if g[1] is not None]
    assert args == [
        {"who": "alice", "amount": 10},
        {"who": "bob", "amount": 1},
        {"text": "héllo"},
        {"blob": "00ff", "memo": {"text": "m", "tags": ["a", "b"]}, "more": []},
        {},
    ]
    decoded_args = [w[1] for w in want if w[1] is not None]
    assert decoded_args[:3] == args[:3]


def test_one_method_gives_a_column_per_parameter_and_errors_are_named() -> None:
    decoder = CallDecoder(SERVICE, "deposit")
    deposit = Ledger.rpc_methods_by_name()["deposit"].id
    note = Ledger.rpc_methods_by_name()["note"].id
    data = pickle.dumps((("carol",), {"amount": 3}))
    assert decoder.row("RPC", "fork", deposit, data) == (
        "deposit", '{"who": "carol", "amount": 3}', None, '"carol"', "3"
    )  # fmt: skip
    assert decoder.row("RPC", "impulse", note, b'{"text":"x"}')[3:] == (None, None)
    wrong = decoder.row("RPC", "fork", deposit, pickle.dumps(((), {"nobody": 1})))
    assert wrong[0] == "deposit" and wrong[1] is None and "TypeError" in str(wrong[2])
    assert decoder.row("RPC", "return", None, data) == (None,) * 5
    assert decoder.row("RPC", "fork", 12345, data) == (None,) * 5  # not the service's
    with pytest.raises(ValueError, match="no @rpc method 'withdraw'"):
        CallDecoder(Ledger, "withdraw")


@pytest.mark.parametrize("how", ["decoded()", "option"])
def test_spark_adds_the_decoded_columns(spark: Any, recorded: Path, how: str) -> None:
    from ambrosia_py.spark.decode import decoded

    source = spark.read.format("ambrosia")
    if how == "option":
        df = source.options(decode=SERVICE, decode_method="deposit").load(str(recorded))
    else:
        df = decoded(source.load(str(recorded)), SERVICE, method="deposit")
    names = [name for name, _, _ in DECODED_COLUMNS]
    assert df.columns[-5:] == [*names, "arg_who", "arg_amount"]
    got = {
        (r["log_file"], r["offset"], r["msg_index"]): tuple(r[n] for n in df.columns[-5:])
        for r in df.collect()
    }
    decoder = CallDecoder(Ledger, "deposit")
    rows = list(read_rows(recorded))
    want = {
        (r["log_file"], r["offset"], r["msg_index"]): decoder.row(
            r["msg_type"], r["rpc_type"], r["method_id"], r["payload"]
        )
        for r in rows
    }
    assert got == want
    assert sorted(v[3] for v in got.values() if v[3] is not None) == ['"alice"', '"bob"']


def test_the_decode_options_are_checked() -> None:
    pytest.importorskip("pyspark")
    from ambrosia_py.spark.source import Options

    with pytest.raises(ValueError, match="decode_method needs option decode"):
        Options.parse({"path": "data", "decode_method": "deposit"})
    with pytest.raises(ValueError, match="not with level=record"):
        Options.parse({"path": "data", "decode": SERVICE, "level": "record"})
    options = Options.parse({"path": "data", "decode": SERVICE, "decode_method": "deposit"})
    assert [name for name, _, _ in options.columns()][-5:] == [
        "method", "args_json", "decode_error", "arg_who", "arg_amount"
    ]  # fmt: skip
