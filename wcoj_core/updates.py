"""The update-triple contract: ``(data, time, diff)`` as a Spark DataFrame.

A collection's changes are a DataFrame whose data columns are followed by ``time`` (the epoch, a
long) and ``diff`` (a signed multiplicity, a long). The collection at time ``t`` is the sum of the
updates with ``time <= t`` (or ``< t`` for the state just before ``t``): a multiset in which a
deletion subtracts.

Three operations keep update streams tidy:

* `consolidate` sums the diffs of equal ``(data, time)`` and drops the zeros;
* `accumulate` collapses the updates as of a time into ``(data, diff)``;
* `compact` advances every time at or before a frontier to the frontier, then consolidates, which
  keeps every accumulation at or after the frontier unchanged.
"""

from __future__ import annotations

from collections.abc import Sequence

import pyarrow as pa
from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql import types as T

from wcoj_core.traces import DIFF, TIME
from wcoj_core.traces import relation_columns as relation_columns  # part of this contract too


def data_columns(df: DataFrame) -> list[str]:
    """The data columns of an update DataFrame: every column but ``time`` and ``diff``."""
    return [c for c in df.columns if c not in (TIME, DIFF)]


def total_diff(df: DataFrame) -> int:
    """The sum of the multiplicities of a collection of changes (0 when it is empty)."""
    row = df.agg(F.sum(DIFF).alias("total")).first()
    return int(row["total"] or 0) if row is not None else 0


def update_schema(columns: Sequence[str], with_time: bool = True) -> T.StructType:
    """The schema of update triples over long data columns."""
    fields = [T.StructField(c, T.LongType(), False) for c in columns]
    if with_time:
        fields.append(T.StructField(TIME, T.LongType(), False))
    fields.append(T.StructField(DIFF, T.LongType(), False))
    return T.StructType(fields)


def consolidate(df: DataFrame, columns: Sequence[str] | None = None) -> DataFrame:
    """Sum the diffs of equal (data, time) and drop the zeros.

    Works with or without a ``time`` column: without one, it sums per data.
    """
    cols = list(columns) if columns is not None else data_columns(df)
    keys = [*cols, TIME] if TIME in df.columns else cols
    grouped = df.groupBy(*keys) if keys else df.groupBy()
    return grouped.agg(F.sum(DIFF).alias(DIFF)).where(F.col(DIFF) != 0)


def consolidate_table(table: pa.Table, columns: Sequence[str], time: int) -> pa.Table:
    """`consolidate` for an Arrow table of changes (`columns`, then ``diff``) held on the
    driver: one row per distinct tuple, stamped with `time`, diffs summed, zeros dropped."""
    from wcoj_core.kernel.changes import changes_layer, changes_table

    layer = changes_layer(columns, table)
    return changes_table(columns, layer.rows, layer.diff, time)


def as_of(time: int, strict: bool = False) -> Column:
    """The predicate selecting updates visible at `time`: ``time <= t``, or ``time < t`` if strict."""
    return F.col(TIME) < F.lit(time) if strict else F.col(TIME) <= F.lit(time)


def accumulate(df: DataFrame, time: int | None = None, strict: bool = False) -> DataFrame:
    """The collection as of `time` as ``(data, diff)`` with non-zero diffs.

    With ``time=None`` every update counts (the collection at the end of the stream).
    """
    visible = df if time is None or TIME not in df.columns else df.where(as_of(time, strict))
    return consolidate(visible.drop(TIME) if TIME in visible.columns else visible)


def compact(df: DataFrame, frontier: int) -> DataFrame:
    """Advance times at or before `frontier` to it, then consolidate."""
    advanced = df.withColumn(TIME, F.greatest(F.col(TIME), F.lit(frontier)))
    return consolidate(advanced)


def at_time(df: DataFrame, time: int) -> DataFrame:
    """Attach a constant ``time`` to a ``(data, diff)`` DataFrame, keeping diff last."""
    cols = data_columns(df)
    return df.select(*cols, F.lit(time).cast("long").alias(TIME), F.col(DIFF))
