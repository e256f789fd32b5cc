"""``ambrosia-py analyze`` speaks the services' names: ingress calls under the methods they
carry, the project's own services decoded whole, kills and recoveries marked, and only
the sections that apply.

One recording (module scope), made as a user would: the demo's pipeline (``ambrosia-py
demo --quick --no-spark`` with fewer readings: the Ockam hub, the Wallaroo connector and
worker, each SIGKILLed twice), then in the same data dir a small shop run with
``ambrosia-py run --ingress``, called through ``ambrosia_py.client``, its service process
SIGKILLed between two rounds of calls and run again. The command runs over the whole
data dir and over the shop's logs alone, on the shared Spark session; what it says is
checked against what the run did (the calls made, the kills the demo printed, the clock
around the kill) and against the log read without the report (``read_rows`` and the
ingress's own envelope decoder).
"""

from __future__ import annotations

import collections
import os
import pickle
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from ambrosia_py.binding.loading import load_service
from ambrosia_py.cli import analyze as analyze_module
from ambrosia_py.cli import main
from ambrosia_py.client import Client
from ambrosia_py.demo.analytics import SERVICES as DEMO_SERVICES
from ambrosia_py.demo.command import QUICK
from ambrosia_py.ingress.envelope import (
    INGRESS_METHOD_ID,
    CallEnvelope,
    RetentionEnvelope,
    decode_envelope,
    encode_call_envelope,
    encode_retention_envelope,
)
from ambrosia_py.spark import decoded, read_rows
from ambrosia_py.spark.report_services import ServiceDecoder, service_method_ids
from ambrosia_py.testing import ServiceProcess, free_port

# The recording and the first Spark job (a JVM started) come in the first test's time.
pytestmark = pytest.mark.timeout(600)

ROOT = Path(__file__).resolve().parents[1]
DEADLINE = 60.0
SHOP = """
from ambrosia_py import Immortal, rpc


class Orders(Immortal):
    def __init__(self) -> None:
        self.items: list[str] = []

    @rpc
    def place(self, item: str) -> int:
        self.items.append(item)
        return len(self.items)

    @rpc
    def count(self) -> int:
        return len(self.items)
"""
BEFORE, AFTER = 5, 3  # place calls before the kill and after the restart
# The demo's output is a pipe here: nothing in the environment may say otherwise.
ENV = {k: v for k, v in os.environ.items() if k not in ("FORCE_COLOR", "TTY_COMPATIBLE", "COLUMNS")}
ENV["PYTHONPATH"] = str(ROOT)


class Recording:
    """What the recorded run did, as the test saw it."""

    def __init__(self, data: Path, shop: Path) -> None:
        self.data = data
        self.shop = shop
        self.kills: collections.Counter[str] = collections.Counter()  # per demo instance
        self.killed_at = 0.0  # the clock just before the shop's SIGKILL
        self.answered_at = 0.0  # ... and once its first call after the restart returned


def _shop_run(shop: Path, data: Path, port: int) -> ServiceProcess:
    run = ServiceProcess(str(shop), "orders", data, ["--ingress", f"127.0.0.1:{port}"])
    run.start()
    try:
        run.wait_for_log("ingress listening on", DEADLINE)
    except BaseException:
        run.kill("both")
        raise
    return run


def _drive_shop(rec: Recording) -> None:
    orders: Any = load_service(f"{rec.shop}:Orders")
    port = free_port()
    run = _shop_run(rec.shop, rec.data, port)
    try:
        with Client(f"127.0.0.1:{port}", data_dir=rec.data, timeout=DEADLINE) as client:
            for i in range(BEFORE):
                assert client.call(orders.place, f"before-{i}", key=f"b{i}") == i + 1
            rec.killed_at = time.time()
            run.kill("service")
            run = _shop_run(rec.shop, rec.data, port)
            assert client.call(orders.place, "after-0", key="a0") == BEFORE + 1
            rec.answered_at = time.time()
            for i in range(1, AFTER):
                assert client.call(orders.place, f"after-{i}", key=f"a{i}") == BEFORE + i + 1
            assert client.call(orders.count) == BEFORE + AFTER
    finally:
        run.stop()


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> Recording:
    tmp = tmp_path_factory.mktemp("names")
    workdir = tmp / "demo"
    argv = [sys.executable, "-m", "ambrosia_py.cli", "demo", "--quick", "--no-spark"]
    argv += ["--events", "400", "--rate", "100", "--workdir", str(workdir)]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=240, cwd=ROOT, env=ENV)
    output = done.stdout + done.stderr
    assert done.returncode == 0, output
    shop = tmp / "shop.py"
    shop.write_text(SHOP)
    rec = Recording(workdir / "data", shop)
    rec.kills.update(re.findall(r"SIGKILL (hub|connector|worker): \w+ \(pids", output))
    assert sum(rec.kills.values()) == len(QUICK.kills), output
    _drive_shop(rec)
    return rec


def _analyze(spark: Any, path: Path, out: Path, services: list[str]) -> Path:
    argv = ["analyze", str(path), "--out", str(out)]
    for service in services:
        argv += ["--service", service]
    with pytest.MonkeyPatch.context() as patch:
        # The suite's one session, which the command must not stop.
        patch.setattr(analyze_module, "_session", lambda cores: (spark, False))
        result = CliRunner().invoke(main, argv)
    assert result.exit_code == 0, (result.output, result.exception)
    return out


@pytest.fixture(scope="module")
def report(spark: Any, recorded: Recording, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The report over the whole data dir, naming the services as the demo does."""
    out = tmp_path_factory.mktemp("report")
    return _analyze(spark, recorded.data, out, [f"{recorded.shop}:Orders", *DEMO_SERVICES])


def table(report: Path, name: str) -> Any:
    import pandas as pd

    return pd.read_parquet(report / "tables" / f"{name}.parquet")


def headings(report: Path) -> list[str]:
    return re.findall(r"<h2>([^<]+)</h2>", (report / "index.html").read_text())


def section(report: Path, title: str) -> str:
    page = (report / "index.html").read_text()
    return page.split(f"<h2>{title}</h2>", 1)[1].split("<h2>", 1)[0]


def test_ingress_calls_are_counted_under_the_methods_they_carry(
    spark: Any, report: Path, recorded: Recording
) -> None:
    orders: Any = load_service(f"{recorded.shop}:Orders")
    ids = {name: m.id for name, m in orders.rpc_methods_by_name().items()}
    calls = table(report, "calls_over_time")
    mine = calls[calls["instance"] == "orders"]
    got = mine.groupby(["method_id", "method", "ingress"])["calls"].sum().to_dict()
    assert got == {
        (ids["place"], "place", "call"): BEFORE + AFTER,
        (ids["count"], "count", "call"): 1,
    }
    # The log read without the report: every ingress impulse carries one of these calls.
    rows = [r for r in read_rows(recorded.data / "orders_0") if r["rpc_type"] == "impulse"]
    assert {r["method_id"] for r in rows} == {INGRESS_METHOD_ID}
    carried = collections.Counter(decode_envelope(r["payload"]).method_id for r in rows)
    assert carried == {ids["place"]: BEFORE + AFTER, ids["count"]: 1}
    # What Spark's decoded() names them, on the same rows.
    df = spark.read.format("ambrosia").load(str(recorded.data / "orders_0"))
    named = decoded(df, f"{recorded.shop}:Orders").where("method IS NOT NULL")
    assert dict(collections.Counter(r["method"] for r in named.collect())) == {
        "place": BEFORE + AFTER,
        "count": 1,
    }
    kinds = table(report, "call_kinds")
    assert set(kinds[kinds["instance"] == "orders"]["method"]) == {"place", "count"}
    shown = section(report, "Calls over time") + section(report, "Impulses versus replayable calls")
    assert "<td>place</td>" in shown and "<td>count</td>" in shown
    assert f"#{INGRESS_METHOD_ID}" not in (report / "index.html").read_text()


def test_the_kill_and_the_recovery_are_marked(report: Path, recorded: Recording) -> None:
    import pandas as pd

    starts = table(report, "starts")
    shop = starts[starts["instance"] == "orders"].to_dict("records")
    assert [(r["log_number"], r["start"]) for r in shop] == [(1, "first start"), (2, "restart")]
    restart = shop[1]
    # The restart's first record came after the kill, by the first call answered after it;
    # the instance's last record before it, before the kill.
    t = restart["time"].tz_localize("UTC").timestamp()
    assert recorded.killed_at < t <= recorded.answered_at
    assert restart["quiet_since"].tz_localize("UTC").timestamp() <= recorded.killed_at
    assert restart["quiet_seconds"] == pytest.approx(
        (restart["time"] - restart["quiet_since"]).total_seconds()
    )
    logs = table(report, "logs")
    assert logs[logs["instance"] == "orders"]["start"].tolist() == ["first start", "restart"]
    # Named under the chart that marks it, at its time to the millisecond.
    when = pd.Timestamp(restart["time"]).strftime("%H:%M:%S.%f")[:-3]
    assert f"orders restart at {when} UTC" in section(report, "Calls over time")
    totals = dict(zip(*table(report, "totals").to_dict("list").values(), strict=True))
    assert totals["restarts"] == sum(recorded.kills.values()) + 1
    assert "maybe_restarts" not in totals


def test_the_demo_services_decode_whole_and_their_restarts_are_marked(
    report: Path, recorded: Recording
) -> None:
    assert table(report, "undecoded").empty
    assert "Not decoded" not in headings(report)
    assert {"Ockam streams", "Wallaroo streams"} <= set(headings(report))
    wallaroo = table(report, "wallaroo_streams")
    roles = wallaroo.groupby("instance")["role"].unique().to_dict()
    assert {i: list(r) for i, r in roles.items()} == {
        "connector": ["connector"],
        "worker": ["worker"],
    }
    # The connector's frames are the worker's answers, its stream named by its config.
    acks = wallaroo[(wallaroo["instance"] == "connector") & (wallaroo["request"] == "NotifyAck")]
    assert set(acks["stream"]) == {"ockam:readings"}
    starts = table(report, "starts")
    restarts = starts[starts["start"] == "restart"]
    assert restarts.groupby("instance").size().to_dict() == {**recorded.kills, "orders": 1}
    for row in restarts.to_dict("records"):
        if row["instance"] in ("worker", "connector"):
            assert "logged a new incarnation" in row["evidence"], row
    logs = table(report, "logs")
    assert set(logs[logs["log_number"] > 1]["start"]) == {"restart"}  # no checkpoint taken


def test_an_ordinary_service_s_report_leaves_out_what_does_not_apply(
    spark: Any, recorded: Recording, tmp_path: Path
) -> None:
    shop = [f"{recorded.shop}:Orders"]
    out = _analyze(spark, recorded.data / "orders_0", tmp_path / "report", shop)
    assert headings(out) == [
        "Instances",
        "Calls over time",
        "Message sizes",
        "Impulses versus replayable calls",
        "Log files and checkpoints",
        "Starts and restarts",
    ]
    page = (out / "index.html").read_text()
    assert "Ockam" not in page and "Wallaroo" not in page
    charts = re.findall(r'<img src="([^"]+)"', page)
    assert sorted(charts) == sorted(p.name for p in out.glob("*.png"))
    assert "calls_between.png" not in charts
    assert not list((out / "tables").glob("*_streams.parquet"))
    assert not (out / "tables" / "undecoded.parquet").exists()


def test_the_ingress_columns_agree_with_the_envelope_decoder(spark: Any) -> None:
    from ambrosia_py.spark.report_ingress import with_ingress

    payloads = [
        encode_call_envelope(1, b"k", 5, b"args"),
        encode_call_envelope(2**64 - 1, b"x" * 255, -1, b""),
        encode_call_envelope(7, b"ab", -(2**31), bytes(100)),
        encode_call_envelope(7, b"ab", 2**31 - 1, b"\x01"),
        encode_retention_envelope(RetentionEnvelope(3, 4)),
        b"",
        b"\x01",
        b"\x01" + bytes(9),  # no key
        b"\x03" + bytes(20),  # no such kind
        encode_call_envelope(1, b"key", 9, b"")[:-1],  # the method id cut
        encode_retention_envelope(RetentionEnvelope(3, 4)) + b"\x00",
    ]
    rows = [("RPC", "impulse", INGRESS_METHOD_ID, p) for p in payloads]
    rows += [("RPC", "impulse", 77, b"\x01"), ("RPC", "async", INGRESS_METHOD_ID, b"\x01")]
    schema = "msg_type STRING, rpc_type STRING, method_id INT, payload BINARY"
    columns = with_ingress(spark.createDataFrame(rows, schema)).collect()
    got = [(r["ingress"], r["called_id"]) for r in columns]
    expected = []
    for p in payloads:
        try:
            envelope = decode_envelope(p)
        except Exception:
            expected.append(("undecodable", INGRESS_METHOD_ID))
            continue
        if isinstance(envelope, CallEnvelope):
            expected.append(("call", envelope.method_id))
        else:
            expected.append(("retention", INGRESS_METHOD_ID))
    assert got == [*expected, (None, 77), (None, INGRESS_METHOD_ID)]


class _Global:
    """Pickles as a call of ``module.name(*args)``."""

    def __init__(self, module: str, name: str, *args: Any) -> None:
        self.target = (module, name, args)

    def __reduce__(self) -> Any:
        module, name, args = self.target
        return (getattr(__import__(module, fromlist=[name]), name), args)


@pytest.mark.parametrize(
    ("module", "name", "args"),
    [
        ("immortals.wallaroo.connector_actions", "parse_address", ("h:1",)),
        ("shutil", "which", ("sh",)),
    ],
)
def test_only_the_named_classes_of_the_services_modules_unpickle(
    module: str, name: str, args: tuple[Any, ...]
) -> None:
    """ConnectorConfig is allowed, not its module: any other global there is refused."""
    decoder = ServiceDecoder()
    payload = pickle.dumps((("incarnation", _Global(module, name, *args)), {}))
    decoder.feed(service_method_ids()["start"], payload, "log L, offset 0, message 0")
    [row] = decoder.rows("svc", 0)
    assert row[2:4] == ("unknown", None) and row[7] == "undecodable"
    assert f"the global {module}.{name} is not allowed here" in row[10]
