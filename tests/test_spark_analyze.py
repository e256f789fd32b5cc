"""``ambrosia-py analyze``: a report over a recorded run, checked against the log.

One recorded run (module scope): the hello client and server calling each other, the
server SIGKILLed and recovered, logs rolled small so checkpoints are taken; an Ockam hub
that a real client creates streams on and pushes to over TCP; a Wallaroo worker that a
v3 connector streams to. The command runs once on the shared Spark session, and every
number in its Parquet tables and on its page is compared with counts made directly from
the log with ``read_rows`` (and with what the run is known to have done).
"""

from __future__ import annotations

import asyncio
import collections
import os
import pickle
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from ambrosia_py.cli import analyze as analyze_module
from ambrosia_py.cli import main
from ambrosia_py.spark import find_logs, read_rows
from ambrosia_py.spark.report_page import TOTAL_LABELS
from ambrosia_py.spark.report_services import ServiceDecoder, service_method_ids
from ambrosia_py.spark.report_tables import CALL_TYPES, NO_SENDER
from ambrosia_py.testing import ImmortalRunner
from tests.test_spark_rows import write_log

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples" / "hello"))

from client import HelloClient
from server import HelloServer

GREETINGS = 30
PUSHES = {("alpha", 0): 7, ("beta", 0): 3, ("parted", 1): 2}
WORDS = [b"w%d" % i for i in range(1, 6)]
PNG = b"\x89PNG\r\n\x1a\n"


def _wait(condition: Any, what: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(what)
        time.sleep(0.01)  # polling a condition, bounded by the deadline


def _hello(runner: ImmortalRunner) -> None:
    server = runner.start(HelloServer, "server")
    client = runner.start(HelloClient, "client", count=GREETINGS)
    client.wait_until(lambda s: len(s["replies"]) + len(s["refusals"]) >= 10)
    server.kill()  # recovered below: a restart, and a new log
    server = runner.start(HelloServer, "server")
    client.wait_until(lambda s: s["done"])
    server.wait_until(lambda s: s["calls"] == GREETINGS)
    client.stop()
    server.stop()


def _ockam(runner: ImmortalRunner) -> None:
    from immortals.ockam.hub import OckamHub
    from immortals.ockam.hub_client import OckamClient

    hub = runner.start(OckamHub, "hub", listen="127.0.0.1:0")
    local = hub.dispatcher.immortal.local  # this incarnation's things: its transport
    _wait(lambda: getattr(local, "transport", None) is not None, "the hub's transport")
    port = local.transport.address[1]

    async def talk() -> None:
        client = await OckamClient.connect("127.0.0.1", port)
        try:
            streams = {
                ("alpha", 0): await client.create("alpha"),
                ("beta", 0): await client.create("beta"),
            }
            streams[("parted", 1)] = (await client.create_partitioned("parted", 2))[1]
            for key, n in PUSHES.items():
                for i in range(n):
                    await client.push(streams[key], b"%s-%d" % (key[0].encode(), i))
            await client.pull(streams[("alpha", 0)], 0, 10)
        finally:
            await client.close()

    asyncio.run(talk())
    hub.wait_until(lambda s: s["hub"].pushes == sum(PUSHES.values()))
    hub.stop()


def _wallaroo(runner: ImmortalRunner) -> None:
    from immortals.wallaroo.worker import WallarooWorker
    from tests.wallaroo_process import COOKIE, V3Client, released_stream_id, v3_eos, v3_message

    worker = runner.start(
        WallarooWorker, "worker", listen="127.0.0.1:0", dialect="v3", cookie=COOKIE
    )
    local = worker.dispatcher.immortal.local
    _wait(lambda: getattr(local, "transport", None) is not None, "the worker's transport")
    connector = V3Client(local.transport.address[1])
    try:
        connector.handshake()
        connector.notify("words", 0)
        sid = released_stream_id("words")
        for i, word in enumerate(WORDS, 1):
            connector.send(v3_message(sid, i, word))
        connector.send(v3_eos(sid))
    finally:
        connector.close()
    worker.wait_until(lambda s: not s["core"].connections and s["core"].streams)
    worker.stop()


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The data dir of the recorded run (see the module docstring)."""
    data = tmp_path_factory.mktemp("run") / "data"
    # Logs roll at 1 KB, so each instance takes checkpoints while it runs.
    runner = ImmortalRunner(data, coordinator_options=["--log-trigger-mb", "0.001"])
    try:
        _hello(runner)
        _ockam(runner)
        _wallaroo(runner)
    finally:
        runner.close()
    # The worker's logs as an older coordinator (or the released one) leaves them: no
    # sidecar index, so no commit_time, and its calls are counted per record seq.
    for index in (data / "worker_0").glob("serverindex*"):
        index.unlink()
    # And a generated log holding every kind of message (batches, checkpoints, ...) with
    # a flipped byte in record 5: one damaged row.
    log = data / "gen_0" / "serverlog1"
    offsets = write_log(log, range(12), index_every=300)
    flipped = bytearray(log.read_bytes())
    flipped[offsets[5] + 30] ^= 1
    log.write_bytes(bytes(flipped))
    yield data


@pytest.fixture(scope="module")
def report(spark: Any, recorded: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``ambrosia-py analyze`` run on the recorded data dir, on the shared session."""
    out = tmp_path_factory.mktemp("report")
    services = ["server:HelloServer", "client:HelloClient", "immortals.ockam.hub"]
    # The size at which the run's coordinators rolled their logs (the fixture's option).
    argv = ["analyze", str(recorded), "--out", str(out), "--log-trigger-mb", "0.001"]
    for service in [*services, "immortals.wallaroo.worker"]:
        argv += ["--service", service]
    with pytest.MonkeyPatch.context() as patch:
        # The suite's one session, which the command must not stop.
        patch.setattr(analyze_module, "_session", lambda cores: (spark, False))
        result = CliRunner().invoke(main, argv)
    assert result.exit_code == 0, (result.output, result.exception)
    assert result.stdout.strip().splitlines()[-1] == f"report: {out / 'index.html'}"
    return out


def table(report: Path, name: str) -> Any:
    import pandas as pd

    return pd.read_parquet(report / "tables" / f"{name}.parquet")


def log_rows(data: Path) -> list[dict[str, Any]]:
    return list(read_rows(data))


def expected_totals(data: Path) -> dict[str, int]:
    rows = log_rows(data)
    kinds = collections.Counter(r["rpc_type"] for r in rows)
    return {
        "log_files": len(find_logs(data)),
        "instance_versions": len({(r["instance"], r["version"]) for r in rows}),
        "records": len({(r["log_file"], r["offset"]) for r in rows}),
        "messages": len(rows),
        "damaged": sum(not r["check_ok"] for r in rows),
        "calls": sum(kinds[t] for t in CALL_TYPES),
        **{t: kinds[t] for t in CALL_TYPES},
        "returns": kinds["return"],
        "other": sum(r["msg_type"] not in (None, "RPC") for r in rows),
        "payload_bytes": sum(r["payload_size"] or 0 for r in rows),
    }


def test_totals_are_the_counts_of_the_log(report: Path, recorded: Path) -> None:
    totals = dict(zip(*table(report, "totals").to_dict("list").values(), strict=True))
    expected = expected_totals(recorded)
    assert {k: totals[k] for k in expected} == expected
    assert expected["damaged"] == 1
    # What the run did: every greeting called and answered once, across the SIGKILL.
    rows = log_rows(recorded)
    hello = HelloServer.rpc_methods_by_name()["hello"].id
    at_server = [r for r in rows if r["instance"] == "server" and r["method_id"] == hello]
    assert len(at_server) == GREETINGS and all(r["rpc_type"] == "async" for r in at_server)
    assert sum(r["rpc_type"] == "return" and r["instance"] == "client" for r in rows) == GREETINGS
    per_instance = table(report, "instances").set_index("instance")
    assert per_instance.loc["server", "async"] == GREETINGS
    assert per_instance.loc["client", "returns"] == GREETINGS
    assert per_instance["messages"].sum() == expected["messages"]


def test_calls_over_time_by_method_and_the_axis_used(report: Path, recorded: Path) -> None:
    calls = table(report, "calls_over_time")
    rows = [r for r in log_rows(recorded) if r["rpc_type"] in CALL_TYPES]
    expected = collections.Counter((r["instance"], r["method_id"]) for r in rows)
    got = calls.groupby(["instance", "method_id"])["calls"].sum().to_dict()
    assert got == dict(expected)
    assert set(calls[calls["instance"] == "server"]["method"]) == {"hello"}
    assert set(calls[calls["instance"] == "client"]["method"]) == {"greet_all"}
    assert set(calls[calls["instance"] == "hub"]["method"]) == {"frames"}
    axes = calls.drop_duplicates("instance").set_index("instance")["axis"].to_dict()
    assert axes == {"server": "commit_time", "client": "commit_time", "hub": "commit_time",
                    "gen": "commit_time", "worker": "seq"}  # fmt: skip
    # Each timed call lies in its bucket: commit_time in [bucket, bucket + width).
    timed = [r for r in rows if r["commit_time"] is not None]
    per_bucket = collections.Counter()
    for r in timed:
        width = calls[calls["instance"] == r["instance"]]["width"].iloc[0]
        t = r["commit_time"].timestamp()
        per_bucket[(r["instance"], r["method_id"], round(t // width * width, 3))] += 1
    mine = calls[calls["axis"] == "commit_time"]
    assert {
        (i, m, round(b, 3)): n
        for i, m, b, n in zip(mine["instance"], mine["method_id"], mine["bucket"], mine["calls"],
                              strict=True)
    } == dict(per_bucket)  # fmt: skip


def test_sizes_kinds_and_calls_between_instances(report: Path, recorded: Path) -> None:
    rows = log_rows(recorded)

    def kind(r: dict[str, Any]) -> str:
        return f"RPC {r['rpc_type']}" if r["msg_type"] == "RPC" else str(r["msg_type"])

    sized = [r for r in rows if r["payload_size"] is not None]
    stats = table(report, "message_size_stats").set_index("kind")
    for k in {kind(r) for r in sized}:
        sizes = [r["payload_size"] for r in sized if kind(r) == k]
        assert stats.loc[k, "messages"] == len(sizes)
        assert stats.loc[k, "bytes"] == sum(sizes)
        assert (stats.loc[k, "min"], stats.loc[k, "max"]) == (min(sizes), max(sizes))
    bins = table(report, "message_sizes")
    counted = collections.Counter()
    for r in sized:
        size = r["payload_size"]
        low = 0 if size == 0 else 1 << (size.bit_length() - 1)
        counted[(kind(r), low)] += 1
    keys = zip(bins["kind"], bins["low"], strict=True)
    assert dict(zip(keys, bins["messages"], strict=True)) == counted
    assert all(lo <= hi for lo, hi in zip(bins["low"], bins["high"], strict=True))

    kinds = table(report, "call_kinds")
    expected = collections.Counter(
        (r["instance"], r["method_id"], r["rpc_type"]) for r in rows if r["rpc_type"] in CALL_TYPES
    )
    got = zip(kinds["instance"], kinds["method_id"], kinds["rpc_type"], kinds["calls"], strict=True)
    assert {(i, m, t): n for i, m, t, n in got} == expected
    assert set(kinds[kinds["replayable"]]["rpc_type"]) <= {"async", "fork"}

    between = table(report, "calls_between")
    expected = collections.Counter(
        (r["sender"] or NO_SENDER, r["destination"], r["rpc_type"])
        for r in rows
        if r["msg_type"] == "RPC"
    )
    got = zip(between["sender"], between["destination"], between["rpc_type"], between["messages"],
              strict=True)  # fmt: skip
    assert {(s, d, t): n for s, d, t, n in got} == expected
    assert expected[("client", "server", "async")] == GREETINGS
    assert expected[("server", "client", "return")] == GREETINGS


def test_log_files_checkpoints_and_control_messages(report: Path, recorded: Path) -> None:
    logs = table(report, "logs")
    rows = log_rows(recorded)
    files = find_logs(recorded)
    assert list(logs["log_file"]) == [f.path for f in files]
    for log, row in zip(files, logs.to_dict("records"), strict=True):
        mine = [r for r in rows if r["log_file"] == log.path]
        assert row["records"] == len({r["offset"] for r in mine})
        assert row["messages"] == len(mine)
        if log.number == 1:
            assert row["start"] == "first start"
        checkpoint = Path(log.path).parent / f"serverchkpt{log.number}"
        assert row["checkpoint"] == checkpoint.exists()
        if mine:
            assert (row["first_seq"], row["last_seq"]) == (mine[0]["seq"], mine[-1]["seq"])
    # The hello logs rolled (checkpoints while running), the server's also at its recovery.
    per_instance = logs.groupby("instance")["log_number"].max().to_dict()
    assert per_instance["client"] >= 2 and per_instance["server"] >= 3, per_instance
    # A log rolls once past 0.001 MB here (as a coordinator counts it), so a new log after
    # a smaller one is the restart, and the files cannot tell the others; only the server
    # restarted, once. The worker logs a new incarnation at every start: its new logs are
    # all checkpoints.
    trigger = int(0.001 * 1024 * 1024)
    for row in logs[logs["log_number"] > 1].to_dict("records"):
        size = Path(row["log_file"]).with_name(f"serverlog{row['log_number'] - 1}").stat().st_size
        if row["instance"] == "worker":
            assert row["start"] == "checkpoint", row
        else:
            assert row["start"] == ("restart" if size < trigger else "checkpoint or restart"), row
    restarts = logs[logs["start"] == "restart"]
    assert set(restarts["instance"]) <= {"server"} and len(restarts) <= 1
    starts = table(report, "starts")
    assert list(starts["log_file"]) == list(logs[logs["start"] != "checkpoint"]["log_file"])
    control = table(report, "control_messages")
    expected = collections.Counter(
        (r["log_file"], r["msg_type"]) for r in rows if r["msg_type"] not in (None, "RPC")
    )
    got = zip(control["log_file"], control["msg_type"], control["messages"], strict=True)
    assert {(f, t): n for f, t, n in got} == expected
    assert set(control["msg_type"]) == {"InitialMessage", "AttachTo", "TrimTo", "TakeCheckpoint",
                                        "Checkpoint", "Ping"}  # fmt: skip
    hello = control[control["instance"].isin(["client", "server", "hub", "worker"])]
    assert list(hello["msg_type"]) == ["InitialMessage"] * 4  # one per first start


def _independent_service_counts(data: Path) -> tuple[dict[Any, int], dict[Any, list[int]]]:
    """Ockam pushes per (stream, partition), and Wallaroo (messages, bytes) per stream
    name, decoded here from ``read_rows`` with plain ``pickle`` (the logs are ours)."""
    from immortals.ockam import codec
    from immortals.ockam.routing import decode_message
    from immortals.wallaroo.codec import Dialect, decode_tagged
    from immortals.wallaroo.frames import Message, Notify

    frames_id = service_method_ids()["frames"]
    pushes: dict[Any, int] = collections.Counter()
    words: dict[Any, list[int]] = collections.defaultdict(lambda: [0, 0])
    names: dict[int, str] = {}
    for r in log_rows(data):
        if r["method_id"] != frames_id:
            continue
        (_, _, frames), _ = pickle.loads(r["payload"])
        for frame in frames:
            if r["instance"] == "hub":
                msg = decode_message(frame)
                request = codec.decode_request(msg.payload)
                if isinstance(request, codec.PushRequest):
                    _, partition, stream = msg.onward_route[0].text.split(".", 2)
                    pushes[(stream, int(partition))] += 1
            else:
                decoded = decode_tagged(frame, Dialect.V3)
                if isinstance(decoded, Notify):
                    names[decoded.stream_id] = decoded.stream_name
                if isinstance(decoded, Message) and decoded.payload is not None:
                    words[names[decoded.stream_id]][0] += 1
                    words[names[decoded.stream_id]][1] += len(decoded.payload)
    return dict(pushes), dict(words)


def test_ockam_and_wallaroo_streams_decoded_from_payloads(report: Path, recorded: Path) -> None:
    pushes, words = _independent_service_counts(recorded)
    assert pushes == PUSHES
    assert words == {"words": [len(WORDS), sum(map(len, WORDS))]}
    ockam = table(report, "ockam_streams")
    stored = ockam[ockam["request"] == "PushRequest"]
    got = zip(stored["stream"], stored["partition"], stored["frames"], strict=True)
    assert {(s, int(p)): n for s, p, n in got} == PUSHES
    assert set(ockam["request"]) == {"CreateStreamRequest", "CreatePartitionedRequest",
                                     "PushRequest", "PullRequest"}  # fmt: skip
    wallaroo = table(report, "wallaroo_streams")
    messages = wallaroo[wallaroo["request"] == "Message"]
    assert [(s, n, b) for s, n, b in zip(messages["stream"], messages["frames"], messages["bytes"],
            strict=True)] == [("words", len(WORDS), sum(map(len, WORDS)))]  # fmt: skip
    assert set(wallaroo["request"]) == {"Hello", "Notify", "Message", "EosMessage"}
    assert table(report, "undecoded").empty
    totals = dict(zip(*table(report, "totals").to_dict("list").values(), strict=True))
    assert totals["ockam_frames"] == ockam["frames"].sum()
    assert totals["wallaroo_frames"] == wallaroo["frames"].sum()


def test_the_page_names_the_totals_and_its_charts_are_pngs(report: Path, recorded: Path) -> None:
    import matplotlib.image

    page = (report / "index.html").read_text()
    shown = dict(re.findall(r"<tr><td>([^<]+)</td><td>([\d,]+)</td></tr>", page))
    expected = expected_totals(recorded)
    assert {k: int(shown[TOTAL_LABELS[k]].replace(",", "")) for k in expected} == expected
    assert "decoded by unpickling" in page and "Decode only logs you trust" in page
    assert "per record seq for worker" in page
    assert not re.search(r"(src|href)=\"(https?:)?//", page)  # nothing fetched from afar
    charts = re.findall(r'<img src="([^"]+)"', page)
    assert set(charts) == {p.name for p in report.glob("*.png")}
    assert len(charts) == 7
    for chart in charts:
        data = (report / chart).read_bytes()
        assert data.startswith(PNG) and data[-8:-4] == b"IEND", chart
        assert matplotlib.image.imread(report / chart).shape[0] > 50
    for link in re.findall(r'<a href="([^"]+)"', page):
        assert (report / link).is_file()


def test_without_the_spark_extra_it_says_what_to_install(tmp_path: Path) -> None:
    code = (
        "import sys\n"
        "class Block:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name.split('.')[0] == 'matplotlib':\n"
        "            raise ImportError(name)\n"
        "sys.meta_path.insert(0, Block())\n"
        "from ambrosia_py.cli import main\n"
        f"main(['analyze', {str(tmp_path)!r}, '--out', {str(tmp_path / 'out')!r}])\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 1
    assert out.stderr.splitlines() == [
        "Error: ambrosia-py analyze needs the spark extra (no matplotlib here): "
        "pip install 'ambrosia-py[spark]'"
    ]
    assert not (tmp_path / "out").exists()


class _Evil:
    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> Any:
        return (os.system, (f"touch {self.marker}",))


def test_decoding_unpickles_no_global_but_the_services_configs(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    decoder = ServiceDecoder()
    hostile = pickle.dumps(((_Evil(marker),), {}))
    decoder.feed(service_method_ids()["frames"], hostile, "log L, offset 7, message 0")
    assert not marker.exists()
    [row] = decoder.rows("svc", 0)
    assert row[:4] == ("svc", 0, "unknown", None) and row[7:9] == ("undecodable", 1)
    assert row[10].startswith("log L, offset 7, message 0: arguments not decoded")
    assert "is not allowed here" in row[10]


def test_services_are_decoded_by_default_only_from_this_user_s_private_logs(
    tmp_path: Path,
) -> None:
    from ambrosia_py.spark.report_services import own_logs

    log = tmp_path / "serverlog1"
    log.write_bytes(b"")
    log.chmod(0o600)  # as the coordinator makes them
    assert own_logs([log])
    log.chmod(0o620)  # others may have written it
    assert not own_logs([log])
