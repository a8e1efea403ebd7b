"""Arrow columns to numpy and back without pyarrow's pandas shim.

pyarrow imports pandas (a third of a second) the first time an array is converted with
``to_numpy`` or built from a numpy array with ``pa.array``. A fresh ``wcoj apply`` process has no
other use for pandas, so the engine's own conversions go through the buffers instead: long
columns without nulls — what every batch and every change holds — are viewed in place
(`longs`), and numpy arrays are wrapped without a copy (`long_array`).

Other conversions (the input readers', pyarrow's own) still reach the shim, and the shim's
import has a second cost: pyarrow discards any error raised while it imports pandas, a
``KeyboardInterrupt`` included, so a Ctrl-C in that third of a second was lost and the epoch
went on to commit. The ``wcoj`` program (`wcoj_core.cli.main` reading
its own command line) therefore fences pandas off (`fence_pandas`: an import finder that refuses
it at once, and pyarrow goes on without pandas) until Spark is needed (`lift_pandas_fence`,
called before pyspark is imported): a fresh ``wcoj apply`` of a small epoch took 0.33 s
instead of 0.59 s.

>>> import numpy as np
>>> longs(long_array(np.array([3, -1, 2]))).tolist()
[3, -1, 2]
"""

from __future__ import annotations

import contextlib
import importlib.abc
import sys

import numpy as np
import pyarrow as pa

I64 = np.int64


class _PandasFence(importlib.abc.MetaPathFinder):
    """Refuses ``import pandas`` (and its submodules), remembering that it did."""

    refused = False

    def find_spec(self, name: str, path: object = None, target: object = None) -> None:
        if name.partition(".")[0] == "pandas":
            self.refused = True
            raise ModuleNotFoundError("pandas is fenced off until Spark starts", name=name)
        return None


_FENCE = _PandasFence()


def fence_pandas() -> None:
    """Make ``import pandas`` fail in this process until `lift_pandas_fence` (a no-op when
    pandas is already imported)."""
    if "pandas" not in sys.modules and _FENCE not in sys.meta_path:
        sys.meta_path.insert(0, _FENCE)


def lift_pandas_fence() -> None:
    """Let pandas be imported again (for Spark, whose Arrow conversions use it). pyarrow's shim
    remembers a failed import, and without pandas it would take a pandas object for a plain
    sequence: when it was refused, it is made to import pandas now."""
    if _FENCE not in sys.meta_path:
        return
    sys.meta_path.remove(_FENCE)
    if _FENCE.refused:
        _FENCE.refused = False
        with contextlib.suppress(ImportError, AttributeError):
            pa.lib._pandas_api.series()  # type: ignore[attr-defined]


def long_array(values: np.ndarray) -> pa.Array:
    """A numpy array of longs as an Arrow int64 array (no copy when it is contiguous)."""
    data = np.ascontiguousarray(values, dtype=I64)
    return pa.Array.from_buffers(pa.int64(), len(data), [None, pa.py_buffer(data)])


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
