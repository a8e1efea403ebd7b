"""``--output FILE``: a query's tuples written to one Parquet or CSV file, safely.

`check_output` runs before anything is read: a local ``.parquet`` or ``.csv`` path in a writable
folder, new or (with ``--force``) a regular file, never one of the command's inputs nor a path
inside a state. `write_tuples` writes ``c0 .. c{k-1}, diff`` (from a table, record batches or a
Spark DataFrame) to a temporary file in the target's folder, then moves it into place (a hard
link without ``--force``, a rename with it): a failed write leaves no partial file. See
docs/cli.md.
"""

from __future__ import annotations

import argparse
import os
import stat
import uuid
from collections.abc import Sequence
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING

from wcoj_core.cli.console import UsageError
from wcoj_core.store.location import Location
from wcoj_core.traces import TIME

if TYPE_CHECKING:  # Arrow is imported by the writer only: a command that writes no file
    import pyarrow as pa  # (`wcoj query` of one vertex) starts without it
    from pyspark.sql import DataFrame


class OutputFormat(Enum):
    """The file formats ``--output`` writes, by extension."""

    PARQUET = ".parquet"
    CSV = ".csv"


def add_output_arguments(p: argparse.ArgumentParser, what: str = "the output's tuples") -> None:
    """``--output FILE`` (writing `what`) and ``--force`` (overwriting an existing FILE)."""
    p.add_argument(
        "--output",
        metavar="FILE",
        help=f"also write {what} (c0.., diff) to FILE, .parquet or .csv; a new file unless "
        "--force is given",
    )
    p.add_argument(
        "--force",
        action="store_true",
        help="let --output replace an existing file (never one of the command's inputs)",
    )


def check_output(
    path: str, *, force: bool = False, inputs: Sequence[str] = (), state: str | None = None
) -> tuple[Path, OutputFormat]:
    """The ``--output`` path and its format, or a `UsageError` saying what to give instead;
    `inputs` and `state` (the command's) must not be overwritten.

    >>> check_output("tri.CSV")[1]
    <OutputFormat.CSV: '.csv'>
    >>> check_output("tri.txt")
    Traceback (most recent call last):
      ...
    wcoj_core.cli.console.UsageError: --output tri.txt: give a path ending in .parquet or .csv
    """
    target = Path(path)
    formats = {f.value: f for f in OutputFormat}
    kind = formats.get(target.suffix.lower())
    if kind is None:
        raise UsageError(f"--output {path}: give a path ending in .parquet or .csv")
    existing = _stat(target)
    if existing is not None and stat.S_ISDIR(existing.st_mode):
        raise UsageError(f"--output {path}: is a directory; give a file path")
    folder = target.parent
    if not folder.is_dir():
        raise UsageError(f"--output {path}: the folder {folder} does not exist")
    if not os.access(folder, os.W_OK):
        raise UsageError(f"--output {path}: the folder {folder} is not writable")
    _check_not_an_input(path, target, existing, inputs)
    _check_not_in_a_state(path, target, state)
    if existing is not None and not stat.S_ISREG(existing.st_mode):
        raise UsageError(f"--output {path}: exists and is not a regular file; give a file path")
    if existing is not None and not force:
        raise UsageError(f"--output {path}: the file exists; pass --force to replace it")
    return target, kind


def _stat(path: Path) -> os.stat_result | None:
    try:
        return os.stat(path)
    except (FileNotFoundError, NotADirectoryError):
        return None
    except OSError as exc:
        raise UsageError(f"--output {path}: cannot be checked ({exc.strerror})") from exc


def _check_not_an_input(
    path: str, target: Path, existing: os.stat_result | None, inputs: Sequence[str]
) -> None:
    """Refuse a target that is, or lies inside, one of the inputs."""
    from wcoj_core.input_read import local_path

    resolved = target.resolve()
    for spec in inputs:
        local = local_path(spec)
        if local is None:
            continue
        source = Path(local).resolve()
        same = resolved == source
        if not same and existing is not None:
            found = _stat(Path(local))
            same = found is not None and (found.st_dev, found.st_ino) == (
                existing.st_dev,
                existing.st_ino,
            )
        if same:
            raise UsageError(
                f"--output {path}: is the input {spec}; write the output to another file"
            )
        if source in resolved.parents:
            raise UsageError(
                f"--output {path}: is inside the input folder {spec}; write it elsewhere"
            )


def _check_not_in_a_state(path: str, target: Path, state: str | None) -> None:
    """Refuse a target inside the command's state, or inside any folder holding a state's
    marker (links resolved)."""
    from wcoj_core.store.names import MARKER

    resolved = target.resolve()
    where = Location.of(state) if state is not None else None
    if where is not None and where.local:
        root = Path(where.path).resolve()
        if root == resolved or root in resolved.parents:
            raise UsageError(
                f"--output {path}: is inside the state {state}; write it outside any state "
                "(a state holds what wcoj writes there, nothing else)"
            )
    for folder in resolved.parents:
        if (folder / MARKER).is_file():
            raise UsageError(
                f"--output {path}: is inside the state {folder}; write it outside any state "
                "(a state holds what wcoj writes there, nothing else)"
            )


def write_tuples(
    rows: pa.Table | pa.RecordBatchReader | DataFrame,
    target: Path,
    kind: OutputFormat,
    *,
    force: bool = False,
    inputs: Sequence[str] = (),
    state: str | None = None,
) -> int:
    """Write the data columns and ``diff`` of `rows` into `target`, `check_output` checked again
    first; the number of rows."""
    import pyarrow as pa
    import pyarrow.csv as pacsv
    import pyarrow.parquet as pq

    check_output(str(target), force=force, inputs=inputs, state=state)
    if isinstance(rows, pa.RecordBatchReader):
        stream: pa.RecordBatchReader = rows
    else:
        table: pa.Table = rows if isinstance(rows, pa.Table) else rows.toArrow()
        stream = pa.RecordBatchReader.from_batches(table.schema, table.to_batches())
    names = [c for c in stream.schema.names if c != TIME]
    schema = pa.schema([stream.schema.field(c) for c in names])
    scratch = target.with_name(f".{target.name}.{uuid.uuid4().hex}.tmp")
    fd = os.open(scratch, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0), 0o666)
    written = 0
    try:
        with os.fdopen(fd, "wb") as sink:
            if kind is OutputFormat.PARQUET:
                with pq.ParquetWriter(sink, schema) as out:
                    for batch in stream:  # a batch at a time: an output of any size
                        out.write_batch(batch.select(names))
                        written += batch.num_rows
            else:
                # The header is written here: older pyarrow quotes every column name.
                sink.write((",".join(names) + "\n").encode())
                options = pacsv.WriteOptions(include_header=False, quoting_style="none")
                with pacsv.CSVWriter(sink, schema, write_options=options) as out:
                    for batch in stream:
                        out.write_batch(batch.select(names))
                        written += batch.num_rows
            sink.flush()
            os.fsync(sink.fileno())
        _move(scratch, target, force)
    except OSError as e:  # a full disk, a folder gone meanwhile: one line, nothing left there
        raise UsageError(
            f"--output {target}: cannot be written ({e.strerror or e}); nothing was written there"
        ) from e
    finally:
        scratch.unlink(missing_ok=True)
    return written


def _move(scratch: Path, target: Path, force: bool) -> None:
    """Put the written `scratch` file at `target`: replacing it only with `force`."""
    if force:
        os.replace(scratch, target)
        return
    try:
        os.link(scratch, target)  # fails if the target exists: never replaced
    except FileExistsError:
        raise UsageError(
            f"--output {target}: the file exists; pass --force to replace it"
        ) from None
    except OSError:  # a file system without hard links
        if os.path.lexists(target):
            raise UsageError(
                f"--output {target}: the file exists; pass --force to replace it"
            ) from None
        os.replace(scratch, target)
