"""How a mapped layer's pages are read: advice to the operating system (``madvise``).

A segment's file is mapped (`wcoj_core.store.segments`) and a cold search faults its pages in.
Unadvised, Linux reads a whole read-ahead window around every page a file mapping faults on
(``read_ahead_kb``: 8 MiB on this project's test machine), so a fresh epoch's few thousand
scattered lookups read hundreds of megabytes they never look at (an 18.6 M-edge state: 585 MiB
read for one 1,000-change epoch, against 54 MiB advised). So:

* a layer searched for few keys (`Layer.spec`) is advised ``MADV_RANDOM``: a fault reads its own
  page and nothing around it;
* a layer searched for many keys, or read whole, is advised ``MADV_NORMAL`` again, and a column
  about to be read whole (a directory made from a layer's first column) ``MADV_WILLNEED``: its
  pages are read ahead in large requests, whatever the mapping's advice.

Advice only changes how pages are read, never what a search finds; arrays that are not views of
a file mapping (built in memory) are left alone, as is everything where ``madvise`` is missing.
"""

from __future__ import annotations

import mmap
from collections.abc import Iterable

import numpy as np

RANDOM = getattr(mmap, "MADV_RANDOM", None)
NORMAL = getattr(mmap, "MADV_NORMAL", None)
WILLNEED = getattr(mmap, "MADV_WILLNEED", None)


def mapping_of(array: np.ndarray) -> mmap.mmap | None:
    """The file mapping `array` is a view of, if any."""
    base: object = array
    while base is not None:
        if isinstance(base, mmap.mmap):
            return base
        base = base.obj if isinstance(base, memoryview) else getattr(base, "base", None)
    return None


def advise(arrays: Iterable[np.ndarray | None], advice: int | None) -> int:
    """Give `advice` for the pages under each array that views a file mapping; how many were
    advised. Errors are ignored: advice is never needed for a right answer."""
    if advice is None:
        return 0
    done = 0
    for array in arrays:
        if array is None or array.size == 0:
            continue
        mapped = mapping_of(array)
        if mapped is None or mapped.closed:
            continue
        start = np.frombuffer(mapped, dtype=np.uint8, count=1).ctypes.data
        low, high = np.lib.array_utils.byte_bounds(array)
        offset = (low - start) // mmap.PAGESIZE * mmap.PAGESIZE
        try:
            mapped.madvise(advice, offset, high - start - offset)
        except (OSError, ValueError):
            continue
        done += 1
    return done
