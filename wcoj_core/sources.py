"""Reading relations and update streams from files into Spark.

Contract: a relation is a DataFrame with data columns ``c0 .. c{k-1}`` and a ``diff`` column, all
``LongType`` and non-null, where ``diff`` is a non-zero signed multiplicity. A file is a multiset:
two equal lines give two rows, and consolidating them is the engine's job, not the reader's.
An update stream has the same shape with a ``time`` column between the data and ``diff``.

The formats, and what makes a file bad, are those of `wcoj_core.local_read`, which reads a local
file the same way without Spark (`read_local`); this module reads any path Spark can reach:

* ``.parquet`` or a directory: Parquet. Integer columns only (int8 .. int64).
* ``.csv`` or ``.csv.gz``: CSV with a header row. Header names are free; columns are taken in file
  order, apart from the ones named ``diff`` (and ``time`` for updates).
* anything else (``.txt``, ``.txt.gz``, ``.tsv``, ``.el``, no extension, ...): whitespace-separated
  text in the SNAP edge-list style. Lines whose first non-blank character is ``#`` and blank lines
  are skipped; fields are separated by runs of spaces or tabs; CRLF endings are fine; every data
  line carries exactly ``arity`` integers, each with multiplicity 1.
* ``rmat:key=value,...``: not a file but a generated graph (see `wcoj_core.generate`).

Gzip works for every file format (Spark reads ``.gz`` natively). A local path that is not a
regular file (a named pipe, a device; a folder other than Parquet's) is refused before Spark
opens it (`check_input_file`), so that no read hangs.

Validation runs in Spark: one aggregate over the parsed rows tells whether any row is bad and
whether there is any data at all. Only when something is wrong is a local file read again by
`read_local`, whose `InputError` names the file, the 1-based line (for Parquet: the 1-based row)
and the column: for text the 1-based character column where the offending field starts, for CSV
the 1-based column index, for Parquet the column name. Spark and Py4J exceptions raised while
reading a bad file are turned into `InputError` as well.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

from py4j.protocol import Py4JError
from pyspark.errors import PySparkException
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from wcoj_core import generate
from wcoj_core.errors import InputError, listed
from wcoj_core.local_read import (
    Format,
    Role,
    assign_roles,
    check_arity,
    check_input_file,
    check_locally,
    csv_header,
    detect_format,
    local_path,
    read_local,
    source_name,
)
from wcoj_core.updates import DIFF, consolidate, relation_columns

INT_PATTERN = "^[+-]?[0-9]+$"
_EDGE_BLANKS = r"^[ \t\r]+|[ \t\r]+$"
_INTEGER_TYPES = (T.ByteType, T.ShortType, T.IntegerType, T.LongType)

__all__ = [  # the readers' names callers have always imported from here
    "Format",
    "canonical_undirected",
    "check_locally",
    "detect_format",
    "negative_tuples",
    "read_relation",
    "read_updates",
]


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
    match detect_format(path):
        case Format.TEXT:
            return _read_text(spark, path, arity, name)
        case Format.CSV:
            return _read_csv(spark, path, arity, name, with_time=False)
        case Format.PARQUET:
            return _read_parquet(spark, path, arity, name, with_time=False)


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
    match detect_format(path):
        case Format.TEXT:
            raise InputError(
                "update files must be CSV or Parquet with 'time' and 'diff' columns; "
                "a plain-text edge list cannot carry them",
                source,
            )
        case Format.CSV:
            return _read_csv(spark, path, arity, name, with_time=True)
        case Format.PARQUET:
            return _read_parquet(spark, path, arity, name, with_time=True)


def canonical_undirected(df: DataFrame) -> DataFrame:
    """Input normalization: the set of undirected edges of a binary relation, each with diff 1.

    Self-loops are dropped and each edge becomes ``(least, greatest)``. An edge is kept when its
    summed multiplicity over both directions is positive, so for an ordinary file (every diff
    positive) the result is exactly the distinct set of undirected edges.
    """
    if relation_columns(2) != [c for c in df.columns if c != DIFF]:
        raise InputError(
            f"needs a binary relation (c0, c1, diff), got columns {listed(df.columns)}",
            "canonical_undirected",
        )
    c0, c1 = F.col("c0"), F.col("c1")
    diff = F.col(DIFF) if DIFF in df.columns else F.lit(1).cast("long")
    edges = df.where(c0 != c1).select(
        F.least(c0, c1).alias("c0"), F.greatest(c0, c1).alias("c1"), diff.alias(DIFF)
    )
    present = edges.groupBy("c0", "c1").agg(F.sum(DIFF).alias("net")).where(F.col("net") > 0)
    return present.select("c0", "c1", F.lit(1).cast("long").alias(DIFF))


def negative_tuples(
    df: DataFrame, limit: int = 20
) -> tuple[int, list[tuple[tuple[int, ...], int]]]:
    """The tuples of relation `df` (``c0 .. c{k-1}, diff``) whose summed multiplicity is negative.

    Such a tuple is a deletion of something absent. A file may carry one (a diff is a signed
    multiplicity), so it is not an `InputError`; callers report these tuples instead. Returns
    ``(how many, the first `limit` of them in tuple order with their multiplicities)``, in one
    Spark job (two when more than `limit` are negative).
    """
    cols = [c for c in df.columns if c not in ("time", DIFF)]
    negative = consolidate(df.select(*cols, DIFF), cols).where(F.col(DIFF) < 0)
    rows = negative.orderBy(*cols).limit(limit + 1).collect()
    count = len(rows) if len(rows) <= limit else negative.count()
    return count, [(tuple(r[c] for c in cols), r[DIFF]) for r in rows[:limit]]


# --- text ---------------------------------------------------------------------------------------


def _read_text(spark: SparkSession, path: str, arity: int, name: str) -> DataFrame:
    source = source_name(path, name)
    with _spark_errors(source, "text"):
        lines = spark.read.text(path)
    stripped = F.regexp_replace(F.col("value"), _EDGE_BLANKS, "")
    fields = F.split(stripped, "[ \t]+")
    values = [F.try_element_at(fields, F.lit(i + 1)) for i in range(arity)]
    parsed = [_try_long(v) for v in values]
    bad = F.size(fields) != arity
    for value, number in zip(values, parsed, strict=True):
        bad = bad | ~value.rlike(INT_PATTERN) | number.isNull()
    rows = lines.where((stripped != "") & ~stripped.startswith("#")).select(
        *[_non_null(p).alias(c) for p, c in zip(parsed, relation_columns(arity), strict=True)],
        bad.alias("_bad"),
    )
    _validate(rows, path, source, "text", lambda: read_local(path, arity, name))
    return rows.select(*relation_columns(arity), F.lit(1).cast("long").alias(DIFF))


# --- CSV ----------------------------------------------------------------------------------------


def _read_csv(
    spark: SparkSession, path: str, arity: int, name: str, *, with_time: bool
) -> DataFrame:
    source = source_name(path, name)
    # The header is parsed here rather than by Spark, which renames duplicate column names.
    with _spark_errors(source, "CSV"):
        first = spark.read.text(path).where(F.col("value") != "").first()
    if first is None:
        raise InputError("has no data rows (the file is empty)", source)
    header, roles = csv_header(first["value"], arity, source, with_time)
    # One column more than the header catches rows with too many fields.
    names = [f"_f{i}" for i in range(len(header) + 1)]
    schema = T.StructType([T.StructField(n, T.StringType()) for n in names])
    with _spark_errors(source, "CSV"):
        raw = spark.read.option("header", True).schema(schema).csv(path)
    texts = [F.regexp_replace(F.col(n), "^[ \t]+|[ \t]+$", "") for n in names[:-1]]
    parsed = [_try_long(t) for t in texts]
    bad = F.col(names[-1]).isNotNull()
    for text, number, role in zip(texts, parsed, roles, strict=True):
        bad = bad | text.isNull() | ~text.rlike(INT_PATTERN) | number.isNull()
        if role is Role.DIFF:
            bad = bad | (number == 0)
    rows = raw.select(
        *_output_columns(parsed, roles, arity, with_time),
        bad.alias("_bad"),
    )
    _validate(rows, path, source, "CSV", lambda: read_local(path, arity, name, with_time=with_time))
    return rows.drop("_bad")


# --- Parquet ------------------------------------------------------------------------------------


def _read_parquet(
    spark: SparkSession, path: str, arity: int, name: str, *, with_time: bool
) -> DataFrame:
    source = source_name(path, name)
    with _spark_errors(source, "Parquet"):
        raw = spark.read.parquet(path)
        fields = raw.schema.fields
    for field in fields:
        if not isinstance(field.dataType, _INTEGER_TYPES):
            raise InputError(
                f"column {field.name!r} has type {field.dataType.simpleString()}; "
                "relation columns must be integers (int8 .. int64)",
                source,
                column=field.name,
            )
    header = [f.name for f in fields]
    roles = assign_roles(header, arity, source, with_time, line=None)
    positional = raw.toDF(*[f"_f{i}" for i in range(len(header))])
    columns = [F.col(c).cast("long") for c in positional.columns]
    bad = F.lit(False)
    for column, role in zip(columns, roles, strict=True):
        bad = bad | column.isNull()
        if role is Role.DIFF:
            bad = bad | (column == 0)
    rows = positional.select(
        *_output_columns(columns, roles, arity, with_time),
        bad.alias("_bad"),
    )
    _validate(
        rows, path, source, "Parquet", lambda: read_local(path, arity, name, with_time=with_time)
    )
    return rows.drop("_bad")


# --- shared -------------------------------------------------------------------------------------


def _output_columns(
    values: list[Column], roles: list[Role], arity: int, with_time: bool
) -> list[Column]:
    data = [v for v, r in zip(values, roles, strict=True) if r is Role.DATA]
    out = [_non_null(v).alias(c) for v, c in zip(data, relation_columns(arity), strict=True)]
    if with_time:
        out.append(_non_null(values[roles.index(Role.TIME)]).alias("time"))
    diff = values[roles.index(Role.DIFF)] if Role.DIFF in roles else F.lit(1).cast("long")
    out.append(_non_null(diff).alias(DIFF))
    return out


def _validate(
    rows: DataFrame, path: str, source: str, what: str, reread: Callable[[], object]
) -> None:
    """One Spark action: is there a bad row, and is there any row at all?

    When there is a bad row, a local file is read again without Spark (`reread`, which raises
    the first bad row's `InputError`) to say where it is.
    """
    with _spark_errors(source, what):
        summary = rows.agg(F.count(F.lit(1)).alias("n"), F.bool_or("_bad").alias("bad")).first()
    assert summary is not None
    if summary["bad"]:
        if local_path(path) is not None:
            reread()
        raise InputError("has a malformed row (its position could not be located)", source)
    if summary["n"] == 0:
        raise InputError("has no data rows", source)


def _try_long(text: Column) -> Column:
    return text.try_cast("bigint")


def _non_null(value: Column) -> Column:
    # Validation has already rejected nulls; the coalesce only records that in the schema.
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
