"""`ambrosia-py run` takes an importable module (``package.module[:Class]``), as uvicorn does."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from ambrosia_py.binding import load_service
from ambrosia_py.cli import main
from immortals.ockam.hub import OckamHub


def invoke(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(main, ["run", *args])
    return result.exit_code, result.output


def test_a_module_with_one_immortal_needs_no_class_name() -> None:
    assert load_service("immortals.ockam.hub") is OckamHub
    assert load_service("immortals.ockam.hub:OckamHub") is OckamHub


def test_the_modules_options_become_flags() -> None:
    code, out = invoke("immortals.ockam.hub", "--help")
    assert code == 0, out
    assert "--listen TEXT" in out and "--retention-messages INTEGER" in out
    text = " ".join(out.split())  # help wraps at 80 columns
    assert "--stream-service TEXT the stream service's worker address [default:" in text
    assert "[default: stream_service]" in text


def test_an_unknown_module_is_a_clear_error() -> None:
    code, out = invoke("immortals.ockam.nowhere")
    assert code == 2 and "cannot import immortals.ockam.nowhere" in out


def test_a_module_with_two_immortals_asks_for_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "two_services.py").write_text(
        "from ambrosia_py import Immortal\n"
        "class A(Immortal):\n    pass\n"
        "class B(Immortal):\n    pass\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    code, out = invoke("two_services")
    assert code == 2 and "defines 2 Immortal subclasses ['A', 'B']" in out
    assert load_service("two_services:B").__name__ == "B"
