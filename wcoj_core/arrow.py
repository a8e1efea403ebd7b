"""Arrow columns to numpy and back without pyarrow's pandas shim.

pyarrow imports pandas (a third of a second) the first time an array is converted with
``to_numpy`` or built from a numpy array with ``pa.array``. A fresh ``wcoj apply`` process has no
other use for pandas, so the engine's own conversions go through the buffers instead: long
columns without nulls — what every batch and every change holds — are viewed in place
(`longs`), and numpy arrays are wrapped without a copy (`long_array`).

The ``wcoj`` program keeps pandas out of the process altogether until Spark starts
(`wcoj_core.fence`).

>>> import numpy as np
>>> longs(long_array(np.array([3, -1, 2]))).tolist()
[3, -1, 2]
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pyarrow as pa

I64 = np.int64


def long_array(values: np.ndarray) -> pa.Array:
    """A numpy array of longs as an Arrow int64 array over its memory (no copy when contiguous;
    not ``pa.array``, which imports ``numpy.ma``): not for Arrow's threaded readers."""
    values = np.ascontiguousarray(values, dtype=I64)
    return pa.Array.from_buffers(pa.int64(), len(values), [None, pa.py_buffer(values)])


def longs(column: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """An integer column without nulls as a numpy array of longs (a view when it is one int64
    chunk; raises `ValueError` for nulls or a type that is not an integer)."""
    if isinstance(column, pa.ChunkedArray):
        chunks = column.chunks
        if len(chunks) == 1:
            return longs(chunks[0])
        if not chunks:
            return np.zeros(0, dtype=I64)
        return np.concatenate([longs(c) for c in chunks])
    if column.null_count:
        raise ValueError("the column holds nulls")
    if not pa.types.is_integer(column.type):
        raise ValueError(f"the column holds {column.type}, not integers")
    if column.type != pa.int64():
        column = column.cast(pa.int64())
    buffer = column.buffers()[1]
    if buffer is None:
        return np.zeros(0, dtype=I64)
    return np.frombuffer(buffer, dtype=I64, count=len(column), offset=column.offset * 8)


def consolidated(tables: Sequence[pa.Table], columns: Sequence[str], diff: str = "diff") -> bool:
    """Whether tables of rows (`columns`, then `diff`), taken in order, are together what a
    consolidated, sorted layer holds — 64-bit integers without nulls, rows strictly increasing
    (each tuple once, lexicographically sorted), no zero diff — checked exactly, in one
    vectorized pass over views of their columns.

    What the engine writes (a batch's files, each sorted, in order) passes: a reader that
    checks this reads a stored batch without sorting it again.

    >>> t = pa.table({"c0": [1, 1, 2], "c1": [1, 3, 0], "diff": [1, -1, 2]})
    >>> consolidated([t.slice(0, 2), t.slice(2)], ["c0", "c1"])
    True
    >>> consolidated([t.slice(2), t.slice(0, 2)], ["c0", "c1"])  # out of order
    False
    >>> consolidated([pa.table({"c0": [1, 1], "c1": [3, 3], "diff": [1, 1]})], ["c0", "c1"])
    False
    """
    names = [*columns, diff]
    last: list[int] | None = None
    for table in tables:
        for name in names:
            col = table.column(name)
            if col.type != pa.int64() or col.null_count:
                return False
        for part in table.to_batches():
            if not part.num_rows:
                continue
            cols = [longs(part.column(c)) for c in columns]
            if not longs(part.column(diff)).all():
                return False
            if last is not None and not last < [int(c[0]) for c in cols]:
                return False
            undecided = np.ones(part.num_rows - 1, dtype=bool)
            for c in cols:  # lexicographic: a later column decides where the earlier are equal
                if (undecided & (c[1:] < c[:-1])).any():
                    return False
                undecided &= c[1:] == c[:-1]
            if undecided.any():  # a tuple twice
                return False
            last = [int(c[-1]) for c in cols]
    return True
