"""The one general linear operator, and the familiar operators as instances of it.

A linear operator maps each update ``(data, time, diff)`` to any number of updates
``(data2, max(time, time2), diff * diff2)``: it is a join of the update stream with a function
from a record to a small collection of ``(data2, time2, diff2)``. Because it acts on one record at
a time, ``op(x + y) == op(x) + op(y)``, so it can be applied to changes as easily as to whole
collections.

``map``, ``filter``, ``flat_map``, ``explode`` (emit diffs), ``validity`` (a temporal window: a
record counts from one time until another) and ``symmetrize`` (an undirected edge list as both
directions, self-loops dropped) are all `Linear` values. ``a.then(b)`` fuses two operators into
one: the emissions of ``b`` are built on the expressions of ``a``, so a whole chain lowers to a
single Spark projection (one ``select``, plus one ``inline`` when an operator fans out) rather
than one stage per operator.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from wcoj_core.updates import DIFF, TIME, data_columns

Row = Mapping[str, Column]


@dataclass(frozen=True, slots=True)
class Emission:
    """One output of a record: new data, and optionally a condition, a time and a diff factor.

    ``time=None`` keeps the input time; ``diff=None`` keeps the input diff (a factor of one).
    """

    data: Row
    when: Column | None = None
    time: Column | None = None
    diff: Column | None = None


Emit = Callable[[Row], Sequence[Emission]]


def _and(a: Column | None, b: Column | None) -> Column | None:
    if a is None:
        return b
    if b is None:
        return a
    return a & b


def _later(a: Column | None, b: Column | None) -> Column | None:
    if a is None:
        return b
    if b is None:
        return a
    return F.greatest(a, b)


def _times(a: Column | None, b: Column | None) -> Column | None:
    if a is None:
        return b
    if b is None:
        return a
    return a * b


@dataclass(frozen=True, slots=True)
class Linear:
    """A linear operator on update streams: a function from a record to its emissions."""

    emit: Emit
    name: str = field(default="linear")

    def then(self, other: Linear) -> Linear:
        """Fuse: apply `self`, then `other` to each of its emissions, as one operator."""

        def fused(row: Row) -> list[Emission]:
            out: list[Emission] = []
            for first in self.emit(row):
                for second in other.emit(first.data):
                    out.append(
                        Emission(
                            data=second.data,
                            when=_and(first.when, second.when),
                            time=_later(first.time, second.time),
                            diff=_times(first.diff, second.diff),
                        )
                    )
            return out

        return Linear(fused, f"{self.name}.{other.name}")

    def apply(self, df: DataFrame) -> DataFrame:
        """Apply to an update DataFrame (``time`` optional): one projection, at most one inline."""
        row = {c: F.col(c) for c in data_columns(df)}
        has_time = TIME in df.columns
        emissions = list(self.emit(row))
        if not emissions:
            raise ValueError(f"linear operator {self.name} emits nothing for every record")
        out_cols = list(emissions[0].data)
        for e in emissions:
            if list(e.data) != out_cols:
                raise ValueError(
                    f"linear operator {self.name}: every emission must have the columns "
                    f"{out_cols}, got {list(e.data)}"
                )

        def columns_of(e: Emission) -> list[Column]:
            cols = [e.data[c].cast("long").alias(c) for c in out_cols]
            if has_time:
                cols.append(_later(F.col(TIME), e.time).cast("long").alias(TIME))  # type: ignore[union-attr]
            diff = F.col(DIFF) if e.diff is None else F.col(DIFF) * e.diff
            cols.append(diff.cast("long").alias(DIFF))
            return cols

        if len(emissions) == 1:
            (e,) = emissions
            selected = df if e.when is None else df.where(e.when)
            return selected.select(*columns_of(e))
        # Several emissions: build every candidate row as a struct (null when its condition
        # fails), inline them in one pass, and drop the nulls.
        structs = [
            F.when(e.when if e.when is not None else F.lit(True), F.struct(*columns_of(e)))
            for e in emissions
        ]
        fields = [*out_cols, *([TIME] if has_time else []), DIFF]
        exploded = df.select(F.inline(F.filter(F.array(*structs), lambda s: s.isNotNull())))
        return exploded.select(*fields)


def identity() -> Linear:
    """The operator that changes nothing."""
    return Linear(lambda row: [Emission(dict(row))], "identity")


def map_(fn: Callable[[Row], Row], name: str = "map") -> Linear:
    """Map each record to one new record."""
    return Linear(lambda row: [Emission(dict(fn(row)))], name)


def filter_(predicate: Callable[[Row], Column], name: str = "filter") -> Linear:
    """Keep the records satisfying `predicate`."""
    return Linear(lambda row: [Emission(dict(row), when=predicate(row))], name)


def flat_map(fn: Callable[[Row], Sequence[Row]], name: str = "flat_map") -> Linear:
    """Map each record to a fixed number of records (each with the input's time and diff)."""
    return Linear(lambda row: [Emission(dict(r)) for r in fn(row)], name)


def explode(fn: Callable[[Row], Sequence[tuple[Row, Column]]], name: str = "explode") -> Linear:
    """Map each record to records with diff factors: ``(data2, diff2)``, multiplied in."""
    return Linear(lambda row: [Emission(dict(r), diff=d) for r, d in fn(row)], name)


def validity(start: str, end: str, name: str = "validity") -> Linear:
    """A temporal filter: a record counts from time ``row[start]`` until time ``row[end]``.

    The record is emitted twice: ``+diff`` at ``max(time, start)`` and ``-diff`` at
    ``max(time, end)``; the two columns are dropped from the data.
    """

    def emit(row: Row) -> list[Emission]:
        data = {c: v for c, v in row.items() if c not in (start, end)}
        return [
            Emission(data, time=row[start]),
            Emission(data, time=row[end], diff=F.lit(-1)),
        ]

    return Linear(emit, name)


def symmetrize(src: str = "c0", dst: str = "c1", name: str = "symmetrize") -> Linear:
    """An edge as both of its directions; self-loops are dropped."""

    def emit(row: Row) -> list[Emission]:
        rest = {c: v for c, v in row.items() if c not in (src, dst)}
        differs = row[src] != row[dst]
        forward = {src: row[src], dst: row[dst], **rest}
        backward = {src: row[dst], dst: row[src], **rest}
        return [Emission(forward, when=differs), Emission(backward, when=differs)]

    return Linear(emit, name)
