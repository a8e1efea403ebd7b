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
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from wcoj_core.arrangement import counts_trace_name, relation_trace_name
from wcoj_core.errors import StateError
from wcoj_core.memory import keep_freed_memory
from wcoj_core.query.ir import CmpOp, Const, Filter, Var
from wcoj_core.query.plan import AtomView, DeltaRule, Extender, Plan, Step, Version
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


def _cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


# A step proposes and validates on up to this many threads (see `_step`), in pieces of at least
# this many proposals (as the counts estimate them): a smaller piece is not worth a thread.
WORKERS = max(1, min(4, _cores()))
PIECE_PROPOSALS = 1 << 18
# A batch is written as one file per this many rows, up to `WORKERS` files, written at once.
WRITE_FILE_ROWS = 1 << 21


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
        # Column by column: a reduction along axis 0 of a row-major array is several times slower.
        cols = [rows[:, j] for j in range(rows.shape[1])]
        lows = tuple(int(c.min()) for c in cols)
        highs = tuple(int(c.max()) for c in cols)
        bits = tuple((h - lo).bit_length() for lo, h in zip(lows, highs, strict=True))
        return cls(lows, highs, bits) if sum(bits) <= 64 else None

    def shift(self, p: int) -> int:
        """How far a packed row is shifted right to leave its first `p` columns."""
        return sum(self.bits[p:])

    def pack(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The first ``rows.shape[1]`` columns packed, and which rows lie inside the box."""
        return self.pack_columns([rows[:, j] for j in range(rows.shape[1])], len(rows))

    def pack_columns(
        self, cols: Sequence[np.ndarray], n: int | None = None
    ) -> tuple[np.ndarray, np.ndarray]:
        """`pack` of rows given as their first columns (`n` rows when no column is given).

        The hot paths hold their rows as separate columns: packing them here spares stacking
        them into a row array first, which would copy every value once more.
        """
        out: np.ndarray | None = None
        inside: np.ndarray | None = None
        for j, col in enumerate(cols):
            # Wrapping subtraction: exact for every value inside the box. A value below the box
            # wraps past the top of the span, and one above it lands past it: one unsigned
            # comparison tells both bounds.
            offset = col.astype(I64, copy=False).view(U64) - U64(self.lows[j] % (1 << 64))
            here = offset <= U64(self.highs[j] - self.lows[j])
            inside = here if inside is None else np.logical_and(inside, here, out=inside)
            if self.bits[j] == 0:
                continue
            if out is None:  # the columns before held one value each: no bits
                out = offset
            else:  # `offset` is ours (a fresh array): shift and merge in place
                out <<= U64(self.bits[j])
                out |= offset
        size = len(cols[0]) if cols else (n or 0)
        if out is None:
            out = np.zeros(size, dtype=U64)
        if inside is None:
            inside = np.ones(size, dtype=bool)
        elif not inside.all():
            out[~inside] = 0
        return out, inside

    def unpack(self, packed: np.ndarray) -> np.ndarray:
        """The rows of packed keys (all columns of the box), column-major.

        Column-major: every column of the result is contiguous, as the searches, gathers and
        Parquet writes of a layer read it column by column.

        >>> pk = Packing.of(np.array([[5, -1], [7, 2]]))
        >>> pk.unpack(pk.pack(np.array([[7, -1], [6, 2]]))[0]).tolist()
        [[7, -1], [6, 2]]
        """
        rows = np.empty((len(packed), len(self.bits)), dtype=I64, order="F")
        shift = sum(self.bits)
        for j, (low, bits) in enumerate(zip(self.lows, self.bits, strict=True)):
            shift -= bits
            base = U64(low % (1 << 64))
            if bits == 0:
                rows[:, j] = low
                continue
            field = packed >> U64(shift) if shift else packed.copy()
            if bits < 64:
                field &= U64((1 << bits) - 1)
            field += base  # wraps back to the value (the inverse of `pack`'s subtraction)
            rows[:, j] = field.view(I64)
        return rows


def _consolidate_sorted(
    rows: np.ndarray, diff: np.ndarray, keys: np.ndarray | None
) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """Sum the diffs of equal adjacent rows (rows sorted) and drop zeros."""
    starts = np.ones(len(rows), dtype=bool)
    if keys is not None:
        starts[1:] = keys[1:] != keys[:-1]
    else:
        starts[1:] = np.any(rows[1:] != rows[:-1], axis=1)
    if starts.all():  # no two rows equal: nothing to sum, and often nothing to drop either
        nonzero = diff != 0
        if nonzero.all():
            return rows, diff, keys
        return rows[nonzero], diff[nonzero], None if keys is None else keys[nonzero]
    first = np.flatnonzero(starts)
    sums = np.add.reduceat(diff, first).astype(I64)
    nonzero = sums != 0
    picked = first[nonzero]
    return rows[picked], sums[nonzero], None if keys is None else keys[picked]


def _columns(rows: np.ndarray) -> list[np.ndarray]:
    """The columns of a row array (views)."""
    return [rows[:, j] for j in range(rows.shape[1])]


def _stack(cols: Sequence[np.ndarray], m: int) -> np.ndarray:
    """Columns as an ``(m, len(cols))`` row array (``(m, 0)`` for no column)."""
    if not cols:
        return np.zeros((m, 0), dtype=I64)
    return np.column_stack(cols).astype(I64, copy=False).reshape(m, len(cols))


class Layer:
    """Consolidated rows (no zero diffs), sorted lexicographically, with binary-search lookups.

    Searches run on each row's packed ``uint64`` when the layer's columns fit (`Packing`), on
    its `encode` bytes otherwise; both orders equal the rows' lexicographic order.

    A layer is never changed once built: its arrays may be shared with whoever built it.
    """

    __slots__ = ("_cols", "_keys", "_packing", "_unit", "diff", "rows")

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
        self._cols: dict[int, np.ndarray] = {}
        self._unit: bool | None = None

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
            if bool((packed[1:] >= packed[:-1]).all()):
                pass  # already in order: a batch read back, or sorted rows' leading column
            elif bool((diff == diff[0]).all()):
                # One diff for all (whole relations, support changes): sorting the keys alone and
                # unpacking the rows from them gives the same layer as permuting rows and diffs
                # (equal keys are equal rows with equal diffs), without an argsort or a gather.
                packed = np.sort(packed)
                rows = packing.unpack(packed)
            else:
                order = np.argsort(packed)
                packed, rows, diff = packed[order], rows[order], diff[order]
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

    @property
    def unit(self) -> bool:
        """Whether every diff is 1 (a set): then a lookup's diff is whether the row is found,
        and multiplying by the diffs of found rows changes nothing."""
        if self._unit is None:
            self._unit = bool((self.diff == 1).all())
        return self._unit

    def col(self, j: int) -> np.ndarray:
        """Column `j` as a contiguous array (gathers from a strided column are slower)."""
        if j not in self._cols:
            self._cols[j] = np.ascontiguousarray(self.rows[:, j])
        return self._cols[j]

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

    def _probe(self, cols: Sequence[np.ndarray], m: int) -> tuple[np.ndarray, np.ndarray | None]:
        """Keys (as columns) in the layer's search encoding; with packing, which keys can be
        present at all."""
        packing = self.packing
        if packing is None:
            return encode(_stack(cols, m)), None
        return packing.pack_columns(cols, m)

    def ranges(self, keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """For each key (the first ``p`` columns), the half-open range of rows starting with it."""
        return self.ranges_of(_columns(keys), len(keys))

    def ranges_of(self, cols: Sequence[np.ndarray], m: int) -> tuple[np.ndarray, np.ndarray]:
        """`ranges` of `m` keys given as columns."""
        p = len(cols)
        if p == 0 or len(self) == 0:
            return np.zeros(m, dtype=I64), np.full(m, len(self), dtype=I64)
        sorted_keys = self._sorted_keys(p)
        probe, inside = self._probe(cols, m)
        lo = np.searchsorted(sorted_keys, probe, "left").astype(I64, copy=False)
        hi = np.searchsorted(sorted_keys, probe, "right").astype(I64, copy=False)
        if inside is not None and not inside.all():
            hi[~inside] = lo[~inside]
        return lo, hi

    def lookup(self, rows: np.ndarray) -> np.ndarray:
        """The diff of each row (0 when absent)."""
        return self.lookup_of(_columns(rows), len(rows))

    def lookup_of(self, cols: Sequence[np.ndarray], m: int) -> np.ndarray:
        """`lookup` of `m` rows given as columns."""
        if self.packing is None or len(cols) != self.width or m == 0:
            out = np.zeros(m, dtype=I64)
            lo, hi = self.ranges_of(cols, m)
            found = hi > lo
            out[found] = self.diff[lo[found]]
            return out
        lo, found = self._search_whole(cols, m)
        if self.unit:
            return found.astype(I64)
        # Read the diff at every position (in range after the clip), then keep the found ones:
        # cheaper than gathering through a mask.
        return np.where(found, self.diff[lo], 0).astype(I64, copy=False)

    def contains_of(self, cols: Sequence[np.ndarray], m: int) -> np.ndarray:
        """Whether each of `m` rows given as columns is in the layer (with a non-zero diff)."""
        if self.packing is None or len(cols) != self.width or m == 0:
            return self.lookup_of(cols, m) != 0
        return self._search_whole(cols, m)[1]

    def _search_whole(self, cols: Sequence[np.ndarray], m: int) -> tuple[np.ndarray, np.ndarray]:
        """Where each whole row (packed; `m` > 0) would be, clipped into the layer, and whether
        it is there. Whole rows are unique: one search, then "is it this row?" (half the work
        of a range)."""
        assert self.packing is not None
        keys = self._sorted_keys(self.width)
        probe, inside = self.packing.pack_columns(cols, m)
        lo = np.searchsorted(keys, probe, "left")
        np.minimum(lo, len(self) - 1, out=lo)
        found = keys[lo] == probe
        found &= inside
        return lo, found

    def narrow_of(
        self,
        cols: Sequence[np.ndarray],
        m: int,
        lo: np.ndarray,
        hi: np.ndarray,
        bounds: Sequence[Bound],
    ) -> tuple[np.ndarray, np.ndarray]:
        """Narrow each of `m` keys' ranges (keys given as columns) to the rows whose next column
        satisfies every bound."""
        p = len(cols)
        sorted_keys = self._sorted_keys(p + 1)
        packing = self.packing
        for b in bounds:
            values = np.asarray(b.values, dtype=I64)
            if packing is None:
                # Bytes: the first row at or past the bound (lower), or past or at it (upper).
                probe = encode(_stack([*cols, values], m))
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
            probe, _ = packing.pack_columns([*cols, edge], m)
            found = np.searchsorted(sorted_keys, probe, "left" if b.lower else "right")
            if b.lower:
                lo = np.maximum(lo, found)
            else:
                hi = np.minimum(hi, found)
            hi = np.where(none, lo, hi)
        return lo, np.maximum(hi, lo)

    def span_of(
        self, cols: Sequence[np.ndarray], m: int, bounds: Sequence[Bound]
    ) -> tuple[np.ndarray, np.ndarray]:
        """`ranges_of` narrowed by `narrow_of`, in half the searches on packed keys.

        Every bound is clipped into the next column's box, so the row it finds lies within its
        key's range: a lower and an upper bound alone give the range, and the key's own two
        searches are not needed (a side without a bound is the box's edge, which finds the
        key's range's end). Only empty ranges may differ from `narrow_of`'s, where they start.
        """
        packing = self.packing
        p = len(cols)
        if packing is None or not bounds or len(self) == 0:
            lo, hi = self.ranges_of(cols, m)
            return self.narrow_of(cols, m, lo, hi, bounds) if bounds else (lo, hi)
        sorted_keys = self._sorted_keys(p + 1)
        low, high = packing.lows[p], packing.highs[p]
        sides = [b for b in bounds if b.lower] or [Bound(np.full(m, low, dtype=I64), True, True)]
        sides += [b for b in bounds if not b.lower] or [
            Bound(np.full(m, high, dtype=I64), False, True)
        ]
        lo: np.ndarray | None = None
        hi: np.ndarray | None = None
        empty = np.zeros(m, dtype=bool)
        for b in sides:
            # As in `narrow_of`: ``> v`` is ``>= v + 1``, ``< v`` is ``<= v - 1``, then clipped.
            values = np.asarray(b.values, dtype=I64)
            if b.lower:
                empty |= values > high if b.inclusive else values >= high
                edge = values if b.inclusive else values + 1
            else:
                empty |= values < low if b.inclusive else values <= low
                edge = values if b.inclusive else values - 1
            probe, inside = packing.pack_columns([*cols, np.clip(edge, low, high)], m)
            empty |= ~inside  # a key outside the box has no rows
            found = np.searchsorted(sorted_keys, probe, "left" if b.lower else "right")
            found = found.astype(I64, copy=False)
            if b.lower:
                lo = found if lo is None else np.maximum(lo, found)
            else:
                hi = found if hi is None else np.minimum(hi, found)
        assert lo is not None and hi is not None
        return lo, np.maximum(np.where(empty, lo, hi), lo)

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


def _present(
    layers: Sequence[Layer], cols: Sequence[np.ndarray], m: int
) -> tuple[np.ndarray, np.ndarray | None]:
    """The rows (`m`, given as columns) whose diff summed over the layers is not 0: their
    indices, and every row's sum, or None when each present row's is 1 (one layer, a set): a
    found row is then all there is to know, and no sum is built."""
    held = [layer for layer in layers if len(layer)]
    if len(held) == 1 and held[0].unit:
        return np.flatnonzero(held[0].contains_of(cols, m)), None
    total = lookup_sum_of(layers, cols, m)
    return np.flatnonzero(total), total


def lookup_sum(layers: Sequence[Layer], rows: np.ndarray) -> np.ndarray:
    """The summed diff of each row over the layers (0 when absent from all)."""
    return lookup_sum_of(layers, _columns(rows), len(rows))


def lookup_sum_of(layers: Sequence[Layer], cols: Sequence[np.ndarray], m: int) -> np.ndarray:
    """`lookup_sum` of `m` rows given as columns."""
    total: np.ndarray | None = None
    for layer in layers:
        if len(layer):
            got = layer.lookup_of(cols, m)
            total = got if total is None else np.add(total, got, out=total)
    return np.zeros(m, dtype=I64) if total is None else total


@dataclass(frozen=True, slots=True)
class Bound:
    """A bound on the column after the key, per key: ``value > v`` (or ``>=``, ``<``, ``<=``)."""

    values: np.ndarray
    lower: bool
    inclusive: bool


@dataclass(frozen=True, slots=True)
class Found:
    """Rows `find` found extending keys: each row's key, its rest columns, its diff.

    When one layer held every row (the usual case), the rows come grouped by key, in key order:
    `sizes` then holds each key's number of rows, and a key's columns are spread over its rows
    with `np.repeat`, several times cheaper than a gather through each row's key index (built
    only when asked, by `owner`). `diff` is None when every diff is 1.
    """

    sizes: np.ndarray | None
    owners: np.ndarray | None
    rest: np.ndarray
    diff: np.ndarray | None

    def __len__(self) -> int:
        return len(self.rest)

    @property
    def owner(self) -> np.ndarray:
        """Each row's key index."""
        if self.owners is not None:
            return self.owners
        assert self.sizes is not None
        return np.repeat(np.arange(len(self.sizes), dtype=I64), self.sizes)

    def spread(self, col: np.ndarray) -> np.ndarray:
        """A column of the keys (one value per key) as a column of the rows."""
        if self.sizes is not None:
            return np.repeat(col, self.sizes)
        return col[self.owner]


def _positions(lo: np.ndarray, sizes: np.ndarray) -> np.ndarray:
    """The row positions of consecutive ranges ``lo[i], lo[i] + sizes[i]``, one after another.

    A range's ``t``-th output row is at ``t + (lo[i] - start[i])``, where ``start[i]`` is where
    range ``i`` starts in the output: one `np.repeat` and one addition.
    """
    starts = lo - (np.cumsum(sizes) - sizes)
    pos = np.arange(int(sizes.sum()), dtype=I64)
    pos += np.repeat(starts, sizes)
    return pos


def find(
    layers: Sequence[Layer], cols: Sequence[np.ndarray], m: int, bounds: Sequence[Bound] = ()
) -> Found:
    """`enumerate_ranges` for `m` keys given as columns, in the form its callers use cheapest."""
    p = len(cols)
    ranged: list[tuple[Layer, np.ndarray, np.ndarray]] = []
    touched = np.zeros(m, dtype=bool)
    for i, layer in enumerate(layers):
        if len(layer) == 0:
            continue
        lo, hi = layer.span_of(cols, m, bounds)
        sizes = hi - lo
        if i > 0:
            touched |= sizes > 0
        ranged.append((layer, lo, sizes))
    width = (layers[0].width if layers else p) - p
    if not ranged:
        empty = np.zeros(0, dtype=I64)
        return Found(None, empty, np.zeros((0, width), dtype=I64), empty)
    if len(ranged) == 1:
        layer, lo, sizes = ranged[0]
        pos = _positions(lo, sizes)
        # Column by column from contiguous copies: a row gather from a 2-d array is slower.
        picked = [layer.col(j)[pos] for j in range(p, layer.width)]
        rest = picked[0].reshape(-1, 1) if len(picked) == 1 else _stack(picked, len(pos))
        return Found(sizes, None, rest, None if layer.unit else layer.diff[pos])
    parts: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
    for layer, lo, sizes in ranged:
        pos = _positions(lo, sizes)
        owner = np.repeat(np.arange(m, dtype=I64), sizes)
        parts.append((owner, layer.rows[pos, p:], layer.diff[pos]))
    if not touched.any():
        owner = np.concatenate([o for o, _, _ in parts])
        rest = np.concatenate([r for _, r, _ in parts])
        diff = np.concatenate([d for _, _, d in parts])
        return Found(None, owner, rest, diff)
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
    return Found(None, owner, rest, diff)


def enumerate_ranges(
    layers: Sequence[Layer], keys: np.ndarray, bounds: Sequence[Bound] = ()
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Every row extending each key, summed over the layers: (key index, rest columns, diff).

    `bounds` restrict the column right after the key (a filter such as ``b < c`` on the value
    being proposed): the range is narrowed by binary search, so filtered-out candidates are
    never produced. Rows whose summed diff is 0 (a tuple deleted in a later layer) are dropped.
    """
    found = find(layers, _columns(keys), len(keys), bounds)
    diff = found.diff if found.diff is not None else np.ones(len(found), dtype=I64)
    return found.owner, found.rest, diff


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
        recent = _merged(self.recent, delta)
        paths = (*self.paths, path)
        if len(recent) > max(MERGE_MIN_ROWS, MERGE_SHARE * len(self.base)):
            base = _merged(self.base, recent)
            return TraceIndex(self.columns, base, Layer.empty(len(self.columns)), paths)
        kept = {k: v for k, v in self.derived.items() if k[0] == "base"}
        return TraceIndex(self.columns, self.base, recent, paths, kept)


def _merged(layer: Layer, other: Layer) -> Layer:
    """Two layers as one, equal rows summed (a layer merged with an empty one is itself)."""
    if len(layer) == 0:
        return other
    if len(other) == 0:
        return layer
    return Layer.build(
        np.concatenate([layer.rows, other.rows]), np.concatenate([layer.diff, other.diff])
    )


class KeyedIndex:
    """The driver-resident index of a state's relation and counts traces."""

    def __init__(self, root: str) -> None:
        keep_freed_memory()  # the driver reuses its arrays' memory (see `wcoj_core.memory`)
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
        schema = pa.schema(
            [pa.field(c, pa.int64(), nullable=False) for c in (*trace.columns, TIME, DIFF)]
        )
        # Dictionaries for the time and the diffs only (a value or a few: a tiny page). The
        # relation's columns hold ids with far too many distinct values for one: Arrow would
        # build a dictionary until it overflows, then write them plain anyway, at twice the cost
        # of writing them plain at once. (pyarrow takes a list of columns; its stub says bool.)
        dictionary: Any = [TIME, DIFF]
        # A large batch is written as several files at once, on as many threads (Arrow encodes
        # and compresses without the GIL), as Spark writes a batch of several partitions.
        files = max(1, min(WORKERS, n // WRITE_FILE_ROWS))
        cuts = [n * i // files for i in range(files + 1)]

        def write_file(i: int) -> None:
            lo, hi = cuts[i], cuts[i + 1]
            # A contiguous column (a column-major array's, see `output_changes`) is taken by
            # Arrow as it is, without a copy.
            arrays = [
                pa.array(np.ascontiguousarray(rows[lo:hi, j]), type=pa.int64())
                for j in range(rows.shape[1])
            ]
            arrays += [
                pa.array(np.full(hi - lo, time, dtype=I64)),
                pa.array(diff[lo:hi], type=pa.int64()),
            ]
            pq.write_table(
                pa.Table.from_arrays(arrays, schema=schema),
                os.path.join(folder, f"part-{i:05d}-keyed.snappy.parquet"),
                compression="snappy",
                use_dictionary=dictionary,
            )

        try:
            os.makedirs(folder)
            if files == 1:
                write_file(0)
            else:
                with ThreadPoolExecutor(files) as pool:
                    list(pool.map(write_file, range(files)))
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
        # Gathering the kept rows by index is several times cheaper than a boolean mask over
        # each column.
        return self.take(np.flatnonzero(mask))

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
    found: list[Part] = []
    counts: list[StepCounts] = []
    for lo in range(0, max(len(d), 1), max(chunk_rows, 1)):  # once at least: counts of 0
        part = slice(lo, lo + chunk_rows)
        prefixes = Prefixes({v: d.rows[part, i] for i, v in enumerate(start)}, d.diff[part])
        made = _run_prefixes(plan, rule, prefixes, layers, joins, found)
        counts = made if not counts else [a.plus(b) for a, b in zip(counts, made, strict=True)]
    vs = list(dict.fromkeys([*start, *(s.var for s in rule.steps)]))
    head = plan.query.head
    lead = head if len(set(head)) == len(head) and set(head) <= set(vs) else ()
    return _concat(found, vs, lead), counts


# Bindings in the making: rows of the prefixes, or only those at the given indices (the rows a
# validation kept, gathered once, when the parts are put together by `_concat`).
Part = tuple[Prefixes, np.ndarray | None]


def _rows(part: Part) -> int:
    return len(part[0]) if part[1] is None else len(part[1])


def _run_prefixes(
    plan: Plan,
    rule: DeltaRule,
    prefixes: Prefixes,
    layers: EpochLayers,
    joins: list[int],
    found: list[Part],
) -> list[StepCounts]:
    """A rule from the given delta tuples (as prefixes): checks, then each step in turn.

    Appends the full bindings to `found`, in parts, in order (see `_step`): `found` then holds
    the only references to them (see `_concat`).
    """
    atom_vars = plan.atom_vars
    for c in rule.checks:
        vs = atom_vars[c.atom]
        order = tuple(range(c.view.arity))
        m = lookup_sum_of(
            layers.layers(relation_trace_name(c.view.relation), c.view, order, c.version),
            [prefixes.cols[v] for v in vs],
            len(prefixes),
        )
        keep = np.flatnonzero(m)
        prefixes = prefixes.take(keep)
        prefixes.weight = prefixes.weight * m[keep]
        joins.append(len(prefixes))
    parts: list[Part] = [(prefixes.filtered(rule.start_filters), None)]
    names = list(prefixes.cols)
    counts: list[StepCounts] = []
    for step in rule.steps:
        parts, made = _step(plan, step, _concat(parts, names), layers, joins)
        names.append(step.var)
        counts.append(made)
    found += parts
    return counts


def _step(
    plan: Plan, step: Step, prefixes: Prefixes, layers: EpochLayers, joins: list[int]
) -> tuple[list[Part], StepCounts]:
    """One step: count, pick the fewest, propose, validate.

    The prefixes won by each extender (whose count was the least) propose and are validated
    apart from the others' (`_extend`), and their bindings come out in extender order, as the
    Spark path's union gives them. A large set of them is cut into consecutive pieces, run on
    `WORKERS` threads at once (numpy releases the GIL in its searches, gathers and arithmetic)
    and put back in order: the bindings, their order and every count are the same as in one
    piece. Only proposals read from a single layer are cut (`Found.sizes`: rows in key order);
    summed over layers they come in an order a cut would change.
    """
    atom_vars = plan.atom_vars
    xs = step.extenders
    n = np.zeros((len(xs), len(prefixes)), dtype=I64)
    alive = np.ones(len(prefixes), dtype=bool)
    for j, x in enumerate(xs):
        # An empty key is no column: every prefix then reads the one total count.
        n[j] = lookup_sum_of(
            layers.layers(counts_trace_name(x.counts), None, tuple(range(len(x.key))), x.version),
            [prefixes.cols[atom_vars[x.atom][k]] for k in x.key],
            len(prefixes),
        )
        alive &= n[j] > 0
        joins.append(int(alive.sum()))
    if not alive.all():
        keep = np.flatnonzero(alive)
        prefixes, n = prefixes.take(keep), n[:, keep]
    tag = np.argmin(n, axis=0) if len(xs) > 1 else np.zeros(len(prefixes), dtype=I64)
    least = n[tag, np.arange(len(prefixes))] if len(prefixes) else np.zeros(0, dtype=I64)
    _, leftover = _bounds(step.var, step.filters, prefixes)  # the same for any prefixes
    # About `2 * WORKERS` pieces in all, so that the threads finish close together; and
    # threads at all only for work worth one (a small epoch's step runs as it comes).
    estimate = int(least.sum())
    target = max(PIECE_PROPOSALS, -(-estimate // (2 * WORKERS)))
    threads = WORKERS > 1 and estimate >= PIECE_PROPOSALS
    tasks: list[Callable[[], tuple[Part, int, list[tuple[int, int, int]]]]] = []
    for j, x in enumerate(xs):
        mine = np.flatnonzero(tag == j) if len(xs) > 1 else None
        if (len(prefixes) if mine is None else len(mine)) == 0:
            continue
        source = layers.layers(*_support_source(x), x.version)
        checks = [
            (i, y, layers.layers(*_support_source(y), y.version))
            for i, y in enumerate(xs)
            if i != j
        ]
        # The threads read these layers' search keys and columns: build them here, once.
        _prepare(source, len(x.key))
        for _, _, ys in checks:
            _prepare(ys, None)
        pieces: list[np.ndarray | None] = [mine]
        if threads and sum(1 for layer in source if len(layer)) == 1:
            rows = np.arange(len(prefixes)) if mine is None else mine
            pieces = list(_pieces(rows, least[rows], target))
        for piece in pieces:
            got = prefixes if piece is None else prefixes.take(piece)
            tasks.append(partial(_extend, plan, step, j, got, source, checks, leftover))
    if threads and len(tasks) > 1:
        with ThreadPoolExecutor(min(WORKERS, len(tasks))) as pool:
            results = list(pool.map(lambda task: task(), tasks))
    else:
        results = [task() for task in tasks]
    checked = [0] * len(xs)
    passed = [0] * len(xs)
    for _, _, tally in results:
        for i, c, p in tally:
            checked[i] += c
            passed[i] += p
    proposed = sum(made for _, made, _ in results)
    joins.append(proposed)
    joins.extend(passed[j] for j in range(len(xs)) if checked[j])
    parts = [part for part, _, _ in results]
    validated = sum(_rows(part) for part in parts)
    return parts, StepCounts(step.var.name, len(prefixes), int(least.sum()), proposed, validated)


def _prepare(layers: Sequence[Layer], key: int | None) -> None:
    """Build the lazy parts of layers that threads will read: lookups (`key` None) need the
    whole rows' keys, proposals from `key` columns the keys of one more and that column."""
    for layer in layers:
        if len(layer) == 0:
            continue
        _ = layer.unit, layer.packing
        for p in (layer.width,) if key is None else (key, key + 1):
            if 0 < p <= layer.width:
                layer._sorted_keys(p)
        if key is not None and key < layer.width:
            layer.col(key)


def _pieces(rows: np.ndarray, sizes: np.ndarray, target: int) -> Iterator[np.ndarray]:
    """`rows` cut into consecutive pieces of about `target` in `sizes` each (none empty)."""
    total = int(sizes.sum())
    count = min(len(rows), total // max(target, 1))
    if count <= 1:
        yield rows
        return
    ends = np.cumsum(sizes)
    cuts = np.searchsorted(ends, np.arange(1, count) * (total / count))
    for piece in np.split(rows, cuts):
        if len(piece):
            yield piece


def _extend(
    plan: Plan,
    step: Step,
    j: int,
    mine: Prefixes,
    source: Sequence[Layer],
    checks: Sequence[tuple[int, Extender, Sequence[Layer]]],
    leftover: Sequence[Filter],
) -> tuple[Part, int, list[tuple[int, int, int]]]:
    """Extender `j` proposes for prefixes `mine` from `source`; every other extender validates.

    Returns the bindings, the number proposed, and per validator, how many rows it checked and
    how many passed. The rows a validator drops are gathered out before the next one checks,
    but the last one's only marks the rows it kept (see `Part`).
    """
    atom_vars = plan.atom_vars
    x = step.extenders[j]
    bounds, _ = _bounds(step.var, step.filters, mine)
    found = find(source, [mine.cols[atom_vars[x.atom][k]] for k in x.key], len(mine), bounds)
    part = Prefixes({v: found.spread(c) for v, c in mine.cols.items()}, found.spread(mine.weight))
    part.cols[step.var] = found.rest[:, 0]
    if x.completes and found.diff is not None:
        part.weight = part.weight * found.diff
    proposed = len(part)
    if leftover:  # the filters the proposals' bounds did not already apply
        part = part.filtered(leftover)
    kept: np.ndarray | None = None
    tally: list[tuple[int, int, int]] = []
    for i, y, ys in checks:
        if kept is not None:
            part, kept = part.take(kept), None
        if len(part) == 0:
            continue
        cols = [part.cols[atom_vars[y.atom][k]] for k in (*y.key, y.value)]
        kept, m = _present(ys, cols, len(part))
        tally.append((i, len(part), len(kept)))
        if y.completes and m is not None:  # else every kept row's factor is 1
            part.weight = part.weight * m  # the rows dropped (factor 0) are never read
    return (part, kept), proposed, tally


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


def _concat(parts: list[Part], vs: Sequence[Var], lead: Sequence[Var] = ()) -> Prefixes:
    """Parts of bindings, one after another: each column is written once, straight from the
    rows each part kept (a single whole part is returned as it is, unless `lead` is given).

    The list is emptied as the parts are copied: each part's memory is freed as soon as its
    rows are in place, and the next parts' rows land in the pages it held (touching new memory
    costs far more than reusing what was just freed).

    The columns of `lead` (distinct variables of `vs`) are written as the columns of one
    column-major array, in that order: `output_changes` then takes that array as the output's
    rows as it is, instead of copying every column once more (see `_block`).
    """
    if len(parts) == 1 and parts[0][1] is None and not lead:
        return parts.pop()[0]
    total = sum(_rows(part) for part in parts)
    block = np.empty((total, len(lead)), dtype=I64, order="F")
    at = {v: i for i, v in enumerate(lead)}
    cols = {v: block[:, at[v]] if v in at else np.empty(total, dtype=I64) for v in vs}
    weight = np.empty(total, dtype=I64)
    start = 0
    parts.reverse()  # popped from the end: first part first
    while parts:
        p, kept = parts.pop()
        end = start + (len(p) if kept is None else len(kept))
        for src, out in [*((p.cols[v], cols[v]) for v in vs), (p.weight, weight)]:
            if kept is None:
                out[start:end] = src
            else:  # indices known valid: "clip" writes straight into `out`, unbuffered
                np.take(src, kept, out=out[start:end], mode="clip")
        start = end
    return Prefixes(cols, weight)


def _block(p: Prefixes, head: Sequence[Var]) -> np.ndarray | None:
    """The head's columns of `p` as one column-major array, when they already are the leading
    columns of one (`_concat` with ``lead=head``), without a copy; else None."""
    if not head or len(set(head)) != len(head):
        return None
    base = p.cols[head[0]].base
    if not isinstance(base, np.ndarray) or base.ndim != 2 or base.shape[1] != len(head):
        return None
    for i, v in enumerate(head):
        col, want = p.cols[v], base[:, i]
        if (col.dtype, col.shape, col.strides, col.ctypes.data) != (
            want.dtype,
            want.shape,
            want.strides,
            want.ctypes.data,
        ):
            return None
    return base


def support_delta(layers: EpochLayers, view: AtomView) -> Layer:
    """View tuples entering (+1) or leaving (-1) the non-zero support at this epoch."""
    name = relation_trace_name(view.relation)
    order = tuple(range(view.arity))
    (delta,) = layers.layers(name, view, order, Version.DELTA)
    old = lookup_sum(layers.layers(name, view, order, Version.OLD), delta.rows)
    change = (old + delta.diff != 0).astype(I64) - (old != 0).astype(I64)
    keep = change != 0
    if keep.all():  # every tuple changed its support (a whole relation): same rows, same keys
        return Layer(delta.rows, change, delta._packing, delta._keys.get(delta.width))
    return Layer(delta.rows[keep], change[keep])


def counts_delta(support: Layer, key: Sequence[int]) -> Layer:
    """Support changes grouped by the key columns: a counts change."""
    return Layer.build(support.rows[:, list(key)], support.diff)


def changes_layer(columns: Sequence[str], table: pa.Table) -> Layer:
    """An epoch's changes (an Arrow table with the relation columns and diff), consolidated."""
    rows = np.empty((table.num_rows, len(columns)), dtype=I64, order="F")  # see `output_changes`
    for i, c in enumerate(columns):
        rows[:, i] = table.column(c).to_numpy(zero_copy_only=False)
    diff = table.column(DIFF).to_numpy(zero_copy_only=False).astype(I64, copy=False)
    return Layer.build(rows, diff)


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
    # Column-major: each column is filled with one contiguous copy, and read as it is by the
    # sort or by Arrow when the batch is written (a row-major array's columns are strided).
    # One rule's bindings (a static evaluation's) usually hold that array already (`run_rule`).
    block = _block(prefixes[0], head) if len(prefixes) == 1 else None
    if block is not None:
        rows, weight = block, prefixes[0].weight
    else:
        rows = np.empty((sum(len(p) for p in prefixes), len(head)), dtype=I64, order="F")
        for i, v in enumerate(head):
            np.concatenate([p.cols[v] for p in prefixes], out=rows[:, i])
        weight = np.concatenate([p.weight for p in prefixes])
    if distinct:
        return rows, weight
    out = Layer.build(rows, weight)
    return out.rows, out.diff


def relation_traces(plans: Mapping[str, Plan]) -> list[str]:
    return sorted({relation_trace_name(r) for p in plans.values() for r in p.query.relations})
