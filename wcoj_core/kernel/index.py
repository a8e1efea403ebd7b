"""A trace held in memory as of some time, and what one epoch's join reads from the traces.

* `TraceIndex` — one trace as a large **base** layer plus a small **recent** layer holding the
  batches added since the base was built; `advanced` adds one batch, merging recent into the
  base once it outgrows a share of it (so an epoch costs a merge only now and then). It records
  the batches it covers (`paths`): whoever keeps it checks that against the state's manifest.
* `EpochLayers` — the traces as of the epoch's *old* state (indexes) plus the epoch's changes
  (deltas): a rule reads any trace, through any view, as of old (before the epoch), new (up to
  it) or only its delta.

Views and column orders derived from a layer are memoized on the index that owns the layer, so
every rule of every query reading the same view shares one sorted copy.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Protocol

from wcoj_core.kernel.layer import Layer, arranged, merged
from wcoj_core.query.plan import AtomView, Version

# Recent is merged into the base once it holds more than this share of the base's rows (and at
# least `MERGE_MIN_ROWS`): rare enough to amortize, small enough to keep range lookups cheap.
MERGE_SHARE = 0.05
MERGE_MIN_ROWS = 50_000

# A view of a layer: (which layer, the atom's view or None for the trace as stored, the order of
# its columns).
ViewKey = tuple[str, AtomView | None, tuple[int, ...]]


@dataclass
class TraceIndex:
    """One trace as base + recent layers, and the batches they cover (in manifest order)."""

    columns: tuple[str, ...]
    base: Layer
    recent: Layer
    paths: tuple[str, ...]
    derived: dict[ViewKey, Layer] = field(default_factory=dict)

    @classmethod
    def of(cls, columns: tuple[str, ...], layer: Layer, paths: tuple[str, ...]) -> TraceIndex:
        """A trace whose batches `paths` hold `layer` (consolidated)."""
        return cls(columns, layer, Layer.empty(len(columns)), paths)

    def __len__(self) -> int:
        return len(self.base) + len(self.recent)

    def layer(self, which: str, view: AtomView | None, order: tuple[int, ...]) -> Layer:
        """A layer (``base`` or ``recent``) through a view, columns in `order`, memoized."""
        key = (which, view, order)
        if key not in self.derived:
            raw = self.base if which == "base" else self.recent
            self.derived[key] = arranged(raw, view, order)
        return self.derived[key]

    def layers(self, view: AtomView | None, order: tuple[int, ...]) -> list[Layer]:
        """The whole trace through a view: the base and, when it holds rows, recent."""
        out = [self.layer("base", view, order)]
        if len(self.recent):
            out.append(self.layer("recent", view, order))
        return out

    def advanced(self, delta: Layer, path: str) -> TraceIndex:
        """The index after one more batch: recent absorbs it, merged into base when large."""
        recent = merged(self.recent, delta)
        paths = (*self.paths, path)
        if len(recent) > max(MERGE_MIN_ROWS, MERGE_SHARE * len(self.base)):
            return TraceIndex.of(self.columns, merged(self.base, recent), paths)
        kept = {k: v for k, v in self.derived.items() if k[0] == "base"}
        return TraceIndex(self.columns, self.base, recent, paths, kept)


class Layers(Protocol):
    """What a rule reads: any trace, through any view, as of old, new or only its delta."""

    def layers(
        self, name: str, view: AtomView | None, order: tuple[int, ...], version: Version
    ) -> list[Layer]: ...

    def delta(self, name: str, view: AtomView | None, order: tuple[int, ...]) -> Layer: ...


@dataclass
class EpochLayers:
    """What one epoch's join reads: every trace as of the old state, plus the epoch's changes.

    A trace missing from `deltas` did not change at the epoch. `arrange` makes a delta's view
    in a column order (`arranged`; a deployment bounding its memory passes one that sorts a
    large delta a run at a time, `wcoj_core.spill`).
    """

    traces: Mapping[str, TraceIndex]
    deltas: Mapping[str, Layer]
    _derived: dict[tuple[str, AtomView | None, tuple[int, ...]], Layer] = field(
        default_factory=dict
    )
    arrange: Callable[[Layer, AtomView | None, tuple[int, ...]], Layer] = arranged

    def delta(self, name: str, view: AtomView | None, order: tuple[int, ...]) -> Layer:
        """The epoch's changes of a trace through `view`, columns in `order` (may be empty)."""
        key = (name, view, order)
        if key not in self._derived:
            raw = self.deltas.get(name)
            if raw is None:
                return Layer.empty(len(order))
            self._derived[key] = self.arrange(raw, view, order)
        return self._derived[key]

    def layers(
        self, name: str, view: AtomView | None, order: tuple[int, ...], version: Version
    ) -> list[Layer]:
        """The trace (through `view`, columns in `order`) as of old, new, or only its delta."""
        out: list[Layer] = []
        if version is not Version.DELTA:
            out += self.traces[name].layers(view, order)
        if version is not Version.OLD and name in self.deltas:
            out.append(self.delta(name, view, order))
        return out
