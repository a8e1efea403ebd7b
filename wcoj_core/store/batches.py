"""A state's batches, read and written with pyarrow: the Parquet codec of update triples.

Everything but Spark reads a state's batches here into `Layer`s and writes them, on the driver
or in a Spark task, through the state's `Files` (local, or remote through pyarrow's file systems:
``hdfs://`` needs ``libhdfs`` and a Hadoop ``CLASSPATH`` on every executor). Reading never
consolidates across files (`read_layer` sums what it read); a batch written here is one Parquet
file per writer piece, named by the manifest.
"""

from __future__ import annotations

import contextlib
import hashlib
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa

from wcoj_core.arrow import longs
from wcoj_core.errors import DamagedBatch, StateError, read_failure
from wcoj_core.kernel.changes import changes_layer, changes_table, data_rows
from wcoj_core.kernel.layer import Layer
from wcoj_core.kernel.multiplicity import exact_sum
from wcoj_core.store.files import Files, check_stamp
from wcoj_core.store.manifest import Batch, FileRef
from wcoj_core.traces import DIFF, TIME

if TYPE_CHECKING:
    import pyarrow.fs as pafs
    import pyarrow.parquet as pq


def _pq() -> Any:
    """pyarrow.parquet, imported when a batch is first read or written (it imports pyarrow's
    file systems and ssl: a count that keeps nothing needs neither)."""
    import pyarrow.parquet as pq

    return pq


# A batch written on the driver is one file per this many rows, up to `WRITE_FILES` files
# written at once (Arrow encodes and compresses without the GIL).
WRITE_FILE_ROWS = 1 << 21
WRITE_FILES = 4

# The column statistics a batch file keeps: the epoch's (`check_epoch` reads its minimum and
# maximum). Nothing reads the data columns' or the diffs', and making them cost a warm epoch's
# four small files about a fifth of their writing.
STATISTICS: Any = [TIME]  # a list of columns (the stubs say a bool only)


class Batches:
    """The batches of one state, read and written with pyarrow through its `Files`."""

    def __init__(self, files: Files | str) -> None:
        self.files = files if isinstance(files, Files) else Files(files)
        self.root = self.files.root

    def read_layer(self, columns: Sequence[str], batches: Sequence[Batch]) -> Layer:
        """Batches as one consolidated layer: exactly the files each lists, read whole and
        checked (`verified_tables`)."""
        tables = [
            t
            for b in batches
            for t in self.verified_tables(b.path, columns, b.files, b.rows, b.time)
        ]
        return read_tables(columns, tables)

    def iter_chunks(
        self, batch: Batch, columns: Sequence[str], *, digests: bool = False
    ) -> Iterator[pa.RecordBatch]:
        """The data columns and diffs of a stored batch, a record batch at a time: exactly the
        files it lists, each checked by size before it is read (with `digests`, by its sha256
        too, hashed a block at a time: a file read in pieces is otherwise not hashed), and
        their rows against the batch's."""
        rows = 0
        for ref in batch.files:
            rel = f"{batch.path}/{ref.name}"
            path = self.files.full(rel)
            self.check(rel, ref, digest=False)
            if digests:
                self.check_digest(rel, ref)
            try:
                parquet = _pq().ParquetFile(path, filesystem=self.files.fs)
                check_epoch(path, parquet, batch.time)
                for chunk in parquet.iter_batches(columns=[*columns, DIFF]):
                    rows += chunk.num_rows
                    yield chunk
            except (OSError, MemoryError, pa.ArrowException) as e:
                raise read_failure(path, e, "not a readable batch") from e
        if rows != batch.rows:
            raise DamagedBatch(self.files.full(batch.path), _rows_differ(rows, batch.rows))

    def read_files(self, columns: Sequence[str], files: Sequence[str]) -> Layer:
        """Parquet files of changes (absolute paths in this file system), consolidated."""
        return read_tables(columns, [read_changes_file(self.files.fs, f, columns) for f in files])

    def write(
        self,
        rel: str,
        columns: Sequence[str],
        rows: np.ndarray,
        diff: np.ndarray,
        time: int,
        *,
        part: str = "0",
        threads: bool = False,
    ) -> tuple[FileRef, ...]:
        """Write rows and diffs into the batch folder `rel` as Parquet files named by `part`
        (several at once with `threads`); each file's name, size and digest. `StateError` (the
        folder removed) when the storage refuses."""
        n = len(diff)
        files = max(1, min(WRITE_FILES, n // WRITE_FILE_ROWS)) if threads else 1
        cuts = [n * i // files for i in range(files + 1)]

        def write_file(i: int) -> FileRef:
            lo, hi = cuts[i], cuts[i + 1]
            table = changes_table(columns, rows[lo:hi], diff[lo:hi], time)
            sink = pa.BufferOutputStream()
            _pq().write_table(table, sink, **batch_options(columns))
            name = f"part-{part}-{i:03d}.snappy.parquet"
            return self.files.put(f"{rel}/{name}", sink.getvalue())

        try:
            self.files.mkdirs(rel)
            if files == 1:
                written = [write_file(0)]
            else:
                with ThreadPoolExecutor(files) as pool:
                    written = list(pool.map(write_file, range(files)))
        except OSError as e:
            self.remove(rel)
            raise StateError(
                f"state {self.root}: cannot write a batch ({e.strerror or e}); nothing was applied"
            ) from e
        return tuple(written)

    def remove(self, rel: str) -> None:
        """Delete a batch's folder or file, as far as the storage lets (a failure's cleanup)."""
        with contextlib.suppress(OSError):
            self.files.delete(rel)

    def read_verified(
        self,
        rel: str,
        columns: Sequence[str],
        refs: Sequence[FileRef],
        rows: int | None = None,
        time: int | None = None,
    ) -> Layer:
        """A stored batch whose files must match `refs` (size and digest), hold `rows` rows and
        rows of epoch `time` only (when given): read whole, checked, consolidated. Raises
        `DamagedBatch` naming the file and what is wrong."""
        return read_tables(columns, self.verified_tables(rel, columns, refs, rows, time))

    def verified_tables(
        self,
        rel: str,
        columns: Sequence[str],
        refs: Sequence[FileRef],
        rows: int | None = None,
        time: int | None = None,
    ) -> list[pa.Table]:
        """The files `refs` of the batch folder `rel` (and no other file of it), each read whole
        and checked against its size and digest, as tables of the data `columns` and ``diff``;
        their rows checked against `rows` (the manifest's count) and their epochs against
        `time` (the batch's), when given."""
        tables: list[pa.Table] = []
        for ref in refs:
            path = self.files.full(f"{rel}/{ref.name}")
            try:
                with self.files.fs.open_input_file(path) as f:
                    data = f.read_buffer()  # Arrow's memory (see input_read.arrow_owned)
            except (OSError, MemoryError, pa.ArrowException) as e:
                raise read_failure(path, e, "cannot be read") from e
            if len(data) != ref.size:
                raise DamagedBatch(path, f"{len(data)} bytes, the manifest says {ref.size}")
            if hashlib.sha256(data).hexdigest() != ref.sha256:
                raise DamagedBatch(path, "its contents do not match its digest")
            try:
                # ParquetFile, not read_table: read_table's dataset layer imports pandas.
                reader = _pq().ParquetFile(pa.BufferReader(data))
                if time is not None:
                    check_epoch(path, reader, time)
                tables.append(reader.read(columns=[*columns, DIFF]))
            except (OSError, MemoryError, pa.ArrowException) as e:
                raise read_failure(path, e, "not a readable batch") from e
        held = sum(t.num_rows for t in tables)
        if rows is not None and held != rows:
            raise DamagedBatch(self.files.full(rel), _rows_differ(held, rows))
        return tables

    def checked_uris(self, batch: Batch) -> list[str]:
        """The files a stored batch lists, as URIs for Spark, each checked first: its size
        always; on a local disk its digest too, unless its stamp says it is the file written
        (the same inode, modification and change times); the rows of their footers against the
        batch's. Raises `DamagedBatch` naming the file and what is wrong."""
        uris = []
        rows = 0
        for ref in batch.files:
            rel = f"{batch.path}/{ref.name}"
            path = self.files.full(rel)
            if not (self.files.local and check_stamp(path, ref)):
                self.check(rel, ref, digest=self.files.local)
            try:
                parquet = _pq().ParquetFile(path, filesystem=self.files.fs)
                check_epoch(path, parquet, batch.time)
                rows += parquet.metadata.num_rows
            except (OSError, MemoryError, pa.ArrowException) as e:
                raise read_failure(path, e, "not a readable batch") from e
            uris.append(self.files.spark_uri(rel))
        if rows != batch.rows:
            raise DamagedBatch(self.files.full(batch.path), _rows_differ(rows, batch.rows))
        return uris

    def verified_pieces(
        self, batch: Batch, columns: Sequence[str]
    ) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        """A stored batch's rows (the data `columns`) and diffs, a record batch at a time,
        each file's digest checked before it is read (`iter_chunks`)."""
        for chunk in self.iter_chunks(batch, columns, digests=True):
            yield data_rows(chunk, columns), longs(chunk.column(DIFF))

    def check(self, rel: str, ref: FileRef, *, digest: bool = True) -> None:
        """Raise `DamagedBatch` unless the file `rel` is there with `ref`'s size (and, with
        `digest`, its sha256): `Files.verify`."""
        try:
            what = self.files.verify(rel, ref, digest=digest)
        except (OSError, MemoryError, pa.ArrowException) as e:
            raise read_failure(self.files.full(rel), e, "cannot be read") from e
        if what is not None:
            raise DamagedBatch(self.files.full(rel), what)

    def check_digest(self, rel: str, ref: FileRef) -> None:
        """Raise `DamagedBatch` unless the file's sha256 is `ref`'s (read a block at a time)."""
        try:
            sha = self.files.digest(rel)[1]
        except (OSError, MemoryError, pa.ArrowException) as e:
            raise read_failure(self.files.full(rel), e, "cannot be read") from e
        if sha != ref.sha256:
            raise DamagedBatch(self.files.full(rel), "its contents do not match its digest")


def check_epoch(path: str, parquet: pq.ParquetFile, time: int) -> None:
    """Raise `DamagedBatch` unless every row of a batch file is of epoch `time` (from its
    row groups' statistics; the column read when a row group has none)."""
    schema = parquet.schema_arrow
    j = schema.get_field_index(TIME)
    if j < 0:
        raise DamagedBatch(path, f"has no {TIME!r} column: not a batch")
    meta = parquet.metadata
    for g in range(meta.num_row_groups):
        group = meta.row_group(g)
        if group.num_rows == 0:
            continue
        stats = group.column(j).statistics
        if stats is not None and stats.has_min_max:
            low, high = stats.min, stats.max
        else:
            times = longs(parquet.read_row_group(g, columns=[TIME]).column(TIME))
            low, high = int(times.min()), int(times.max())
        if low != time or high != time:
            held = f"epoch {low}" if low == high else f"epochs {low}..{high}"
            raise DamagedBatch(path, f"holds rows of {held}, the manifest says epoch {time}")


def _rows_differ(held: int, rows: int) -> str:
    """What is wrong with a batch whose files hold `held` rows and whose manifest says `rows`.

    >>> _rows_differ(5, 0)
    'its files hold 5 rows, the manifest says 0'
    """
    return f"its files hold {held:,} rows, the manifest says {rows:,}"


def read_changes_file(fs: pafs.FileSystem, path: str, columns: Sequence[str]) -> pa.Table:
    """One Parquet file of changes: its data `columns` and ``diff`` as non-null longs.

    Raises `StateError` naming the file for a missing column, a null or a value that is not
    a whole number.
    """
    table = _pq().read_table(path, columns=[*columns, DIFF], filesystem=fs)
    out = []
    for name in (*columns, DIFF):
        col = table.column(name)
        if col.null_count:
            raise StateError(f"{path}: column {name!r} holds {col.null_count} null value(s)")
        out.append(col.cast(pa.int64()))
    return pa.Table.from_arrays(out, names=[*columns, DIFF])


def read_tables(columns: Sequence[str], tables: Sequence[pa.Table]) -> Layer:
    """Tables of changes (data `columns` and ``diff``) as one consolidated layer."""
    live = [t for t in tables if t.num_rows]
    if not live:
        return Layer.empty(len(columns))
    if len(live) == 1:
        return changes_layer(columns, live[0])
    parts = [changes_layer(columns, t) for t in live]
    return Layer.build(
        np.concatenate([p.rows for p in parts]), np.concatenate([p.diff for p in parts])
    )


class BatchWriter:
    """A batch folder written a chunk at a time, as its rows are made: Parquet files of at most
    `file_rows` rows, each chunk a row group, so no more than a chunk is ever held; counts the
    rows and sums the diffs as they go. `close` gives every file's reference."""

    def __init__(
        self,
        batches: Batches,
        rel: str,
        columns: Sequence[str],
        time: int,
        *,
        file_rows: int = 2 * WRITE_FILE_ROWS,
        part: str = "0",
    ) -> None:
        self.batches = batches
        self.rel = rel
        self.columns = tuple(columns)
        self.time = time
        self.file_rows = file_rows
        self.part = part
        self.rows = 0
        self.total = 0
        self._done: list[FileRef] = []
        self._current: PartWriter | None = None

    def write(self, rows: np.ndarray, diff: np.ndarray) -> None:
        at = 0
        while at < len(diff):
            if self._current is None or self._current.rows >= self.file_rows:
                self._next()
            assert self._current is not None
            take = min(len(diff) - at, self.file_rows - self._current.rows)
            self._current.write(rows[at : at + take], diff[at : at + take])
            at += take
        self.rows += len(diff)
        if len(diff):
            self.total += exact_sum(diff)

    def _next(self) -> None:
        self._close_current()
        name = f"part-{self.part}-{len(self._done):03d}.snappy.parquet"
        self._current = PartWriter(self.batches, self.rel, self.columns, self.time, name)

    def _close_current(self) -> None:
        if self._current is not None:
            self._current.close()
            if self._current.ref is not None:
                self._done.append(self._current.ref)
            self._current = None

    def close(self) -> tuple[FileRef, ...]:
        """Finish the last file; every file's reference (an empty batch: one empty file)."""
        try:
            self._close_current()
            if not self._done:
                return self.batches.write(
                    self.rel,
                    self.columns,
                    np.zeros((0, len(self.columns)), dtype=np.int64),
                    np.zeros(0, dtype=np.int64),
                    self.time,
                )
        except OSError as e:
            self.batches.remove(self.rel)
            raise StateError(
                f"state {self.batches.root}: cannot write a batch ({e.strerror or e}); nothing "
                "was applied"
            ) from e
        return tuple(self._done)


class PartWriter:
    """One Parquet file of a batch folder, written a chunk at a time (opened at the first)."""

    def __init__(self, batches: Batches, rel: str, columns: Sequence[str], time: int, name: str):
        self.files = batches.files
        self.rel = rel
        self.columns = tuple(columns)
        self.time = time
        self.name = name
        self.rows = 0
        self.total = 0  # the sum of the diffs written
        self.ref: FileRef | None = None  # the file's size and digest, once closed
        self._writer: pq.ParquetWriter | None = None
        self._sink: Any = None

    @property
    def path(self) -> str:
        """The file, relative to the state."""
        return f"{self.rel}/{self.name}"

    def write(self, rows: np.ndarray, diff: np.ndarray) -> None:
        if len(diff) == 0:
            return
        table = changes_table(self.columns, rows, diff, self.time)
        if self._writer is None:
            self.files.mkdirs(self.rel)
            self._sink = self.files.fs.open_output_stream(self.files.full(self.path))
            self._writer = _pq().ParquetWriter(
                self._sink, table.schema, **batch_options(self.columns)
            )
        assert self._writer is not None
        self._writer.write_table(table)
        self.rows += len(diff)
        self.total += exact_sum(diff)

    def close(self) -> None:
        """Finish the file and take its size and digest (read back once: a task's part)."""
        if self._writer is not None:
            self._writer.close()
            self._sink.close()
            self._writer = None
            self.ref = self.files.ref(self.path)


def batch_options(columns: Sequence[str]) -> dict[str, Any]:
    """How a batch's columns are written: dictionaries for the time and the diffs (a value or
    a few: a tiny page); the data columns, sorted (a batch is a consolidated layer's rows),
    as deltas bit-packed (Parquet's DELTA_BINARY_PACKED: an edge's first column costs next to
    nothing, its second the bits of the gap to the previous neighbour). A dictionary of ids
    would overflow and be written plain anyway, at twice the cost. Snappy over all of it."""
    return {
        "compression": "snappy",
        "use_dictionary": ["time", DIFF],
        "column_encoding": {c: "DELTA_BINARY_PACKED" for c in columns},
        "write_statistics": STATISTICS,
    }
