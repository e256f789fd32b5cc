"""A log holding ingress BATCH impulses, recorded as the system writes it, for the tests
of the tools that read logs (``log show``, Spark's decoding and the analytics report).

A real ``ambrosia-py run --ingress`` of a small service, called at once by sixteen
threads (each a ``Client``, a connection of its own) and by one ``AsyncClient`` sending
forty calls together: the ingress logs the calls of each turn of its event loop as one
BATCH impulse, and a lone call as a CALL. The recording keeps what was called with which
key, so the tests check the tools against the calls made, not against each other.

Also here: a BATCH built by hand from the layout in docs/ingress.md, byte by byte, and a
log file written with chosen messages (for malformed impulses no run would log).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import attrs

from ambrosia_py import eventloop, wire
from ambrosia_py.binding.immortal import method_id_for
from ambrosia_py.binding.loading import load_service
from ambrosia_py.client import AsyncClient, Client
from ambrosia_py.coordinator.storage.files import InstanceFiles

from .ingress_process import DEADLINE, RunProcess, free_port

__all__ = [
    "ADD",
    "NOTE",
    "SERVICE",
    "Call",
    "Recording",
    "hand_built_batch",
    "record",
    "write_log",
]

SERVICE = """
from ambrosia_py import Immortal, rpc


class Tally(Immortal):
    def __init__(self) -> None:
        self.total = 0

    @rpc
    def add(self, token: str, amount: int) -> int:
        self.total += amount
        return self.total

    @rpc(codec="json")
    def note(self, text: str) -> str:
        return text
"""
ADD = method_id_for("add")  # the service's methods' ids
NOTE = method_id_for("note")
THREADS = 16
CALLS_PER_THREAD = 12
COMMITTER = 5  # of the logs write_log writes
BURST = 40  # calls one AsyncClient sends together: read at once, logged as one batch


@attrs.frozen
class Call:
    """A call the test made: its key, the method, and the arguments by parameter name."""

    key: str
    method: str
    arguments: dict[str, Any]


@attrs.frozen
class Recording:
    data_dir: Path
    service_file: Path
    calls: tuple[Call, ...]

    def by_key(self) -> dict[str, Call]:
        return {call.key: call for call in self.calls}

    def logs(self) -> list[Path]:
        return sorted(self.data_dir.glob("*/serverlog*"))


def _plan() -> list[list[Call]]:
    """The calls, per caller: the threads', then the burst's (every key distinct)."""
    plans = []
    for t in range(THREADS):
        calls = []
        for i in range(CALLS_PER_THREAD):
            key = f"t{t}-{i}"
            if i % 3 == 2:
                calls.append(Call(key, "note", {"text": f"note {t}/{i}"}))
            else:
                calls.append(Call(key, "add", {"token": f"tok-{t}-{i}", "amount": t * 100 + i}))
        plans.append(calls)
    plans.append([Call(f"burst-{i}", "add", {"token": f"b{i}", "amount": i}) for i in range(BURST)])
    return plans


def _send(client: Any, service: Any, call: Call) -> Any:
    method = getattr(service, call.method)
    return client.call(method, *call.arguments.values(), key=call.key)


def record(tmp: Path) -> Recording:
    """Run the service, make every planned call, stop it; every call answered."""
    service_file = tmp / "tally.py"
    service_file.write_text(SERVICE)
    service: Any = load_service(f"{service_file}:Tally")
    data_dir = tmp / "data"
    port = free_port()
    address = f"127.0.0.1:{port}"
    plans = _plan()
    errors: list[BaseException] = []
    run = RunProcess(service_file, data_dir, port)
    try:
        clients = [Client(address, data_dir=data_dir, timeout=DEADLINE) for _ in range(THREADS)]
        start = threading.Barrier(THREADS)

        def caller(t: int) -> None:
            try:
                start.wait(DEADLINE)  # all at once, so their calls meet in the ingress
                for call in plans[t]:
                    _send(clients[t], service, call)
            except BaseException as exc:  # reported by the test's thread
                errors.append(exc)

        threads = [threading.Thread(target=caller, args=(t,), daemon=True) for t in range(THREADS)]
        try:
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join(DEADLINE)
                assert not thread.is_alive(), "a caller did not finish"
        finally:
            for client in clients:
                client.close()
        assert not errors, errors

        async def burst() -> None:
            async with AsyncClient(address, data_dir=data_dir, timeout=DEADLINE) as client:
                await client.call(service.note, "connected", key="first")  # then all at once
                await asyncio.gather(*(_send(client, service, call) for call in plans[-1]))

        eventloop.run(burst())
    finally:
        run.stop()
    first = Call("first", "note", {"text": "connected"})
    calls = [call for plan in plans[:-1] for call in plan] + [first, *plans[-1]]
    return Recording(data_dir, service_file, tuple(calls))


def hand_built_batch(time_ms: int, calls: Sequence[tuple[bytes, int, bytes]]) -> bytes:
    """A BATCH impulse's arguments from docs/ingress.md, *What is logged*, field by field:
    ``u8 3 | u64 arrival time | u32 n | n times (u8 k | key | i32 method id | u32 a |
    arguments)``, little-endian; nothing of the envelope module is used."""
    out = bytearray([3])
    out += time_ms.to_bytes(8, "little")
    out += len(calls).to_bytes(4, "little")
    for key, method_id, args in calls:
        out.append(len(key))
        out += key
        out += method_id.to_bytes(4, "little", signed=True)
        out += len(args).to_bytes(4, "little")
        out += args
    return bytes(out)


def write_log(data_dir: Path, instance: str, records: Sequence[Sequence[wire.Message]]) -> Path:
    """A log file of ``records`` (each a list of messages), as a coordinator frames them."""
    files = InstanceFiles(data_dir, instance, 0)
    files.create()
    with files.open_log(1) as log:
        for seq, messages in enumerate(records):
            body = b"".join(wire.encode_message(m) for m in messages)
            log.append([wire.encode_disk_record(COMMITTER, seq, body, [], [])])
    return files.log_path(1)
