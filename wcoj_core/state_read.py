"""A state's traces read back by readers outside the engine: exactly the files the manifest
lists, checked.

A trace is a list of batches; the manifest lists each batch's files (name, size, sha256), its
rows and its epoch. A trace as of an epoch is the sum of its batches up to it. Every reader here
reads **the files the manifest lists and no other** — a file dropped into a batch folder is never
read (``wcoj verify`` names it) — and checks what it reads before using it:

* `read_table` (a trace as of an epoch, consolidated: one row per tuple with a non-zero summed
  multiplicity) and `change_table` (one epoch's stored change) read with pyarrow, without a JVM:
  each file is read whole and checked against its size and digest, and each batch's files
  against its row count;
* `accumulated`, `changes_at` and `read_batches` give the same as Spark DataFrames (for the
  Dagster IO manager, `Engine.output` and `Engine.relation`, the Spark SQL check): Spark is
  handed the listed files by path, never a folder, after each was checked here — its size
  always, its digest too on a local disk unless its stamp (inode, modification and change
  times) shows it is the file written, and its rows (Parquet footers) against the batch's.

`listed` gives the batches each reads (an epoch's change, or every batch visible as of an
epoch), for a reader of its own: the lazy forms of `wcoj_assets.outputs`.

Each takes what reaches the state (`Reach`): an `Engine`, or the `StateAccess` it holds.
Columns are ``c0 .. c{k-1}`` and ``diff``. A damaged file raises `DamagedBatch` naming it and
what is wrong — only on evidence: memory running out while a file is read is `OutOfMemory`
(`wcoj_core.errors.read_failure`); an unknown trace, a trace as of an epoch before the
compaction frontier, or a change at an epoch at or before it (merged into the frontier's batch) or after the last epoch
applied (`change_batches`), `StateError`. A read uses one manifest: when a file it names is
gone because commits meanwhile retired it, the read starts again from the new manifest, which
names the epoch's batches or refuses the epoch (`_settled`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol, TypeVar

import numpy as np
import pyarrow as pa

from wcoj_core.arrow import long_array
from wcoj_core.errors import DamagedBatch, StateError
from wcoj_core.store.manifest import Batch, Manifest, Trace
from wcoj_core.traces import DIFF

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

    from wcoj_core.store.batches import Batches
    from wcoj_core.store.store import Store

__all__ = [
    "Reach",
    "accumulated",
    "change_batches",
    "change_table",
    "changes_at",
    "listed",
    "read_batches",
    "read_table",
    "trace_as_of",
]


class Reach(Protocol):
    """What the readers use to reach a state: its store, its files, Spark when asked for
    (`wcoj_core.served.StateAccess`, or an engine)."""

    @property
    def store(self) -> Store: ...

    @property
    def batches(self) -> Batches: ...

    def spark(self, reason: str) -> SparkSession: ...


def _trace(state: Reach, m: Manifest, name: str) -> Trace:
    trace = m.trace(name)
    if trace is None:
        raise StateError(f"{name!r} is not in the state at {state.store.root}")
    return trace


def trace_as_of(
    state: Reach, name: str, time: int | None, m: Manifest | None = None
) -> tuple[Trace, list[Batch]]:
    """A trace and its batches as of `time` (default: the last epoch) in `m` (default: the
    current manifest)."""
    m = state.store.current() if m is None else m
    trace = _trace(state, m, name)
    if time is not None and m.frontier is not None and time < m.frontier:
        raise StateError(
            f"history before epoch {m.frontier} was compacted in {state.store.root}; "
            f"cannot read {name!r} as of epoch {time}"
        )
    return trace, list(trace.visible(time))


def change_batches(
    state: Reach, name: str, epoch: int, m: Manifest | None = None
) -> tuple[Trace, list[Batch]]:
    """A trace and its batches at `epoch` in `m` (default: the current manifest): refused when
    the epoch's change is not what they hold — at or before the compaction frontier (merged
    into the frontier's batch) or after the last epoch applied (not committed yet)."""
    m = state.store.current() if m is None else m
    trace = _trace(state, m, name)
    if m.frontier is not None and epoch <= m.frontier:
        raise StateError(
            f"the change of {name!r} at epoch {epoch} is not kept: history up to epoch "
            f"{m.frontier} (the compaction frontier) was merged in {state.store.root}; read "
            f"a change after it, or the output as of an epoch from {m.frontier} on"
        )
    if m.epoch is None or epoch > m.epoch:
        last = "none is" if m.epoch is None else f"the last is {m.epoch}"
        raise StateError(
            f"epoch {epoch} is not applied to {state.store.root} yet ({last}): no change of "
            f"{name!r} to read"
        )
    return trace, [b for b in trace.batches if b.time == epoch]


T = TypeVar("T")


def _settled(state: Reach, read: Callable[[Manifest], T]) -> T:
    """`read` of the current manifest; when a file it names is gone or unreadable and the
    state has meanwhile committed a later generation (which may have retired it), `read` of
    that one (a few times at most: each must be a new commit)."""
    m = state.store.current()
    for _ in range(3):
        try:
            return read(m)
        except DamagedBatch:
            now = state.store.current()
            if now.generation == m.generation:
                raise
            m = now
    return read(m)


def _table(columns: tuple[str, ...], rows: np.ndarray, diff: np.ndarray) -> pa.Table:
    arrays = [long_array(rows[:, j]) for j in range(len(columns))]
    return pa.Table.from_arrays([*arrays, long_array(diff)], names=[*columns, DIFF])


def _read(state: Reach, trace: Trace, batches: list[Batch]) -> pa.Table:
    """Batches of a trace summed into one table: one row per tuple with a non-zero sum, sorted."""
    layer = state.batches.read_layer(trace.columns, batches)
    return _table(trace.columns, np.asarray(layer.rows), np.asarray(layer.diff))


def listed(
    state: Reach, name: str, epoch: int | None, *, change: bool = False
) -> tuple[Trace, list[Batch]]:
    """A trace and the batches a reader of it reads: its stored change at `epoch` (with
    `change`: `change_batches`), else every batch visible as of `epoch` (default: the last)."""
    if change and epoch is not None:
        return change_batches(state, name, epoch)
    return trace_as_of(state, name, epoch)


def read_table(state: Reach, name: str, time: int | None = None) -> pa.Table:
    """A trace as of `time` (default: the last epoch), consolidated, read with pyarrow from
    exactly the files the manifest lists, each checked (see the module)."""
    return _settled(state, lambda m: _read(state, *trace_as_of(state, name, time, m)))


def change_table(state: Reach, name: str, epoch: int) -> pa.Table:
    """A trace's stored change at `epoch` (``c0 ..``, ``diff``; empty when none), read with
    pyarrow from exactly the files the manifest lists, each checked (see the module)."""
    return _settled(state, lambda m: _read(state, *change_batches(state, name, epoch, m)))


def read_batches(state: Reach, trace: Trace, batches: list[Batch]) -> DataFrame:
    """The update triples of some batches of a trace (time dropped), unconsolidated, in Spark:
    exactly the files they list, each checked before Spark reads it (see the module)."""
    from wcoj_core.updates import update_schema

    uris = [uri for b in batches for uri in state.batches.checked_uris(b)]
    spark = state.spark("reading stored batches as Spark DataFrames")
    if not uris:
        return spark.createDataFrame([], update_schema(trace.columns, with_time=False))
    return spark.read.schema(update_schema(trace.columns)).parquet(*uris).drop("time")


def accumulated(state: Reach, name: str, time: int | None) -> DataFrame:
    """A trace as of `time` (default: the last epoch), consolidated, in Spark."""
    from wcoj_core.updates import consolidate

    trace, batches = trace_as_of(state, name, time)
    return consolidate(read_batches(state, trace, batches), trace.columns)


def changes_at(state: Reach, name: str, epoch: int) -> DataFrame:
    """A trace's stored change at `epoch` (columns.., diff), in Spark."""
    return read_batches(state, *change_batches(state, name, epoch))
