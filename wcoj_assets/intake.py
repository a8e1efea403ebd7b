"""The landing location: where each epoch's changes arrive, and how they are found and read.

Layout: ``<landing>/<relation>/<epoch key>/`` holds one or more files — ``*.parquet`` (a file or
a Spark output directory), ``*.csv`` / ``*.csv.gz`` with a header, ``*.txt`` / ``*.txt.gz`` SNAP
edge lists. Names starting with ``_`` or ``.`` are ignored (``_SUCCESS``, ``.crc``, files still
being written under a hidden name); anything else is listed as *ignored* so that a misnamed file
is visible rather than silently dropped. Each file is read with `wcoj_core.sources.read_relation`
(data columns in file order, then an optional ``diff``) and the files are unioned: the update
triples of the epoch.

A folder whose name is not a well-formed epoch key is never read: `epoch_folders` reports it
separately, and `landed_files` refuses a malformed key before building any path from it.
Listing goes through `upath.UPath`, so local paths and any fsspec URL work without Spark (the
sensor runs in a process that has no JVM). Which folders are epochs depends on the code location's
first day (`wcoj_assets.epochs.Epochs`); `landed_files` only requires a well-formed date.

An **undirected** binary relation lands as a plain edge list: each change ``(a, b, diff)`` once,
in either direction. Read with ``undirected=True``, both readers return its changes symmetric
and loop-free, as ``wcoj apply --undirected`` reads them: every change also as ``(b, a, diff)``,
and every self-loop ``(a, a, diff)`` dropped and counted (`Read.loops`), so the caller can warn.
An edge landed in both directions is thus counted twice.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Generic, TypeVar

from upath import UPath

from wcoj_assets.epochs import DEFAULT_EPOCHS, Epochs, date_of_key

T = TypeVar("T")

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import DataFrame, SparkSession

SUFFIXES = (".parquet", ".csv", ".csv.gz", ".txt", ".txt.gz")


@dataclass(frozen=True, slots=True)
class LandedFile:
    """One file (or Parquet directory) of an epoch's changes."""

    path: str
    name: str
    size: int
    mtime: float


@dataclass(frozen=True, slots=True)
class Landing:
    """What an epoch folder of one relation holds: files to read and names ignored."""

    files: tuple[LandedFile, ...]
    ignored: tuple[str, ...]


def _hidden(name: str) -> bool:
    return name.startswith(("_", "."))


def epoch_folders(
    landing: str, relation: str, epochs: Epochs = DEFAULT_EPOCHS
) -> tuple[list[str], list[str]]:
    """(epoch keys, other folder names) under ``<landing>/<relation>/``, each sorted.

    A folder named by a date before the first epoch is not an epoch: it is among the others.
    """
    root = UPath(landing) / relation
    if not root.is_dir():
        return [], []
    good: list[str] = []
    bad: list[str] = []
    for entry in root.iterdir():
        if _hidden(entry.name) or not entry.is_dir():
            continue
        (good if epochs.is_key(entry.name) else bad).append(entry.name)
    return sorted(good, key=epochs.number), sorted(bad)


def _stat(path: UPath) -> tuple[int, float]:
    if path.is_dir():
        sizes = [_stat(p) for p in path.iterdir() if not _hidden(p.name)]
        return sum(s for s, _ in sizes), max((m for _, m in sizes), default=0.0)
    st = path.stat()
    return int(st.st_size), float(st.st_mtime)


def landed_files(landing: str, relation: str, key: str) -> Landing:
    """The files of one relation at one epoch (none when the folder does not exist)."""
    date_of_key(key)  # refuse anything that is not a date before touching a path
    folder = UPath(landing) / relation / key
    if not folder.is_dir():
        return Landing((), ())
    files: list[LandedFile] = []
    ignored: list[str] = []
    for entry in sorted(folder.iterdir(), key=lambda p: p.name):
        if _hidden(entry.name):
            continue
        if not entry.name.lower().endswith(SUFFIXES):
            ignored.append(entry.name)
            continue
        size, mtime = _stat(entry)
        files.append(LandedFile(str(entry), entry.name, size, mtime))
    return Landing(tuple(files), tuple(ignored))


def fingerprint(files: Sequence[LandedFile]) -> str:
    """A short digest of names, sizes and modification times: changes when a file is replaced.

    >>> fingerprint([LandedFile("/l/e/2020-01-01/a.csv", "a.csv", 10, 1.5)])
    '02fe0694270e'
    """
    text = "\n".join(
        f"{f.path}\t{f.size}\t{f.mtime:.6f}" for f in sorted(files, key=lambda f: f.path)
    )
    return hashlib.sha256(text.encode()).hexdigest()[:12]


@dataclass(frozen=True, slots=True)
class Read(Generic[T]):
    """What a reader read (None: nothing to read, or not this way) and the self-loops it
    dropped from an undirected relation."""

    rows: T | None
    loops: int = 0


def read_changes(
    spark: SparkSession,
    files: Sequence[LandedFile],
    arity: int,
    relation: str,
    *,
    undirected: bool = False,
) -> Read[DataFrame]:
    """The union of the files' update rows (c0.., diff); no rows when there are no files.

    Raises `wcoj_core.errors.InputError` for a file that is not a well-formed relation. An
    `undirected` relation's rows come back symmetric and loop-free; counting its self-loops
    costs one Spark job (the files are valid by then: `read_relation` checked them).
    """
    from pyspark.sql import functions as F

    from wcoj_core import linear
    from wcoj_core.sources import read_relation

    frames = [read_relation(spark, f.path, arity, relation) for f in files]
    if not frames:
        return Read(None)
    total = frames[0]
    for frame in frames[1:]:
        total = total.unionByName(frame)
    if not undirected:
        return Read(total)
    loops = total.where(F.col("c0") == F.col("c1")).count()
    return Read(linear.symmetrize().apply(total), loops)


def read_changes_locally(
    files: Sequence[LandedFile],
    arity: int,
    relation: str,
    max_rows: int,
    *,
    undirected: bool = False,
) -> Read[pa.Table]:
    """The files' update rows (c0.., diff) read by pyarrow, when every file can be so read.

    That is: every file is a local Parquet file (or folder) that
    `wcoj_core.sources.read_relation_locally` takes, and they hold at most `max_rows` rows
    together (an undirected relation's, once made symmetric). Else no rows, and `read_changes`
    reads them with Spark (and reports their errors).
    """
    import pyarrow as pa

    from wcoj_core.sources import read_relation_locally

    if undirected:
        max_rows //= 2  # each change comes back in both directions
    tables: list[pa.Table] = []
    for f in files:
        table = read_relation_locally(f.path, arity, relation, max_rows)
        if table is None:
            return Read(None)
        max_rows -= table.num_rows
        tables.append(table)
    if not tables:
        return Read(None)
    total = pa.concat_tables(tables)
    if not undirected:
        return Read(total)
    symmetric, loops = symmetric_table(total)
    return Read(symmetric, loops)


def symmetric_table(table: pa.Table) -> tuple[pa.Table, int]:
    """A binary relation's rows (c0, c1, diff) in both directions, self-loops dropped; and how
    many self-loops there were. The same rows as `wcoj_core.linear.symmetrize` gives on Spark.

    >>> import pyarrow as pa
    >>> rows, loops = symmetric_table(pa.table({"c0": [1, 3], "c1": [2, 3], "diff": [1, -1]}))
    >>> rows.to_pylist(), loops
    ([{'c0': 1, 'c1': 2, 'diff': 1}, {'c0': 2, 'c1': 1, 'diff': 1}], 1)
    """
    import pyarrow as pa
    import pyarrow.compute as pc

    kept = table.filter(pc.not_equal(table["c0"], table["c1"]))
    back = pa.table([kept["c1"], kept["c0"], kept["diff"]], names=["c0", "c1", "diff"])
    return pa.concat_tables([kept, back]), table.num_rows - kept.num_rows
