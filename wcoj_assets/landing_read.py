"""The landing location: where each epoch's changes arrive, and how they are found and read.

Layout: ``<landing>/<relation>/<epoch key>/`` holds one or more files — ``*.parquet`` (a file or
a Spark output directory), ``*.csv`` / ``*.csv.gz`` with a header, ``*.txt`` / ``*.txt.gz`` SNAP
edge lists. Names starting with ``_`` or ``.`` are ignored (``_SUCCESS``, ``.crc``, files still
being written under a hidden name); anything else is listed as *ignored* so that a misnamed file
is visible rather than silently dropped. Each file is read with `wcoj_core.input_spark.read_relation`
(data columns in file order, then an optional ``diff``) and the files are unioned: the update
triples of the epoch.

A folder whose name is not a well-formed epoch key is never read: `epoch_folders` reports it
separately, and `landed_files` refuses a malformed key before building any path from it.
Listing goes through `upath.UPath`, so local paths and any fsspec URL work without Spark (the
sensor runs in a process that has no JVM). Which folders are epochs depends on the code location's
first day (`wcoj_assets.epochs.Epochs`); `landed_files` only requires a well-formed date.

`read_epoch` reads one relation's folder at one epoch as the update rows its files hold
(``c0 .. c{k-1}, diff``, not consolidated): local files with pyarrow (`wcoj_core.input_read`,
the same rows and the same errors as the Spark reader), without starting Spark — into one table
when they are small, else as a stream of record batches (`LandedStream`: checked as the engine
lands them, the files read once), a file of any size within the memory budget; files on remote storage, or
local ones together bigger than `LOCAL_READ_BYTES`, as a Spark DataFrame
(`wcoj_core.input_spark.read_relation`, Spark started through the given starter, which says why).
What the rows mean — a set's presence, an undirected relation's two directions and its dropped
self-loops — is the engine's business (`wcoj_core.meaning`, `wcoj_core.input_land`): an edge landed
in both directions, or twice, is landed once in a set.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from upath import UPath

from wcoj_assets.epochs import DAY_MINUTES, DEFAULT_EPOCHS, Epochs

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import SparkSession

# Accepts the folder of an epoch of any pipeline: a day, or a day and a minute.
_ANY = Epochs("1900-01-01", DAY_MINUTES)
SUFFIXES = (".parquet", ".csv", ".csv.gz", ".txt", ".txt.gz")
# Local landed files bigger than this together are read by Spark rather than by the driver.
LOCAL_READ_BYTES = 4 << 30
# Local landed files that may hold more than this many bytes (decompressed) are streamed a block
# at a time (`LandedStream`) rather than read into one table; deflate's largest expansion.
TABLE_BYTES = 64 << 20
DEFLATE_RATIO = 1032


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


def partition_folders(
    landing: str, relation: str, key: str, epochs: Epochs
) -> tuple[list[int], list[str]]:
    """The epochs of partition `key` that have a folder of `relation` (oldest first), and the
    other names in the day's folder (several epochs a day: each epoch in ``<day>/<HHMM>/``)."""
    root = UPath(landing) / relation / key
    if not root.is_dir():
        return [], []
    if epochs.per_day == 1:
        return [epochs.number(key)], []
    good: list[int] = []
    bad: list[str] = []
    for entry in root.iterdir():
        folder = f"{key}/{entry.name}"
        if _hidden(entry.name):
            continue
        if entry.is_dir() and epochs.is_key(folder):
            good.append(epochs.number(folder))
        else:
            bad.append(entry.name)
    return sorted(good), sorted(bad)


def partition_files(landing: str, relation: str, key: str, epochs: Epochs) -> list[LandedFile]:
    """Every file of `relation` landed for partition `key`: each of its epochs' folders'."""
    found = partition_folders(landing, relation, key, epochs)[0]
    return [f for t in found for f in landed_files(landing, relation, epochs.folder(t)).files]


def landed_files(landing: str, relation: str, key: str) -> Landing:
    """The files of one relation at one epoch, in its folder `key` (``YYYY-MM-DD``, or
    ``YYYY-MM-DD/HHMM``: `Epochs.folder`); none when the folder does not exist."""
    _ANY.number(key)  # refuse anything that is not an epoch's folder before touching a path
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
class LandedStream:
    """Landed local files as a stream of record batches (``c0 ..``, ``diff``), read anew each
    time `batches` (or `checked`) is asked, never held whole: the step checks each batch as the
    engine lands it (`checked`), one pass over the files."""

    paths: tuple[str, ...]
    arity: int
    relation: str

    def batches(self) -> Any:
        import pyarrow as pa

        return pa.RecordBatchReader.from_batches(self._schema(), self._every())

    def _schema(self) -> pa.Schema:
        import pyarrow as pa

        from wcoj_core.traces import DIFF, relation_columns

        names = [*relation_columns(self.arity), DIFF]
        return pa.schema([pa.field(n, pa.int64()) for n in names])

    def _every(self) -> Iterator[pa.RecordBatch]:
        from wcoj_core.input_read import read_local_batches

        names = self._schema().names
        for path in self.paths:
            for batch in read_local_batches(path, self.arity, self.relation):
                yield batch.select(names)

    def checked(
        self, check: Callable[[Any, int], list[str]], bad_rows_limit: int
    ) -> pa.RecordBatchReader:
        """`batches`, each given to ``check(batch, rows before it)`` before it goes on: what the
        engine lands in the same pass as the rows are checked, the files read once. A batch
        with problems, or a file the reader refuses, raises `Refused` (with every bad row of a
        text or CSV file, up to `bad_rows_limit`: `bad_rows`) before anything is committed."""
        import pyarrow as pa

        from wcoj_core.errors import InputError

        batches = self._every()

        def every() -> Iterator[pa.RecordBatch]:
            seen = 0
            while True:
                try:
                    batch = next(batches)
                except StopIteration:
                    return
                except InputError as e:
                    rows = [
                        r
                        for path in self.paths
                        for r in bad_rows(path, self.arity, self.relation, bad_rows_limit)
                    ]
                    raise Refused(self.relation, rows[:bad_rows_limit] or [str(e)]) from e
                found = check(batch, seen)
                if found:
                    raise Refused(self.relation, found)
                seen += batch.num_rows
                yield batch

        return pa.RecordBatchReader.from_batches(self._schema(), every())


class Refused(Exception):
    """Landed rows of `relation` refused while they were being landed (`LandedStream.checked`):
    the problems, one line each."""

    def __init__(self, relation: str, lines: Sequence[str]) -> None:
        self.relation, self.lines = relation, list(lines)
        super().__init__(f"{relation}: " + "; ".join(self.lines[:3]))


@dataclass(frozen=True, slots=True)
class Read:
    """One relation's landed rows at one epoch: an Arrow table (read by the driver), a Spark
    DataFrame, or None (no files); the files read, their bytes, names ignored, and rows read
    (None for a DataFrame: counting them would cost a Spark job)."""

    rows: Any
    files: int
    bytes: int
    ignored: tuple[str, ...]
    count: int | None
    paths: tuple[LandedFile, ...] = ()


def read_epoch(
    landing: str,
    relation: str,
    arity: int,
    key: str,
    spark: Callable[[str], SparkSession],
    *,
    local_bytes: int = LOCAL_READ_BYTES,
) -> Read:
    """The update rows (c0.., diff) of `relation`'s landing folder at epoch `key`.

    Raises `wcoj_core.errors.InputError` for a file that is not a well-formed relation, naming
    the file, line and column. `spark(reason)` gives the session when one is needed.
    """
    found = landed_files(landing, relation, key)
    files = found.files
    size = sum(f.size for f in files)
    if not files:
        return Read(None, 0, 0, found.ignored, 0)
    from wcoj_core.store.location import Location

    remote = not all(Location.of(f.path).local for f in files)
    if size <= local_bytes and not remote:
        # At most this many bytes once decompressed (deflate expands at most ~1032 times).
        bound = sum(f.size * (DEFLATE_RATIO if f.path.endswith(".gz") else 1) for f in files)
        if bound <= TABLE_BYTES:
            import pyarrow as pa

            from wcoj_core.input_read import read_local

            table = pa.concat_tables([read_local(f.path, arity, relation) for f in files])
            return Read(table, len(files), size, found.ignored, table.num_rows, files)
        # Larger than read at once: streamed, a block of a file at a time (checked as it is
        # landed), within the memory budget.
        stream = LandedStream(tuple(f.path for f in files), arity, relation)
        return Read(stream, len(files), size, found.ignored, None, files)
    from wcoj_core.input_spark import read_relation

    why = "landed files on remote storage" if remote else f"landed files of {size:,} bytes"
    session = spark(f"{why} ({relation} at {key})")
    frames = [read_relation(session, f.path, arity, relation) for f in files]
    total = frames[0]
    for frame in frames[1:]:
        total = total.unionByName(frame)
    return Read(total, len(files), size, found.ignored, None, files)


def bad_rows(path: str, arity: int, relation: str, limit: int) -> list[str]:
    """Every problem (up to `limit`) of a landed text or CSV file, one line each with the file,
    line and column, as the reader names the first: what a user fixes in one go. Empty for a
    Parquet file or a file the line rules do not object to (then the reader's one message
    stands).

    >>> import pathlib, tempfile
    >>> f = pathlib.Path(tempfile.mkdtemp()) / "changes.csv"
    >>> _ = f.write_text("src,dst,diff\\n1,2,1\\n1,x,1\\n3,4,0\\n")
    >>> for line in bad_rows(str(f), 2, "edge", 10): print(line.split("changes.csv")[1])
     (relation edge), line 3, column 2: value in column 'dst' is not an integer: 'x'
     (relation edge), line 4, column 3: value in column 'diff' is zero; a diff must be a non-zero multiplicity
    """
    import gzip

    from wcoj_core.errors import InputError
    from wcoj_core.input_read import (
        Format,
        blank_csv_line,
        check_csv_line,
        check_text_line,
        csv_header,
        detect_format,
        local_path,
        source_name,
    )

    local = local_path(path)
    kind = detect_format(path)
    if local is None or kind not in (Format.TEXT, Format.CSV):
        return []
    source = source_name(path, relation)
    opener: Any = gzip.open if local.endswith(".gz") else open
    found: list[str] = []
    header: tuple[list[str], list[Any]] | None = None
    try:
        with opener(local, "rt", encoding="utf-8", errors="replace", newline="") as handle:
            for number, raw in enumerate(handle, 1):
                line = raw.rstrip("\n").rstrip("\r")
                if kind is Format.TEXT:
                    problem = check_text_line(line, arity)
                elif blank_csv_line(line):
                    continue
                elif header is None:
                    header = csv_header(line, arity, source, False)
                    continue
                else:
                    problem = check_csv_line(line, *header)
                if problem is not None:
                    found.append(str(InputError(problem[0], source, number, problem[1])))
                    if len(found) >= limit:
                        break
    except (InputError, OSError, EOFError):
        return found
    return found


def landed_columns(path: str) -> tuple[str, ...]:
    """The data columns as a landed CSV or Parquet file names them (before ``diff``); none for a
    SNAP edge list or what cannot be read cheaply."""
    import csv
    import gzip

    try:
        if path.lower().endswith(".parquet"):
            import pyarrow.parquet as pq

            names = pq.read_schema(path).names if not UPath(path).is_dir() else []
        elif path.lower().endswith((".csv", ".csv.gz")):
            opener: Any = gzip.open if path.endswith(".gz") else open
            with opener(path, "rt", encoding="utf-8", errors="replace", newline="") as handle:
                first = next((line for line in handle if line.strip()), "")
            names = next(csv.reader([first])) if first else []
        else:
            return ()
    except Exception:
        return ()
    return tuple(n.strip() for n in names if n.strip().lower() not in ("diff", "time"))


def landed_epochs(landing: str, relations: Sequence[str]) -> Epochs:
    """The epochs of a pipeline whose first day is not given: from the oldest epoch folder
    landed under ``<landing>/<relation>/`` of any of `relations`, or from today (UTC) when none
    has; a relative `landing` is relative to the working directory.

    >>> import pathlib, tempfile
    >>> root = pathlib.Path(tempfile.mkdtemp())
    >>> for day in ("2024-03-02", "2024-03-01", "notes"): (root / "edge" / day).mkdir(parents=True)
    >>> landed_epochs(str(root), ["edge"]).start
    '2024-03-01'
    """
    import datetime as dt

    from wcoj_assets.resources import resolve

    days = [d for rel in relations for d in epoch_folders(resolve(landing), rel, _ANY)[0]]
    return Epochs(min(days) if days else dt.datetime.now(dt.UTC).date().isoformat())
