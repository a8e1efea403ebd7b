"""The landing zone: an update stream laid out as one folder per epoch.

Contract: `write_epochs` takes update triples ``(c0 .. c{k-1}, time, diff)`` and, for every time
``n`` present in the stream, publishes ``<landing>/<relation>/<epoch key of n>/part-0.<ext>``
(the key of ``n`` is the day ``n`` days after `start`, the code location's first epoch):
exactly one plain file holding that epoch's updates as the columns ``c0 .. c{k-1}, diff`` (long
integers; the time is the folder's epoch, so the file carries none). ``fmt="csv"`` writes CSV
with the header row ``c0,...,diff``; the default is Parquet. Both read back with
`wcoj_core.input_spark.read_relation`. Epochs without updates get no folder.

Publishing is atomic, so a sensor watching the landing zone never sees half an epoch. Spark
writes the whole stream once, partitioned by time, into a hidden staging directory under
``<landing>`` (hence on the same filesystem). Each epoch's file is then renamed into a staged
folder, and that folder is renamed into place: the folder appears with its file already inside.
When the folder already exists, the file goes in under a hidden name first and is then renamed
over ``part-0.<ext>``. A folder that holds any other plain file is refused before anything is
published.

`generate_landing` fills a landing zone with the built-in R-MAT graph, spread over epochs with
`wcoj_core.replay.epoch_stream` (undirected: every update appears in both directions, and some
edges are deleted again at a later epoch). The same arguments always give the same files.

Importing this module does no I/O and starts no Spark.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from enum import Enum
from pathlib import Path

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from wcoj_assets.epochs import EPOCH_START, Epochs
from wcoj_core.errors import WcojError
from wcoj_core.generate import generate
from wcoj_core.replay import epoch_stream
from wcoj_core.traces import DIFF, TIME, relation_columns
from wcoj_core.updates import data_columns

FILE_STEM = "part-0"


class LandingError(WcojError):
    """A stream or landing zone that cannot be written as epoch folders."""


class LandingFormat(Enum):
    """The file format of a landed epoch; the value is the file's extension."""

    PARQUET = "parquet"
    CSV = "csv"

    @property
    def file_name(self) -> str:
        return f"{FILE_STEM}.{self.value}"


def write_epochs(
    spark: SparkSession,
    landing: str,
    relation: str,
    stream: DataFrame,
    fmt: str = "parquet",
    start: str = EPOCH_START,
) -> list[str]:
    """Publish `stream` under ``<landing>/<relation>/`` as one folder per epoch.

    Returns the epoch keys written, oldest first (time ``n`` is the day ``n`` days after
    `start`). `spark` is the session `stream` belongs to; the stream carries it, so the writer
    only takes it to match the other landing functions.
    """
    form = _landing_format(fmt)
    epochs = Epochs(start)
    if not relation or relation.startswith((".", "_")) or "/" in relation or os.sep in relation:
        raise LandingError(
            f"relation {relation!r}: a relation name must be a plain folder name "
            "(no '/', not starting with '.' or '_')"
        )
    columns = _stream_columns(stream, relation)
    root = Path(landing)
    target = root / relation
    target.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".staging-", dir=root))
    try:
        spark_out = staging / "spark"
        ordered = stream.select(*[F.col(c).cast("long") for c in (*columns, TIME, DIFF)])
        # One task per time value, so each time folder receives exactly one part file.
        writer = (
            ordered.repartition(TIME)
            .write.mode("overwrite")
            .option("maxRecordsPerFile", 0)
            .partitionBy(TIME)
        )
        if form is LandingFormat.CSV:
            writer.option("header", True).csv(str(spark_out))
        else:
            writer.parquet(str(spark_out))
        parts = _spark_parts(spark_out, relation)
        keys = [epochs.key(n) for n in parts]
        for key in keys:
            _check_folder(target / key, form.file_name)
        for key, part in zip(keys, parts.values(), strict=True):
            _publish(part, staging / "epochs" / key, target / key, form.file_name)
        return keys
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def generate_landing(
    spark: SparkSession,
    landing: str,
    *,
    scale: int = 10,
    edges: int = 8000,
    seed: int = 7,
    epochs: int = 5,
    delete_fraction: float = 0.2,
    relation: str = "edge",
    fmt: str = "parquet",
    start: str = EPOCH_START,
) -> list[str]:
    """Land an undirected R-MAT graph as `epochs` epochs of inserts and deletions, the first on
    the day `start`. Every change is landed in both directions (a directed relation)."""
    graph = generate(spark, f"rmat:scale={scale},edges={edges},seed={seed}")
    stream = epoch_stream(graph, epochs, delete_fraction, seed, undirected=True)
    return write_epochs(spark, landing, relation, stream, fmt, start)


def _landing_format(fmt: str) -> LandingFormat:
    try:
        return LandingFormat(fmt.lower())
    except ValueError:
        known = ", ".join(f.value for f in LandingFormat)
        raise LandingError(f"unknown landing format {fmt!r} (known: {known})") from None


def _stream_columns(stream: DataFrame, relation: str) -> list[str]:
    """The data columns ``c0 .. c{k-1}`` in order; the stream must have exactly those plus
    ``time`` and ``diff``."""
    data = data_columns(stream)
    expected = relation_columns(len(data))
    if not data or sorted(data) != sorted(expected) or {TIME, DIFF} - set(stream.columns):
        raise LandingError(
            f"relation {relation!r}: an update stream needs the columns c0 .. c(k-1), "
            f"{TIME!r} and {DIFF!r}; got {stream.columns}"
        )
    return expected


def _spark_parts(out: Path, relation: str) -> dict[int, Path]:
    """The one part file Spark wrote per ``time=<n>`` folder, keyed by ``n`` in order."""
    parts: dict[int, Path] = {}
    folders = [d for d in out.iterdir() if d.is_dir() and d.name.startswith(f"{TIME}=")]
    for folder in folders:
        value = folder.name.partition("=")[2]
        time = int(value) if value.lstrip("-").isdigit() else -1
        if time < 0:
            raise LandingError(
                f"relation {relation!r}: the stream has updates at time {value}; "
                "epochs are numbered from 0"
            )
        files = sorted(f for f in folder.iterdir() if not f.name.startswith((".", "_")))
        if len(files) != 1:
            raise LandingError(
                f"relation {relation!r}, epoch {time}: Spark wrote {len(files)} files, "
                "expected exactly one"
            )
        parts[time] = files[0]
    return dict(sorted(parts.items()))


def _check_folder(folder: Path, name: str) -> None:
    """Refuse a folder that already holds a plain file other than `name`."""
    if not folder.is_dir():
        return
    others = sorted(
        p.name for p in folder.iterdir() if not p.name.startswith((".", "_")) and p.name != name
    )
    if others:
        raise LandingError(
            f"{folder}: already holds {others}; an epoch folder must contain only {name} "
            "(remove the other files or land into an empty directory)"
        )


def _publish(part: Path, staged: Path, folder: Path, name: str) -> None:
    """Move `part` to ``folder / name`` so that readers see all of it or nothing."""
    staged.mkdir(parents=True)
    os.replace(part, staged / name)
    try:
        # Renaming onto a missing (or empty) folder brings the folder in with its file.
        os.rename(staged, folder)
        return
    except OSError:
        if not folder.is_dir():
            raise
    hidden = folder / f".{name}.incoming"
    os.replace(staged / name, hidden)
    os.replace(hidden, folder / name)
