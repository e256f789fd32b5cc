"""The keys a client makes up: 16 random bytes, never the same twice, not even in a
forked child, which must not draw the bytes its parent drew."""

from __future__ import annotations

import os

from ambrosia_py.client.calls import DEFAULT_KEY_SIZE, call_key


def test_made_up_keys_are_16_bytes_and_distinct() -> None:
    keys = [call_key(None) for _ in range(10_000)]
    assert {len(key) for key in keys} == {DEFAULT_KEY_SIZE}
    assert len(set(keys)) == len(keys)


def test_a_forked_child_makes_other_keys_than_its_parent() -> None:
    call_key(None)  # the parent holds random bytes it has not handed out yet
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: its next keys, to the parent
        try:
            os.write(write, b"".join(call_key(None) for _ in range(8)))
        finally:
            os._exit(0)
    os.close(write)
    with os.fdopen(read, "rb") as pipe:
        child = pipe.read()
    os.waitpid(pid, 0)
    parent = b"".join(call_key(None) for _ in range(8))
    assert len(child) == len(parent) == 8 * DEFAULT_KEY_SIZE
    assert child != parent
