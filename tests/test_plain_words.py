"""Words only insiders can read stay out of what users and contributors read.

The code, the docs, the examples, the chart titles and the tests say what a thing does
and why, not which tracker issue or review finding asked for it, which working session
made it, or on which date it was measured: those are in the history (``git log``), not
in the tree. The patterns are precise, so that "a GitHub issue", a Spark session, a TLS
session or a Wallaroo connector's session (the protocol's own word) pass.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCANNED = ("ambrosia_py", "immortals", "examples", "docs", "tests", "README.md")
SUFFIXES = {".py", ".md", ".c", ".h", ".toml", ".txt"}

_ORDINAL = r"(?:second|third|fourth|fifth|sixth|seventh|eighth|ninth|tenth|\d+(?:st|nd|rd|th))"
INSIDER = {
    "a tracker issue by number": re.compile(r"\bissues? #?\d+", re.I),
    "a review finding by number": re.compile(r"\bfindings? \d+", re.I),
    "a working session": re.compile(rf"\b{_ORDINAL} session\b|\bother sessions\b", re.I),
    # A date alone (a timestamp in sample output, 2026-01-02T03:04:05Z, is no journal).
    "a date": re.compile(r"\b20\d\d-[01]\d-[0-3]\d\b(?!T\d)"),
}


def _files() -> Iterator[Path]:
    for name in SCANNED:
        path = ROOT / name
        if path.is_file():
            yield path
            continue
        for found in sorted(path.rglob("*")):
            if found.suffix in SUFFIXES and "__pycache__" not in found.parts:
                yield found


def _insider(text: str) -> list[tuple[str, str]]:
    return [(what, m.group(0)) for what, pattern in INSIDER.items() for m in pattern.finditer(text)]


def test_no_insider_words_in_the_tree() -> None:
    here = Path(__file__).resolve()
    found = [
        f"{path.relative_to(ROOT)}:{number}: {what} ({word!r})"
        for path in _files()
        if path != here
        for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1)
        for what, word in _insider(line)
    ]
    assert not found, "say what and why instead:\n" + "\n".join(found)


@pytest.mark.parametrize(
    "line",
    [
        "Goals of issue 13",
        "(issue 9, finding 4)",
        "Issues 9 and 10 ask for it",
        "### 2026-11-26, sixth session: where the time goes",
        "the machine swings with the other sessions' load",
        "measured since 2026-11-25",
    ],
)
def test_insider_words_are_caught(line: str) -> None:
    assert _insider(line)


@pytest.mark.parametrize(
    "line",
    [
        "report it as a GitHub issue",
        "one shared SparkSession per suite, a session-scoped fixture",
        "the TLS session is resumed",
        "the stream is introduced again in the next session, at its end",
        "failed sessions in a row (back-off)",
        "ingress call key c2 at 2026-11-23T17:59:54.862Z, method 245320616 add(5)",
        "the first session of a connector",
    ],
)
def test_plain_words_pass(line: str) -> None:
    assert not _insider(line)
