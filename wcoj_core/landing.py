"""An epoch's landed changes, as the engine reads them: consolidated layers on the driver.

A relation's changes at an epoch come as an Arrow table (read from files with pyarrow, or
already in memory), a Spark DataFrame (a large or remote input, a generator), or a `Layer`
(consolidated changes the engine stored itself, when it derives a stale epoch again). `land`
turns any of them into one consolidated `Layer` of the relation's data columns, when it fits
the driver's budget (a DataFrame is counted before it is collected): an undirected relation's
changes are read in both directions and self-loops dropped (`symmetrized`).

Only a DataFrame needs Spark, and only when it is not a plain scan of local Parquet files
(`wcoj_core.spark.local_parquet_files`), which pyarrow reads.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa

from wcoj_core.errors import InputError, listed
from wcoj_core.kernel.changes import changes_layer
from wcoj_core.kernel.layer import Layer
from wcoj_core.meaning import RelationSpec
from wcoj_core.traces import DIFF, TIME, relation_columns

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

# An epoch's changes are first collected with a limit of this many rows (one cheap job for the
# usual small epoch); a larger epoch is counted, then collected whole, which costs Spark less
# than a large limit (a limit gathers its rows through a shuffle to one partition).
DRIVER_PROBE_ROWS = 250_000

Changes = Any  # pa.Table | DataFrame | Layer


@dataclass(frozen=True, slots=True)
class Landed:
    """A relation's landed changes at an epoch: consolidated, as the relation reads them (both
    directions for an undirected one); rows read, and self-loops dropped."""

    layer: Layer
    rows_in: int
    self_loops: int = 0


def is_dataframe(changes: Changes) -> bool:
    return not isinstance(changes, pa.Table | Layer) and hasattr(changes, "sparkSession")


def check_columns(spec: RelationSpec, changes: Changes, epoch: int) -> None:
    """Refuse changes without the relation's columns (``c0 ..``, ``diff``; ``time`` allowed)."""
    if isinstance(changes, Layer):
        if changes.width != spec.arity:
            raise InputError(
                f"changes have {changes.width} columns, the relation {spec.arity}",
                source=f"relation {spec.name!r} at epoch {epoch}",
            )
        return
    cols = relation_columns(spec.arity)
    names = list(changes.column_names) if isinstance(changes, pa.Table) else list(changes.columns)
    missing = [c for c in (*cols, DIFF) if c not in names]
    extra = [c for c in names if c not in (*cols, DIFF, TIME)]
    if missing or extra:
        raise InputError(
            f"changes must have columns {[*cols, DIFF]} (and optionally {TIME}); "
            f"missing {listed(missing)}, unexpected {listed(extra)}",
            source=f"relation {spec.name!r} at epoch {epoch}",
        )


def land(spec: RelationSpec, changes: Changes, budget: int) -> Landed | None:
    """The changes as a consolidated layer on the driver, or None when they hold more than
    `budget` rows (a DataFrame is not collected then)."""
    cols = relation_columns(spec.arity)
    if isinstance(changes, Layer):
        layer, rows_in = changes, len(changes)
    else:
        if isinstance(changes, pa.Table):
            table = changes.select([*cols, DIFF])
        else:
            collected = _collect(changes.select(*cols, DIFF), budget)
            if collected is None:
                return None
            table = collected
        if table.num_rows > budget:
            return None
        nulls = [
            c for c, col in zip(table.column_names, table.columns, strict=True) if col.null_count
        ]
        if nulls:
            raise InputError(
                f"changes hold null values in {', '.join(nulls)}; every value must be a whole "
                "number",
                source=f"relation {spec.name!r}",
            )
        layer, rows_in = changes_layer(cols, table), table.num_rows
    if not spec.undirected:
        return Landed(layer, rows_in)
    both, loops = symmetrized(layer)
    return Landed(both, rows_in, loops)


def symmetrized(layer: Layer) -> tuple[Layer, int]:
    """A binary layer in both directions, self-loops dropped; and how many landed rows were
    loops.

    >>> both, loops = symmetrized(Layer.build(np.array([[1, 2], [3, 3]]), np.array([1, 1])))
    >>> both.rows.tolist(), both.diff.tolist(), loops
    ([[1, 2], [2, 1]], [1, 1], 1)
    """
    a, b, diff = layer.col(0), layer.col(1), np.asarray(layer.diff)
    loop = a == b
    loops = int(np.count_nonzero(loop))
    if loops:
        kept = np.flatnonzero(~loop)
        a, b, diff = a[kept], b[kept], diff[kept]
    # Column by column: no array of rows is made (the kernel sorts columns as they are).
    both = [np.concatenate([a, b]), np.concatenate([b, a])]
    return Layer.build(both, np.concatenate([diff, diff])), loops


def _collect(rows: DataFrame, budget: int) -> pa.Table | None:
    """A DataFrame's rows on the driver, or None when it holds more than `budget` rows.

    A plain scan of local Parquet files is counted from the footers and read with pyarrow,
    without a Spark job; any other is collected with a limit of `DRIVER_PROBE_ROWS` first and,
    when that limit is reached, counted, then collected whole.
    """
    from wcoj_core.spark import local_parquet_files, parquet_rows, read_local_parquet

    files = local_parquet_files(rows)
    if files is not None:
        if parquet_rows(files) > budget:
            return None
        table = read_local_parquet(rows, files)
        if table is not None:
            return table
    probe = min(budget, DRIVER_PROBE_ROWS)
    table = rows.limit(probe + 1).toArrow()
    if table.num_rows > probe:
        if rows.count() > budget:
            return None
        table = rows.toArrow()
    return table


def landed_rows(changes: Sequence[Landed]) -> int:
    return sum(len(c.layer) for c in changes)
