"""The binding's side of the protocol, byte for byte, against a fake coordinator.

The fake coordinator speaks raw bytes (struct, xxhash, hand-written varints from
``tests.fake_binding``); the binding is the real one, run with ``serve``.
"""

from __future__ import annotations

import asyncio
import pickle
import struct
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest
import xxhash

from ambrosia_py import Immortal, rpc
from ambrosia_py.binding.client import serve
from ambrosia_py.binding.dispatcher import Dispatcher
from tests.fake_binding import frame, unzz, zz

HEADER = struct.Struct("<iiQq")
P = pickle.HIGHEST_PROTOCOL
COMMITTER = 1


class Svc(Immortal):
    def __init__(self) -> None:
        self.log: list[object] = []

    @rpc(id=3)
    def note(self, x: object) -> None:
        self.log.append(x)

    @rpc(id=4)
    def double(self, x: int) -> int:
        return 2 * x

    @rpc(id=5)
    def fail(self) -> None:
        raise ValueError("boom")

    @rpc(id=6)
    async def ask(self, x: int) -> int:
        y: int = await self.me.double(x)
        self.log.append(y)
        return y

    @rpc(id=7)
    def tell(self, x: object) -> None:
        self.proxy("server", Svc).note.fork(x)


class SvcV1(Svc):
    version = 1

    @classmethod
    def upgrade_state(cls, state: dict[str, Any], from_version: int) -> dict[str, Any]:
        return {"log": [*state["log"], f"upgraded from {from_version}"]}


def record(seq: int, body: bytes) -> bytes:
    check = 0 if seq == -2 else xxhash.xxh64_intdigest(body)
    return HEADER.pack(COMMITTER, 24 + len(body), check, seq) + body


def call(method: int, rpc_type: int, args: bytes, sender: str = "", call_seq: int = 0) -> bytes:
    body = b"\x00" + zz(method) + bytes([rpc_type])
    if rpc_type == 0:
        body += zz(len(sender)) + sender.encode() + zz(call_seq)
    return frame(0, body + args)


def pickled(*args: object, **kwargs: object) -> bytes:
    return pickle.dumps((args, kwargs), protocol=P)


class FakeIC:
    """Listens on the receive port; opens the send port only once that is connected."""

    def __init__(self) -> None:
        self.events: list[str] = []
        self.from_binding: asyncio.StreamReader | None = None
        self.to_binding: asyncio.StreamWriter | None = None
        self._buf = b""
        self._servers: list[asyncio.Server] = []

    async def start(self) -> tuple[int, int]:
        attached = asyncio.Event()
        send_ready = asyncio.Event()

        async def on_receive(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
            self.events.append("receive")
            self.from_binding = r
            self._keep = w
            attached.set()

        async def on_send(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
            self.events.append("send")
            self.to_binding = w
            send_ready.set()

        receive = await asyncio.start_server(on_receive, "127.0.0.1", 0)
        self._servers.append(receive)
        # Pick the send port now but listen only after the receive connection.
        probe = await asyncio.start_server(on_send, "127.0.0.1", 0)
        send_port = probe.sockets[0].getsockname()[1]
        probe.close()
        await probe.wait_closed()

        async def open_send_later() -> None:
            await attached.wait()
            self._servers.append(await asyncio.start_server(on_send, "127.0.0.1", send_port))

        self._opener = asyncio.ensure_future(open_send_later())
        self.send_ready = send_ready
        return receive.sockets[0].getsockname()[1], send_port

    async def send(self, data: bytes) -> None:
        await self.send_ready.wait()
        assert self.to_binding is not None
        self.to_binding.write(data)
        await self.to_binding.drain()

    async def read(self, n: int) -> bytes:
        assert self.from_binding is not None
        while len(self._buf) < n:
            chunk = await asyncio.wait_for(self.from_binding.read(65536), 30)
            assert chunk, "binding closed its connection"
            self._buf += chunk
        out, self._buf = self._buf[:n], self._buf[n:]
        return out

    async def message(self) -> tuple[int, bytes]:
        """One framed message from the binding: (type, data); a checkpoint's blob is read too."""
        size = 0
        shift = 0
        while True:
            b = (await self.read(1))[0]
            size |= (b & 0x7F) << shift
            shift += 7
            if b < 0x80:
                break
        size = (size >> 1) ^ -(size & 1)
        raw = await self.read(size)
        if raw[0] == 8:
            blob_len, _ = unzz(raw, 1)
            return 8, await self.read(blob_len)
        return raw[0], raw[1:]

    def close(self) -> None:
        if self.to_binding is not None:
            self.to_binding.close()
        for s in self._servers:
            s.close()


@asynccontextmanager
async def running(dispatcher: Dispatcher) -> AsyncIterator[FakeIC]:
    ic = FakeIC()
    receive_port, send_port = await ic.start()
    task = asyncio.ensure_future(serve(Svc, "svc", receive_port, send_port, dispatcher=dispatcher))
    try:
        yield ic
    finally:
        ic.close()
        await asyncio.wait_for(task, 30)  # the binding stops when its coordinator goes away


async def first_start(ic: FakeIC) -> bytes:
    await ic.send(bytes.fromhex("010000001a000000c7f179c2cb842ddaffffffffffffffff020b"))
    assert await ic.message() == (9, b"")  # InitialMessage
    mtype, blob = await ic.message()
    assert mtype == 8 and blob.startswith(b"AMBPYCK")
    await ic.send(record(0, frame(9, b"")))
    return blob


async def test_connection_order_and_first_start() -> None:
    d = Dispatcher(Svc, "svc")
    async with running(d) as ic:
        await first_start(ic)
        assert ic.events == ["receive", "send"]
    assert d.mode.value == "primary"


async def test_fork_impulse_and_batch_dispatch_in_log_order() -> None:
    d = Dispatcher(Svc, "svc")
    async with running(d) as ic:
        await first_start(ic)
        batch = frame(5, zz(2) + call(3, 1, pickled("b")) + call(3, 2, pickled("c")))
        await ic.send(record(1, call(3, 1, pickled("a")) + batch))
        await ic.send(record(2, call(4, 0, pickled(21), "caller", 9)))
        await ic.message()  # wait for the return value: everything before it was handled
    assert isinstance(d.immortal, Svc) and d.immortal.log == ["a", "b", "c"]


async def test_a_count_replayable_batch_dispatches_its_calls_in_order() -> None:
    """Type 13: ZigZagInt count, ZigZagInt count of non-impulse calls, the calls."""
    d = Dispatcher(Svc, "svc")
    async with running(d) as ic:
        await first_start(ic)
        batch = frame(13, zz(2) + zz(1) + call(3, 1, pickled("b")) + call(3, 2, pickled("c")))
        await ic.send(record(1, call(3, 1, pickled("a")) + batch))
        await ic.send(record(2, call(4, 0, pickled(21), "caller", 9)))
        await ic.message()  # the return value: everything before it was handled
    assert isinstance(d.immortal, Svc) and d.immortal.log == ["a", "b", "c"]


async def test_attach_to_goes_once_before_the_first_call_to_another_instance() -> None:
    """Seed 002, *Attach-before-send protocol*: AttachTo (type 1, the name in UTF-8) once,
    before the first RPC to that instance; later calls go without it."""
    d = Dispatcher(Svc, "svc")
    async with running(d) as ic:
        await first_start(ic)
        await ic.send(record(1, call(7, 1, pickled("a")) + call(7, 1, pickled("b"))))
        assert await ic.message() == (1, b"server")
        fork = zz(6) + b"server" + b"\x00" + zz(3) + b"\x01"
        assert await ic.message() == (0, fork + pickled("a"))
        assert await ic.message() == (0, fork + pickled("b"))


async def test_return_values_and_exceptions_byte_for_byte() -> None:
    d = Dispatcher(Svc, "svc")
    async with running(d) as ic:
        await first_start(ic)
        await ic.send(record(1, call(4, 0, pickled(21), "caller", 9)))
        value = pickle.dumps(42, protocol=P)
        expected = zz(6) + b"caller" + b"\x01" + zz(3) + b"svc" + zz(9)
        assert await ic.message() == (0, expected + zz(len(value)) + value)
        await ic.send(record(2, call(5, 0, pickled(), "caller", 10)))
        mtype, data = await ic.message()
        assert mtype == 0 and data.startswith(zz(6) + b"caller\x03" + zz(3) + b"svc" + zz(10))
        head = zz(6) + b"caller\x03" + zz(3) + b"svc" + zz(10)
        length, start = unzz(data, len(head))
        exc = pickle.loads(data[start:])
        assert length == len(data) - start
        assert isinstance(exc, ValueError) and str(exc) == "boom"
        await ic.send(record(3, call(3, 0, pickled("x"), "caller", 11)))
        assert await ic.message() == (0, zz(6) + b"caller\x02" + zz(3) + b"svc" + zz(11))


async def test_an_awaiting_handler_resumes_when_its_reply_is_dispatched() -> None:
    d = Dispatcher(Svc, "svc")
    async with running(d) as ic:
        await first_start(ic)
        await ic.send(record(1, call(6, 0, pickled(5), "caller", 1)))
        # The handler's self-call: destination length 0, async/await, our name, call seq 1.
        assert await ic.message() == (
            0,
            zz(0) + b"\x00" + zz(4) + b"\x00" + zz(3) + b"svc" + zz(1) + pickled(5),
        )
        reply = pickle.dumps(10, protocol=P)
        await ic.send(
            record(2, frame(0, b"\x01" + zz(3) + b"svc" + zz(1) + zz(len(reply)) + reply))
        )
        value = pickle.dumps(10, protocol=P)
        assert await ic.message() == (
            0,
            zz(6) + b"caller\x01" + zz(3) + b"svc" + zz(1) + zz(len(value)) + value,
        )
    assert isinstance(d.immortal, Svc) and d.immortal.log == [10]


async def test_recovery_restores_then_replays_and_refuses_impulses_until_primary() -> None:
    first = Dispatcher(Svc, "svc")
    async with running(first) as ic:
        blob = await first_start(ic)
    d = Dispatcher(Svc, "svc")
    async with running(d) as ic:
        await ic.send(record(-2, frame(8, zz(len(blob)))) + blob)
        await ic.send(record(0, frame(9, b"")) + record(1, call(3, 2, pickled("replayed"))))
        await ic.send(record(2, call(4, 0, pickled(1), "caller", 1)))
        await ic.message()  # the replayed call's return value: replay regenerates outputs
        assert d.mode.value == "recovering"
        with pytest.raises(Exception, match="impulse note sent while recovering"):
            d.immortal.impulse.note("not allowed")
        await ic.send(bytes.fromhex("010000001a000000c7f179c2cb842ddaffffffffffffffff020b"))
        mtype, _ = await ic.message()
        assert mtype == 8  # the checkpoint that makes it primary
    assert isinstance(d.immortal, Svc) and d.immortal.log == ["replayed"]
    assert d.mode.value == "primary"


UPGRADE_TAKE_CHECKPOINT = record(-1, bytes.fromhex("020a"))  # size 1, type 10, no data
UPGRADE_SERVICE = record(-1, bytes.fromhex("020c"))  # size 1, type 12, no data


async def test_upgrade_take_checkpoint_after_a_replay_by_the_old_code() -> None:
    """Seed 002, recovering and upgrading: Checkpoint, replay (by the old code),
    UpgradeTakeCheckpoint; the binding upgrades and sends the new version's checkpoint."""
    first = Dispatcher(Svc, "svc")
    async with running(first) as ic:
        blob = await first_start(ic)
    d = Dispatcher(Svc, "svc", upgrade_to=SvcV1)
    async with running(d) as ic:
        await ic.send(record(-2, frame(8, zz(len(blob)))) + blob)
        await ic.send(record(0, frame(9, b"")) + record(1, call(3, 1, pickled("old"))))
        await ic.send(UPGRADE_TAKE_CHECKPOINT)
        mtype, new_blob = await ic.message()
        assert mtype == 8 and new_blob != blob
    assert type(d.immortal) is SvcV1 and d.immortal.log == ["old", "upgraded from 0"]
    assert d.mode.value == "primary"


async def test_upgrade_service_before_the_replay_runs_it_on_the_new_code() -> None:
    """Seed 002, upgrade what-if test: Checkpoint, UpgradeService, then the replay."""
    first = Dispatcher(Svc, "svc")
    async with running(first) as ic:
        blob = await first_start(ic)
    d = Dispatcher(Svc, "svc", upgrade_to=SvcV1)
    async with running(d) as ic:
        await ic.send(record(-2, frame(8, zz(len(blob)))) + blob + UPGRADE_SERVICE)
        await ic.send(record(0, frame(9, b"")) + record(1, call(3, 1, pickled("new"))))
        await ic.send(record(2, call(4, 0, pickled(1), "caller", 1)))
        await ic.message()  # the return value: record 1 was handled
    assert type(d.immortal) is SvcV1 and d.immortal.log == ["upgraded from 0", "new"]
    assert d.mode.value == "recovering"  # a what-if test never becomes primary
