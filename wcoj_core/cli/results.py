"""``--output FILE``: a query's tuples written to one Parquet or CSV file.

Contract: `check_output` runs before Spark starts and accepts a local path ending in
``.parquet`` or ``.csv`` (any case) whose folder exists and that is not a folder itself;
anything else is a `UsageError` naming the path. `write_tuples` writes the data columns
``c0 .. c{k-1}`` and ``diff`` of a DataFrame of update triples (a ``time`` column is dropped)
into that file: Parquet, or CSV with a header row, the format `wcoj_core.sources` reads back.
The rows are gathered on the driver — read straight from the engine's Parquet batch by pyarrow
when the DataFrame is a plain scan of local files, collected through Spark otherwise — and
written to a temporary file beside the target, then renamed over it, so a failed write leaves
no partial file. It returns the number of rows written.
"""

from __future__ import annotations

import os
import tempfile
from enum import Enum
from pathlib import Path

from pyspark.sql import DataFrame

from wcoj_core.cli.console import UsageError
from wcoj_core.spark import local_parquet_files, read_local_parquet
from wcoj_core.updates import TIME


class OutputFormat(Enum):
    """The file formats ``--output`` writes, by extension."""

    PARQUET = ".parquet"
    CSV = ".csv"


def check_output(path: str) -> tuple[Path, OutputFormat]:
    """The ``--output`` path and its format, or a `UsageError` saying what to give instead.

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
    if target.is_dir():
        raise UsageError(f"--output {path}: is a directory; give a file path")
    folder = target.parent
    if not folder.is_dir():
        raise UsageError(f"--output {path}: the folder {folder} does not exist")
    if not os.access(folder, os.W_OK):
        raise UsageError(f"--output {path}: the folder {folder} is not writable")
    return target, kind


def write_tuples(df: DataFrame, target: Path, kind: OutputFormat) -> int:
    """Write the data columns and ``diff`` of `df` into `target`; the number of rows."""
    import pyarrow.csv as pacsv
    import pyarrow.parquet as pq

    tuples = df.select(*[c for c in df.columns if c != TIME])
    files = local_parquet_files(tuples)
    table = read_local_parquet(tuples, files) if files is not None else None
    if table is None:
        table = tuples.toArrow()
    fd, scratch = tempfile.mkstemp(prefix=f".{target.name}.", dir=target.parent)
    os.close(fd)
    try:
        if kind is OutputFormat.PARQUET:
            pq.write_table(table, scratch)
        else:
            # The header is written here: older pyarrow quotes every column name.
            options = pacsv.WriteOptions(include_header=False, quoting_style="none")
            with open(scratch, "wb") as sink:
                sink.write((",".join(table.column_names) + "\n").encode())
                pacsv.write_csv(table, sink, write_options=options)
        os.replace(scratch, target)
    finally:
        if os.path.exists(scratch):
            os.unlink(scratch)
    return table.num_rows
