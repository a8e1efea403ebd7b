"""Persisted state: traces of update batches under a state directory, and atomic manifests.

Layout::

    <state>/manifests/0000000007.json   one file per committed generation, never rewritten
    <state>/traces/<trace-dir>/<batch>/  Parquet files of one batch of update triples

A *trace* is a named collection of update triples (a relation, a counts arrangement, a query's
output) stored as immutable batches, each consolidated and stamped with one time. The current
manifest (the highest generation) lists the live batches of every trace and the last applied
epoch. Writers stage new batches in fresh directories, then commit a new manifest by creating the
next generation's file exclusively: a crash before that leaves the previous state intact (the
staged batches are orphans, removed later), and of two writers racing for the same generation
exactly one wins.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import os
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

from pyspark.sql import DataFrame, Observation, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import StructType

from wcoj_core import files
from wcoj_core.errors import ConcurrentCommit, StateError
from wcoj_core.updates import DIFF, TIME, update_schema

FORMAT = 1
KEEP_MANIFESTS = 8
ORPHAN_AGE = 3600.0


@dataclass(frozen=True, slots=True)
class Batch:
    """One immutable batch of a trace: its directory (relative to the state), time and row count.

    `inputs` is the provenance of a derived batch: a digest of the batches it was computed from
    (see `wcoj_core.history.History.current`); empty for batches that are inputs themselves.
    """

    path: str
    time: int
    rows: int
    inputs: str = ""


@dataclass(frozen=True, slots=True)
class Trace:
    """A named collection of update triples over long `columns`, as a list of batches."""

    name: str
    columns: tuple[str, ...]
    batches: tuple[Batch, ...] = ()

    def visible(self, time: int | None, strict: bool = False) -> tuple[Batch, ...]:
        """The batches whose updates are visible at `time` (all of them for ``None``)."""
        if time is None:
            return self.batches
        return tuple(b for b in self.batches if (b.time < time if strict else b.time <= time))

    def rows(self, time: int | None = None, strict: bool = False) -> int:
        """Stored rows visible at `time`; 0 means the collection is certainly empty."""
        return sum(b.rows for b in self.visible(time, strict))

    def with_batch(self, batch: Batch) -> Trace:
        return replace(self, batches=(*self.batches, batch))

    def replacing(self, batch: Batch) -> Trace:
        """The trace with `batch` in place of whatever it held at the batch's time."""
        kept = tuple(b for b in self.batches if b.time != batch.time)
        return replace(self, batches=tuple(sorted((*kept, batch), key=lambda b: b.time)))


@dataclass(frozen=True, slots=True)
class Manifest:
    """One committed generation of the state."""

    generation: int = 0
    epoch: int | None = None
    traces: Mapping[str, Trace] = field(default_factory=dict)
    frontier: int | None = None  # history at or before it is compacted into one batch

    def trace(self, name: str) -> Trace | None:
        return self.traces.get(name)

    def with_trace(self, trace: Trace) -> Manifest:
        return replace(self, traces={**self.traces, trace.name: trace})

    def to_json(self) -> str:
        return json.dumps(
            {
                "format": FORMAT,
                "generation": self.generation,
                "epoch": self.epoch,
                "frontier": self.frontier,
                "traces": {
                    name: {
                        "columns": list(t.columns),
                        "batches": [
                            [b.path, b.time, b.rows, *([b.inputs] if b.inputs else [])]
                            for b in t.batches
                        ],
                    }
                    for name, t in sorted(self.traces.items())
                },
            },
            indent=1,
        )

    @staticmethod
    def from_json(text: str, source: str) -> Manifest:
        try:
            raw = json.loads(text)
            if raw.get("format") != FORMAT:
                raise StateError(f"{source}: unsupported state format {raw.get('format')!r}")
            traces = {
                name: Trace(
                    name,
                    tuple(t["columns"]),
                    tuple(
                        Batch(p, int(time), int(rows), str(inputs[0]) if inputs else "")
                        for p, time, rows, *inputs in t["batches"]
                    ),
                )
                for name, t in raw["traces"].items()
            }
            return Manifest(int(raw["generation"]), raw["epoch"], traces, raw.get("frontier"))
        except (ValueError, KeyError, TypeError) as e:
            raise StateError(f"{source}: corrupt manifest ({e})") from e


def trace_dir(name: str) -> str:
    """A directory name for a trace: readable prefix plus a hash of the full name.

    >>> trace_dir("rel/edge").startswith("rel-edge-")
    True
    """
    readable = "".join(ch if ch.isalnum() else "-" for ch in name)[:40]
    digest = hashlib.sha1(name.encode()).hexdigest()[:10]
    return f"{readable}-{digest}"


class StateStore:
    """A state directory: reads manifests, stages batches, commits generations.

    The directory may be a local path or any URI Spark can write (``hdfs://``, ``s3a://``, ...);
    see `wcoj_core.files`.
    """

    def __init__(
        self, spark: SparkSession, root: str | os.PathLike[str], cache: bool = False
    ) -> None:
        self.spark = spark
        self.files = files.files_for(spark, os.fspath(root))
        self.root = self.files.root
        self.cache = cache
        self._frames: dict[str, DataFrame] = {}
        self._parsed: dict[str, Manifest] = {}  # generations read, by file name

    def uri(self, rel: str) -> str:
        """The full path of a stored batch, for Spark."""
        return self.files.uri(rel)

    def _generations(self) -> list[str]:
        names = [n for n, _ in self.files.list("manifests") if n.endswith(".json")]
        return sorted(n for n in names if n.removesuffix(".json").isdigit())

    def _manifest(self, name: str) -> Manifest:
        """A committed generation (parsed once: a generation's file is never rewritten)."""
        found = self._parsed.get(name)
        if found is None:
            rel = f"manifests/{name}"
            found = Manifest.from_json(self.files.read_text(rel), self.files.uri(rel))
            self._parsed[name] = found
            while len(self._parsed) > 2 * KEEP_MANIFESTS:
                self._parsed.pop(next(iter(self._parsed)))
        return found

    # -- manifests -------------------------------------------------------------------------
    def current(self) -> Manifest:
        """The manifest of the highest committed generation (an empty one for a new state)."""
        try:
            gens = self._generations()
            return self._manifest(gens[-1]) if gens else Manifest()
        except OSError as e:
            raise StateError(f"state {self.root}: cannot read ({e.strerror or e})") from e

    def commit(self, manifest: Manifest, expected: Manifest) -> Manifest:
        """Commit `manifest` as the generation after `expected`, or fail if someone else did."""
        new = replace(manifest, generation=expected.generation + 1)
        try:
            created = self.files.create_exclusive(
                f"manifests/{new.generation:010d}.json", new.to_json()
            )
        except OSError as e:
            raise StateError(f"state {self.root}: cannot commit ({e.strerror or e})") from e
        except Exception as e:  # a Java exception from a Hadoop file system
            raise StateError(f"state {self.root}: cannot commit ({_first_line(e)})") from e
        if not created:
            raise ConcurrentCommit(
                f"state {self.root}: generation {new.generation} was committed by another "
                f"writer while this one was working; nothing was applied, reload and retry"
            )
        self._prune(new)
        self._release({b.path for t in new.traces.values() for b in t.batches})
        return new

    def _prune(self, current: Manifest) -> None:
        """Drop old manifest files, the batches only they referenced, and stale orphans.

        A batch that no kept manifest references was either retired (by compaction; it was in
        a manifest pruned now or earlier) or staged by a writer that failed. A staged batch
        younger than `ORPHAN_AGE` seconds may belong to a writer still at work: it stays.
        """
        gens = self._generations()
        kept, dropped = gens[-KEEP_MANIFESTS:], gens[:-KEEP_MANIFESTS]
        live: set[str] = {b.path for t in current.traces.values() for b in t.batches}
        retired: set[str] = set()
        for paths, names in ((live, kept), (retired, dropped)):
            for name in names:
                try:
                    m = self._manifest(name)
                except (StateError, OSError):
                    return  # never delete data on a doubt
                paths.update(b.path for t in m.traces.values() for b in t.batches)
        for name in dropped:
            self.files.delete(f"manifests/{name}")
        now = time.time()
        for tdir, _ in self.files.list("traces"):
            for bdir, mtime in self.files.list(f"traces/{tdir}"):
                rel = f"traces/{tdir}/{bdir}"
                if rel in live:
                    continue
                if rel in retired or now - mtime > ORPHAN_AGE:
                    self.files.delete(rel)

    def discard(self, paths: Sequence[str]) -> None:
        """Remove staged batches that will never be committed."""
        for p in paths:
            frame = self._frames.pop(p, None)
            if frame is not None:
                frame.unpersist()
            self.files.delete(p)

    # -- batches ---------------------------------------------------------------------------
    def write_batch(
        self, trace: Trace, df: DataFrame, time: int, partitions: int = 1, inputs: str = ""
    ) -> Batch:
        """Write update triples (trace columns + diff) as a new batch at `time`; count its rows.

        The row count comes from an observation on the write itself, not a second job.
        """
        rel = f"traces/{trace_dir(trace.name)}/b-s-{time}-{uuid.uuid4().hex[:12]}"
        obs = Observation()
        out = df.select(
            *[F.col(c).cast("long") for c in trace.columns],
            F.lit(time).cast("long").alias(TIME),
            F.col(DIFF).cast("long"),
        ).observe(obs, F.count(F.lit(1)).alias("rows"))
        try:
            out.coalesce(partitions).write.mode("errorifexists").parquet(self.uri(rel))
        except Exception as e:
            with contextlib.suppress(Exception):  # cleaning up must not hide the failure
                self.files.delete(rel)
            if isinstance(e, OSError):
                raise StateError(f"state {self.root}: cannot write a batch ({e})") from e
            cause = storage_failure(e)
            if cause is not None:
                raise StateError(
                    f"state {self.root}: cannot write a batch ({cause}); nothing was applied"
                ) from e
            raise
        rows = int((obs.get or {}).get("rows", 0))
        return Batch(rel, time, rows, inputs)

    def read(self, trace: Trace, batches: Sequence[Batch]) -> DataFrame:
        """The update triples of some batches of a trace, unconsolidated across batches."""
        schema = update_schema(trace.columns)
        live = [b for b in batches if b.rows > 0]
        if not live:
            return self.spark.createDataFrame([], schema)
        if not self.cache:
            return self.spark.read.schema(schema).parquet(*[self.uri(b.path) for b in live])
        frames = [self._cached(b, schema) for b in live]
        return functools.reduce(DataFrame.union, frames)

    # -- the cache of hot batches ------------------------------------------------------------
    # A batch never changes once written (its path is new), so a batch read once can be kept in
    # Spark's memory for every later epoch that reads it: the big early batches of a relation
    # are scanned from memory instead of Parquet. Batches that leave the state (compacted away,
    # discarded) leave the cache.
    def _cached(self, batch: Batch, schema: StructType) -> DataFrame:
        frame = self._frames.get(batch.path)
        if frame is None:
            frame = self.spark.read.schema(schema).parquet(self.uri(batch.path)).cache()
            self._frames[batch.path] = frame
        return frame

    def _release(self, live: set[str]) -> None:
        for path in [p for p in self._frames if p not in live]:
            self._frames.pop(path).unpersist()


# How a storage failure reads in a Java exception chain (Spark wraps it several times).
STORAGE_FAILURES = (
    "No space left on device",
    "Disk quota exceeded",
    "File too large",
    "Read-only file system",
    "Permission denied",
    "Operation not permitted",
    "Mkdirs failed",
    "Not a directory",
    "Parent path is not a directory",
    "AccessDeniedException",
)


def storage_failure(e: BaseException) -> str | None:
    """The storage failure behind a Spark write error (full disk, unwritable path), if any."""
    text = str(e)
    java = getattr(e, "java_exception", None)
    if java is not None:
        try:
            text += "\n" + str(java.toString())
            cause = java.getCause()
            while cause is not None:
                text += "\n" + str(cause.toString())
                cause = cause.getCause()
        except Exception:  # the gateway may be gone
            pass
    for phrase in STORAGE_FAILURES:
        if phrase in text:
            return phrase
    return None


def _first_line(e: BaseException) -> str:
    return (str(e).strip().splitlines() or [type(e).__name__])[0]
