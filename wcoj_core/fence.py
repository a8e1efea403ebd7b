"""pandas fenced off until Spark starts, in a process that is the ``wcoj`` program.

pyarrow imports pandas (a third of a second) the first time an array is converted with
``to_numpy`` or built from a numpy array with ``pa.array``, and discards any error raised while
it imports it, a ``KeyboardInterrupt`` included: a Ctrl-C in that third of a second was lost and
the epoch went on to commit. The engine's own conversions avoid the shim (`wcoj_core.arrow`);
the input readers' and pyarrow's own still reach it. The ``wcoj`` program (`wcoj_core.cli.main`
reading its own command line) therefore fences pandas off (`fence_pandas`: an import finder that
refuses it at once, and pyarrow goes on without pandas) until Spark is needed
(`lift_pandas_fence`, called before pyspark is imported). What it saves a fresh ``wcoj apply``
is measured in docs/benchmarks.md (the cold part).

This module imports neither numpy nor pyarrow, so that a command that reads no Arrow data
(``wcoj status``) pays for neither.
"""

from __future__ import annotations

import contextlib
import sys


class _PandasFence:
    """Refuses ``import pandas`` (and its submodules), remembering that it did (a meta path
    finder: ``find_spec`` is all it needs; `importlib.abc` would cost its imports)."""

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
            import pyarrow as pa

            pa.lib._pandas_api.series()  # type: ignore[attr-defined]
