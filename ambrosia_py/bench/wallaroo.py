"""``ambrosia-py bench wallaroo``: messages per second from a connector to a worker.

Each run starts, in its own temporary data directories, a real worker (``ambrosia-py
run immortals.wallaroo.worker``) and a real connector (``ambrosia-py run
immortals.wallaroo.connector``) whose source is ``gen://N?seed=1&size=100``: N
messages of 100 bytes on one stream. Each has its own coordinator logging every input
durably (group commit, ``fdatasync``), so a message is applied only once the worker's
log holds it, and an ACK refills credits only once it is durable. The worker's credit
window (``--max-credits``, refilled at half) is the variable: 10, 100 and 1,000.

What is timed: from the connector's start of streaming (the first poll that finds the
worker holding the stream its NOTIFY introduced) to the poll that finds the worker
has applied all N; the rate counts the messages applied between those two polls. The
polls read ``applied`` through the worker's operators' port (``--control``), on one
kept-open connection, and space themselves by the remaining time the rate so far
predicts (about a dozen requests a run), so observing barely perturbs the worker. CPU
time of the four processes (worker and connector, each a service process and its
coordinator) over the same interval comes from ``/proc`` and says which one limits;
so does the time each service's event loop spent runnable but waiting for a CPU
(``/proc/PID/schedstat``), which is what the machine's other load took from it.

The machine's speed swings 2-4x with its other load, so each round first measures two
baselines and every figure is also given as a ratio to its own round's:

- ``fdatasync``ed 4 KiB appends per second on the disk the logs are on (every durable
  figure is bounded by it; ``msgs/fsync`` is how many messages a flush must carry);
- loopback TCP: 100-byte frames with a u32 length prefix, sent in batches to another
  Python process that splits them frame by frame: the ceiling for any Python receiver.

Rounds interleave the windows (round 1: 10, 100, 1,000; round 2: ...) so a swing in
the machine's load touches every window alike. The median of the runs is shown beside
each run. ``--json`` prints every figure as one JSON object on the last line.
"""

from __future__ import annotations

import json
import os
import socket
import statistics
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Final

import click
from rich.console import Console
from rich.table import Table

from ..testing.ports import free_port
from ..testing.processes import ServiceProcess
from .coordinator import measure_fsync_rate

__all__ = [
    "APPS",
    "PAYLOAD_SIZE",
    "TARGET",
    "Control",
    "count_messages",
    "count_words",
    "measure_stream",
    "measure_tcp_frames",
    "wallaroo_bench",
]

PAYLOAD_SIZE: Final = 100
TARGET: Final = 20_000  # messages/s at 1,000 credits: the goal docs/wallaroo.md reports against
TARGET_CREDITS: Final = 1000
COOKIE: Final = "bench-wallaroo"
_FIRST_POLL: Final = 0.005  # seconds between polls until the stream starts
_MIN_POLL: Final = 0.002
_MAX_POLL: Final = 0.5
_STALL: Final = 60.0  # seconds without progress before a run is given up


def count_messages(state: dict[str, Any], payload: bytes) -> None:
    """The trivial application: count the messages."""
    state["messages"] = state.get("messages", 0) + 1


def count_words(state: dict[str, Any], payload: bytes) -> None:
    """Word count, as the worker's tests run it: count each word, and the messages."""
    counts = state.setdefault("counts", {})
    for word in payload.decode("utf-8").split():
        counts[word] = counts.get(word, 0) + 1
    state["messages"] = state.get("messages", 0) + 1


APPS: Final = {
    "words": f"{__name__}:count_words",
    "count": f"{__name__}:count_messages",
}


# --- processes ---------------------------------------------------------------------------


class _Process(ServiceProcess):
    """An immortal's processes, with the CPU they have used."""

    def __init__(self, data_dir: Path, service: str, instance: str, args: list[str]) -> None:
        super().__init__(service, instance, data_dir, args)

    def cpu_seconds(self) -> tuple[float, float, float]:
        """Seconds so far: CPU (user + system) of the service process and of its
        coordinator, and how long the service's event loop waited, runnable, for a CPU."""
        assert self.proc is not None
        ic = self.coordinator_pid()
        pid = self.proc.pid
        return _cpu(pid), (_cpu(ic) if ic is not None else 0.0), _waited(pid)


_TICK: Final = os.sysconf("SC_CLK_TCK")


def _cpu(pid: int) -> float:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / _TICK  # utime, stime (fields 14, 15)


def _waited(pid: int) -> float:
    """Seconds the main thread has spent on a run queue, runnable but not running: the
    CPU other load took from it (``/proc/PID/schedstat``, its second field, in ns)."""
    try:
        return int(Path(f"/proc/{pid}/schedstat").read_text().split()[1]) / 1e9
    except (OSError, IndexError, ValueError):
        return 0.0


class Control:
    """One kept-open connection to a worker's operators' port, asking for its status."""

    def __init__(self, address: str, cookie: str, timeout: float = 10.0) -> None:
        host, _, port = address.rpartition(":")
        self.sock = socket.create_connection((host, int(port)), timeout=timeout)
        self.answers = self.sock.makefile("rb")
        self.request = json.dumps({"op": "status", "cookie": cookie}).encode() + b"\n"

    def status(self) -> tuple[float, dict[str, Any]]:
        """(when, status): ``when`` is the middle of the request's round trip."""
        sent = time.perf_counter()
        self.sock.sendall(self.request)
        line = self.answers.readline()
        got = time.perf_counter()
        if not line:
            raise ConnectionError("the worker closed its operators' port")
        answer = json.loads(line)
        if not answer.get("ok"):
            raise RuntimeError(f"status refused: {answer}")
        return (sent + got) / 2, dict(answer["status"])

    def close(self) -> None:
        self.answers.close()
        self.sock.close()


def _free_address() -> str:
    return f"127.0.0.1:{free_port()}"


def _connect_control(worker: _Process, control: str, timeout: float = 60.0) -> Control:
    deadline = time.monotonic() + timeout
    while True:
        try:
            return Control(control, COOKIE)
        except OSError:
            worker.check_alive()
            if time.monotonic() > deadline:
                raise RuntimeError(f"the worker did not start:\n{worker.tail()}") from None
            time.sleep(0.02)  # polling a condition, bounded by the deadline


# --- one run -----------------------------------------------------------------------------


def measure_stream(
    directory: Path, messages: int, credits: int, dialect: str, app: str
) -> dict[str, Any]:
    """One worker and one connector streaming ``messages`` 100-byte messages.

    Returns ``msgs_per_s`` (the messages applied between the start of streaming and the
    last one, over that time), ``seconds``, ``timed`` (how many messages that was),
    ``applied`` and ``duplicates`` as the worker reports them once the stream has ended,
    ``end_point`` (the stream's acknowledged point), and ``cpu``: over the timed
    interval, each process's share of one core (``worker``, ``worker_ic``,
    ``connector``, ``connector_ic``) and how much of it each service's event loop spent
    runnable but waiting for a CPU (``worker_waiting``, ``connector_waiting``: the
    machine's other load). RuntimeError if a process dies or stalls.
    """
    control = _free_address()
    listen = _free_address()
    worker = _Process(
        directory / "worker",
        "immortals.wallaroo.worker",
        "worker",
        [
            *("--listen", listen, "--control", control, "--cookie", COOKIE),
            *("--dialect", dialect, "--app", APPS[app]),
            *("--max-credits", str(credits), "--refill-credits", str(max(1, credits // 2))),
        ],
    )
    source = f"gen://{messages}?seed=1&size={PAYLOAD_SIZE}"
    connector = _Process(
        directory / "connector",
        "immortals.wallaroo.connector",
        "connector",
        [
            *("--worker", listen, "--cookie", COOKIE, "--dialect", dialect),
            *("--source", source, "--backoff-max", "0.5"),
        ],
    )
    procs = (worker, connector)
    with worker.running():
        ctl = _connect_control(worker, control)
        try:
            with connector.running():
                return _observe(ctl, procs, messages)
        finally:
            ctl.close()


def _observe(ctl: Control, procs: tuple[_Process, ...], messages: int) -> dict[str, Any]:
    worker, connector = procs
    # The start: the worker holds the stream (its NOTIFY was handled, the answer is on
    # the way and the connector streams as soon as it arrives).
    progress_at = time.monotonic()
    while True:
        t0, status = ctl.status()
        if status["streams"] or status["applied"]:
            break
        if time.monotonic() - progress_at > _STALL:
            raise RuntimeError(f"the connector never started:\n{connector.tail()}")
        connector.check_alive()
        time.sleep(_FIRST_POLL)  # polling a condition, bounded by the deadline
    cpu0 = [c for p in procs for c in p.cpu_seconds()]
    a0 = last = int(status["applied"])
    t, wait = t0, 0.02
    while last < messages:
        time.sleep(wait)  # polling a condition, bounded by the stall deadline
        t, status = ctl.status()
        applied = int(status["applied"])
        if applied > last:
            progress_at, last = time.monotonic(), applied
        elif time.monotonic() - progress_at > _STALL:
            raise RuntimeError(
                f"stalled at {applied} of {messages}:\n{worker.tail()}\n{connector.tail()}"
            )
        for p in procs:
            p.check_alive()
        rate = (applied - a0) / max(t - t0, 1e-6)
        predicted = (messages - applied) / rate if rate > 0 else _MAX_POLL
        wait = min(_MAX_POLL, max(_MIN_POLL, 0.5 * predicted))
    cpu1 = [c for p in procs for c in p.cpu_seconds()]
    seconds = t - t0
    names = (
        *("worker", "worker_ic", "worker_waiting"),
        *("connector", "connector_ic", "connector_waiting"),
    )
    cpu = {n: (b - a) / seconds for n, a, b in zip(names, cpu0, cpu1, strict=True)}
    end = _wait_for_end(ctl, messages)
    return {
        "msgs_per_s": (last - a0) / seconds,
        "seconds": seconds,
        "timed": last - a0,
        "applied": int(end["applied"]),
        "duplicates": int(end["duplicates"]),
        "app_messages": int(end["app_state"].get("messages", 0)),
        "end_point": max((int(s["point"] or 0) for s in end["streams"].values()), default=0),
        "cpu": cpu,
    }


def _wait_for_end(ctl: Control, messages: int, timeout: float = 60.0) -> dict[str, Any]:
    """The worker's status once the stream is closed by EOS at its last point."""
    deadline = time.monotonic() + timeout
    while True:
        _, status = ctl.status()
        streams = list(status["streams"].values())
        if streams and all(s["state"] == "closed" and s["point"] == messages for s in streams):
            return status
        if time.monotonic() > deadline:
            raise RuntimeError(f"the stream did not end at {messages}: {status['streams']}")
        time.sleep(0.01)  # polling a condition, bounded by the deadline


# --- the baseline: loopback TCP, 100-byte frames, split one by one in Python --------------

_RECEIVER: Final = r"""
import socket, struct, sys
n = int(sys.argv[1])
with socket.create_server(("127.0.0.1", 0)) as server:
    print(server.getsockname()[1], flush=True)
    conn, _ = server.accept()
unpack = struct.Struct("<I").unpack_from
buf, got = b"", 0
while got < n:
    data = conn.recv(262144)
    if not data:
        break
    buf += data
    pos, end = 0, len(buf)
    while end - pos >= 4:
        (size,) = unpack(buf, pos)
        if end - pos - 4 < size:
            break
        frame = buf[pos + 4 : pos + 4 + size]
        pos += 4 + size
        got += 1
    buf = buf[pos:]
conn.sendall(b"%d\n" % got)
conn.close()
"""


def measure_tcp_frames(count: int, batch: int = 1000) -> float:
    """Frames per second: ``count`` 100-byte frames (u32 length first) over loopback to
    another Python process that splits them one by one, sent ``batch`` at a time."""
    frame = struct.pack("<I", PAYLOAD_SIZE) + b"m" * PAYLOAD_SIZE
    chunk = frame * batch
    proc = subprocess.Popen(
        [sys.executable, "-c", _RECEIVER, str(count)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout is not None
        port = int(proc.stdout.readline())
        with socket.create_connection(("127.0.0.1", port), timeout=60) as sock:
            start = time.perf_counter()
            sent = 0
            while sent < count:
                n = min(batch, count - sent)
                sock.sendall(chunk if n == batch else frame * n)
                sent += n
            got = int(sock.makefile("rb").readline())
            elapsed = time.perf_counter() - start
        if got != count:
            raise RuntimeError(f"the receiver split {got} of {count} frames")
        return count / elapsed
    finally:
        proc.wait(30)


# --- the command ---------------------------------------------------------------------------


def _windows(text: str) -> list[int]:
    try:
        windows = [int(w) for w in text.split(",") if w.strip()]
    except ValueError:
        raise click.BadParameter(f"{text!r}: expected numbers like 10,100,1000") from None
    if not windows or any(w < 1 for w in windows):
        raise click.BadParameter(f"{text!r}: credit windows are positive")
    return windows


def _measure_all(
    messages: int, windows: list[int], runs: int, dialect: str, app: str, warm_up: bool
) -> tuple[dict[int, list[dict[str, Any]]], list[dict[str, float]]]:
    """Every round: the baselines, then one run per window (interleaved, so a swing in
    the machine's load touches every window alike)."""
    results: dict[int, list[dict[str, Any]]] = {w: [] for w in windows}
    rounds: list[dict[str, float]] = []
    with tempfile.TemporaryDirectory(prefix="ambrosia-bench-wallaroo-") as tmp:
        root = Path(tmp)
        if warm_up:
            measure_stream(root / "warm-up", min(messages, 5_000), max(windows), dialect, app)
        for i in range(runs):
            rounds.append(
                {
                    "fsync_per_s": measure_fsync_rate(root, 0.5),
                    "tcp_frames_per_s": measure_tcp_frames(max(200_000, messages)),
                }
            )
            for w in windows:
                results[w].append(measure_stream(root / f"r{i}-w{w}", messages, w, dialect, app))
    return results, rounds


def _summary(runs: list[dict[str, Any]], rounds: list[dict[str, float]]) -> dict[str, Any]:
    """One window's runs, with ratios to the baselines of each run's own round."""
    rates = [r["msgs_per_s"] for r in runs]
    return {
        "median_msgs_per_s": statistics.median(rates),
        "runs_msgs_per_s": rates,
        "vs_tcp": statistics.median(
            r["msgs_per_s"] / b["tcp_frames_per_s"] for r, b in zip(runs, rounds, strict=True)
        ),
        "msgs_per_fsync": statistics.median(
            r["msgs_per_s"] / b["fsync_per_s"] for r, b in zip(runs, rounds, strict=True)
        ),
        "cpu": {k: statistics.median(r["cpu"][k] for r in runs) for k in runs[0]["cpu"]},
        "runs": runs,
    }


@click.command("wallaroo")
@click.option("--messages", default=50_000, show_default=True, help="Messages per run.")
@click.option(
    "--credits",
    "credit_list",
    default="10,100,1000",
    show_default=True,
    help="Credit windows (the worker's --max-credits; refilled at half), comma-separated.",
)
@click.option("--runs", default=3, show_default=True, help="Runs per window (median shown).")
@click.option("--dialect", type=click.Choice(["draft", "v3"]), default="draft", show_default=True)
@click.option(
    "--app",
    type=click.Choice(sorted(APPS)),
    default="words",
    show_default=True,
    help="The worker's application: word count, or counting messages only.",
)
@click.option(
    "--warm-up/--no-warm-up",
    default=True,
    show_default=True,
    help="A first, untimed run (cold caches, imports).",
)
@click.option("--json", "as_json", is_flag=True, help="Also print one JSON object, last.")
def wallaroo_bench(
    messages: int,
    credit_list: str,
    runs: int,
    dialect: str,
    app: str,
    warm_up: bool,
    as_json: bool,
) -> None:
    """Messages per second from a Wallaroo connector to a worker, both durable."""
    windows = _windows(credit_list)
    if messages < 1 or runs < 1:
        raise click.BadParameter("--messages and --runs are positive")
    console = Console(width=150)
    try:
        results, rounds = _measure_all(messages, windows, runs, dialect, app, warm_up)
    except RuntimeError as exc:  # a process died or stalled: its log's end says why
        raise click.ClickException(str(exc)) from None
    summary = {w: _summary(results[w], rounds) for w in windows}
    _print(console, summary, rounds, messages, dialect, app)
    report: dict[str, Any] = {
        "bench": "wallaroo",
        "dialect": dialect,
        "app": app,
        "messages": messages,
        "payload_bytes": PAYLOAD_SIZE,
        "runs": runs,
        "baseline": {
            key: {
                "median": statistics.median(r[key] for r in rounds),
                "runs": [r[key] for r in rounds],
            }
            for key in ("fsync_per_s", "tcp_frames_per_s")
        },
        "windows": [{"credits": w, "refill_at": max(1, w // 2), **summary[w]} for w in windows],
        "target_msgs_per_s": TARGET,
        "target_met": (
            summary[TARGET_CREDITS]["median_msgs_per_s"] >= TARGET
            if TARGET_CREDITS in summary
            else None
        ),
    }
    if as_json:
        click.echo(json.dumps(report, sort_keys=True))


def _print(
    console: Console,
    summary: dict[int, dict[str, Any]],
    rounds: list[dict[str, float]],
    messages: int,
    dialect: str,
    app: str,
) -> None:
    table = Table(
        title=f"wallaroo connector -> worker ({dialect}, app {app}): {messages:,} messages "
        f"of {PAYLOAD_SIZE} B, both sides logging durably"
    )
    columns = ("credits", "msgs/s (median)", f"runs ({len(rounds)})", "vs TCP", "msgs/fsync")
    for col in (
        *columns,
        "cpu: worker / its IC",
        "connector / its IC",
        "runnable, no cpu: worker / connector",
    ):
        table.add_column(col, justify="right")
    for w, s in summary.items():
        cpu = s["cpu"]
        table.add_row(
            f"{w:,}",
            f"{s['median_msgs_per_s']:,.0f}",
            ", ".join(f"{r:,.0f}" for r in s["runs_msgs_per_s"]),
            f"{s['vs_tcp']:.2%}",
            f"{s['msgs_per_fsync']:,.1f}",
            f"{cpu['worker']:.0%} / {cpu['worker_ic']:.0%}",
            f"{cpu['connector']:.0%} / {cpu['connector_ic']:.0%}",
            f"{cpu['worker_waiting']:.0%} / {cpu['connector_waiting']:.0%}",
        )
    console.print(table)
    fsync = [r["fsync_per_s"] for r in rounds]
    tcp = [r["tcp_frames_per_s"] for r in rounds]
    console.print(
        f"baselines, per round: {', '.join(f'{x:,.0f}' for x in fsync)} fdatasync'ed 4 KiB "
        f"writes/s; {', '.join(f'{x:,.0f}' for x in tcp)} loopback TCP frames/s "
        f"({PAYLOAD_SIZE} B, split in Python)"
    )
    if TARGET_CREDITS in summary:
        got = summary[TARGET_CREDITS]["median_msgs_per_s"]
        verdict = "met" if got >= TARGET else "NOT met"
        console.print(f"target: >= {TARGET:,} msgs/s at {TARGET_CREDITS:,} credits: {verdict}")
