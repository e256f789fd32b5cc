"""Help that says what was written: service options from their comments, and the
program's command summaries whole."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from ambrosia_py.binding.loading import load_service
from ambrosia_py.cli.option_help import option_help

SERVICE = '''
from ambrosia_py import Immortal, rpc


class Shop(Immortal):
    class Options:
        listen: str = "127.0.0.1:9000"  # where buyers connect
        max_cart: int = 50
        """Items one cart may hold;
        past it, adding is refused."""
        quiet: bool = False

    @rpc
    def ping(self) -> None:
        pass
'''


def test_comments_and_attribute_docstrings_are_the_help(tmp_path: Path) -> None:
    path = tmp_path / "shop.py"
    path.write_text(SERVICE)
    shop: Any = load_service(str(path))
    helps = option_help(shop.Options)
    assert helps == {
        "listen": "where buyers connect",
        "max_cart": "Items one cart may hold; past it, adding is refused.",
    }


def test_run_help_shows_them(tmp_path: Path) -> None:
    path = tmp_path / "shop.py"
    path.write_text(SERVICE)
    done = subprocess.run(
        [sys.executable, "-m", "ambrosia_py.cli", "run", str(path), "--help"],
        capture_output=True,
        text=True,
        timeout=120,
        env={"COLUMNS": "200", "PATH": "/usr/bin:/bin"},
    )
    assert done.returncode == 0, done.stderr
    text = " ".join(done.stdout.split())  # help wraps at 80 columns
    assert "--listen TEXT where buyers connect [default: 127.0.0.1:9000]" in text
    assert "--max-cart INTEGER Items one cart may hold; past it, adding is refused." in text
    assert "--quiet BOOLEAN Shop option." in text  # nothing written: the plain fallback


@pytest.mark.parametrize("group", [[], ["bench"], ["log"], ["registry"]], ids=repr)
def test_every_group_keeps_each_summary_whole(group: list[str]) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "ambrosia_py.cli", *group, "--help"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    commands = done.stdout.split("Commands:", 1)[1]
    assert "..." not in commands, commands
    if not group:
        text = " ".join(commands.split())
        assert "run Run an immortal service with its coordinator; run it again to recover." in text
