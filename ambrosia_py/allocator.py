"""Socket reads without a fresh memory mapping each: the C allocator primed at start.

Every read here asks for up to 256 KiB (asyncio's transports ask as much, and so do the
binding's and the coordinator's own readers): Python allocates that much for the result,
then shrinks it to what arrived. glibc's malloc serves a request over its mmap threshold
(128 KiB at start) with a fresh mapping, so such a read also costs an ``mmap``, an
``mremap``, a ``munmap`` and a page fault: several times what the same read costs from
the heap. That threshold is dynamic (mallopt(3), M_MMAP_THRESHOLD):
freeing a mapped block raises it to the block's size, after which such reads come from
the heap. So a process that had once freed a large block read cheaply and one that had
not paid on every read, a cost that came and went with each process's history (seen in
an awaited round trip's two coordinators: one paid it, the other not).

:func:`prime_allocator` allocates and frees one mapped block at start, so every process
starts where a long-running one ends up. With another allocator it is one allocation.
"""

from __future__ import annotations

from typing import Final

__all__ = ["PRIME_BYTES", "prime_allocator"]

# Above the largest read (256 KiB) and a link frame (4 MiB): blocks up to this size come
# from the heap from then on, and the heap keeps up to twice as much free for reuse.
PRIME_BYTES: Final = 4 * 1024 * 1024 + 4096


def prime_allocator() -> None:
    """Raise glibc's dynamic mmap threshold to :data:`PRIME_BYTES` (see the module)."""
    block = bytes(PRIME_BYTES)  # calloc'd: a mapping whose pages are never touched
    del block
