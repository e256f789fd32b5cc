"""``ambrosia-py log show --service``: a log read in the service's own terms.

Method ids become method names and arguments Python values (with a warning: that
unpickles what the log holds); ingress impulses are taken apart with or without the
service; without it, the output is as before.
"""

from __future__ import annotations

import pickle
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from ambrosia_py import wire
from ambrosia_py.binding.codec import encode_args
from ambrosia_py.binding.immortal import method_id_for
from ambrosia_py.cli import main
from ambrosia_py.coordinator.storage.files import InstanceFiles
from ambrosia_py.ingress.envelope import (
    INGRESS_METHOD_ID,
    RetentionEnvelope,
    encode_call_envelope,
    encode_retention_envelope,
)

SERVICE = """
from ambrosia_py import Immortal, rpc

class Ledger(Immortal):
    @rpc
    def deposit(self, who: str, amount: int = 1) -> int:
        return amount

    @rpc(codec="json")
    def note(self, text: str) -> None:
        pass
"""

DEPOSIT = method_id_for("deposit")
NOTE = method_id_for("note")
TIME_MS = 1_764_000_000_123  # 2025-11-24T16:00:00.123Z


def args(*a: object, **kw: object) -> bytes:
    return pickle.dumps((a, kw), protocol=pickle.HIGHEST_PROTOCOL)


def messages() -> list[wire.Message]:
    return [
        wire.IncomingRpc(DEPOSIT, wire.RpcType.FORK, args("alice", amount=10)),
        wire.IncomingRpc(DEPOSIT, wire.RpcType.ASYNC_AWAIT, args("bob"), "teller", 4),
        wire.IncomingRpc(NOTE, wire.RpcType.IMPULSE, b'{"text":"hi"}'),
        wire.IncomingRpc(77, wire.RpcType.FORK, b"\x01\x02"),
        wire.IncomingReturnValue(wire.ReturnType.VALUE, "bank", 2, pickle.dumps({"ok": 1})),
        wire.IncomingRpc(
            INGRESS_METHOD_ID,
            wire.RpcType.IMPULSE,
            encode_call_envelope(TIME_MS, b"order-17", DEPOSIT, args("carol", 5)),
        ),
        wire.IncomingRpc(
            INGRESS_METHOD_ID,
            wire.RpcType.IMPULSE,
            encode_retention_envelope(RetentionEnvelope(1000, 3_600_000)),
        ),
    ]


@pytest.fixture
def log_path(tmp_path: Path) -> Path:
    files = InstanceFiles(tmp_path / "data", "ledger", 0)
    files.create()
    body = b"".join(wire.encode_message(m) for m in messages())
    with files.open_log(1) as log:
        log.append([wire.encode_disk_record(5, 0, body, [], [])])
    return files.log_path(1)


@pytest.fixture
def service(tmp_path: Path) -> Path:
    path = tmp_path / "ledger_service.py"
    path.write_text(SERVICE)
    return path


def show(*extra: str | Path) -> Result:
    return CliRunner().invoke(main, ["log", "show", *map(str, extra)])


def test_with_the_service_methods_and_values_are_named(log_path: Path, service: Path) -> None:
    result = show(log_path, "--service", service)
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert lines[0].startswith("warning: decoding the logged arguments unpickles them")
    assert "decode only logs you trust" in lines[0]
    assert lines[2:] == [
        f"  RPC fork method {DEPOSIT} deposit('alice', amount=10)",
        f"  RPC async_await method {DEPOSIT} deposit('bob') from 'teller' call 4",
        f"  RPC impulse method {NOTE} note(text='hi')",
        "  RPC fork method 77 (not a method of the service), args 2 bytes: 0102",
        "  return value from 'bank' call 2, value {'ok': 1}",
        f"  ingress call key 'order-17' at 2025-11-24T16:00:00.123Z, method {DEPOSIT} "
        "deposit('carol', 5)",
        "  ingress retention: keep the outcomes of the last 1000 calls, none older than 3600 s",
    ]


def test_without_the_service_ingress_impulses_are_still_taken_apart(log_path: Path) -> None:
    result = show(log_path)
    assert result.exit_code == 0, result.output
    assert "warning" not in result.output
    lines = result.output.splitlines()
    assert lines[1].startswith(f"  RPC fork method {DEPOSIT}, args ")
    assert lines[6].startswith(
        f"  ingress call key 'order-17' at 2025-11-24T16:00:00.123Z, method {DEPOSIT}, args "
    )
    assert lines[7] == (
        "  ingress retention: keep the outcomes of the last 1000 calls, none older than 3600 s"
    )


def test_arguments_that_do_not_decode_are_said(tmp_path: Path, service: Path) -> None:
    files = InstanceFiles(tmp_path / "other", "ledger", 0)
    files.create()
    bad = wire.IncomingRpc(DEPOSIT, wire.RpcType.FORK, b"\x80\x05not a pickle")
    with files.open_log(1) as log:
        log.append([wire.encode_disk_record(5, 0, wire.encode_message(bad), [], [])])
    result = show(files.log_path(1), "--service", service)
    assert result.exit_code == 0, result.output
    assert f"method {DEPOSIT} deposit(<14 bytes that do not decode: " in result.output


def test_the_service_argument_is_encoded_as_the_binding_does(service: Path) -> None:
    from ambrosia_py.binding.loading import load_service

    ledger = load_service(str(service))
    spec = ledger.rpc_methods_by_name()["deposit"]
    assert encode_args("pickle", spec.signature, ("alice",), {"amount": 10}) == args(
        "alice", amount=10
    )
