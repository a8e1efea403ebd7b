"""Layers: consolidated rows sorted by a search key, and the lookups a join step makes on them.

A `Layer` holds rows of longs with their multiplicities (``diff``), consolidated (each row once,
no zero) and sorted lexicographically. Every access a GenericJoin step needs is a binary search:

* **count / validate** — `Layer.lookup_of`: the diff of whole rows (or of keys, in a counts
  layer); summed over several layers by `lookup_sum_of`;
* **propose** — `find`: every row extending each key, optionally narrowed by `Bound`s on the
  next column (a filter such as ``b < c`` never proposes ``c <= b``), summed over layers.

A trace read as of some time is a few layers (a large base, a small recent layer, the epoch's
delta): a lookup sums them and a proposal sums the rows found in several of them.

A layer may be opened from memory-mapped files (`Layer` given its rows, diffs, search keys,
packing and unit flag): no search then does work or allocates memory in proportion to the
layer's rows — every search is a binary search of the whole rows' keys (`Layer.search_keys`),
prefixes included, and a column of Fortran-ordered rows is read where it lies (`Layer.col`).

Sums of multiplicities (equal rows consolidated, a row's diffs over layers) are checked: one
that leaves int64 raises `MultiplicityOverflow` (`wcoj_core.kernel.multiplicity`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from wcoj_core.errors import MultiplicityOverflow
from wcoj_core.kernel.keys import I64, U64, Packing, encode
from wcoj_core.kernel.multiplicity import LIMIT, Namer, magnitude, row_namer, sums_at, total
from wcoj_core.query.ir import Const
from wcoj_core.query.plan import AtomView

# What a consolidation sums, and a lookup over layers, as an error names it.
SUMMING = "summing the multiplicities of equal rows"
OVER_LAYERS = "summing a row's multiplicities over layers"


def _consolidate_sorted(
    rows: np.ndarray, diff: np.ndarray, keys: np.ndarray | None, what: str = SUMMING
) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """Sum the diffs of equal adjacent rows (rows sorted) and drop zeros (a sum leaving int64
    raises `MultiplicityOverflow`, naming the row)."""
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
    sums = sums_at(diff, first, _rows_namer(rows), what)
    nonzero = sums != 0
    picked = first[nonzero]
    return rows[picked], sums[nonzero], None if keys is None else keys[picked]


def _rows_namer(rows: np.ndarray) -> Namer:
    """The data tuple of a row of a row array."""
    return lambda i: tuple(int(v) for v in rows[i])


def columns_of(rows: np.ndarray) -> list[np.ndarray]:
    """The columns of a row array (views)."""
    return [rows[:, j] for j in range(rows.shape[1])]


def stack(cols: Sequence[np.ndarray], m: int) -> np.ndarray:
    """Columns as an ``(m, len(cols))`` row array (``(m, 0)`` for no column)."""
    if not cols:
        return np.zeros((m, 0), dtype=I64)
    return np.column_stack(cols).astype(I64, copy=False).reshape(m, len(cols))


class Layer:
    """Consolidated rows (no zero diffs), sorted lexicographically, with binary-search lookups.

    Searches run on each row's packed ``uint64`` when the layer's columns fit (`Packing`), on
    its `encode` bytes otherwise; both orders equal the rows' lexicographic order. Either way
    one array holds the keys of whole rows (`search_keys`): a search on the first ``p`` columns
    searches it too (packed, with its probes moved into the top bits; bytes, through a view of
    each key's first ``8p`` bytes), so no search builds an array as long as the layer.

    ``Layer(rows, diff, packing, packed, unit)``: `rows` (``n x w`` int64) and `diff` (``n``
    int64) consolidated and sorted; `packing` the layer's `Packing` (None: found on first use,
    or none when `packed` holds bytes); `packed` its `search_keys` when known (the packed
    ``uint64`` keys with a packing, `encode` bytes without); `unit` whether every diff is 1
    (None: found on first use; given, never recomputed). A layer opened from memory-mapped
    files is given all of them, and its `rows` in Fortran order (each column contiguous, read
    in place by `col`): opening it, `prepare` and every search then cost no pass over its rows.

    A layer is never changed once built: its arrays may be shared with whoever built it, and
    may be read-only memory-mapped arrays — nothing may write into them.
    """

    __slots__ = (
        "_bound",
        "_cols",
        "_keys",
        "_packing",
        "_packs",
        "_shifts",
        "_unit",
        "diff",
        "rows",
    )

    def __init__(
        self,
        rows: np.ndarray,
        diff: np.ndarray,
        packing: Packing | None = None,
        packed: np.ndarray | None = None,
        unit: bool | None = None,
    ) -> None:
        if packed is not None:
            if len(packed) != len(diff):
                raise ValueError(f"{len(packed)} search keys for a layer of {len(diff)} rows")
            if packing is None and packed.dtype.kind != "V" and rows.shape[1] and len(packed):
                raise ValueError("packed search keys without their packing")
        self.rows = rows
        self.diff = diff
        self._packing = packing
        # Whether the rows pack: known from a packing, or from keys that are bytes.
        self._packs: bool | None = True if packing is not None else None
        if packing is None and packed is not None and packed.dtype.kind == "V":
            self._packs = False
        self._keys: dict[int, np.ndarray] = {} if packed is None else {rows.shape[1]: packed}
        self._cols: dict[int, np.ndarray] = {}
        self._unit = unit
        # A bound on |diff| when known (a layer built here), for the checked sums of lookups.
        self._bound: int | None = 1 if unit else None
        self._shifts: tuple[int, ...] = ()  # per p, `Packing.shift` (made on first use)

    @classmethod
    def sort(
        cls, rows: np.ndarray, diff: np.ndarray, *, consolidate: bool = False, what: str = SUMMING
    ) -> Layer:
        """A layer of `rows` in any order (consolidated first when asked: equal rows summed;
        a sum leaving int64 raises `MultiplicityOverflow`, `what` naming the operation)."""
        rows = np.asarray(rows, dtype=I64)
        diff = np.asarray(diff, dtype=I64)
        width = rows.shape[1]
        if width == 0 or len(rows) == 0:
            if consolidate and len(rows):
                summed = sums_at(diff, np.zeros(1, dtype=I64), lambda _: (), what)
                keep = slice(0, 1 if summed[0] != 0 else 0)
                return cls(rows[keep], summed[keep])
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
        n = len(rows)
        if consolidate:
            rows, diff, packed = _consolidate_sorted(rows, diff, packed, what)
        layer = cls(rows, diff, packing, packed)
        if packing is None and len(rows) == n:  # the same rows: they do not pack (fewer may)
            layer._packs = False
        layer._bound = magnitude(diff)  # two reductions, next to the sort
        return layer

    @classmethod
    def build(cls, rows: np.ndarray, diff: np.ndarray, *, what: str = SUMMING) -> Layer:
        """Rows in any order, equal rows summed, zeros dropped (`sort`)."""
        return cls.sort(rows, diff, consolidate=True, what=what)

    def with_diff(self, diff: np.ndarray) -> Layer:
        """The same rows (and search keys) with other diffs, none of them 0."""
        layer = Layer(self.rows, diff, self._packing, self._keys.get(self.width))
        layer._packs = self._packs
        return layer

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
        """The box the rows pack into (None: they do not, or the layer is empty or has no
        column); found once, on first use, when not given."""
        if self._packs is None and len(self) and self.width:
            self._packing = Packing.of(self.rows)
            self._packs = self._packing is not None
        return self._packing

    def diff_bound(self) -> int | None:
        """A bound on every ``|diff|`` when one is known without a pass over the layer (a
        layer built by `sort`, or a unit one); else None."""
        return self._bound

    @property
    def unit(self) -> bool:
        """Whether every diff is 1 (a set): then a lookup's diff is whether the row is found,
        and multiplying by the diffs of found rows changes nothing."""
        if self._unit is None:
            self._unit = bool((self.diff == 1).all())
            if self._unit:
                self._bound = 1
        return self._unit

    def search_keys(self) -> np.ndarray:
        """The search keys of whole rows, in row order (so sorted): packed ``uint64`` when the
        layer has a `packing`, `encode` bytes otherwise (``uint64`` zeros for no column).
        Built on first use unless given; what a persisted layer stores as its keys."""
        keys = self._keys.get(self.rows.shape[1])
        if keys is None:
            packing = self.packing
            if packing is not None:
                keys = packing.pack(self.rows)[0]
            elif self.width:
                keys = encode(self.rows)
            else:
                keys = np.zeros(len(self), dtype=U64)
            self._keys[self.width] = keys
        return keys

    def col(self, j: int) -> np.ndarray:
        """Column `j` as a contiguous array (gathers from a strided column are slower): the
        column itself when it is (Fortran-ordered rows), else a copy made once."""
        column = self.rows[:, j]
        if column.flags.c_contiguous:
            return column
        if j not in self._cols:
            self._cols[j] = np.ascontiguousarray(column)
        return self._cols[j]

    def prepare(self, *widths: int) -> None:
        """Build now what lookups and ranges over the first `widths` columns build lazily (no
        pass over the rows when the keys, packing and unit flag were given)."""
        if len(self) == 0:
            return
        _ = self.unit, self.search_keys()
        if self.packing is not None:
            self._shift_table()
            return
        for p in widths:
            if 0 < p < self.width:
                self._prefix_keys(p)

    def _prefix_keys(self, p: int) -> np.ndarray:
        """The `encode` keys of the first `p` columns (a layer without packing): a strided view
        of the whole rows' keys, never a copy."""
        if p == self.width:
            return self.search_keys()
        if p not in self._keys:
            raw = self.search_keys().view(np.uint8).reshape(len(self), 8 * self.width)
            self._keys[p] = raw[:, : 8 * p].view(f"V{8 * p}").reshape(len(self))
        return self._keys[p]

    def _shift_table(self) -> tuple[int, ...]:
        """`Packing.shift` of the first ``p`` columns, for every ``p`` (a packed layer)."""
        packing = self.packing
        assert packing is not None
        self._shifts = tuple(packing.shift(q) for q in range(self.width + 1))
        return self._shifts

    def _packed_at(self, p: int) -> tuple[np.ndarray, int]:
        """The whole rows' packed keys, and how far the first `p` columns sit above their
        bottom bit (`_packed_edge`)."""
        keys = self._keys.get(self.rows.shape[1])  # (a hot path: no property, no call)
        if keys is None:
            keys = self.search_keys()
        return keys, (self._shifts or self._shift_table())[p]

    def _probe(self, cols: Sequence[np.ndarray], m: int) -> tuple[np.ndarray, np.ndarray | None]:
        """Keys (as columns) in the layer's search encoding; with packing, which keys can be
        present at all."""
        packing = self.packing
        if packing is None:
            return encode(stack(cols, m)), None
        return packing.pack_columns(cols, m)

    def ranges(self, keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """For each key (the first ``p`` columns), the half-open range of rows starting with it."""
        return self.ranges_of(columns_of(keys), len(keys))

    def ranges_of(self, cols: Sequence[np.ndarray], m: int) -> tuple[np.ndarray, np.ndarray]:
        """`ranges` of `m` keys given as columns."""
        p = len(cols)
        if p == 0 or len(self) == 0:
            return np.zeros(m, dtype=I64), np.full(m, len(self), dtype=I64)
        probe, inside = self._probe(cols, m)
        if inside is None:
            keys = self._prefix_keys(p)
            lo = np.searchsorted(keys, probe, "left").astype(I64, copy=False)
            hi = np.searchsorted(keys, probe, "right").astype(I64, copy=False)
            return lo, hi
        keys, s = self._packed_at(p)
        lo, hi = _packed_edge(keys, probe, s, False), _packed_edge(keys, probe, s, True)
        if not inside.all():
            hi[~inside] = lo[~inside]
        return lo, hi

    def lookup(self, rows: np.ndarray) -> np.ndarray:
        """The diff of each row (0 when absent)."""
        return self.lookup_of(columns_of(rows), len(rows))

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
        keys = self.search_keys()
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
        packing = self.packing
        keys, s = self._packed_at(p + 1) if packing is not None else (self._prefix_keys(p + 1), 0)
        for b in bounds:
            values = np.asarray(b.values, dtype=I64)
            if packing is None:
                # Bytes: the first row at or past the bound (lower), or past or at it (upper).
                probe = encode(stack([*cols, values], m))
                if b.lower:
                    lo = np.maximum(
                        lo, np.searchsorted(keys, probe, "left" if b.inclusive else "right")
                    )
                else:
                    hi = np.minimum(
                        hi, np.searchsorted(keys, probe, "right" if b.inclusive else "left")
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
            found = _packed_edge(keys, probe, s, not b.lower)
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
        keys, s = self._packed_at(p + 1)
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
            found = _packed_edge(keys, probe, s, not b.lower)
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


def _packed_edge(keys: np.ndarray, probe: np.ndarray, s: int, upper: bool) -> np.ndarray:
    """Where packed probes of a layer's first columns fall in its whole rows' sorted packed
    `keys`, the columns' bits `s` above the bottom: the first row whose first columns are at
    or after each probe, or (`upper`) one past the last at or before it.

    The probe moves into the keys' top bits: a row's prefix is below ``k`` exactly when its
    key is below ``k << s``, and at most ``k`` exactly when its key is at most
    ``(k << s) | (2**s - 1)``; with ``s`` 64 every row has the one prefix (the first columns
    hold one value each). `probe` is not changed.
    """
    if s == 0:
        return np.searchsorted(keys, probe, "right" if upper else "left").astype(I64, copy=False)
    if s >= 64:
        return np.full(len(probe), len(keys) if upper else 0, dtype=I64)
    moved = probe << U64(s)
    if not upper:
        return np.searchsorted(keys, moved, "left").astype(I64, copy=False)
    moved |= U64((1 << s) - 1)
    return np.searchsorted(keys, moved, "right").astype(I64, copy=False)


def view_of(view: AtomView, layer: Layer) -> Layer:
    """The layer seen through an atom's view: constants select, repeats select, then project.

    The projection is injective on the selected rows, so the result stays consolidated.
    """
    if view.is_identity:
        return layer
    rows, keep = view_rows(view, layer.rows)
    return Layer.sort(rows, layer.diff[keep])


def view_rows(view: AtomView, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Relation rows through an atom's view: the view's rows, and which relation rows they are.

    >>> from wcoj_core.query.plan import AtomView
    >>> got, keep = view_rows(AtomView("e", (0, 0, Const(3))), np.array([[1, 1, 3], [1, 2, 3]]))
    >>> got.tolist(), keep.tolist()
    ([[1]], [0])
    """
    keep = np.ones(len(rows), dtype=bool)
    first: dict[int, int] = {}
    for col, p in enumerate(view.pattern):
        if isinstance(p, Const):
            keep &= rows[:, col] == p.value
        elif p in first:
            keep &= rows[:, col] == rows[:, first[p]]
        else:
            first[p] = col
    picked = np.flatnonzero(keep)
    cols = [first[j] for j in range(view.arity)]
    return rows[picked][:, cols], picked


def arranged(layer: Layer, view: AtomView | None, order: tuple[int, ...]) -> Layer:
    """A layer through a view (None: as stored), columns in `order`, sorted."""
    return (view_of(view, layer) if view is not None else layer).permuted(order)


def present(
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


def lookup_bound(layers: Sequence[Layer]) -> int | None:
    """A bound on the magnitudes `lookup_sum_of` the layers returns, known without looking at
    them: the layers' `Layer.diff_bound` summed (None when one is unknown)."""
    bounds = [layer._bound for layer in layers if len(layer)]
    return None if None in bounds else sum(b for b in bounds if b is not None)


def lookup_sum(layers: Sequence[Layer], rows: np.ndarray) -> np.ndarray:
    """The summed diff of each row over the layers (0 when absent from all)."""
    return lookup_sum_of(layers, columns_of(rows), len(rows))


def lookup_sum_of(layers: Sequence[Layer], cols: Sequence[np.ndarray], m: int) -> np.ndarray:
    """`lookup_sum` of `m` rows given as columns (a sum leaving int64 raises
    `MultiplicityOverflow`, naming the row)."""
    out: np.ndarray | None = None
    bound = 0  # on the sum's magnitudes: the layers' bounds, else read from their lookups
    for layer in layers:
        if len(layer):
            got = layer.lookup_of(cols, m)
            bound += magnitude(got) if layer._bound is None else layer._bound
            if out is None:
                out = got
            elif bound < LIMIT:
                np.add(out, got, out=out)
            else:  # rare: every layer looked up again, every row's sum checked
                held = [x.lookup_of(cols, m) for x in layers if len(x)]
                return total(held, row_namer(cols), OVER_LAYERS)
    return np.zeros(m, dtype=I64) if out is None else out


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
    only when asked, by `owner`). `diff` is None when every diff is 1; `bound`, when known,
    bounds every ``|diff|`` (for the checked products of the weights they multiply).
    """

    sizes: np.ndarray | None
    owners: np.ndarray | None
    rest: np.ndarray
    diff: np.ndarray | None
    bound: int | None = None  # on every |diff|, when known

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
        rest = picked[0].reshape(-1, 1) if len(picked) == 1 else stack(picked, len(pos))
        if layer.unit:
            return Found(sizes, None, rest, None, 1)
        return Found(sizes, None, rest, layer.diff[pos], layer.diff_bound())
    parts: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
    for layer, lo, sizes in ranged:
        pos = _positions(lo, sizes)
        owner = np.repeat(np.arange(m, dtype=I64), sizes)
        parts.append((owner, layer.rows[pos, p:], layer.diff[pos]))
    each = [layer.diff_bound() for layer, _, _ in ranged]
    if not touched.any():
        owner = np.concatenate([o for o, _, _ in parts])
        rest = np.concatenate([r for _, r, _ in parts])
        diff = np.concatenate([d for _, _, d in parts])
        return Found(None, owner, rest, diff, _bounds_sum(each, max))
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
    summed = _summed_over_layers(rows, np.concatenate([d for _, _, d in mixed]), cols)
    rows = summed.rows
    owner = np.concatenate([*(o for o, _, _ in clean), rows[:, 0]])
    rest = np.concatenate([*(r for _, r, _ in clean), rows[:, 1:]])
    diff = np.concatenate([*(d for _, _, d in clean), summed.diff])
    return Found(None, owner, rest, diff, _bounds_sum(each, sum))


def _bounds_sum(bounds: Sequence[int | None], combine: Callable[[list[int]], int]) -> int | None:
    """Known bounds combined (their `max`, or their `sum`), None when one is unknown."""
    known = [b for b in bounds if b is not None]
    return combine(known) if len(known) == len(bounds) else None


def _summed_over_layers(rows: np.ndarray, diff: np.ndarray, keys: Sequence[np.ndarray]) -> Layer:
    """Rows (key index, rest columns) found in several layers, summed: a sum leaving int64
    raises `MultiplicityOverflow` naming the data row (the key's columns, then the rest)."""
    try:
        return Layer.build(rows, diff, what=OVER_LAYERS)
    except MultiplicityOverflow as e:
        if e.tuple is None:
            raise
        owner, *rest = e.tuple
        raise MultiplicityOverflow(OVER_LAYERS, (*row_namer(keys)(owner), *rest)) from None


def enumerate_ranges(
    layers: Sequence[Layer], keys: np.ndarray, bounds: Sequence[Bound] = ()
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Every row extending each key, summed over the layers: (key index, rest columns, diff).

    `bounds` restrict the column right after the key (a filter such as ``b < c`` on the value
    being proposed): the range is narrowed by binary search, so filtered-out candidates are
    never produced. Rows whose summed diff is 0 (a tuple deleted in a later layer) are dropped.
    """
    found = find(layers, columns_of(keys), len(keys), bounds)
    diff = found.diff if found.diff is not None else np.ones(len(found), dtype=I64)
    return found.owner, found.rest, diff


def merged(layer: Layer, other: Layer) -> Layer:
    """Two layers as one, equal rows summed (a layer merged with an empty one is itself)."""
    if len(layer) == 0:
        return other
    if len(other) == 0:
        return layer
    return Layer.build(
        np.concatenate([layer.rows, other.rows]),
        np.concatenate([layer.diff, other.diff]),
        what="merging two layers",
    )
