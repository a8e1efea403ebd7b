"""The update-triple contract: ``(data, time, diff)`` as a Spark DataFrame.

A collection's changes are a DataFrame whose data columns are followed by ``time`` (the epoch, a
long) and ``diff`` (a signed multiplicity, a long). The collection at time ``t`` is the sum of the
updates with ``time <= t`` (or ``< t`` for the state just before ``t``): a multiset in which a
deletion subtracts. `consolidate` keeps a stream tidy: it sums the diffs of equal
``(data, time)`` and drops the zeros.
"""

from __future__ import annotations

from collections.abc import Sequence

from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql import types as T

from wcoj_core.traces import DIFF, TIME


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
