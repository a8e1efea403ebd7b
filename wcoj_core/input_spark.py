"""Reading relations and update streams from files into Spark: the one reader, in Spark's tasks.

Contract: a relation is a DataFrame with data columns ``c0 .. c{k-1}`` and a ``diff`` column, all
``LongType`` and non-null, where ``diff`` is a non-zero signed multiplicity. A file is a multiset:
two equal lines give two rows, and consolidating them is the engine's job, not the reader's.
An update stream has the same shape with a ``time`` column between the data and ``diff``.

The formats, and what makes a file bad, are those of `wcoj_core.input_read`, and so is the
parsing: Spark lists the files under a path (``binaryFile``: any file system Spark reaches) and
each task parses the files it is handed with `wcoj_core.input_read.read_file_bytes`, the reader
that reads a local file without Spark (`read_local`). The two readers cannot disagree: they are
one. A path may also be ``rmat:key=value,...``: not a file but a generated graph (see
`wcoj_core.generate`). A local path that is not a regular file (a named pipe, a device; a folder
other than Parquet's) is refused before Spark opens it (`check_input_file`), so that no read
hangs. A file is handed to a task whole (at most 2 GiB, Spark's limit for a binary value).

Validation is one Spark action: the rows counted, and the first bad file's `InputError` (its
file, 1-based line — for Parquet the row — and column, as the local reader names them) raised
on the driver. Spark and Py4J exceptions are turned into `InputError` as well.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import partial

import pyarrow as pa
from py4j.protocol import Py4JError
from pyspark.errors import PySparkException
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from wcoj_core import generate
from wcoj_core.errors import InputError, listed
from wcoj_core.input_read import (
    Format,
    _parquet_files,
    _parquet_schema,
    canonical_undirected_local,
    check_arity,
    check_input_file,
    detect_format,
    local_path,
    negative_rows,
    read_file_bytes,
    read_local,
    source_name,
)
from wcoj_core.traces import DIFF, relation_columns

_ERROR = "_error"  # the column a Spark task reports a bad file in (`_parse_files`)


def read_relation(spark: SparkSession, path: str, arity: int, name: str) -> DataFrame:
    """Read relation `name` of the given arity from `path` as ``c0 .. c{arity-1}, diff``.

    `path` may also be a generator spec such as ``rmat:scale=12,edges=20000,seed=1`` (binary
    relations only). Raises `InputError` for anything that is not a well-formed relation.
    """
    if generate.is_generator_spec(path):
        if arity != 2:
            raise InputError(
                f"a generated graph is binary, but relation {name} has arity {arity}", path
            )
        return generate.generate(spark, path)
    source = source_name(path, name)
    check_arity(arity, source)
    check_input_file(path, name)
    return _read_files(spark, path, arity, name, with_time=False)


def read_updates(spark: SparkSession, path: str, arity: int, name: str) -> DataFrame:
    """Read update triples ``c0 .. c{arity-1}, time, diff`` for relation `name` from `path`.

    Only CSV and Parquet can carry updates, and the file must have both a ``time`` and a ``diff``
    column besides its `arity` data columns.
    """
    source = source_name(path, name)
    if generate.is_generator_spec(path):
        raise InputError("a generator spec gives a relation, not a stream of updates", source)
    check_arity(arity, source)
    check_input_file(path, name)
    if detect_format(path) is Format.TEXT:
        raise InputError(
            "update files must be CSV or Parquet with 'time' and 'diff' columns; "
            "a plain-text edge list cannot carry them",
            source,
        )
    return _read_files(spark, path, arity, name, with_time=True)


def canonical_undirected(df: DataFrame) -> DataFrame:
    """Input normalization: the set of undirected edges of a binary relation, each with diff 1.

    Self-loops are dropped and each edge becomes ``(least, greatest)``. An edge is kept when its
    summed multiplicity over both directions is positive, so for an ordinary file (every diff
    positive) the result is exactly the distinct set of undirected edges. The rows are shuffled
    by edge and each task applies `wcoj_core.input_read.canonical_undirected_local`: the one
    implementation, on the driver or in Spark's tasks.
    """
    if relation_columns(2) != [c for c in df.columns if c != DIFF]:
        raise InputError(
            f"needs a binary relation (c0, c1, diff), got columns {listed(df.columns)}",
            "canonical_undirected",
        )
    c0, c1 = F.col("c0"), F.col("c1")
    diff = F.col(DIFF) if DIFF in df.columns else F.lit(1)
    edges = df.select(c0.cast("long"), c1.cast("long"), diff.cast("long").alias(DIFF))
    by_edge = edges.repartition(F.least(c0, c1), F.greatest(c0, c1))
    return by_edge.mapInArrow(
        partial(_per_task, _canonical, ["c0", "c1", DIFF]), _longs(["c0", "c1", DIFF])
    )


def negative_tuples(
    df: DataFrame, limit: int = 20
) -> tuple[int, list[tuple[tuple[int, ...], int]]]:
    """The tuples of relation `df` (``c0 .. c{k-1}, diff``) whose summed multiplicity is negative.

    Such a tuple is a deletion of something absent. A file may carry one (a diff is a signed
    multiplicity), so it is not an `InputError`; callers report these tuples instead. Returns
    ``(how many, the first `limit` of them in tuple order with their multiplicities)``: the rows
    shuffled by tuple, each task applying `wcoj_core.input_read.negative_rows`.
    """
    cols = [c for c in df.columns if c not in ("time", DIFF)]
    by_tuple = df.select(*[F.col(c).cast("long") for c in cols], F.col(DIFF).cast("long"))
    negative = by_tuple.repartition(*cols).mapInArrow(
        partial(_per_task, negative_rows, [*cols, DIFF]), _longs([*cols, DIFF])
    )
    rows = negative.orderBy(*cols).limit(limit + 1).collect()
    count = len(rows) if len(rows) <= limit else negative.count()
    return count, [(tuple(r[c] for c in cols), r[DIFF]) for r in rows[:limit]]


def _per_task(
    op: Callable[[pa.Table], pa.Table], names: list[str], batches: Iterator[pa.RecordBatch]
) -> Iterator[pa.RecordBatch]:
    """In a Spark task: `op` applied to the task's rows (all of one key's rows are in it)."""
    parts = list(batches)
    if parts:
        yield from op(pa.Table.from_batches(parts)).select(names).to_batches()


def _canonical(table: pa.Table) -> pa.Table:
    return canonical_undirected_local(table)[0]


def _longs(names: list[str]) -> T.StructType:
    return T.StructType([T.StructField(n, T.LongType()) for n in names])


# --- the one reader, in Spark's tasks -----------------------------------------------------------


def _read_files(
    spark: SparkSession, path: str, arity: int, name: str, *, with_time: bool
) -> DataFrame:
    """The rows of every file under `path`, each file parsed inside a Spark task by the reader
    the driver uses (`wcoj_core.input_read.read_file_bytes`), then checked in one Spark action:
    a bad file's first `InputError`, or no data rows at all, is raised here."""
    source = source_name(path, name)
    kind = detect_format(path)
    what = {Format.TEXT: "text", Format.CSV: "CSV", Format.PARQUET: "Parquet"}[kind]
    local = local_path(path)
    folder = local is not None and os.path.isdir(local)
    if folder and kind is Format.PARQUET:
        assert local is not None
        _parquet_schema(local, _parquet_files(local, source), source)  # footers: one relation
    names = [*relation_columns(arity), *(["time"] if with_time else []), DIFF]
    schema = T.StructType(
        [*(T.StructField(n, T.LongType()) for n in names), T.StructField(_ERROR, T.StringType())]
    )
    parse = partial(
        _parse_files,
        arity=arity,
        source=source,
        folder=local if folder else None,
        with_time=with_time,
    )
    with _spark_errors(source, what):
        files = spark.read.format("binaryFile").load(path).select("path", "content")
        rows = files.mapInArrow(parse, schema)
        summary = rows.agg(
            F.count(F.when(F.col(_ERROR).isNull(), 1)).alias("n"),
            F.min(_ERROR).alias("error"),
        ).first()
    assert summary is not None
    if summary["error"] is not None:
        message, where, line, column = json.loads(summary["error"])[1:]
        raise InputError(message, where, line, column)
    if summary["n"] == 0:
        if local is not None:  # Spark lists no empty file: the reader says what it holds
            read_local(path, arity, name, with_time=with_time)
        raise InputError("has no data rows", source)
    return rows.where(F.col(_ERROR).isNull()).select(*[_non_null(F.col(n)).alias(n) for n in names])


def _parse_files(
    batches: Iterator[pa.RecordBatch],
    *,
    arity: int,
    source: str,
    folder: str | None,
    with_time: bool,
) -> Iterator[pa.RecordBatch]:
    """In a Spark task: each file of `batches` (``path``, ``content``) parsed; a bad file gives
    one row holding its `InputError` (the file's path first, so that the first file's error
    wins), as JSON."""
    names = [*relation_columns(arity), *(["time"] if with_time else []), DIFF]
    for batch in batches:
        for uri, content in zip(batch.column("path"), batch.column("content"), strict=True):
            file = str(uri.as_py())
            where = source
            if folder is not None:  # named as the local reader names a file of the folder
                inside = os.path.relpath(local_path(file) or file, os.path.abspath(folder))
                where = f"{source} [{os.path.join(folder, inside)}]"
            try:
                for rows in read_file_bytes(
                    content.as_buffer(), file, arity, where, with_time=with_time
                ):
                    yield rows.append_column(_ERROR, pa.nulls(rows.num_rows, pa.string()))
            except InputError as error:
                message = str(error).removeprefix(_where(error)).removeprefix(": ")
                text = json.dumps([file, message, error.source, error.line, error.column])
                columns = [pa.nulls(1, pa.int64()) for _ in names]
                yield pa.RecordBatch.from_arrays([*columns, pa.array([text])], [*names, _ERROR])


def _where(error: InputError) -> str:
    where = error.source
    if error.line is not None:
        where += f", line {error.line}"
    if error.column is not None:
        where += f", column {error.column}"
    return where


def _non_null(value: Column) -> Column:
    # Every row was checked; the coalesce only records that in the schema.
    return F.coalesce(value.cast("long"), F.lit(0).cast("long"))


@contextmanager
def _spark_errors(source: str, what: str) -> Iterator[None]:
    """Turn Spark and Py4J failures into an InputError naming the file."""
    try:
        yield
    except (PySparkException, Py4JError) as exc:
        condition = getattr(exc, "getCondition", lambda: None)()
        if condition == "PATH_NOT_FOUND":
            raise InputError("no such file", source) from exc
        raise InputError(f"cannot be read as {what}: {_describe(exc)}", source) from exc


def _describe(exc: Exception) -> str:
    """One line on why Spark failed: the root Java cause when there is one."""
    java = getattr(exc, "java_exception", None)
    text = ""
    if java is not None:
        try:
            while java.getCause() is not None:
                java = java.getCause()
            text = str(java.toString())
        except Py4JError:
            text = ""
    lines = (text or str(exc)).strip().splitlines() or [type(exc).__name__]
    return lines[0][:300]
