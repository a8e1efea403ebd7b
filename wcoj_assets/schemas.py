"""Pandera schemas for update triples, and a validation that cannot pass silently.

An update frame has data columns ``c0 .. c{k-1}``, an optional ``time`` and a ``diff``, all
non-null longs, no other column; ``diff`` is non-zero, ``time`` equals the partition's epoch, and a
consolidated frame holds each ``(data, time)`` once.

`pandera.pyspark` does not raise on bad data: ``validate(lazy=True)`` returns the frame with the
errors in ``df.pandera.errors``. `problems` reads them right after validating and returns them as
lines; callers turn a non-empty list into a failed check. The validation depth is set explicitly
(and validation forced on) for each call, so ``PANDERA_VALIDATION_DEPTH`` or
``PANDERA_VALIDATION_ENABLED`` in the environment cannot weaken it:

* `Depth.FULL` (schema and data: types, nulls, ``diff != 0``, ``time``, uniqueness) on each epoch's
  incoming changes — what can be wrong. Landed rows on the driver (a table or a stream) are
  checked by the same rules vectorized on their Arrow columns (`arrow_problems`, exact over every
  row), pandera describing the rows that fail (converting an epoch of 20 rows to pandas for
  pandera costs more than applying it);
* `Depth.SCHEMA` (columns and types only) on what the engine wrote (rule and query outputs).

Each schema comes in two backends with the same rules: `pandera.pyspark` for frames Spark holds,
and `pandera.pandas` (``local=True``) for what is already on the driver — a small epoch's changes
collected for the keyed path, or a written batch's Parquet footer — where a Spark job per check
would cost far more than the data it looks at. `problems` takes either and reports the same way.

pandera is imported when a schema is built, not when this module is imported.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from enum import Enum
from typing import TYPE_CHECKING, Any

from wcoj_core.traces import DIFF, TIME

# A reported problem is cut at this many characters (pandera lists every failure case).
LINE = 400

if TYPE_CHECKING:
    import pandas as pd
    from pyspark.sql import DataFrame


class Depth(Enum):
    """How deep a validation goes (pandera's ValidationDepth)."""

    FULL = "SCHEMA_AND_DATA"
    SCHEMA = "SCHEMA_ONLY"


def triples_schema(
    columns: Sequence[str],
    *,
    epoch: int | None = None,
    with_time: bool = False,
    unique: bool = False,
    local: bool = False,
) -> Any:
    """A pandera DataFrameSchema for update triples over data `columns`.

    With `epoch`, ``time`` must be present and equal to it; `with_time` requires ``time``
    without fixing its value; `unique` requires each (data, time) at most once. The schema is
    for Spark DataFrames (`pandera.pyspark`), or with `local` for pandas ones (`pandera.pandas`).
    """
    if local:
        pa = local_pandera()
        long: Any = "int64"
    else:
        import pandera.pyspark as pa  # type: ignore[no-redef]
        from pyspark.sql import types as T

        long = T.LongType()
    fields: dict[str, Any] = {
        c: pa.Column(long, nullable=False, title=f"data column {c}") for c in columns
    }
    keys = list(fields)
    if epoch is not None or with_time:
        checks = [pa.Check.eq(epoch)] if epoch is not None else []
        fields[TIME] = pa.Column(long, checks=checks, nullable=False, title="epoch")
        keys.append(TIME)
    fields[DIFF] = pa.Column(long, checks=[pa.Check.ne(0)], nullable=False, title="multiplicity")
    return pa.DataFrameSchema(
        columns=fields,
        strict=True,
        unique=keys if unique else None,
        name="update_triples",
    )


def problems(df: DataFrame | pd.DataFrame, schema: Any, depth: Depth) -> list[str]:
    """Validate `df` against `schema` at `depth`; one line per error (empty when valid).

    `df` is a Spark DataFrame for a `pandera.pyspark` schema, or a pandas one for a local schema.
    """
    import pandas as pd
    from pandera.config import config_context

    if isinstance(df, pd.DataFrame):
        return _local_problems(df, schema, depth)
    with config_context(validation_enabled=True, validation_depth=depth.value):
        validated = schema.validate(df, lazy=True)
        errors = validated.pandera.errors or {}
    lines: list[str] = []
    for category, reasons in sorted(errors.items()):
        for reason, items in sorted(reasons.items()):
            for item in items:
                column = item.get("column")
                where = f" column {column!r}" if column and column != schema.name else ""
                lines.append(f"{category}/{reason}{where}: {item.get('error', item)}")
    return lines


@contextmanager
def unloaded(*modules: str) -> Iterator[None]:
    """Import what the block imports as if `modules` were not installed, unless they are loaded
    already (``import`` of them fails inside the block only).

    pandera's pandas backend is loaded so (`local_pandera`): on import, pandera imports
    pyspark.pandas whenever pyspark is installed (to patch pandas' type hints for its typing
    module, which wcoj does not use), and its data-synthesis strategies import hypothesis (a
    test dependency here); together about a second of a run's start, for an epoch that needs
    neither. A later ``import pyspark`` (the Spark path) works as usual.
    """
    blocked = [m for m in modules if m not in sys.modules]
    for m in blocked:
        sys.modules[m] = None  # type: ignore[assignment]
    try:
        yield
    finally:
        for m in blocked:
            if m in sys.modules and sys.modules[m] is None:
                del sys.modules[m]


def local_pandera() -> Any:
    """``pandera.pandas``, and the built-in checks its pandas backend registers, loaded without
    pyspark and hypothesis (see `unloaded`)."""
    with unloaded("pyspark", "hypothesis"):
        import pandera.backends.pandas.builtin_checks  # noqa: F401  (what registering imports)
        import pandera.pandas as pa
    return pa


def _local_problems(df: pd.DataFrame, schema: Any, depth: Depth) -> list[str]:
    """`problems` for a pandas frame: pandera.pandas raises every error at once (lazy)."""
    from pandera.config import config_context
    from pandera.errors import SchemaErrors

    with config_context(validation_enabled=True, validation_depth=depth.value):
        try:
            schema.validate(df, lazy=True)
        except SchemaErrors as e:
            lines = []
            for error in e.schema_errors:
                reason = getattr(error.reason_code, "name", str(error.reason_code))
                column = getattr(error, "column_name", None)
                where = f" column {column!r}" if column else ""
                first = str(error).splitlines()[0] if str(error) else repr(error)
                if len(first) > LINE:
                    first = first[: LINE - 1] + "…"
                lines.append(f"{reason}{where}: {first}")
            return lines
    return []


# Landed rows are checked by `arrow_problems`, pandera describing the rows it flags (at most this
# many).
FLAGGED_ROWS = 1000


def landed_problems(rows: Any, columns: Sequence[str], epoch: int) -> list[str]:
    """The full check of an epoch's landed update rows (``c0 ..``, ``diff``), stamped with the
    epoch: on the driver (an Arrow table, or a stream of batches: `wcoj_assets.landing_read.LandedStream`)
    pandera's rules checked exactly on the Arrow columns (`arrow_problems`); pandera.pyspark for
    a Spark DataFrame. One line per error; empty when they are valid."""
    import pyarrow as pa

    if hasattr(rows, "batches"):  # landed files streamed (`wcoj_assets.landing_read.LandedStream`)
        seen = 0
        for batch in rows.batches():
            found = arrow_problems(batch, columns, epoch, offset=seen)
            if found:
                return found
            seen += batch.num_rows
        return []
    if isinstance(rows, pa.Table):
        return arrow_problems(rows, columns, epoch)
    from pyspark.sql import functions as F

    stamped = rows.select(*columns, F.lit(epoch).cast("long").alias(TIME), DIFF)
    return problems(stamped, triples_schema(columns, epoch=epoch), Depth.FULL)


def _pandera_problems(
    table: Any, columns: Sequence[str], epoch: int, index: Any = None
) -> list[str]:
    """pandera's full check of an Arrow table's rows (``time`` stamped with `epoch`); `index`
    names the rows (their positions in what was landed) in pandera's failure cases."""
    import numpy as np

    frame = table.to_pandas()
    if index is not None:
        frame.index = index
    frame.insert(len(columns), TIME, np.full(len(frame), epoch, dtype=np.int64))
    return problems(frame, triples_schema(columns, epoch=epoch, local=True), Depth.FULL)


def arrow_problems(rows: Any, columns: Sequence[str], epoch: int, offset: int = 0) -> list[str]:
    """`landed_problems` of an Arrow table or record batch of any size, without converting it:
    the schema's rules checked exactly, a vectorized pass per column — every data column and
    ``diff`` present, 64-bit integers, no nulls; ``diff`` non-zero (``time`` is the epoch by
    construction) — and pandera's messages for what fails: its full check of the flagged rows
    (at most `FLAGGED_ROWS`, indexed by their position plus `offset`), or of the first rows when
    a column's type is wrong. Agrees with pandera on every table (tests/assets/test_units.py).

    >>> import pyarrow as pa
    >>> arrow_problems(pa.table({"c0": [1, 2], "c1": [2, 3], "diff": [1, -1]}), ["c0", "c1"], 0)
    []
    >>> bad = pa.table({"c0": [1, 2, 3], "c1": [2, 3, 4], "diff": [1, 0, 1]})
    >>> [line.split(":")[0] for line in arrow_problems(bad, ["c0", "c1"], 0)]
    ["DATAFRAME_CHECK column 'diff'"]
    """
    import numpy as np
    import pyarrow as pa

    names = [*columns, DIFF]
    missing = [n for n in names if n not in rows.schema.names]
    table = rows if isinstance(rows, pa.Table) else pa.Table.from_batches([rows])
    if missing or any(table.schema.field(n).type != pa.int64() for n in names):
        # The schema is wrong: pandera says how, from the first rows (columns and types).
        head = table.slice(0, FLAGGED_ROWS)
        return _pandera_problems(
            head.select([n for n in table.schema.names if n != TIME]), columns, epoch
        )
    table = table.select(names)
    diff = table.column(DIFF)
    flagged = diff.fill_null(1).to_numpy() == 0
    for name in names:
        if table.column(name).null_count:
            flagged |= table.column(name).is_null().to_numpy(zero_copy_only=False)
    at = np.flatnonzero(flagged)
    if not len(at):
        return []
    picked = at[:FLAGGED_ROWS]
    lines = _pandera_problems(table.take(picked), columns, epoch, picked + offset)
    if len(at) > len(picked):
        lines.append(f"{len(at):,} rows fail these checks; the first {len(picked):,} are shown")
    return lines
