"""ambrosia_py.eventloop: which loop our processes start, and the switch that picks it.

The process tests run on the default (uvloop where it is installed); the bank soak
(tests/test_bank_soak.py) and the coordinator's memory bound under a streaming peer
(tests/test_outbox_limit.py) run on each loop, so both carry crash and load tests.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys

import pytest

from ambrosia_py import eventloop


async def _loop_kind() -> str:
    return eventloop.running_loop_name()


def test_the_default_is_uvloop_where_it_is_installed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(eventloop.LOOP_ENV, raising=False)
    pytest.importorskip("uvloop")
    assert eventloop.loop_name() == "uvloop"
    assert eventloop.run(_loop_kind()) == "uvloop"


def test_asyncio_is_picked_by_name(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(eventloop.LOOP_ENV, "asyncio")
    assert eventloop.loop_name() == "asyncio"
    assert eventloop.run(_loop_kind()) == "asyncio"
    loop = eventloop.new_event_loop()
    try:
        assert isinstance(loop, asyncio.SelectorEventLoop)
    finally:
        loop.close()


def test_without_uvloop_asyncio_runs_unless_uvloop_is_asked_for(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "uvloop", None)  # import uvloop now raises ImportError
    monkeypatch.delenv(eventloop.LOOP_ENV, raising=False)
    assert eventloop.loop_name() == "asyncio"
    assert eventloop.run(_loop_kind()) == "asyncio"
    monkeypatch.setenv(eventloop.LOOP_ENV, "uvloop")
    with pytest.raises(ImportError, match="AMBROSIA_LOOP=uvloop, but uvloop is not installed"):
        eventloop.loop_name()


def test_an_unknown_loop_name_is_an_error_naming_the_variable(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(eventloop.LOOP_ENV, "trio")
    with pytest.raises(ValueError, match="AMBROSIA_LOOP='trio': expected one of uvloop, asyncio"):
        eventloop.new_event_loop()


def test_run_returns_the_result_and_closes_the_loop(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(eventloop.LOOP_ENV, raising=False)
    seen: list[asyncio.AbstractEventLoop] = []

    async def work() -> int:
        seen.append(asyncio.get_running_loop())
        await asyncio.sleep(0)
        return 42

    assert eventloop.run(work()) == 42
    assert seen[0].is_closed()


@pytest.mark.parametrize("name", eventloop.LOOPS)
def test_a_coordinator_process_starts_on_the_loop_asked_for(name: str) -> None:
    """The coordinator's entry point goes through eventloop.run (checked in a child, so
    the variable reaches a fresh interpreter the way it reaches a started process)."""
    if name == "uvloop":
        pytest.importorskip("uvloop")
    code = (
        "import asyncio\n"
        "from ambrosia_py.cli import coordinator\n"
        "async def main():\n"
        "    print(type(asyncio.get_running_loop()).__module__)\n"
        "    return 0\n"
        "coordinator.run_to_exit(main())\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        env={**os.environ, eventloop.LOOP_ENV: name},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().partition(".")[0] == name
