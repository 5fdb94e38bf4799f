"""The cyclic garbage collector and the C allocator tuned for a long-running server's hot path.

Each request allocates a few thousand short-lived objects. With CPython's default thresholds the
youngest generation is collected every 700 net allocations, several times per request, and each
older collection walks every module, class and setting loaded at start. Objects alive once
the process serves are frozen out of the collector's view (they live as long as the process), and
the youngest generation is collected ten times less often: the same garbage is found, in fewer
and larger passes.

The C allocator: asyncio reads a socket into a new 256 KiB buffer, then shrinks it to what came. glibc
serves blocks that large with a fresh memory mapping (above its 128 KiB threshold, until a large
block happens to be freed), so every read cost an ``mmap``, a ``mremap``, a ``munmap`` and a page
fault: about 15 % of a worker's CPU per request. With a higher threshold the buffer comes from the heap
and its unused part goes back to it.
"""

from __future__ import annotations

import gc
import os

#: The youngest generation's threshold (CPython's default is 700); the older two keep theirs.
YOUNG_THRESHOLD = 7000
#: Blocks below this come from the heap (glibc's default is 128 KiB, raised as large blocks are freed).
MMAP_THRESHOLD = 4 << 20
#: The heap's free top is returned to the system past this (glibc's default is 128 KiB).
TRIM_THRESHOLD = 8 << 20
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3


def settle() -> None:
    """Call once the process is ready to serve: freeze what start-up left, collect less often, and
    take socket read buffers from the heap.

    No collection first: it would take 15-30 ms of a worker's start (on a cold start's path) to
    find the little garbage start-up leaves, which then stays.
    """
    gc.freeze()
    _, older, oldest = gc.get_threshold()
    gc.set_threshold(YOUNG_THRESHOLD, older, oldest)
    _read_buffers_from_the_heap()


def _read_buffers_from_the_heap() -> bool:
    """Raise glibc's mmap and trim thresholds (see the module's note); elsewhere nothing changes."""
    try:
        glibc = os.confstr("CS_GNU_LIBC_VERSION")  # musl and macOS have no such thresholds
    except (ValueError, OSError):
        glibc = None
    if not glibc:
        return False
    import ctypes  # here, not at the top: commands that never serve do not load it

    libc = ctypes.CDLL(None)
    return bool(libc.mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(
        libc.mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD)
    )
