"""Keep the memory a process frees, for its next arrays (the kernel's allocator setting).

The kernel (`wcoj_core.kernel`) allocates large numpy arrays for every epoch: proposals,
bindings, sorted keys. glibc's allocator gives an allocation above its threshold its own
mapping and returns it to the kernel when it is freed; on a virtual machine that hands freed
memory back to its host (free page reporting, ballooning) the next allocation's first touch then
waits for the host, page by page: on this project's 2-core VM, filling fresh memory was tens of
times slower than filling memory the process had already touched, and the same static count
varied twofold from run to run, the difference spent in writing its bindings (figures in
``docs/benchmarks.md``).

`keep_freed_memory` makes the allocator keep what is freed, as the JVM keeps its heap: large
blocks come from the process's heap instead of mappings of their own (``M_MMAP_MAX`` 0), the
heap is never trimmed (``M_TRIM_THRESHOLD``), and threads share the main heap (``M_ARENA_MAX``
1: a thread's own heap is too small for a large array and would map it after all). Arrow's
buffers (the Parquet reads and writes) then come from the same heap too: Arrow's default pool,
mimalloc, gives freed pages back on its own, so its default pool becomes the system allocator.

It has to run before other threads allocate: a thread that allocated before it keeps its own
heap, which glibc still trims, and later threads may be handed that heap. `wcoj_core.spark.session`
calls it before starting Spark, and `wcoj_core.deploy.resident` when a process first keeps traces
(a no-op on the driver by then; first thing in an executor's Python worker). Measured on the
static count of web-NotreDame, the setting made after Arrow's threads had read the input left
several times more page faults per run than the setting made first (``docs/benchmarks.md``).
The cost is that a process's resident memory stays at its peak. Only glibc on Linux has these
settings; set ``WCOJ_KEEP_MEMORY=0`` to leave the allocators as they are.
"""

from __future__ import annotations

import ctypes
import os
import sys
from functools import cache

from wcoj_core.knobs import knob

# glibc's mallopt parameters (malloc.h).
_M_TRIM_THRESHOLD = -1
_M_MMAP_MAX = -4
_M_ARENA_MAX = -8
_NEVER_TRIM = 2**31 - 1  # the largest value an int parameter takes


@cache
def keep_freed_memory() -> bool:
    """Set the allocator to keep freed memory, once per process; True if it was set."""
    if knob("WCOJ_KEEP_MEMORY") == "0" or not sys.platform.startswith("linux"):
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt  # the process's own symbols: glibc's, no ldconfig
    except (OSError, AttributeError):  # not glibc (musl has no mallopt)
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    kept = all(
        mallopt(param, value) == 1
        for param, value in (
            (_M_MMAP_MAX, 0),
            (_M_TRIM_THRESHOLD, _NEVER_TRIM),
            (_M_ARENA_MAX, 1),
        )
    )
    if kept and "pyarrow" in sys.modules:
        import pyarrow as pa

        pa.set_memory_pool(pa.system_memory_pool())
    elif kept:  # Arrow reads it when it first allocates: a command without Arrow never imports it
        os.environ.setdefault("ARROW_DEFAULT_MEMORY_POOL", "system")
    return kept


__all__ = ["keep_freed_memory"]
