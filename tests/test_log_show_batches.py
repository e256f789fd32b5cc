"""``ambrosia-py log show`` on logs holding ingress BATCH impulses: each batch is a head
line and then a line per call (its place in the batch, key, method and arguments), and a
batch that does not decode is one line saying what is wrong and where, the rest of the
log shown as usual.

Checked on a log a real ``ambrosia-py run --ingress`` wrote while sixteen clients called
at once (``tests/ingress_batches.py``), against the calls the test made; and on a log of
chosen messages, whose batch the envelope encoder wrote and was held byte for byte to
one built by hand from docs/ingress.md.
"""

from __future__ import annotations

import collections
import pickle
import re
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from ambrosia_py import wire
from ambrosia_py.cli import main
from ambrosia_py.ingress.envelope import (
    INGRESS_METHOD_ID,
    decode_impulse,
    encode_batch_envelope,
    encode_call_envelope,
)

from .ingress_batches import ADD, NOTE, SERVICE, Recording, hand_built_batch, record, write_log

pytestmark = pytest.mark.timeout(300)

TIME_MS = 1_764_000_000_123  # 2025-11-24T16:00:00.123Z
AT = "2025-11-24T16:00:00.123Z"
CALL_LINE = re.compile(r"^    call (\d+) of (\d+): key '([^']*)', method (-?\d+) (.*)$")
LONE_LINE = re.compile(r"^  ingress call key '([^']*)' at [^,]+, method (-?\d+) (.*)$")
BATCH_LINE = re.compile(r"^  ingress batch of (\d+) calls at ")


def pickled(*args: object) -> bytes:
    return pickle.dumps((args, {}), protocol=pickle.HIGHEST_PROTOCOL)


def impulse(args: bytes) -> wire.IncomingRpc:
    return wire.IncomingRpc(INGRESS_METHOD_ID, wire.RpcType.IMPULSE, args)


def show(*argv: str | Path) -> Result:
    result = CliRunner().invoke(main, ["log", "show", *map(str, argv)])
    assert result.exit_code == 0, (result.output, result.exception)
    return result


BATCH_CALLS = [
    (b"order-1", ADD, pickled("x", 5)),
    (b"\x00\xff", NOTE, b'{"text":"hi"}'),
    (b"k3", 77, b"\x01\x02"),
]
CUT_CALLS = [(b"a", ADD, pickled("y", 1)), (b"bb", NOTE, b'{"text":"cut"}')]


def test_the_encoder_writes_the_documented_layout() -> None:
    by_hand = hand_built_batch(TIME_MS, BATCH_CALLS)
    assert encode_batch_envelope(TIME_MS, BATCH_CALLS) == by_hand
    calls = decode_impulse(by_hand).calls  # type: ignore[union-attr]
    assert [(c.key, c.method_id, c.args, c.time_ms) for c in calls] == [
        (*call, TIME_MS) for call in BATCH_CALLS
    ]


@pytest.fixture
def chosen(tmp_path: Path) -> tuple[Path, Path, int]:
    """A log of chosen impulses, the service's file, and where the cut batch goes wrong."""
    cut = hand_built_batch(TIME_MS, CUT_CALLS)[:-3]  # call 1's arguments end 3 bytes early
    # Call 1 starts after the head (13 bytes) and call 0 (1 + 1 + 4 + 4 + its arguments);
    # its arguments after its key length, key, method id and their size (1 + 2 + 4 + 4).
    cut_at = 13 + 10 + len(CUT_CALLS[0][2]) + 11
    log = write_log(
        tmp_path / "data",
        "tally",
        [
            [impulse(encode_batch_envelope(TIME_MS, BATCH_CALLS))],
            [impulse(encode_call_envelope(TIME_MS, b"lone", ADD, pickled("z", 2)))],
            [
                impulse(cut),
                impulse(hand_built_batch(TIME_MS, BATCH_CALLS[:1]) + b"\x00\x00"),
                impulse(hand_built_batch(TIME_MS, BATCH_CALLS[1:2])),
            ],
        ],
    )
    service = tmp_path / "tally.py"
    service.write_text(SERVICE)
    return log, service, cut_at


def test_a_batch_reads_as_its_calls_with_the_service(chosen: tuple[Path, Path, int]) -> None:
    log, service, cut_at = chosen
    lines = show(log, "--service", service).output.splitlines()
    assert lines[0].startswith("warning: ")
    body = [line for line in lines[1:] if not line.startswith("record seq")]
    assert body[:5] == [
        f"  ingress batch of 3 calls at {AT}",
        f"    call 0 of 3: key 'order-1', method {ADD} add('x', 5)",
        f"    call 1 of 3: key 00ff, method {NOTE} note(text='hi')",
        "    call 2 of 3: key 'k3', method 77 (not a method of the service), args 2 bytes: 0102",
        f"  ingress call key 'lone' at {AT}, method {ADD} add('z', 2)",
    ]
    cut, trailing = body[5], body[6]
    assert cut.startswith("  ingress impulse that does not decode (call 1 of a BATCH impulse")
    assert f"(offset {cut_at})" in cut
    assert trailing.startswith("  ingress impulse that does not decode (2 bytes after the last")
    assert f"(offset {len(hand_built_batch(TIME_MS, BATCH_CALLS[:1]))})" in trailing
    assert body[7:] == [
        f"  ingress batch of 1 calls at {AT}",
        f"    call 0 of 1: key 00ff, method {NOTE} note(text='hi')",
    ]
    records = [line for line in lines if line.startswith("record seq")]
    assert [r.split()[2] for r in records] == ["0", "1", "2"]
    assert records[2].endswith("messages 3")


def test_without_the_service_a_batch_still_reads_as_its_calls(
    chosen: tuple[Path, Path, int],
) -> None:
    log, _, _ = chosen
    lines = show(log).output.splitlines()
    args = pickled("x", 5)
    note = b'{"text":"hi"}'
    assert lines[1:5] == [
        f"  ingress batch of 3 calls at {AT}",
        f"    call 0 of 3: key 'order-1', method {ADD}, args {len(args)} bytes: "
        f"{args[:16].hex()}...",
        f"    call 1 of 3: key 00ff, method {NOTE}, args 13 bytes: {note.hex()} {note.decode()!r}",
        "    call 2 of 3: key 'k3', method 77, args 2 bytes: 0102",
    ]
    assert lines[5].startswith("record seq 1 ")
    assert "does not decode" not in "\n".join(lines[:8])


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> Recording:
    return record(tmp_path_factory.mktemp("batches"))


def _expected_text(method: str, arguments: dict[str, object]) -> str:
    if method == "add":
        return f"add({arguments['token']!r}, {arguments['amount']})"
    return f"note(text={arguments['text']!r})"


def test_a_recorded_log_shows_every_call_once_under_its_batch(recorded: Recording) -> None:
    ids = {"add": ADD, "note": NOTE}
    seen: collections.Counter[str] = collections.Counter()
    sizes = []
    batches_with_burst_calls = 0
    output = ""
    for log in recorded.logs():
        output += show(log, "--service", recorded.service_file).output
    lines = output.splitlines()
    calls = recorded.by_key()
    for i, line in enumerate(lines):
        if match := BATCH_LINE.match(line):
            n = int(match.group(1))
            sizes.append(n)
            members = [CALL_LINE.match(lines[i + 1 + j]) for j in range(n)]
            assert all(members), lines[i : i + n + 1]
            assert [int(m.group(1)) for m in members if m] == list(range(n))
            assert {int(m.group(2)) for m in members if m} == {n}
            burst = sum(1 for m in members if m and m.group(3).startswith("burst-"))
            batches_with_burst_calls += burst > 1
        for matched in (CALL_LINE.match(line), LONE_LINE.match(line)):
            if matched is None:
                continue
            key, method_id, text = matched.groups()[-3:]
            call = calls[key]
            seen[key] += 1
            assert int(method_id) == ids[call.method], line
            assert text == _expected_text(call.method, call.arguments), line
    assert "does not decode" not in output
    assert seen == collections.Counter(list(calls))  # every call, once
    assert any(n > 1 for n in sizes), sizes
    assert batches_with_burst_calls >= 1  # the burst's calls, read together, share a batch
