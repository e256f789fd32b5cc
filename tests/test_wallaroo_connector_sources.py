"""The connector's sources: a file by line, a generator by position, their specs.

A source is read *after* a point of reference, again and again (after a crash, a rewind,
a move), so these tests read from the start, from the middle, backwards across the
file source's remembered offsets, past the end (a :class:`SourceError`, seed 000 D5)
and through the event loop. The Ockam source is exercised against a real hub in
``test_wallaroo_connector_e2e.py``.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from immortals.wallaroo.sources import (
    FileSource,
    GeneratorSource,
    SourceError,
    generate,
    open_source,
    stream_names,
)


def read(source: FileSource | GeneratorSource, after: int, limit: int = 1000) -> Any:
    batch = source.read_now(after, limit)
    return list(batch.records), batch.end


def test_a_file_one_message_per_line(tmp_path: Path) -> None:
    path = tmp_path / "in.txt"
    path.write_bytes(b"a b\r\n\nc\nlast without newline")
    src = FileSource(str(path))
    assert src.streams == (f"file://{path}",)
    assert read(src, 0) == ([(1, b"a b"), (2, b""), (3, b"c"), (4, b"last without newline")], True)
    assert read(src, 2, 1) == ([(3, b"c")], False)
    assert read(src, 1, 2) == ([(2, b""), (3, b"c")], False)  # a rewind
    assert read(src, 4) == ([], True)
    with pytest.raises(SourceError, match="has 4 lines; cannot resume after line 9"):
        read(src, 9)


def test_a_file_resumes_anywhere_in_a_long_file(tmp_path: Path) -> None:
    path = tmp_path / "long.txt"
    path.write_text("".join(f"line {k}\n" for k in range(1, 20001)))
    src = FileSource(str(path))
    assert read(src, 0, 20000)[0][-1] == (20000, b"line 20000")
    for after in (19999, 5, 12288, 4096, 4095, 0):
        assert read(src, after, 2)[0][0] == (after + 1, f"line {after + 1}".encode())
    assert read(src, 20000) == ([], True)


def test_an_empty_or_missing_file(tmp_path: Path) -> None:
    (tmp_path / "empty").write_bytes(b"")
    assert read(FileSource(str(tmp_path / "empty")), 0) == ([], True)
    with pytest.raises(SourceError, match="No such file"):
        read(FileSource(str(tmp_path / "missing")), 0)


def test_the_generator() -> None:
    src = GeneratorSource(10, seed=7)
    records, end = read(src, 0, 4)
    assert [p for p, _ in records] == [1, 2, 3, 4] and not end
    assert read(src, 8) == ([(9, generate(7, 9)), (10, generate(7, 10))], True)
    assert read(src, 10) == ([], True)
    with pytest.raises(SourceError, match="has 10 records"):
        read(src, 11)
    assert generate(7, 3) == generate(7, 3) != generate(8, 3)
    assert all(1 <= len(generate(1, k).split()) <= 8 for k in range(1, 200))
    assert {len(generate(1, k, 100)) for k in range(1, 200)} == {100}


def test_source_specs(tmp_path: Path) -> None:
    assert stream_names("gen://5?seed=2") == ("gen://5?seed=2",)
    assert stream_names("gen://5?size=100&seed=2") == ("gen://5?seed=2&size=100",)
    assert stream_names("ockam://127.0.0.1:4000/words") == ("ockam:words",)
    assert stream_names(f"file://{tmp_path}/x.txt") == (f"file://{tmp_path}/x.txt",)
    assert isinstance(open_source("gen://5", "c"), GeneratorSource)
    for bad in ("kafka://x", "gen://x", "gen://5?colour=red", "ockam://host/s", "ockam://h:1/"):
        with pytest.raises(ValueError, match="source"):
            stream_names(bad)


def test_sources_read_through_the_event_loop(tmp_path: Path) -> None:
    path = tmp_path / "in.txt"
    path.write_text("x\ny\n")

    async def go() -> tuple[Any, Any, int]:
        src = open_source(f"file://{path}", "c")
        batch = await src.read(src.streams[0], 0, 10)
        gen = open_source("gen://3?seed=1", "c")
        origin = await gen.origin(gen.streams[0])
        await src.close()
        return batch.records, (await gen.read(gen.streams[0], 0, 10)).end, origin

    assert asyncio.run(go()) == (((1, b"x"), (2, b"y")), True, 0)
