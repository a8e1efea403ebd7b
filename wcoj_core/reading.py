"""A state's traces as readers outside the engine see them: Arrow tables or Spark DataFrames.

The batches of a trace are Parquet folders of update triples; a trace as of an epoch is the
sum of its batches up to it. Without Spark (no JVM): `read_table` is a trace as of an epoch,
consolidated (one row per tuple with a non-zero summed multiplicity), and `change_table` one
epoch's stored change, both as pyarrow tables with columns ``c0 .. c{k-1}, diff`` read from the
files the manifest lists. With Spark: `accumulated` (for the Spark SQL check, the tests and a
downstream asset asking for a DataFrame) and `changes_at`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from wcoj_core.errors import StateError

if TYPE_CHECKING:
    import pyarrow as pa
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


def _trace(engine: Engine, name: str) -> Trace:
    trace = engine.store.current().trace(name)
    if trace is None:
        raise StateError(f"{name!r} is not in the state at {engine.store.root}")
    return trace


def _batch_tables(engine: Engine, trace: Trace, batches: list[Batch]) -> list[pa.Table]:
    """The Parquet files the manifest lists for `batches`, read with pyarrow (a few files at a
    time: decoding releases the GIL)."""
    from concurrent.futures import ThreadPoolExecutor

    import pyarrow as pa
    import pyarrow.parquet as pq

    columns = [*trace.columns, "diff"]
    files = engine.files
    paths = [
        files.full(f"{batch.path}/{ref.name}")
        for batch in batches
        if batch.rows
        for ref in batch.files
        if ref.name.endswith(".parquet")
    ]

    def read(path: str) -> pa.Table:
        table = pq.read_table(path, columns=columns, filesystem=files.fs, pre_buffer=True)
        return pa.Table.from_arrays(
            [table.column(c).cast(pa.int64()) for c in columns], names=columns
        )

    if len(paths) <= 1:
        return [read(p) for p in paths]
    with ThreadPoolExecutor(max_workers=min(4, len(paths))) as pool:
        return list(pool.map(read, paths))


def _empty(columns: tuple[str, ...]) -> pa.Table:
    import pyarrow as pa

    names = [*columns, "diff"]
    return pa.Table.from_arrays([pa.array([], pa.int64()) for _ in names], names=names)


def read_table(engine: Engine, name: str, time: int | None = None) -> pa.Table:
    """Trace `name` as of `time` (default: the last epoch), consolidated, as a pyarrow table
    (``c0 .. c{k-1}, diff``), with no JVM."""
    import pyarrow as pa
    import pyarrow.compute as pc

    m = engine.store.current()
    trace = _trace(engine, name)
    if time is not None and m.frontier is not None and time < m.frontier:
        raise StateError(
            f"history before epoch {m.frontier} was compacted in {engine.store.root}; "
            f"cannot read {name!r} as of epoch {time}"
        )
    tables = _batch_tables(engine, trace, list(trace.visible(time)))
    if not tables:
        return _empty(trace.columns)
    if len(tables) == 1:
        table = tables[0]
    else:
        keys = list(trace.columns)
        summed = pa.concat_tables(tables).group_by(keys).aggregate([("diff", "sum")])
        table = summed.rename_columns([*keys, "diff"]).select([*keys, "diff"])
    return table.filter(pc.not_equal(table.column("diff"), 0))  # pyright: ignore[reportAttributeAccessIssue]


def change_table(engine: Engine, name: str, epoch: int) -> pa.Table:
    """Trace `name`'s stored change at `epoch` (``c0 .. c{k-1}, diff``) as a pyarrow table,
    with no JVM."""
    import pyarrow as pa

    trace = _trace(engine, name)
    tables = _batch_tables(engine, trace, [b for b in trace.batches if b.time == epoch])
    return pa.concat_tables(tables) if tables else _empty(trace.columns)
