"""Traces kept in memory between epochs and steps, by whoever runs the kernel.

`Resident.index` gives a trace as of a list of its batches: read once into a `TraceIndex`,
then advanced by the missing batches only (`TraceIndex.advanced`). An index is found by the batch
paths it covers, so a replaced or merged batch is never reused stale (`rename` follows this
process's compactions); the index built from the files is kept beside the latest few, and views
of a shared base layer are given to its siblings. One `Resident` per state on the driver;
`resident_for` keeps one per state root in an executor's Python worker.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from wcoj_core.kernel.changes import data_rows
from wcoj_core.kernel.index import TraceIndex, ViewKey
from wcoj_core.kernel.layer import Layer, view_rows
from wcoj_core.memory import keep_freed_memory
from wcoj_core.query.plan import AtomView
from wcoj_core.store.batches import Batches
from wcoj_core.store.manifest import Batch
from wcoj_core.traces import DIFF

# The indexes kept per trace besides the ones built from the files, and the shards kept at once
# (a task serves one shard; a worker keeps the latest few it served).
KEEP = 4
KEEP_SHARDS = 8

# A batch as a deployment sees it: the manifest's entry (its folder, rows and listed files:
# exactly those files are read).
BatchRef = Batch


@dataclass(frozen=True, slots=True)
class Shape:
    """A shard of a trace's arrangement: the trace through `view`, columns in `order`, only the
    rows whose first column falls in shard `shard` of `shards` (`shard_of`)."""

    view: AtomView | None
    order: tuple[int, ...]
    shard: int
    shards: int

    def cut(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Relation rows of the trace as this shape's rows, and which rows they are."""
        picked = np.arange(len(rows))
        if self.view is not None and not self.view.is_identity:
            rows, picked = view_rows(self.view, rows)
        rows = rows[:, list(self.order)]
        if self.shards > 1 and self.order:
            mine = np.flatnonzero(shard_of(rows[:, 0], self.shards) == self.shard)
            rows, picked = rows[mine], picked[mine]
        return rows, picked


def shard_of(values: np.ndarray, shards: int) -> np.ndarray:
    """The shard of each value, of `shards`: a multiplicative hash, so neighbouring ids spread.

    >>> shard_of(np.array([0, 1, 2, 3]), 1).tolist()
    [0, 0, 0, 0]
    >>> sorted(set(shard_of(np.arange(1000), 3).tolist()))
    [0, 1, 2]
    """
    mixed = values.astype(np.int64).view(np.uint64) * np.uint64(0x9E3779B97F4A7C15)
    return ((mixed >> np.uint64(33)) % np.uint64(shards)).astype(np.int64)


class Resident:
    """Indexes of a state's traces, each as of some of its batches."""

    def __init__(self, batches: Batches) -> None:
        keep_freed_memory()  # this process reuses its arrays' memory (see `wcoj_core.memory`)
        self.batches = batches
        self._built: dict[str, list[TraceIndex]] = {}
        self._latest: dict[str, list[TraceIndex]] = {}
        self._views: dict[str, tuple[Layer, dict[ViewKey, Layer]]] = {}
        self._shaped: list[str] = []  # shard indexes, least recently used first
        self.reads = 0  # batches read from files, for tests and metrics

    def read(
        self, columns: Sequence[str], batches: Sequence[BatchRef], shape: Shape | None = None
    ) -> Layer:
        """Batches of a trace as one consolidated layer (of a shard, for a `shape`: read a
        record batch at a time, so only the shard is ever held whole)."""
        self.reads += len(batches)
        if shape is None:
            return self.batches.read_layer(columns, batches)
        rows: list[np.ndarray] = []
        diffs: list[np.ndarray] = []
        for batch in batches:
            for chunk in self.batches.iter_chunks(batch, columns):
                cut, picked = shape.cut(data_rows(chunk, columns))
                rows.append(cut)
                diffs.append(chunk.column(DIFF).to_numpy(zero_copy_only=False)[picked])
        width = len(shape.order)
        if not rows:
            return Layer.empty(width)
        return Layer.build(np.concatenate(rows), np.concatenate(diffs))

    def index(
        self,
        name: str,
        columns: tuple[str, ...],
        batches: Sequence[BatchRef],
        shape: Shape | None = None,
    ) -> TraceIndex:
        """The trace `name` as of exactly `batches` (in manifest order); for a `shape`, that
        shard of one of its arrangements (its rows already in the shape's columns)."""
        key = name if shape is None else f"{name}|{shape}"
        if shape is not None:
            self._shaped = [k for k in self._shaped if k != key] + [key]
            while len(self._shaped) > KEEP_SHARDS:
                self.forget(self._shaped.pop(0))
        found = self._find(key, columns, batches, shape)
        self._share_views(key, found)
        return found

    def _find(
        self,
        key: str,
        columns: tuple[str, ...],
        batches: Sequence[BatchRef],
        shape: Shape | None,
    ) -> TraceIndex:
        paths = tuple(b.path for b in batches)
        start: TraceIndex | None = None
        for known in self._known(key):
            if known.paths == paths:
                return known
            covered = len(known.paths)
            if paths[:covered] == known.paths and (start is None or covered > len(start.paths)):
                start = known
        shaped = columns if shape is None else tuple(f"c{i}" for i in range(len(shape.order)))
        if start is None:
            built = TraceIndex.of(shaped, self.read(columns, batches, shape), paths)
            self._keep(self._built, key, built)
            return built
        index = start
        for ref in batches[len(start.paths) :]:
            index = index.advanced(self.read(columns, [ref], shape), ref.path)
        self._keep(self._latest, key, index)
        return index

    def advance(self, name: str, index: TraceIndex, delta: Layer, path: str) -> TraceIndex:
        """Keep `index` advanced by a batch this process has just written (not read back)."""
        advanced = index.advanced(delta, path)
        self._keep(self._latest, name, advanced)
        return advanced

    def rename(self, name: str, old: Sequence[str], new: Sequence[str]) -> None:
        """Follow a compaction: an index covering exactly `old` now covers `new` (same rows)."""
        old_paths, new_paths = tuple(old), tuple(new)
        for pool in (self._built, self._latest):
            pool[name] = [
                TraceIndex(i.columns, i.base, i.recent, new_paths, i.derived)
                if i.paths == old_paths
                else i
                for i in pool.get(name, [])
            ]

    def forget(self, name: str) -> None:
        for pool in (self._built, self._latest):
            pool.pop(name, None)
        self._views.pop(name, None)

    def _keep(self, pool: dict[str, list[TraceIndex]], name: str, index: TraceIndex) -> None:
        kept = pool.setdefault(name, [])
        kept[:] = [*kept[-(KEEP - 1) :], index]

    def _known(self, name: str) -> list[TraceIndex]:
        return [*self._built.get(name, []), *self._latest.get(name, [])]

    def _share_views(self, name: str, index: TraceIndex) -> None:
        """Give `index` every view of its base layer a sibling index has built, so that a rule
        reading another view than the step before does not sort the base again."""
        pool = self._views.get(name)
        if pool is None or pool[0] is not index.base:
            pool = (index.base, {})
            self._views[name] = pool
        for other in [*self._known(name), index]:
            if other.base is index.base:
                pool[1].update({k: v for k, v in other.derived.items() if k[0] == "base"})
        index.derived.update(pool[1])


# The states whose indexes a process keeps at once (the most recently used ones).
KEEP_STATES = 2
_WORKER: dict[str, Resident] = {}
_WORKER_LOCK = threading.Lock()


def resident_for(root: str) -> Resident:
    """This process's `Resident` for a state root, kept while the process lives (a Spark Python
    worker is reused from task to task, so an executor keeps its indexes between epochs) and
    dropped once `KEEP_STATES` other states were used since."""
    with _WORKER_LOCK:
        resident = _WORKER.pop(root, None) or Resident(Batches(root))
        _WORKER[root] = resident  # the most recent last
        while len(_WORKER) > KEEP_STATES:
            _WORKER.pop(next(iter(_WORKER)))
        return resident
