"""Reading relations and update streams from files into Spark.

Contract: a relation is a DataFrame with data columns ``c0 .. c{k-1}`` and a ``diff`` column, all
``LongType`` and non-null, where ``diff`` is a non-zero signed multiplicity. A file is a multiset:
two equal lines give two rows, and consolidating them is the engine's job, not the reader's.
An update stream has the same shape with a ``time`` column between the data and ``diff``.

The format follows the path:

* ``.parquet`` or a directory: Parquet. Integer columns only (int8 .. int64).
* ``.csv`` or ``.csv.gz``: CSV with a header row. Header names are free; columns are taken in file
  order, apart from the ones named ``diff`` (and ``time`` for updates).
* anything else (``.txt``, ``.txt.gz``, ``.tsv``, ``.el``, no extension, ...): whitespace-separated
  text in the SNAP edge-list style. Lines whose first non-blank character is ``#`` and blank lines
  are skipped; fields are separated by runs of spaces or tabs; CRLF endings are fine; every data
  line carries exactly ``arity`` integers, each with multiplicity 1.
* ``rmat:key=value,...``: not a file but a generated graph (see `wcoj_core.generate`).

Gzip works for every file format (Spark reads ``.gz`` natively).

Validation runs in Spark: one aggregate over the parsed rows tells whether any row is bad and
whether there is any data at all. Only when something is wrong does a pure-Python rescan of the
local file find the first bad spot, so the `InputError` can name the file, the 1-based line (for
Parquet: the 1-based row) and the column: for text the 1-based character column where the
offending field starts, for CSV the 1-based column index, for Parquet the column name. Spark and
Py4J exceptions raised while reading a bad file are turned into `InputError` as well.

`check_locally` runs the same checks on a local file without Spark, as far as they are cheap (a
small file whole, the head of a large one, a Parquet file's footer), so that a command can refuse
bad input before it starts a JVM. It raises exactly the `InputError` the Spark read would raise
for what it finds, and leaves anything it cannot judge the same way (a damaged file, a column
type Spark names differently, malformed CSV quoting) to the Spark read.
"""

from __future__ import annotations

import csv
import gzip
import io
import os
import re
import zlib
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from enum import Enum
from typing import IO
from urllib.parse import urlparse

import numpy as np
import pyarrow as pa
from py4j.protocol import Py4JError
from pyspark.errors import PySparkException
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from wcoj_core import generate
from wcoj_core.errors import InputError
from wcoj_core.updates import DIFF, TIME, consolidate, relation_columns

INT_PATTERN = "^[+-]?[0-9]+$"
# `check_locally` reads a file up to this size whole, and only the first lines of a larger one.
LOCAL_CHECK_BYTES = 4 << 20
LOCAL_CHECK_LINES = 10_000
_INT = re.compile(r"[+-]?[0-9]+", re.ASCII)
_EDGE_BLANKS = r"^[ \t\r]+|[ \t\r]+$"
_FIELD = re.compile(r"[^ \t\r]+")
_INTEGER_TYPES = (T.ByteType, T.ShortType, T.IntegerType, T.LongType)
_MIN_LONG, _MAX_LONG = -(2**63), 2**63 - 1


class Format(Enum):
    """How a relation file is encoded."""

    TEXT = "text"
    CSV = "csv"
    PARQUET = "parquet"


class Role(Enum):
    """What a column of a CSV or Parquet file holds."""

    DATA = "data"
    TIME = "time"
    DIFF = "diff"


def detect_format(path: str) -> Format:
    """The format of `path`, from its extension (a local directory is Parquet).

    >>> detect_format("edges.txt.gz"), detect_format("e.CSV.gz"), detect_format("e.parquet")
    (<Format.TEXT: 'text'>, <Format.CSV: 'csv'>, <Format.PARQUET: 'parquet'>)
    """
    lowered = path.lower().rstrip("/")
    if lowered.endswith(".parquet"):
        return Format.PARQUET
    if lowered.endswith((".csv", ".csv.gz")):
        return Format.CSV
    local = _local_path(path)
    if local is not None and os.path.isdir(local):
        return Format.PARQUET
    return Format.TEXT


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
    source = _source(path, name)
    _check_arity(arity, source)
    _check_exists(path, source)
    match detect_format(path):
        case Format.TEXT:
            return _read_text(spark, path, arity, source)
        case Format.CSV:
            return _read_csv(spark, path, arity, source, with_time=False)
        case Format.PARQUET:
            return _read_parquet(spark, path, arity, source, with_time=False)


def read_updates(spark: SparkSession, path: str, arity: int, name: str) -> DataFrame:
    """Read update triples ``c0 .. c{arity-1}, time, diff`` for relation `name` from `path`.

    Only CSV and Parquet can carry updates, and the file must have both a ``time`` and a ``diff``
    column besides its `arity` data columns.
    """
    source = _source(path, name)
    if generate.is_generator_spec(path):
        raise InputError("a generator spec gives a relation, not a stream of updates", source)
    _check_arity(arity, source)
    _check_exists(path, source)
    match detect_format(path):
        case Format.TEXT:
            raise InputError(
                "update files must be CSV or Parquet with 'time' and 'diff' columns; "
                "a plain-text edge list cannot carry them",
                source,
            )
        case Format.CSV:
            return _read_csv(spark, path, arity, source, with_time=True)
        case Format.PARQUET:
            return _read_parquet(spark, path, arity, source, with_time=True)


def canonical_undirected(df: DataFrame) -> DataFrame:
    """Input normalization: the set of undirected edges of a binary relation, each with diff 1.

    Self-loops are dropped and each edge becomes ``(least, greatest)``. An edge is kept when its
    summed multiplicity over both directions is positive, so for an ordinary file (every diff
    positive) the result is exactly the distinct set of undirected edges.
    """
    if relation_columns(2) != [c for c in df.columns if c != DIFF]:
        raise InputError(
            f"needs a binary relation (c0, c1, diff), got columns {df.columns}",
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
    cols = [c for c in df.columns if c not in (TIME, DIFF)]
    negative = consolidate(df.select(*cols, DIFF), cols).where(F.col(DIFF) < 0)
    rows = negative.orderBy(*cols).limit(limit + 1).collect()
    count = len(rows) if len(rows) <= limit else negative.count()
    return count, [(tuple(r[c] for c in cols), r[DIFF]) for r in rows[:limit]]


def check_text_line(line: str, arity: int) -> tuple[str, int] | None:
    """The problem with one line of a text edge list, as ``(message, column)``, or None if fine.

    Comment and blank lines are fine. The column is 1-based and points at the offending field.

    >>> check_text_line("# Nodes: 5", 2) is None, check_text_line("1\\t2\\r", 2) is None
    (True, True)
    >>> check_text_line("  7 x9", 2)
    ("field 2 is not an integer: 'x9'", 5)
    >>> check_text_line("1 2 3", 2)
    ('expected 2 fields, found 3', 5)
    """
    stripped = line.strip(" \t\r")
    if not stripped or stripped.startswith("#"):
        return None
    fields = list(_FIELD.finditer(line))
    if len(fields) > arity:
        return f"expected {arity} fields, found {len(fields)}", fields[arity].start() + 1
    if len(fields) < arity:
        return f"expected {arity} fields, found {len(fields)}", len(line.rstrip(" \t\r")) + 1
    for index, field in enumerate(fields, 1):
        problem = _integer_problem(field.group())
        if problem is not None:
            return f"field {index} {problem}", field.start() + 1
    return None


# --- text ---------------------------------------------------------------------------------------


def _read_text(spark: SparkSession, path: str, arity: int, source: str) -> DataFrame:
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
    _validate(rows, source, "text", lambda: _scan_text(path, arity, source))
    return rows.select(*relation_columns(arity), F.lit(1).cast("long").alias(DIFF))


def _scan_text(path: str, arity: int, source: str) -> InputError | None:
    with _open_local(path, source) as handle:
        for number, line in enumerate(handle, 1):
            problem = check_text_line(line.rstrip("\n"), arity)
            if problem is not None:
                return InputError(problem[0], source, number, problem[1])
    return None


# --- CSV ----------------------------------------------------------------------------------------


def _read_csv(
    spark: SparkSession, path: str, arity: int, source: str, *, with_time: bool
) -> DataFrame:
    # The header is parsed here rather than by Spark, which renames duplicate column names.
    with _spark_errors(source, "CSV"):
        first = spark.read.text(path).where(F.col("value") != "").first()
    if first is None:
        raise InputError("has no data rows (the file is empty)", source)
    header = next(csv.reader([first["value"]]))
    if all(_INT.fullmatch(h.strip()) for h in header):
        raise InputError(
            "the first line looks like data; a CSV file needs a header row naming its columns",
            source,
            1,
            1,
        )
    roles = _assign_roles(header, arity, source, with_time, line=1)
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
    _validate(rows, source, "CSV", lambda: _scan_csv(path, header, roles, source))
    return rows.drop("_bad")


def _scan_csv(
    path: str,
    header: Sequence[str],
    roles: Sequence[Role],
    source: str,
    lines: int | None = None,
    quoting: bool = True,
) -> InputError | None:
    # Like Spark (without its multiLine option), each physical line is one row: a quote never
    # spans lines. Strict parsing refuses the irregular quoting Spark does not read as numbers;
    # without `quoting` the scan stops there instead (Spark drops fields past the header's, so
    # only it knows whether it reads such a row).
    with _open_local(path, source) as handle:
        seen_header = False
        for line, text in enumerate(handle, 1):
            if lines is not None and line > lines:
                break
            text = text.rstrip("\n")
            if not seen_header or _blank(text):
                seen_header = seen_header or bool(text)
                continue
            try:
                row = next(csv.reader([text], strict=True))
            except csv.Error as exc:
                if not quoting:
                    return None
                return InputError(
                    f"has malformed quoting ({exc}); quote a whole field, on one line",
                    source,
                    line,
                    _quoting_column(text),
                )
            # Spark reads one field past the header: a row is too long when that one is not
            # empty (it drops any field after it).
            if len(row) < len(header) or (len(row) > len(header) and row[len(header)] != ""):
                column = len(row) + 1 if len(row) < len(header) else len(header) + 1
                return InputError(
                    f"has {len(row)} fields but the header has {len(header)}", source, line, column
                )
            for index, (text, name, role) in enumerate(
                zip(row[: len(header)], header, roles, strict=True), 1
            ):
                problem = _integer_problem(text.strip(" \t"))
                if problem is None and role is Role.DIFF and int(text) == 0:
                    problem = "is zero; a diff must be a non-zero multiplicity"
                if problem is not None:
                    return InputError(f"value in column {name!r} {problem}", source, line, index)
    return None


def _blank(text: str) -> bool:
    """Whether Spark's CSV parser skips the line `text`: nothing but spaces and control characters.

    >>> _blank(" \\t\\x0c"), _blank("\\xa0"), _blank(",")
    (True, False, False)
    """
    return all(c <= " " for c in text)


def _quoting_column(text: str, limit: int = 4096) -> int | None:
    """The 1-based column where strict CSV parsing of the line `text` fails.

    >>> _quoting_column('1,"2"3'), _quoting_column('1,"2')
    (6, 3)
    """
    if len(text) > limit:
        return None
    for end in range(1, len(text) + 1):
        try:
            next(csv.reader([text[:end]], strict=True))
        except csv.Error as exc:
            if "unexpected end of data" not in str(exc):
                return end
    # Only an unclosed quote is left: point at the quote that opens the last field.
    return text.rfind(',"') + 2 if text.rfind(',"') >= 0 else text.find('"') + 1


# --- Parquet ------------------------------------------------------------------------------------


def _read_parquet(
    spark: SparkSession, path: str, arity: int, source: str, *, with_time: bool
) -> DataFrame:
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
    roles = _assign_roles(header, arity, source, with_time, line=None)
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
    _validate(rows, source, "Parquet", lambda: _scan_parquet(path, header, roles, source))
    return rows.drop("_bad")


def read_relation_locally(path: str, arity: int, name: str, max_rows: int) -> pa.Table | None:
    """Relation `name` from a small local Parquet `path`, read by pyarrow; None if not that.

    The same rows, as ``c0 .. c{arity-1}, diff`` int64 columns, as `read_relation` gives for it,
    without a Spark job, when `path` is a local Parquet file (or folder) of at most `max_rows`
    rows whose files share one schema of signed integer columns, and no value is null and no
    diff zero. Anything else gives None, and the caller reads `path` with `read_relation`: Spark
    then reads it, or raises its `InputError`, as it always does. A header that is not the
    relation's (a ``time`` column, a wrong number of data columns) raises that error here.
    """
    import pyarrow.parquet as pq

    local = _local_path(path)
    if local is None or detect_format(path) is not Format.PARQUET or not os.path.exists(local):
        return None
    files = _parquet_files(local)
    try:
        metas = [pq.ParquetFile(f).metadata for f in files]
        schemas = [m.schema.to_arrow_schema() for m in metas]
    except (OSError, pa.ArrowException):
        return None
    if not files or sum(m.num_rows for m in metas) > max_rows:
        return None
    schema = schemas[0]
    if (
        any(not s.equals(schema) for s in schemas)
        or not all(pa.types.is_signed_integer(t) for t in schema.types)
        or len({n.lower() for n in schema.names}) != len(schema.names)  # Spark: ambiguous
    ):
        return None
    roles = _assign_roles(schema.names, arity, _source(path, name), False, line=None)
    try:
        table = pq.read_table(files, schema=schema)
    except (OSError, pa.ArrowException):
        return None
    if table.num_rows == 0 or any(c.null_count for c in table.columns):
        return None
    columns = [
        c.cast(pa.int64())
        for c, role in zip(table.columns, roles, strict=True)
        if role is Role.DATA
    ]
    if Role.DIFF in roles:
        diff = table.column(roles.index(Role.DIFF)).cast(pa.int64())
        if bool((diff.to_numpy() == 0).any()):
            return None
    else:
        diff = pa.chunked_array([pa.array(np.ones(table.num_rows, dtype=np.int64))])
    return pa.table([*columns, diff], names=[*relation_columns(arity), DIFF])


def _scan_parquet(
    path: str, header: Sequence[str], roles: Sequence[Role], source: str
) -> InputError | None:
    import numpy as np
    import pyarrow.parquet as pq

    local = _local_path(path)
    if local is None:
        return None
    for file in _parquet_files(local):
        table = pq.read_table(file)
        masks: dict[str, np.ndarray] = {}
        for name, role in zip(header, roles, strict=True):
            if name in table.column_names:
                column = table.column(name)
                mask = np.asarray(column.is_null().to_numpy(zero_copy_only=False), dtype=bool)
                if role is Role.DIFF:
                    mask |= np.asarray(column.fill_null(1).to_numpy(zero_copy_only=False)) == 0
                masks[name] = mask
        bad_rows = np.flatnonzero(np.logical_or.reduce(list(masks.values()))) if masks else []
        if len(bad_rows) == 0:
            continue
        row = int(bad_rows[0])
        name = next(n for n, m in masks.items() if m[row])
        if table.column(name)[row].as_py() is None:
            problem = "is null"
        else:
            problem = "is zero; a diff must be a non-zero multiplicity"
        where = source if file == local else f"{source} [{file}]"
        return InputError(f"value {problem}", where, row + 1, name)
    return None


def _parquet_files(local: str) -> list[str]:
    if os.path.isfile(local):
        return [local]
    found: list[str] = []
    for root, dirs, files in os.walk(local):
        dirs[:] = sorted(d for d in dirs if not d.startswith(("_", ".")))
        found.extend(os.path.join(root, f) for f in sorted(files) if not f.startswith(("_", ".")))
    return found


# --- without Spark ------------------------------------------------------------------------------


def check_locally(
    path: str,
    arity: int,
    name: str,
    *,
    whole_bytes: int = LOCAL_CHECK_BYTES,
    head_lines: int = LOCAL_CHECK_LINES,
) -> None:
    """Refuse a bad local relation file without Spark: what `read_relation` would refuse first.

    A missing or unreadable file is refused. A text edge list or CSV file of at most
    `whole_bytes` bytes is checked whole (every line, and that it has data rows), a larger one
    up to line `head_lines`; a CSV file's header always. For Parquet the footers give the columns
    and the row count, and a small file's values are checked for nulls and zero diffs. Generator
    specs and remote paths are left alone, and so is anything this cannot judge exactly as Spark
    would: a file that does not decompress or whose footer does not read, a Parquet column that
    is not a signed integer, a CSV line with malformed quoting (the check stops there). Raises
    the `InputError` the Spark read raises for the same problem.

    >>> import pathlib, tempfile
    >>> bad = pathlib.Path(tempfile.mkdtemp()) / "e.txt"
    >>> _ = bad.write_text("1 2\\n3 x\\n")
    >>> try:
    ...     check_locally(str(bad), 2, "edge")
    ... except InputError as error:
    ...     print(error.line, error.column, str(error).split(": ", 1)[1])
    2 3 field 2 is not an integer: 'x'
    """
    local = None if generate.is_generator_spec(path) else _local_path(path)
    if local is None:
        return
    source = _source(path, name)
    _check_arity(arity, source)
    _check_exists(path, source)
    if not os.access(local, os.R_OK):
        raise InputError("cannot be read: permission denied", source)
    kind = detect_format(path)
    whole = _local_bytes(local) <= whole_bytes
    try:
        if kind is Format.PARQUET:
            _check_parquet_locally(path, local, arity, source, whole)
            return
        if whole and local.lower().endswith(".gz"):
            _read_through(local)  # a damaged archive is Spark's to report
        if kind is Format.TEXT:
            _check_text_locally(path, arity, source, None if whole else head_lines)
        else:
            _check_csv_locally(path, arity, source, None if whole else head_lines)
    except (OSError, EOFError, zlib.error):
        return


def _check_text_locally(path: str, arity: int, source: str, lines: int | None) -> None:
    data = False
    with _open_local(path, source) as handle:
        for number, line in enumerate(handle, 1):
            if lines is not None and number > lines:
                return
            text = line.rstrip("\n")
            problem = check_text_line(text, arity)
            if problem is not None:
                raise InputError(problem[0], source, number, problem[1])
            stripped = text.strip(" \t\r")
            data = data or (bool(stripped) and not stripped.startswith("#"))
    if not data:
        raise InputError("has no data rows", source)


def _check_csv_locally(path: str, arity: int, source: str, lines: int | None) -> None:
    with _open_local(path, source) as handle:
        first = next((t.rstrip("\n") for t in handle if t.rstrip("\n")), None)
        rows = first is not None and any(not _blank(t.rstrip("\n")) for t in handle)
    if first is None:
        raise InputError("has no data rows (the file is empty)", source)
    header = next(csv.reader([first]))
    if all(_INT.fullmatch(h.strip()) for h in header):
        raise InputError(
            "the first line looks like data; a CSV file needs a header row naming its columns",
            source,
            1,
            1,
        )
    roles = _assign_roles(header, arity, source, False, line=1)
    problem = _scan_csv(path, header, roles, source, lines, quoting=False)
    if problem is not None:
        raise problem
    if lines is None and not rows:
        raise InputError("has no data rows", source)


def _check_parquet_locally(path: str, local: str, arity: int, source: str, whole: bool) -> None:
    import pyarrow.parquet as pq

    files = _parquet_files(local)
    try:
        metas = [pq.ParquetFile(f).metadata for f in files]
        schemas = [m.schema.to_arrow_schema() for m in metas]
    except (OSError, pa.ArrowException):
        return
    if not files or any(not s.equals(schemas[0]) for s in schemas):
        return
    names = schemas[0].names
    if not all(pa.types.is_signed_integer(t) for t in schemas[0].types) or len(
        {n.lower() for n in names}
    ) != len(names):
        return
    roles = _assign_roles(names, arity, source, False, line=None)
    if sum(m.num_rows for m in metas) == 0:
        raise InputError("has no data rows", source)
    if whole:
        try:
            problem = _scan_parquet(path, names, roles, source)
        except (OSError, pa.ArrowException):
            return
        if problem is not None:
            raise problem


def _local_bytes(local: str) -> int:
    """The size of a local file, or of every file under a local folder."""
    if os.path.isfile(local):
        return os.path.getsize(local)
    return sum(os.path.getsize(f) for f in _parquet_files(local))


def _read_through(local: str) -> None:
    """Decompress a whole gzip file, raising what a damaged one raises."""
    with gzip.open(local, "rb") as handle:
        while handle.read(1 << 20):
            pass


# --- shared -------------------------------------------------------------------------------------


def _assign_roles(
    header: Sequence[str], arity: int, source: str, with_time: bool, line: int | None
) -> list[Role]:
    """Give each file column a role, checking the counts and the required columns."""
    roles: list[Role] = []
    for index, name in enumerate(header, 1):
        key = name.strip().lower()
        column: int | str = index if line is not None else name
        if key == TIME and not with_time:
            raise InputError(
                "a relation file must not carry a 'time' column: times come from the epoch "
                "(use an update file to give explicit times)",
                source,
                line,
                column,
            )
        role = Role.TIME if key == TIME else Role.DIFF if key == DIFF else Role.DATA
        if role is not Role.DATA and role in roles:
            raise InputError(f"has more than one {key!r} column", source, line, column)
        roles.append(role)
    data = [name for name, role in zip(header, roles, strict=True) if role is Role.DATA]
    if len(data) != arity:
        raise InputError(
            f"has {len(data)} data columns {data}, expected {arity} (plus an optional 'diff')",
            source,
            line,
        )
    for required in (Role.TIME, Role.DIFF) if with_time else ():
        if required not in roles:
            raise InputError(
                f"an update file needs a {required.value!r} column; found columns {list(header)}",
                source,
                line,
            )
    return roles


def _output_columns(
    values: Sequence[Column], roles: Sequence[Role], arity: int, with_time: bool
) -> list[Column]:
    data = [v for v, r in zip(values, roles, strict=True) if r is Role.DATA]
    out = [_non_null(v).alias(c) for v, c in zip(data, relation_columns(arity), strict=True)]
    if with_time:
        out.append(_non_null(values[roles.index(Role.TIME)]).alias(TIME))
    diff = values[roles.index(Role.DIFF)] if Role.DIFF in roles else F.lit(1).cast("long")
    out.append(_non_null(diff).alias(DIFF))
    return out


def _validate(
    rows: DataFrame, source: str, what: str, rescan: Callable[[], InputError | None]
) -> None:
    """One Spark action: is there a bad row, and is there any row at all?"""
    with _spark_errors(source, what):
        summary = rows.agg(F.count(F.lit(1)).alias("n"), F.bool_or("_bad").alias("bad")).first()
    assert summary is not None
    if summary["bad"]:
        error = rescan()
        raise error or InputError("has a malformed row (its position could not be located)", source)
    if summary["n"] == 0:
        raise InputError("has no data rows", source)


def _integer_problem(text: str) -> str | None:
    """Why `text` is not a signed 64-bit integer, or None when it is.

    >>> _integer_problem("-12"), _integer_problem("1.5"), _integer_problem("9" * 20)
    (None, "is not an integer: '1.5'", "is out of the signed 64-bit range: '99999999999999999999'")
    """
    if text == "":
        return "is empty"
    if not _INT.fullmatch(text):
        return f"is not an integer: {_show(text)}"
    if not _MIN_LONG <= int(text) <= _MAX_LONG:
        return f"is out of the signed 64-bit range: {_show(text)}"
    return None


def _show(text: str, limit: int = 24) -> str:
    return repr(text if len(text) <= limit else text[:limit] + "...")


def _try_long(text: Column) -> Column:
    return text.try_cast("bigint")


def _non_null(value: Column) -> Column:
    # Validation has already rejected nulls; the coalesce only records that in the schema.
    return F.coalesce(value.cast("long"), F.lit(0).cast("long"))


def _check_arity(arity: int, source: str) -> None:
    if isinstance(arity, bool) or not isinstance(arity, int) or arity < 1:
        raise InputError(f"arity must be a positive integer, got {arity!r}", source)


def _source(path: str, name: str) -> str:
    return f"{path} (relation {name})"


def _local_path(path: str) -> str | None:
    """The local filesystem path behind `path`, or None for a remote URL."""
    parsed = urlparse(path)
    if parsed.scheme == "file":
        return parsed.path
    if parsed.scheme and len(parsed.scheme) > 1:
        return None
    return path


def _check_exists(path: str, source: str) -> None:
    local = _local_path(path)
    if local is not None and not os.path.exists(local):
        raise InputError("no such file", source)


@contextmanager
def _open_local(path: str, source: str) -> Iterator[IO[str]]:
    """Open a local file as text with universal newlines (as Spark splits lines), gzip-aware."""
    local = _local_path(path)
    if local is None:
        raise InputError("has a malformed row (remote files are not rescanned)", source)
    binary = gzip.open(local, "rb") if local.lower().endswith(".gz") else open(local, "rb")  # noqa: SIM115
    with (
        binary,
        io.TextIOWrapper(binary, encoding="utf-8", errors="replace") as t,
    ):
        # Skip a byte order mark, as Spark does. (Not "utf-8-sig": it swallows a file that is
        # only the first byte of one, which Spark reads as a bad line.)
        if t.read(1) != "\ufeff":
            t.seek(0)
        yield t


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
