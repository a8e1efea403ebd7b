"""The keyed path: a small epoch evaluated on the driver against a resident index of the state.

A small epoch touches a few thousand keys, yet every Spark job of the dataflow path streams the
whole arrangement it reads: a 1,000-change epoch on a graph of millions of edges costs seconds,
most of it fixed. The keyed path makes an epoch's cost follow its keys instead. The driver keeps
every arrangement the plans read (relations and counts) as key-sorted numpy arrays, and a rule
looks its prefixes up by binary search: counting is a lookup, proposing enumerates a key range,
validating is a lookup. It is the same plan and the same algorithm as `wcoj_core.extend` (count,
pick the fewest, propose, validate, filters as soon as their variables are bound); only the
access path differs.

The resident index is a cache of the committed state, never a second copy of the truth:

* each trace is a **base** layer (consolidated, sorted) plus a small **recent** layer holding
  the epochs applied since the base was built. A lookup sums the layers, and a range sums the
  candidates found in several layers. When recent outgrows a fraction of the base it is merged
  in, so an epoch costs a merge only now and then, not a pass over the relation each time;
* the index records which batches it covers. Before an epoch it is checked against the
  manifest: batches committed by another writer are read and added; anything else (a state
  rewritten under it) rebuilds it from the files;
* what an epoch writes (relation changes, counts changes, output changes) is written as Parquet
  batches of the same schema the Spark path writes, staged and committed by the same
  manifest protocol, so either path can continue from the other's state.

Sorting many columns at once: a row of ``k`` longs is encoded as ``8k`` big-endian bytes with the
sign bit flipped, so byte order is numeric lexicographic order and numpy's ``searchsorted`` works
on whole rows (and, through a strided view, on any leading columns).
"""

from __future__ import annotations

import os
import shutil
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from wcoj_core.arrangement import counts_trace_name, relation_trace_name
from wcoj_core.errors import StateError
from wcoj_core.query.ir import CmpOp, Const, Filter, Var
from wcoj_core.query.plan import AtomView, DeltaRule, Extender, Plan, Version
from wcoj_core.state import Batch, Manifest, Trace, trace_dir
from wcoj_core.updates import DIFF, TIME

I64 = np.int64
U64 = np.uint64
_SIGN = np.uint64(1 << 63)
# Recent is merged into the base once it holds more than this share of the base's rows (and at
# least `MERGE_MIN_ROWS`): rare enough to amortize, small enough to keep range lookups cheap.
MERGE_SHARE = 0.05
MERGE_MIN_ROWS = 50_000
# A rule takes its delta tuples this many at a time (see `run_rule`).
CHUNK_ROWS = 1 << 20


def encode(rows: np.ndarray) -> np.ndarray:
    """Rows of longs as order-preserving byte strings: one numpy ``void`` per row.

    >>> rows = np.array([[1, -2], [-1, 5], [1, -3]])
    >>> np.argsort(encode(rows), kind="stable").tolist()
    [1, 2, 0]
    """
    width = rows.shape[1]
    flipped = (np.ascontiguousarray(rows, dtype=I64).view(np.uint64) ^ _SIGN).astype(">u8")
    return np.ascontiguousarray(flipped).view(f"V{8 * width}").reshape(len(rows))


@dataclass(frozen=True, slots=True)
class Packing:
    """Rows packed into one ``uint64`` each, order-preserving, for rows inside a box.

    Column ``j`` contributes ``value - lows[j]`` in ``bits[j]`` bits, the first column highest,
    so comparing packed rows compares the rows lexicographically, and the first ``p`` columns of
    a packed row are its top bits. A layer whose columns' spans fit in 64 bits together (vertex
    ids of any graph that fits in memory) is searched as plain integers, several times faster
    than the byte strings of `encode`; a probe outside the box is known absent without a search.

    >>> pk = Packing.of(np.array([[5, -1], [7, 2]]))
    >>> pk.bits, pk.pack(np.array([[5, -1], [7, 2], [8, 0]]))[1].tolist()
    ((2, 2), [True, True, False])
    """

    lows: tuple[int, ...]
    highs: tuple[int, ...]
    bits: tuple[int, ...]

    @classmethod
    def of(cls, rows: np.ndarray) -> Packing | None:
        """The tightest packing of `rows` (non-empty), or None when it needs more than 64 bits."""
        lows = tuple(int(v) for v in rows.min(axis=0))
        highs = tuple(int(v) for v in rows.max(axis=0))
        bits = tuple((h - lo).bit_length() for lo, h in zip(lows, highs, strict=True))
        return cls(lows, highs, bits) if sum(bits) <= 64 else None

    def shift(self, p: int) -> int:
        """How far a packed row is shifted right to leave its first `p` columns."""
        return sum(self.bits[p:])

    def pack(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The first ``rows.shape[1]`` columns packed, and which rows lie inside the box."""
        out = np.zeros(len(rows), dtype=U64)
        inside = np.ones(len(rows), dtype=bool)
        for j in range(rows.shape[1]):
            col = rows[:, j]
            inside &= (col >= self.lows[j]) & (col <= self.highs[j])
            if self.bits[j] == 0:
                continue
            # Wrapping subtraction: exact for every value inside the box (the others are masked).
            offset = col.astype(I64, copy=False).view(U64) - U64(self.lows[j] % (1 << 64))
            out = offset if self.bits[j] == 64 else (out << U64(self.bits[j])) | offset
        out[~inside] = 0
        return out, inside


def _consolidate_sorted(
    rows: np.ndarray, diff: np.ndarray, keys: np.ndarray | None
) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """Sum the diffs of equal adjacent rows (rows sorted) and drop zeros."""
    starts = np.ones(len(rows), dtype=bool)
    if keys is not None:
        starts[1:] = keys[1:] != keys[:-1]
    else:
        starts[1:] = np.any(rows[1:] != rows[:-1], axis=1)
    first = np.flatnonzero(starts)
    sums = np.add.reduceat(diff, first).astype(I64)
    nonzero = sums != 0
    picked = first[nonzero]
    return rows[picked], sums[nonzero], None if keys is None else keys[picked]


class Layer:
    """Consolidated rows (no zero diffs), sorted lexicographically, with binary-search lookups.

    Searches run on each row's packed ``uint64`` when the layer's columns fit (`Packing`), on
    its `encode` bytes otherwise; both orders equal the rows' lexicographic order.
    """

    __slots__ = ("_keys", "_packing", "diff", "rows")

    def __init__(
        self,
        rows: np.ndarray,
        diff: np.ndarray,
        packing: Packing | None = None,
        packed: np.ndarray | None = None,
    ) -> None:
        self.rows = rows
        self.diff = diff
        self._packing = packing
        self._keys: dict[int, np.ndarray] = {} if packed is None else {rows.shape[1]: packed}

    @classmethod
    def sort(cls, rows: np.ndarray, diff: np.ndarray, *, consolidate: bool = False) -> Layer:
        """A layer of `rows` in any order (consolidated first when asked: equal rows summed)."""
        rows = np.asarray(rows, dtype=I64)
        diff = np.asarray(diff, dtype=I64)
        width = rows.shape[1]
        if width == 0 or len(rows) == 0:
            if consolidate and len(rows):
                total = diff.sum(dtype=I64)
                keep = slice(0, 1 if total != 0 else 0)
                return cls(rows[keep], np.array([total], dtype=I64)[keep])
            return cls(rows, diff)
        packing = Packing.of(rows)
        if packing is not None:
            packed, _ = packing.pack(rows)
            order = np.argsort(packed)
            packed = packed[order]
        else:
            order = np.lexsort(rows.T[::-1])
            packed = None
        rows, diff = rows[order], diff[order]
        if consolidate:
            rows, diff, packed = _consolidate_sorted(rows, diff, packed)
        return cls(rows, diff, packing, packed)

    @classmethod
    def build(cls, rows: np.ndarray, diff: np.ndarray) -> Layer:
        """Rows in any order, equal rows summed, zeros dropped."""
        return cls.sort(rows, diff, consolidate=True)

    @classmethod
    def empty(cls, width: int) -> Layer:
        return cls(np.zeros((0, width), dtype=I64), np.zeros(0, dtype=I64))

    def __len__(self) -> int:
        return len(self.diff)

    @property
    def width(self) -> int:
        return self.rows.shape[1]

    @property
    def packing(self) -> Packing | None:
        if self._packing is None and len(self) and self.width:
            self._packing = Packing.of(self.rows)
        return self._packing

    def _sorted_keys(self, p: int) -> np.ndarray:
        """The sorted search keys of the first `p` columns (packed, or bytes)."""
        if p not in self._keys:
            packing = self.packing
            if packing is not None:
                full = self._sorted_keys(self.width) if p < self.width else None
                if full is None:
                    self._keys[p] = packing.pack(self.rows)[0]
                else:
                    shift = packing.shift(p)
                    self._keys[p] = full >> U64(shift) if shift < 64 else np.zeros_like(full)
            elif p == self.width:
                self._keys[p] = encode(self.rows)
            else:
                raw = self._sorted_keys(self.width).view(np.uint8).reshape(len(self), -1)
                self._keys[p] = raw[:, : 8 * p].view(f"V{8 * p}").reshape(len(self))
        return self._keys[p]

    def _probe(self, keys: np.ndarray) -> tuple[np.ndarray, np.ndarray | None]:
        """Keys in the layer's search encoding; with packing, which keys can be present at all."""
        packing = self.packing
        if packing is None:
            return encode(keys), None
        return packing.pack(keys)

    def ranges(self, keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """For each key (the first ``p`` columns), the half-open range of rows starting with it."""
        m, p = keys.shape
        if p == 0 or len(self) == 0:
            return np.zeros(m, dtype=I64), np.full(m, len(self), dtype=I64)
        sorted_keys = self._sorted_keys(p)
        probe, inside = self._probe(keys)
        lo = np.searchsorted(sorted_keys, probe, "left").astype(I64, copy=False)
        hi = np.searchsorted(sorted_keys, probe, "right").astype(I64, copy=False)
        if inside is not None:
            hi[~inside] = lo[~inside]
        return lo, hi

    def lookup(self, rows: np.ndarray) -> np.ndarray:
        """The diff of each row (0 when absent)."""
        out = np.zeros(len(rows), dtype=I64)
        if self.packing is None or rows.shape[1] != self.width or len(rows) == 0:
            lo, hi = self.ranges(rows)
            found = hi > lo
        else:
            # Whole rows are unique: one search, then "is it this row?" (half the work of a range).
            keys = self._sorted_keys(self.width)
            probe, inside = self.packing.pack(rows)
            lo = np.minimum(np.searchsorted(keys, probe, "left"), len(self) - 1)
            found = inside & (keys[lo] == probe)
        out[found] = self.diff[lo[found]]
        return out

    def narrow(
        self, keys: np.ndarray, lo: np.ndarray, hi: np.ndarray, bounds: Sequence[Bound]
    ) -> tuple[np.ndarray, np.ndarray]:
        """Narrow each key's range to the rows whose next column satisfies every bound."""
        p = keys.shape[1]
        sorted_keys = self._sorted_keys(p + 1)
        packing = self.packing
        for b in bounds:
            values = np.asarray(b.values, dtype=I64)
            if packing is None:
                # Bytes: the first row at or past the bound (lower), or past or at it (upper).
                probe = encode(np.column_stack([keys, values]).reshape(len(keys), p + 1))
                if b.lower:
                    lo = np.maximum(
                        lo, np.searchsorted(sorted_keys, probe, "left" if b.inclusive else "right")
                    )
                else:
                    hi = np.minimum(
                        hi, np.searchsorted(sorted_keys, probe, "right" if b.inclusive else "left")
                    )
                continue
            # Integers: ``> v`` is ``>= v + 1`` and ``< v`` is ``<= v - 1`` (wrapping only where
            # no value can pass). The bound is then clipped into the column's box, where it
            # packs exactly.
            low, high = packing.lows[p], packing.highs[p]
            if b.lower:
                none = values > high if b.inclusive else values >= high
                edge = values if b.inclusive else values + 1
            else:
                none = values < low if b.inclusive else values <= low
                edge = values if b.inclusive else values - 1
            edge = np.clip(edge, low, high)
            probe, _ = packing.pack(np.column_stack([keys, edge]).reshape(len(keys), p + 1))
            found = np.searchsorted(sorted_keys, probe, "left" if b.lower else "right")
            if b.lower:
                lo = np.maximum(lo, found)
            else:
                hi = np.minimum(hi, found)
            hi = np.where(none, lo, hi)
        return lo, np.maximum(hi, lo)

    def permuted(self, order: Sequence[int]) -> Layer:
        """The same rows with columns in `order`, sorted again."""
        if tuple(order) == tuple(range(self.width)):
            return self
        return Layer.sort(self.rows[:, list(order)], self.diff)


def view_of(view: AtomView, layer: Layer) -> Layer:
    """The layer seen through an atom's view: constants select, repeats select, then project.

    The projection is injective on the selected rows, so the result stays consolidated.
    """
    if view.is_identity:
        return layer
    rows = layer.rows
    keep = np.ones(len(rows), dtype=bool)
    first: dict[int, int] = {}
    for col, p in enumerate(view.pattern):
        if isinstance(p, Const):
            keep &= rows[:, col] == p.value
        elif p in first:
            keep &= rows[:, col] == rows[:, first[p]]
        else:
            first[p] = col
    cols = [first[j] for j in range(view.arity)]
    return Layer.sort(rows[keep][:, cols], layer.diff[keep])


def _arranged(layer: Layer, view: AtomView | None, order: tuple[int, ...]) -> Layer:
    """A layer through a view (None: as stored), columns in `order`, sorted."""
    return (view_of(view, layer) if view is not None else layer).permuted(order)


def lookup_sum(layers: Sequence[Layer], rows: np.ndarray) -> np.ndarray:
    """The summed diff of each row over the layers (0 when absent from all)."""
    total = np.zeros(len(rows), dtype=I64)
    for layer in layers:
        if len(layer):
            total += layer.lookup(rows)
    return total


@dataclass(frozen=True, slots=True)
class Bound:
    """A bound on the column after the key, per key: ``value > v`` (or ``>=``, ``<``, ``<=``)."""

    values: np.ndarray
    lower: bool
    inclusive: bool


def enumerate_ranges(
    layers: Sequence[Layer], keys: np.ndarray, bounds: Sequence[Bound] = ()
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Every row extending each key, summed over the layers: (key index, rest columns, diff).

    `bounds` restrict the column right after the key (a filter such as ``b < c`` on the value
    being proposed): the range is narrowed by binary search, so filtered-out candidates are
    never produced. Rows whose summed diff is 0 (a tuple deleted in a later layer) are dropped.
    """
    m, p = keys.shape
    parts: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
    touched = np.zeros(m, dtype=bool)
    for i, layer in enumerate(layers):
        if len(layer) == 0:
            continue
        lo, hi = layer.ranges(keys)
        if bounds:
            lo, hi = layer.narrow(keys, lo, hi, bounds)
        sizes = hi - lo
        if i > 0:
            touched |= sizes > 0
        total = int(sizes.sum())
        owner = np.repeat(np.arange(m, dtype=I64), sizes)
        offsets = np.cumsum(sizes) - sizes
        pos = lo[owner] + (np.arange(total, dtype=I64) - offsets[owner])
        parts.append((owner, layer.rows[pos, p:], layer.diff[pos]))
    width = (layers[0].width if layers else p) - p
    if not parts:
        return np.zeros(0, dtype=I64), np.zeros((0, width), dtype=I64), np.zeros(0, dtype=I64)
    if len(parts) == 1 or not touched.any():
        owner = np.concatenate([o for o, _, _ in parts])
        rest = np.concatenate([r for _, r, _ in parts])
        diff = np.concatenate([d for _, _, d in parts])
        return owner, rest, diff
    # Keys met in several layers: sum their rows per (key, rest); the others pass as they are.
    clean: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
    mixed: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
    for owner, rest, diff in parts:
        t = touched[owner]
        clean.append((owner[~t], rest[~t], diff[~t]))
        mixed.append((owner[t], rest[t], diff[t]))
    rows = np.column_stack(
        [np.concatenate([o for o, _, _ in mixed]), np.concatenate([r for _, r, _ in mixed])]
    )
    summed = Layer.build(rows, np.concatenate([d for _, _, d in mixed]))
    rows = summed.rows
    owner = np.concatenate([*(o for o, _, _ in clean), rows[:, 0]])
    rest = np.concatenate([*(r for _, r, _ in clean), rows[:, 1:]])
    diff = np.concatenate([*(d for _, _, d in clean), summed.diff])
    return owner, rest, diff


# -- the resident index ------------------------------------------------------------------------


@dataclass
class TraceIndex:
    """One trace as base + recent layers, and the batches they cover (in manifest order)."""

    columns: tuple[str, ...]
    base: Layer
    recent: Layer
    paths: tuple[str, ...]
    derived: dict[tuple[object, ...], Layer] = field(default_factory=dict)

    def layer(self, which: str, view: AtomView | None, order: tuple[int, ...]) -> Layer:
        """A layer (``base`` or ``recent``) through a view, columns in `order`, memoized."""
        key = (which, view, order)
        if key not in self.derived:
            raw = self.base if which == "base" else self.recent
            self.derived[key] = _arranged(raw, view, order)
        return self.derived[key]

    def advanced(self, delta: Layer, path: str) -> TraceIndex:
        """The index after one more batch: recent absorbs it, merged into base when large."""
        recent = Layer.build(
            np.concatenate([self.recent.rows, delta.rows]),
            np.concatenate([self.recent.diff, delta.diff]),
        )
        paths = (*self.paths, path)
        if len(recent) > max(MERGE_MIN_ROWS, MERGE_SHARE * len(self.base)):
            base = Layer.build(
                np.concatenate([self.base.rows, recent.rows]),
                np.concatenate([self.base.diff, recent.diff]),
            )
            return TraceIndex(self.columns, base, Layer.empty(len(self.columns)), paths)
        kept = {k: v for k, v in self.derived.items() if k[0] == "base"}
        return TraceIndex(self.columns, self.base, recent, paths, kept)


class KeyedIndex:
    """The driver-resident index of a state's relation and counts traces."""

    def __init__(self, root: str) -> None:
        self.root = root
        self.traces: dict[str, TraceIndex] = {}

    def rows(self) -> int:
        return sum(len(t.base) + len(t.recent) for t in self.traces.values())

    def sync(self, manifest: Manifest, names: Sequence[str]) -> None:
        """Make the index cover exactly the manifest's batches of the named traces."""
        for name in names:
            trace = manifest.traces[name]
            paths = tuple(b.path for b in trace.batches)
            have = self.traces.get(name)
            if have is not None and have.paths == paths:
                continue
            if have is not None and paths[: len(have.paths)] == have.paths:
                for b in trace.batches[len(have.paths) :]:
                    have = have.advanced(self.read(trace, [b]), b.path)
                self.traces[name] = have
                continue
            base = self.read(trace, trace.batches)
            self.traces[name] = TraceIndex(
                trace.columns, base, Layer.empty(len(trace.columns)), paths
            )

    def remap(self, before: Manifest, after: Manifest) -> None:
        """Follow a compaction: traces whose batches were merged keep their (equal) contents."""
        for name, index in list(self.traces.items()):
            old, new = before.traces.get(name), after.traces.get(name)
            if old is None or new is None or index.paths != tuple(b.path for b in old.batches):
                self.traces.pop(name, None)
                continue
            self.traces[name] = TraceIndex(
                index.columns,
                index.base,
                index.recent,
                tuple(b.path for b in new.batches),
                index.derived,
            )

    def read(self, trace: Trace, batches: Sequence[Batch]) -> Layer:
        """Batches of a trace as one consolidated layer (Parquet read by pyarrow)."""
        cols = list(trace.columns)
        # Spark's batches and the keyed path's differ in nullability only: read each on its own.
        tables = [
            pq.read_table(os.path.join(self.root, b.path), columns=[*cols, DIFF])
            for b in batches
            if b.rows > 0
        ]
        if not tables:
            return Layer.empty(len(cols))
        parts = [changes_layer(cols, t) for t in tables]
        return Layer.build(
            np.concatenate([p.rows for p in parts]), np.concatenate([p.diff for p in parts])
        )

    def write(self, trace: Trace, rows: np.ndarray, diff: np.ndarray, time: int) -> Batch:
        """Write rows and diffs as a new batch of `trace` at `time` (Spark's batch schema)."""
        rel = f"traces/{trace_dir(trace.name)}/b-k-{time}-{uuid.uuid4().hex[:12]}"
        folder = os.path.join(self.root, rel)
        n = len(diff)
        arrays = [pa.array(rows[:, i], type=pa.int64()) for i in range(rows.shape[1])]
        arrays += [pa.array(np.full(n, time, dtype=I64)), pa.array(diff, type=pa.int64())]
        schema = pa.schema(
            [pa.field(c, pa.int64(), nullable=False) for c in (*trace.columns, TIME, DIFF)]
        )
        try:
            os.makedirs(folder)
            pq.write_table(
                pa.Table.from_arrays(arrays, schema=schema),
                os.path.join(folder, "part-00000-keyed.snappy.parquet"),
                compression="snappy",
            )
            with open(os.path.join(folder, "_SUCCESS"), "wb"):
                pass
        except OSError as e:
            _remove(folder)
            raise StateError(
                f"state {self.root}: cannot write a batch ({e.strerror or e}); nothing was applied"
            ) from e
        return Batch(rel, time, n)


def _remove(folder: str) -> None:
    shutil.rmtree(folder, ignore_errors=True)


# -- one epoch ---------------------------------------------------------------------------------


@dataclass
class EpochLayers:
    """What a keyed epoch reads: the index (old state) plus this epoch's changes per trace."""

    index: KeyedIndex
    deltas: dict[str, Layer]
    _derived: dict[tuple[object, ...], Layer] = field(default_factory=dict)

    def _delta(self, name: str, view: AtomView | None, order: tuple[int, ...]) -> Layer:
        key = (name, view, order)
        if key not in self._derived:
            raw = self.deltas[name]
            self._derived[key] = _arranged(raw, view, order)
        return self._derived[key]

    def layers(
        self, name: str, view: AtomView | None, order: tuple[int, ...], version: Version
    ) -> list[Layer]:
        """The trace (through `view`, columns in `order`) as of old, new, or only its delta."""
        out: list[Layer] = []
        if version is not Version.DELTA:
            t = self.index.traces[name]
            out += [t.layer("base", view, order)]
            if len(t.recent):
                out.append(t.layer("recent", view, order))
        if version is not Version.OLD and name in self.deltas:
            out.append(self._delta(name, view, order))
        return out


def _cmp(op: CmpOp, left: np.ndarray, right: np.ndarray) -> np.ndarray:
    """An elementwise comparison: `CmpOp.fn` is the `operator` function, which numpy broadcasts."""
    compare: Callable[[Any, Any], Any] = op.fn
    return np.asarray(compare(left, right), dtype=bool)


@dataclass
class Prefixes:
    """Bound variables as columns, and the weight of each row."""

    cols: dict[Var, np.ndarray]
    weight: np.ndarray

    def __len__(self) -> int:
        return len(self.weight)

    def take(self, idx: np.ndarray) -> Prefixes:
        return Prefixes({v: c[idx] for v, c in self.cols.items()}, self.weight[idx])

    def where(self, mask: np.ndarray) -> Prefixes:
        return Prefixes({v: c[mask] for v, c in self.cols.items()}, self.weight[mask])

    def rows(self, vs: Sequence[Var]) -> np.ndarray:
        if not vs:
            return np.zeros((len(self), 0), dtype=I64)
        return np.column_stack([self.cols[v] for v in vs]).astype(I64, copy=False)

    def filtered(self, filters: Sequence[Filter]) -> Prefixes:
        return self.where(_filter_mask(self, filters))


@dataclass
class StepCounts:
    """What one keyed step did, as the Spark path's observations would report it."""

    var: str
    prefixes: int
    min_sum: int
    proposed: int
    validated: int

    def plus(self, other: StepCounts) -> StepCounts:
        """Both chunks' counts of the same step."""
        return StepCounts(
            self.var,
            self.prefixes + other.prefixes,
            self.min_sum + other.min_sum,
            self.proposed + other.proposed,
            self.validated + other.validated,
        )


def _support_source(x: Extender) -> tuple[str, AtomView | None, tuple[int, ...]]:
    """Where extender `x` proposes from: the trace, its view, and the columns (key, value)."""
    if x.completes:
        return relation_trace_name(x.view.relation), x.view, (*x.key, x.value)
    cols = x.support.key  # sorted view columns: key + value
    return counts_trace_name(x.support), None, tuple(cols.index(c) for c in (*x.key, x.value))


def run_rule(
    plan: Plan,
    rule: DeltaRule,
    layers: EpochLayers,
    joins: list[int],
    chunk_rows: int = CHUNK_ROWS,
) -> tuple[Prefixes, list[StepCounts]]:
    """One delta rule on the driver: start from the delta view, then count, propose, validate.

    The delta's tuples are taken `chunk_rows` at a time, so the proposals held at once stay
    bounded by a chunk's, not the whole epoch's; the counts of the chunks add up.
    """
    delta_view = plan.views[rule.delta]
    ident = tuple(range(delta_view.arity))
    (d,) = layers.layers(relation_trace_name(delta_view.relation), delta_view, ident, Version.DELTA)
    start = plan.atom_vars[rule.delta]
    found: list[tuple[Prefixes, np.ndarray]] = []
    counts: list[StepCounts] = []
    for lo in range(0, max(len(d), 1), max(chunk_rows, 1)):  # once at least: counts of 0
        part = slice(lo, lo + chunk_rows)
        prefixes = Prefixes({v: d.rows[part, i] for i, v in enumerate(start)}, d.diff[part].copy())
        bindings, made = _run_prefixes(plan, rule, prefixes, layers, joins)
        found.append((bindings, np.zeros(len(bindings), dtype=I64)))
        counts = made if not counts else [a.plus(b) for a, b in zip(counts, made, strict=True)]
    vs = [*start, *(s.var for s in rule.steps)]
    return _concat(found, list(dict.fromkeys(vs)))[0], counts


def _run_prefixes(
    plan: Plan, rule: DeltaRule, prefixes: Prefixes, layers: EpochLayers, joins: list[int]
) -> tuple[Prefixes, list[StepCounts]]:
    """A rule from the given delta tuples (as prefixes): checks, then each step in turn."""
    atom_vars = plan.atom_vars
    for c in rule.checks:
        vs = atom_vars[c.atom]
        order = tuple(range(c.view.arity))
        m = lookup_sum(
            layers.layers(relation_trace_name(c.view.relation), c.view, order, c.version),
            prefixes.rows(vs),
        )
        keep = m != 0
        prefixes = prefixes.where(keep)
        prefixes.weight *= m[keep]
        joins.append(len(prefixes))
    prefixes = prefixes.filtered(rule.start_filters)
    counts: list[StepCounts] = []
    for step in rule.steps:
        xs = step.extenders
        n = np.zeros((len(xs), len(prefixes)), dtype=I64)
        alive = np.ones(len(prefixes), dtype=bool)
        for j, x in enumerate(xs):
            keys = prefixes.rows([atom_vars[x.atom][k] for k in x.key])
            order = tuple(range(len(x.key)))
            # An empty key is a (m, 0) array: every prefix then reads the one total count.
            n[j] = lookup_sum(
                layers.layers(counts_trace_name(x.counts), None, order, x.version), keys
            )
            alive &= n[j] > 0
            joins.append(int(alive.sum()))
        prefixes, n = prefixes.where(alive), n[:, alive]
        tag = np.argmin(n, axis=0) if len(xs) > 1 else np.zeros(len(prefixes), dtype=I64)
        least = n[tag, np.arange(len(prefixes))] if len(prefixes) else np.zeros(0, dtype=I64)
        proposed_parts: list[tuple[Prefixes, np.ndarray]] = []
        leftover: Sequence[Filter] = step.filters
        for j, x in enumerate(xs):
            mine = prefixes.where(tag == j)
            if len(mine) == 0:
                continue
            name, view, order = _support_source(x)
            keys = mine.rows([atom_vars[x.atom][k] for k in x.key])
            found = layers.layers(name, view, order, x.version)
            bounds, leftover = _bounds(step.var, step.filters, mine)
            owner, rest, mult = enumerate_ranges(found, keys, bounds)
            grown = mine.take(owner)
            grown.cols[step.var] = rest[:, 0].copy()
            if x.completes:
                grown.weight = grown.weight * mult
            proposed_parts.append((grown, np.full(len(grown), j, dtype=I64)))
        extended, winners = _concat(proposed_parts, [*prefixes.cols, step.var])
        proposed = len(extended)
        joins.append(proposed)
        if leftover:  # the filters the proposals' bounds did not already apply
            keep = _filter_mask(extended, leftover)
            extended, winners = extended.where(keep), winners[keep]
        # validate: every extender but the winner looks the extended tuple up.
        for j, x in enumerate(xs):
            check = winners != j
            if not check.any():
                continue
            name, view, order = _support_source(x)
            vs = [atom_vars[x.atom][k] for k in (*x.key, x.value)]
            everyone = bool(check.all())
            cols = [extended.cols[v] if everyone else extended.cols[v][check] for v in vs]
            m = lookup_sum(layers.layers(name, view, order, x.version), np.column_stack(cols))
            factor = np.ones(len(extended), dtype=I64)
            factor[check] = m if x.completes else (m != 0).astype(I64)
            keep = (~check) | (factor != 0)
            joins.append(int(check.sum() - (factor[check] == 0).sum()))
            extended = extended.where(keep)
            extended.weight *= factor[keep]
            winners = winners[keep]
        counts.append(
            StepCounts(step.var.name, len(prefixes), int(least.sum()), proposed, len(extended))
        )
        prefixes = extended
    return prefixes, counts


_LOWER = {CmpOp.GT: (True, False), CmpOp.GE: (True, True)}
_UPPER = {CmpOp.LT: (False, False), CmpOp.LE: (False, True)}


def _bounds(var: Var, filters: Sequence[Filter], p: Prefixes) -> tuple[list[Bound], list[Filter]]:
    """The step's filters that compare the new variable with a bound term, as range bounds.

    Also returns the filters left over: those a range cannot apply (``!=``, or not on the new
    variable). Every proposal made within the bounds satisfies the others.
    """
    out: list[Bound] = []
    rest: list[Filter] = []
    for f in filters:
        if f.left == var and f.right != var:
            op, other = f.op, f.right
        elif f.right == var and f.left != var:
            op, other = f.op.flipped(), f.left
        else:
            rest.append(f)
            continue
        sides = {**_LOWER, **_UPPER, CmpOp.EQ: None}
        if op not in sides:
            rest.append(f)  # != cannot narrow a range
            continue
        values = np.asarray(
            p.cols[other] if isinstance(other, Var) else np.full(len(p), other.value), dtype=I64
        )
        found = sides[op]
        for lower, inclusive in [(True, True), (False, True)] if found is None else [found]:
            out.append(Bound(values, lower, inclusive))
    return out, rest


def _filter_mask(p: Prefixes, filters: Sequence[Filter]) -> np.ndarray:
    keep = np.ones(len(p), dtype=bool)
    for f in filters:
        left = p.cols[f.left] if isinstance(f.left, Var) else np.int64(f.left.value)
        right = p.cols[f.right] if isinstance(f.right, Var) else np.int64(f.right.value)
        keep &= _cmp(f.op, np.asarray(left), np.asarray(right))
    return keep


def _concat(
    parts: Sequence[tuple[Prefixes, np.ndarray]], vs: Sequence[Var]
) -> tuple[Prefixes, np.ndarray]:
    if not parts:
        empty = np.zeros(0, dtype=I64)
        return Prefixes({v: empty for v in vs}, empty), empty
    cols = {v: np.concatenate([p.cols[v] for p, _ in parts]) for v in vs}
    weight = np.concatenate([p.weight for p, _ in parts])
    return Prefixes(cols, weight), np.concatenate([t for _, t in parts])


def support_delta(layers: EpochLayers, view: AtomView) -> Layer:
    """View tuples entering (+1) or leaving (-1) the non-zero support at this epoch."""
    name = relation_trace_name(view.relation)
    order = tuple(range(view.arity))
    (delta,) = layers.layers(name, view, order, Version.DELTA)
    old = lookup_sum(layers.layers(name, view, order, Version.OLD), delta.rows)
    change = (old + delta.diff != 0).astype(I64) - (old != 0).astype(I64)
    keep = change != 0
    return Layer(delta.rows[keep], change[keep])


def counts_delta(support: Layer, key: Sequence[int]) -> Layer:
    """Support changes grouped by the key columns: a counts change."""
    return Layer.build(support.rows[:, list(key)], support.diff)


def changes_layer(columns: Sequence[str], table: pa.Table) -> Layer:
    """An epoch's changes (an Arrow table with the relation columns and diff), consolidated."""
    rows = np.column_stack(
        [table.column(c).to_numpy(zero_copy_only=False).astype(I64) for c in columns]
        or [np.zeros((table.num_rows, 0), dtype=I64)]
    ).reshape(table.num_rows, len(columns))
    return Layer.build(rows, table.column(DIFF).to_numpy(zero_copy_only=False).astype(I64))


def output_changes(
    prefixes: Sequence[Prefixes], head: Sequence[Var], distinct: bool = False
) -> tuple[np.ndarray, np.ndarray]:
    """Rules' full bindings projected on the head and summed: an output change (rows, diff).

    With `distinct` the caller knows each binding gives a different head tuple with a non-zero
    weight (see `Engine`'s `_distinct_output`): the rows are then already consolidated, and are
    returned as they come, unsorted.
    """
    if not prefixes:
        return np.zeros((0, len(head)), dtype=I64), np.zeros(0, dtype=I64)
    rows = np.concatenate([p.rows(head) for p in prefixes])
    weight = np.concatenate([p.weight for p in prefixes])
    if distinct:
        return rows, weight
    out = Layer.build(rows, weight)
    return out.rows, out.diff


def relation_traces(plans: Mapping[str, Plan]) -> list[str]:
    return sorted({relation_trace_name(r) for p in plans.values() for r in p.query.relations})
