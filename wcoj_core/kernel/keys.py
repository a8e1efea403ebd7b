"""Sort keys: rows of longs as values whose order is the rows' lexicographic order.

A layer (`wcoj_core.kernel.layer`) is sorted, and persisted, by one key per row:

* `Packing` — a row packed into one ``uint64`` when the columns' value spans fit in 64 bits
  together (vertex ids of any graph that fits in memory): sorted by the kernel's radix sort;
* `encode` — otherwise, a row of ``k`` longs as ``8k`` big-endian bytes with the sign bit
  flipped, so byte order is numeric lexicographic order (what a persisted layer of such rows
  stores as its keys).

The searches themselves read a layer's columns (`wcoj_core.kernel.native`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from wcoj_core.kernel.native import native

I64 = np.int64
U64 = np.uint64
_SIGN = np.uint64(1 << 63)


def encode(rows: np.ndarray) -> np.ndarray:
    """Rows of longs as order-preserving byte strings: one numpy ``void`` per row.

    >>> rows = np.array([[1, -2], [-1, 5], [1, -3]])
    >>> np.argsort(encode(rows), kind="stable").tolist()
    [1, 2, 0]
    """
    width = rows.shape[1]
    flipped = (np.ascontiguousarray(rows, dtype=I64).view(np.uint64) ^ _SIGN).astype(">u8")
    return np.ascontiguousarray(flipped).view(f"V{8 * width}").reshape(len(rows))


@dataclass(frozen=True, slots=True)
class Packing:
    """Rows packed into one ``uint64`` each, order-preserving, for rows inside a box.

    Column ``j`` contributes ``value - lows[j]`` in ``bits[j]`` bits, the first column highest,
    so comparing packed rows compares the rows lexicographically, and the first ``p`` columns of
    a packed row are its top bits. A layer whose columns' spans fit in 64 bits together (vertex
    ids of any graph that fits in memory) is sorted as plain integers, several times faster
    than rows as tuples.

    >>> pk = Packing.of(np.array([[5, -1], [7, 2]]))
    >>> pk.bits, pk.pack(np.array([[5, -1], [7, 2], [8, 0]]))[1].tolist()
    ((2, 2), [True, True, False])
    """

    lows: tuple[int, ...]
    highs: tuple[int, ...]
    bits: tuple[int, ...]

    @classmethod
    def of(cls, rows: np.ndarray | Sequence[np.ndarray]) -> Packing | None:
        """The tightest packing of `rows` (non-empty; a row array, or its columns), or None
        when it needs more than 64 bits."""
        # Column by column: a reduction along axis 0 of a row-major array is several times slower.
        cols = [rows[:, j] for j in range(rows.shape[1])] if isinstance(rows, np.ndarray) else rows
        lows = tuple(int(c.min()) for c in cols)
        highs = tuple(int(c.max()) for c in cols)
        bits = tuple((h - lo).bit_length() for lo, h in zip(lows, highs, strict=True))
        return cls(lows, highs, bits) if sum(bits) <= 64 else None

    def pack(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The first ``rows.shape[1]`` columns packed, and which rows lie inside the box."""
        return self.pack_columns([rows[:, j] for j in range(rows.shape[1])], len(rows))

    def pack_columns(
        self, cols: Sequence[np.ndarray], n: int | None = None
    ) -> tuple[np.ndarray, np.ndarray]:
        """`pack` of rows given as their first columns (`n` rows when no column is given).

        The hot paths hold their rows as separate columns: packing them here spares stacking
        them into a row array first, which would copy every value once more. A row outside the
        box packs as 0. (The compiled kernel's loop: `native.pack`.)
        """
        size = len(cols[0]) if cols else (n or 0)
        out = np.empty(size, dtype=U64)
        inside = np.empty(size, dtype=np.uint8)
        columns = tuple(np.ascontiguousarray(c, dtype=I64) for c in cols)
        native.pack(columns, size, self.lows, self.highs, self.bits, out, inside)
        return out, inside.view(bool)

    def unpack(self, packed: np.ndarray) -> np.ndarray:
        """The rows of packed keys (all columns of the box), column-major.

        Column-major: every column of the result is contiguous, as the searches, gathers and
        Parquet writes of a layer read it column by column.

        >>> pk = Packing.of(np.array([[5, -1], [7, 2]]))
        >>> pk.unpack(pk.pack(np.array([[7, -1], [6, 2]]))[0]).tolist()
        [[7, -1], [6, 2]]
        """
        rows = np.empty((len(packed), len(self.bits)), dtype=I64, order="F")
        cols = tuple(rows[:, j] for j in range(len(self.bits)))
        native.unpack(np.ascontiguousarray(packed, dtype=U64), self.lows, self.bits, cols)
        return rows
