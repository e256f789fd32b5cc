"""The Ockam hub immortal end to end: ``ambrosia-py run immortals.ockam.hub`` over TCP.

Real processes on loopback: the released dialect's behaviour through a client speaking
the released names; a client speaking seed 003's names using partitions and the index
service of a hub in the seed's dialect (the default); then a publisher pushing 10,000
messages (pipelined) while the hub's service process and its
coordinator are SIGKILLed at random moments; afterwards every push is stored exactly once
at its confirmed index, the indexes are contiguous, a consumer using the index service
reads everything with no hole and no repeat, and ``ambrosia-py replay --verify`` finds
the recorded history deterministic.
"""

from __future__ import annotations

import asyncio
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest

from immortals.ockam.bench import HubProcess
from immortals.ockam.codec import Dialect
from immortals.ockam.hub_client import Consumer, HubError, OckamClient, Publisher


@pytest.fixture
def hub(tmp_path: Path) -> object:
    h = HubProcess(tmp_path / "data")
    h.start()
    yield h
    h.stop()


@pytest.fixture
def released_hub(tmp_path: Path) -> object:
    h = HubProcess(tmp_path / "data")
    h.args += ["--dialect", "released"]
    h.start()
    yield h
    h.stop()


async def test_released_behaviour_over_tcp(released_hub: HubProcess) -> None:
    hub = released_hub
    client = await OckamClient.connect("127.0.0.1", hub.port, dialect=Dialect.RELEASED)
    try:
        stream = await client.create("my_stream")
        assert stream.name == "my_stream"
        assert await client.create("my_stream") == stream  # same address again
        parts = await client.create_partitioned("parted", 2)
        assert [p.partition for p in parts] == [0, 1] and parts[0].route != parts[1].route
        anonymous = await client.create(None)
        assert anonymous.name.startswith("generated_")
        with pytest.raises(HubError, match="Invalid request"):
            await client.create("")
        assert await client.push(stream, b"first") == 0
        assert [(m.index, m.data) for m in await client.pull(stream, 0, 1)] == [(0, b"first")]
        for i in range(1, 101):
            assert await client.push(stream, f"m{i}".encode()) == i
        assert [m.index for m in await client.pull(stream, 0, 10)] == list(range(10))
        assert [m.index for m in await client.pull(stream, 10, 10)] == list(range(10, 20))
        assert await client.get_index("c", "my_stream") is None
        await client.save_index("c", "my_stream", 10)
        await client.save_index("c", "my_stream", 5)
        assert await client.get_index("c", "my_stream") == 10
        assert await client.get_index("c", "parted", 1) is None
        await client.save_index("c", "parted", 10, 1)
        await client.save_index("c", "parted", 5, 1)
        assert await client.get_index("c", "parted", 1) == 10
        assert await client.get_index("c", "parted", 0) is None
        # Garbage on the connection: answered with an error or dropped, never a crash.
        client._writer.write(b"\x00\x05\x01\x01\x00\x05\x00")
        assert await client.push(stream, b"still serving") == 101
    finally:
        await client.close()


async def test_a_client_speaking_the_seeds_names_uses_partitions(
    hub: HubProcess, monkeypatch: pytest.MonkeyPatch
) -> None:
    client = await OckamClient.connect("127.0.0.1", hub.port)  # the seed's names: the default
    sent: list[bytes] = []
    write = client._writer.write

    def recording(data: bytes | bytearray | memoryview) -> None:
        sent.append(bytes(data))
        write(data)

    monkeypatch.setattr(client._writer, "write", recording)
    try:
        parts = await client.create_partitioned("orders", 3)
        assert [p.partition for p in parts] == [0, 1, 2]
        assert len({p.route for p in parts}) == 3  # each partition answers from its own
        for p in parts:
            pushed = [await client.push(p, f"{p.partition}:{i}".encode()) for i in range(3)]
            assert pushed == [0, 1, 2]  # indexes per partition
        with pytest.raises(HubError, match="at least one partition"):
            await client.create_partitioned("orders", 0)
        # The index service: a pair never seen is a new record at 0; a save is the last
        # index processed, monotonic.
        assert await client.get_index("reader", "orders", 1) == 0
        got = await client.pull(parts[1], 0, 2)
        assert [m.data for m in got] == [b"1:0", b"1:1"]
        await client.save_index("reader", "orders", got[-1].index, 1)
        await client.save_index("reader", "orders", 0, 1)
        assert await client.get_index("reader", "orders", 1) == 1
        assert await client.get_index("reader", "orders", 2) == 0
    finally:
        await client.close()
    wire = b"".join(sent)
    assert b"stream_create_partitions" in wire and b"stream_index" in wire
    assert b"_partitioned" not in wire

    # A consumer of partition 1 in the seed's dialect resumes after the last processed.
    consumer = Consumer("127.0.0.1", hub.port, "orders", "reader", partition=1)
    seen = []
    async for batch in consumer.batches(until_idle=0.2):
        seen.extend(m.data for m in batch)
        await consumer.commit(batch)
    assert seen == [b"1:2"]
    # A released client on the same hub reads the record in the hub's dialect.
    released = await OckamClient.connect("127.0.0.1", hub.port, dialect=Dialect.RELEASED)
    try:
        assert await released.get_index("reader", "orders", 1) == 2
        assert (await released.create_partitioned("orders", 3))[1].route == parts[1].route
    finally:
        await released.close()


async def test_publisher_and_consumer_survive_sigkills(hub: HubProcess) -> None:
    rng = random.Random(int(os.environ.get("OCKAM_CRASH_SEED", "7")))
    count = 10_000
    payloads = [f"event {i:05d}".encode() for i in range(count)]
    publisher = Publisher("127.0.0.1", hub.port, "events", window=64)
    kills: list[str] = []
    cutting = 0  # kills that found more than two windows of pushes unconfirmed

    async def killer() -> None:
        # Each kill lands at a random point while pushes are in flight.
        nonlocal cutting
        quarter = count // 4
        marks = [k * quarter + rng.randrange(200, quarter // 2) for k in range(4)]
        for which, mark in zip(
            ["service", "coordinator", "service", "coordinator"], marks, strict=True
        ):
            while publisher.confirmed < mark:
                await asyncio.sleep(0.002)
            await asyncio.sleep(rng.uniform(0, 0.05))
            # Pushes the hub has not confirmed when it dies can only be confirmed by a
            # new incarnation: the publisher must reconnect. (A kill after the last
            # confirmation, on a fast run, cuts nothing.)
            outstanding = count - publisher.confirmed
            await asyncio.to_thread(hub.kill, which)
            kills.append(which)
            cutting += outstanding > 2 * 64
            await asyncio.to_thread(hub.start)

    killing = asyncio.ensure_future(killer())
    indexes = await publisher.publish(payloads)
    await killing
    assert len(kills) == 4
    assert len(indexes) == count
    assert cutting >= 1 and publisher.reconnects >= cutting, (cutting, publisher.reconnects)
    print(f"reconnects {publisher.reconnects}, found stored after a crash {publisher.recovered}")

    # Every push stored exactly once, at its confirmed index; indexes contiguous.
    client = await OckamClient.connect("127.0.0.1", hub.port)
    stream = await client.create("events")
    stored: list[tuple[int, bytes]] = []
    while batch := await client.pull(stream, len(stored), 1000):
        stored.extend((m.index, m.data) for m in batch)
    await client.close()
    assert [i for i, _ in stored] == list(range(len(stored)))
    assert len(stored) == count, f"{len(stored) - count} extra messages stored"
    by_index = dict(stored)
    assert all(by_index[index] == payloads[k] for k, index in enumerate(indexes))

    # A consumer through the index service, with one more kill while it reads.
    consumer = Consumer("127.0.0.1", hub.port, "events", "reader", batch=500)
    seen: list[int] = []
    killed_once = False
    async for batch in consumer.batches(until_idle=1.0):
        seen.extend(m.index for m in batch)
        await consumer.commit(batch)
        if not killed_once and len(seen) > count // 2:
            killed_once = True
            await asyncio.to_thread(hub.kill, "service")
            await asyncio.to_thread(hub.start)
    assert seen == list(range(count))  # no hole, no repeat, in order
    assert consumer.gaps == []

    hub.stop()
    replay = subprocess.run(
        [
            sys.executable,
            "-m",
            "ambrosia_py.cli",
            "replay",
            "immortals.ockam.hub",
            "--instance",
            "hub",
            "--data-dir",
            str(hub.data_dir),
            "--verify",
        ],
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert replay.returncode == 0, replay.stdout + replay.stderr
    assert "deterministic" in replay.stdout
