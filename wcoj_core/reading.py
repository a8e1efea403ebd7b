"""A state's traces as Spark DataFrames: what readers outside the engine see.

The batches of a trace are Parquet folders of update triples; a trace as of an epoch is the
sum of its batches up to it. `accumulated` reads them with Spark (for the Dagster IO manager,
the Spark SQL check and the tests), consolidated: one row per tuple with a non-zero summed
multiplicity. `changes_at` is one epoch's batch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from wcoj_core.errors import StateError

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

    from wcoj_core.engine import Engine
    from wcoj_core.store.manifest import Batch, Trace


def read_batches(engine: Engine, trace: Trace, batches: list[Batch]) -> DataFrame:
    """The update triples of some batches of a trace (time dropped), unconsolidated."""
    from wcoj_core.updates import update_schema

    spark = engine.spark("reading stored batches as Spark DataFrames")
    schema = update_schema(trace.columns)
    live = [b for b in batches if b.rows > 0]
    if not live:
        return spark.createDataFrame([], update_schema(trace.columns, with_time=False))
    paths = [engine.files.uri(engine.files.full(b.path)) for b in live]
    return spark.read.schema(schema).parquet(*paths).drop("time")


def accumulated(engine: Engine, name: str, time: int | None) -> DataFrame:
    """A trace as of `time` (default: the last epoch), consolidated."""
    from wcoj_core.updates import consolidate

    m = engine.store.current()
    trace = m.trace(name)
    if trace is None:
        raise StateError(f"{name!r} is not in the state at {engine.store.root}")
    if time is not None and m.frontier is not None and time < m.frontier:
        raise StateError(
            f"history before epoch {m.frontier} was compacted in {engine.store.root}; "
            f"cannot read {name!r} as of epoch {time}"
        )
    return consolidate(read_batches(engine, trace, list(trace.visible(time))), trace.columns)


def changes_at(engine: Engine, name: str, epoch: int) -> DataFrame:
    """A trace's stored change at `epoch` (columns.., diff)."""
    m = engine.store.current()
    trace = m.trace(name)
    if trace is None:
        raise StateError(f"{name!r} is not in the state at {engine.store.root}")
    return read_batches(engine, trace, [b for b in trace.batches if b.time == epoch])
