"""A layer's arrays as a segment file holds them, and the checks of every byte read of them.

A segment file (`wcoj_core.store.segments`, docs/state.md) is searched where it lies: `Stored`
holds its arrays (columns as narrow as their values, diffs, the first column's directory) and
its *guard*: the mapping, the CRC-32 of each of its 4 KiB blocks, and a byte a block saying
whether it was checked. The compiled kernel (`_native.c`, `Guard`) checks each block a search
touches the first time it touches it; Python code that reads the arrays reads them through
`Stored.checked`, which checks the same way. A block that does not match raises `DamagedFile`
naming the file, and the file is remembered (`DAMAGED_FILES`): an epoch that met it rebuilds
the trace from its batches (`wcoj_core.epoch`).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np

from wcoj_core.errors import DamagedFile
from wcoj_core.kernel.keys import I64
from wcoj_core.kernel.native import native

# What the compiled kernel is handed for a layer (see `Layer.spec`): columns, diffs, rows,
# unit, directory, its low key, a mapped layer's guard.
Spec = tuple[Any, ...]

# The files in which a read found a damaged block, in this process: a segment of one is not
# opened again (`wcoj_core.store.segments`), so an epoch that met one rebuilds it.
DAMAGED_FILES: set[str] = set()
DAMAGED = "a block of it does not match its checksum (its bytes changed since it was written)"


@dataclass(frozen=True, slots=True)
class Stored:
    """A layer's arrays as a segment file holds them (`wcoj_core.store.segments`): the columns
    as narrow as their values (``uint32`` where they lie in [0, 2^32), else int64; the first
    None where the directory stands for it), the diffs (int32 or int64; None in a unit layer),
    the first column's directory (``uint32`` or int64) and its low key, and the file's `guard`
    (its bytes, its blocks' CRC-32s, the blocks seen — one more byte: any damaged — the block
    size's shift, its path). The kernel checks each block it reads when it first reads it;
    `part` checks what it reads the same way (`native.checked`)."""

    cols: tuple[np.ndarray | None, ...]
    diff: np.ndarray | None
    dir: np.ndarray | None
    low: int
    guard: tuple[Any, ...]

    def checked(self, array: np.ndarray, lo: int, hi: int) -> np.ndarray:
        """`array[lo:hi]`, its bytes checked against their blocks' sums (`DamagedFile`)."""
        part = array[lo:hi]
        start = part.ctypes.data - self.guard[0].ctypes.data
        if len(part) and not native.checked(self.guard, start, part.nbytes):
            self.damaged()
        return part

    def damaged(self) -> None:
        """Raise `DamagedFile`: a block of the file was found damaged."""
        DAMAGED_FILES.add(self.guard[4])
        raise DamagedFile(self.guard[4], DAMAGED)

    def column(self, j: int, lo: int, hi: int) -> np.ndarray:
        """Rows [lo, hi) of column `j` as int64, checked."""
        col = self.cols[j]
        if col is not None:
            return self.checked(col, lo, hi).astype(I64)
        assert self.dir is not None
        if lo >= hi:
            return np.zeros(0, dtype=I64)
        # The keys' entries found in the directory as it is, then checked: a search that went
        # astray in a damaged block finds entries that do not bracket the rows.
        first, last, edges = self._entries(self.dir, lo, hi)
        if not (first >= 0 and edges[0] <= lo < edges[1] and edges[-2] < hi <= edges[-1]):
            first, last, edges = self._entries(self.checked(self.dir, 0, len(self.dir)), lo, hi)
        runs = np.minimum(edges[1:], hi) - np.maximum(edges[:-1], lo)
        keys = np.arange(self.low + first, self.low + last, dtype=I64)
        return np.repeat(keys, np.maximum(runs, 0))

    def _entries(self, table: np.ndarray, lo: int, hi: int) -> tuple[int, int, np.ndarray]:
        """The directory's entries of the keys of rows [lo, hi): the first's and the last's
        index, and the entries between them, checked, as int64."""
        kind = table.dtype.type  # (a key of another type would convert the whole table)
        first = int(np.searchsorted(table, kind(lo), side="right")) - 1
        last = int(np.searchsorted(table, kind(hi), side="left"))
        assert self.dir is not None
        return first, last, self.checked(self.dir, max(first, 0), last + 1).astype(I64)

    def part(self, n: int, lo: int, hi: int) -> tuple[np.ndarray, np.ndarray]:
        """Rows [lo, hi) of a layer of `n` rows as int64 (column-major) and their diffs."""
        hi = min(hi, n)
        rows = np.empty((hi - lo, len(self.cols)), dtype=I64, order="F")
        for j in range(len(self.cols)):
            rows[:, j] = self.column(j, lo, hi)
        d = self.diff
        diff = np.ones(hi - lo, dtype=I64) if d is None else self.checked(d, lo, hi).astype(I64)
        return rows, diff


def damaged(specs: Iterable[Spec | None]) -> None:
    """Raise `DamagedFile` for a mapped layer among `specs` in which a kernel call found a
    damaged block (its guard's last byte)."""
    for spec in specs:
        if spec is not None and spec[6] is not None and spec[6][2][-1]:
            DAMAGED_FILES.add(spec[6][4])
            raise DamagedFile(spec[6][4], DAMAGED)
