"""Layers: consolidated rows sorted lexicographically, and the lookups a join step makes on them.

A `Layer` holds rows of longs with their multiplicities (``diff``), consolidated (each row once,
no zero) and sorted lexicographically, column by column: the first column is sorted, the second
within each value of the first, and so on. Every access a GenericJoin step needs is a search of
those columns, made by the compiled kernel (`wcoj_core.kernel.native`):

* **count / validate** — `Layer.lookup_of`: the diff of whole rows (or of keys, in a counts
  layer); summed over several layers by `lookup_sum_of`;
* **propose** — `find`: every row extending each key, optionally narrowed by `Bound`s on the
  next column (a filter such as ``b < c`` never proposes ``c <= b``), summed over layers.

A trace read as of some time is a few layers (a large base, a small recent layer, the epoch's
delta): a lookup sums them and a proposal sums the rows found in several of them.

A search reads the layer's columns where they lie (`Layer.col`: rows kept column-major, as
`sort` builds them and memory-mapped files hold them), so no search allocates or passes over
the layer. A call that probes a large share of a layer's keys first gives the layer a
*directory* of its first column (`Layer.directory`, kept with the layer): a key's rows are then
found in one step, the way a CSR matrix finds a row.

Sorting packs each row into one ``uint64`` when the columns' spans fit (`Packing`) and sorts
those keys with the kernel's radix sort; the packed keys are what a persisted layer stores as
its `search_keys`. Sums of multiplicities (equal rows consolidated, a row's diffs over layers)
are exact: one that leaves int64 raises `MultiplicityOverflow` (`wcoj_core.kernel.multiplicity`).
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from wcoj_core.errors import MultiplicityOverflow
from wcoj_core.kernel.keys import I64, U64, Packing, encode
from wcoj_core.kernel.multiplicity import Namer, row_namer, sums_at, total
from wcoj_core.kernel.native import native
from wcoj_core.query.ir import Const
from wcoj_core.query.plan import AtomView

# What a consolidation sums, and a lookup over layers, as an error names it.
SUMMING = "summing the multiplicities of equal rows"
OVER_LAYERS = "summing a row's multiplicities over layers"
AGGREGATED = "an aggregate's sum"

# A search of m keys gives the layer a directory of its first column when m is at least this
# share of its rows, and the directory (one long per value of the column's span) is at most
# `DIRECTORY_SPAN` longs per row.
DIRECTORY_SHARE = 1 / 16
DIRECTORY_SPAN = 2

# A sort of at least this many rows runs on this many threads (each radix pass shared out:
# what a bulk load's landing sort takes on the driver); a smaller one stays on one thread.
SORT_THREAD_ROWS = 1 << 20


def directory_of(first: np.ndarray) -> tuple[np.ndarray, int] | None:
    """A sorted first column's directory, ``(dir, low)``: ``dir[k - low]`` is the first row at
    or after value ``k`` and ``dir[span]`` the row count; None when the column's span is more
    than `DIRECTORY_SPAN` longs per row (or the column is out of order or empty)."""
    if not len(first):
        return None
    low, high = int(first[0]), int(first[-1])
    span = high - low + 1
    if span <= 0 or span > DIRECTORY_SPAN * len(first) + 1024:
        return None  # too sparse (or, out of order, not a layer a search can trust)
    table = np.empty(span + 1, dtype=I64)
    native.directory(np.ascontiguousarray(first, dtype=I64), table, low)
    return table, low


def usable_cores() -> int:
    """The cores this process may run on (its affinity where the platform tells it)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


SORT_THREADS = max(1, min(4, usable_cores()))

# What the compiled kernel is handed for a layer (see `Layer.spec`).
Spec = tuple[tuple[np.ndarray, ...], np.ndarray, bool, np.ndarray | None, int]

_MIN, _MAX = np.iinfo(I64).min, np.iinfo(I64).max


def _rows_namer(rows: np.ndarray) -> Namer:
    """The data tuple of a row of a row array."""
    return lambda i: tuple(int(v) for v in rows[i])


def columns_of(rows: np.ndarray) -> list[np.ndarray]:
    """The columns of a row array (views)."""
    return [rows[:, j] for j in range(rows.shape[1])]


def contiguous(cols: Iterable[np.ndarray]) -> tuple[np.ndarray, ...]:
    """Columns as contiguous int64 arrays (the compiled kernel reads them so; no copy when
    they already are)."""
    return tuple(np.ascontiguousarray(c, dtype=I64) for c in cols)


def stack(cols: Sequence[np.ndarray], m: int) -> np.ndarray:
    """Columns as an ``(m, len(cols))`` row array (``(m, 0)`` for no column).

    >>> stack([np.array([1, 2]), np.array([3, 4])], 2).tolist()
    [[1, 3], [2, 4]]
    """
    if not cols:
        return np.zeros((m, 0), dtype=I64)
    return np.column_stack(cols).astype(I64, copy=False).reshape(m, len(cols))


def _column_major(rows: np.ndarray, order: np.ndarray | None) -> np.ndarray:
    """`rows` (permuted by `order`) as a column-major array, gathered column by column."""
    n = len(rows) if order is None else len(order)
    out = np.empty((n, rows.shape[1]), dtype=I64, order="F")
    for j in range(rows.shape[1]):
        out[:, j] = rows[:, j] if order is None else rows[:, j][order]
    return out


class Layer:
    """Consolidated rows (no zero diffs), sorted lexicographically, searched by the kernel.

    ``Layer(rows, diff, packing, packed, unit)``: `rows` (``n x w`` int64) and `diff` (``n``
    int64) consolidated and sorted; `packing` the layer's `Packing` (None: found on first use,
    or none when `packed` holds bytes); `packed` its `search_keys` when known (the packed
    ``uint64`` keys with a packing, `encode` bytes without) — what a persisted layer stores;
    `unit` whether every diff is 1 (None: found on first use; given, never recomputed). A layer
    opened from memory-mapped files is given all of them, and its `rows` in Fortran order (each
    column contiguous, read in place by `col`): opening it and every search then cost no pass
    over its rows.

    A layer is never changed once built: its arrays may be shared with whoever built it, and
    may be read-only memory-mapped arrays — nothing may write into them.

    `symmetric` (False unless its maker knows better, `mirrored`): a binary layer that is its
    own mirror — each row ``(a, b)`` has ``(b, a)`` with the same diff, as an undirected
    relation's landed edges do. Its columns swapped are then the layer itself, already
    sorted (`permuted`), and its counts by either column are the same (`counts_delta`).
    """

    __slots__ = (
        "_cols",
        "_dir",
        "_keys",
        "_packing",
        "_packs",
        "_unit",
        "diff",
        "rows",
        "symmetric",
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
        self._keys = packed
        self._cols: tuple[np.ndarray, ...] | None = None
        self._unit = unit
        self._dir: tuple[np.ndarray, int] | None = None
        self.symmetric = False

    def mirrored(self) -> Layer:
        """This layer, marked `symmetric` (its maker made every row in both directions with
        the same diff)."""
        if self.width != 2:
            raise ValueError(f"a layer of {self.width} columns cannot be its own mirror")
        self.symmetric = True
        return self

    @classmethod
    def sort(
        cls,
        rows: np.ndarray | Sequence[np.ndarray],
        diff: np.ndarray,
        *,
        consolidate: bool = False,
        what: str = SUMMING,
    ) -> Layer:
        """A layer of `rows` in any order (a row array, or its columns: no row array is then
        made), consolidated first when asked: equal rows summed; a sum leaving int64 raises
        `MultiplicityOverflow`, `what` naming the operation."""
        diff = np.ascontiguousarray(diff, dtype=I64)
        if isinstance(rows, np.ndarray):
            rows = np.asarray(rows, dtype=I64)
            cols = [rows[:, j] for j in range(rows.shape[1])]
        else:
            cols = list(contiguous(rows))
        width, n = len(cols), len(diff)
        if width == 0 or n == 0:
            whole = stack(cols, n)
            if consolidate and n:
                summed = sums_at(diff, np.zeros(1, dtype=I64), lambda _: (), what)
                keep = slice(0, 1 if summed[0] != 0 else 0)
                return cls(whole[keep], summed[keep])
            return cls(whole, diff)
        packing = Packing.of(cols)
        if packing is None:
            return cls._sort_wide(stack(cols, n), diff, consolidate, what)
        keys, _ = packing.pack_columns(cols, n)
        return cls.from_keys(keys, packing, diff, consolidate=consolidate, what=what)

    @classmethod
    def from_keys(
        cls,
        keys: np.ndarray,
        packing: Packing,
        diff: np.ndarray,
        *,
        consolidate: bool = False,
        what: str = SUMMING,
    ) -> Layer:
        """A layer of rows given as their keys packed by `packing` (``uint64``, any order;
        sorted in place), with `diff` (one per key, or one for all), consolidated first when
        asked (as `sort`)."""
        diff = np.ascontiguousarray(diff, dtype=I64)
        if len(keys) == 0:
            return cls.empty(len(packing.bits))
        # One diff for all (whole relations, support changes): the keys alone are sorted, and
        # the rows unpacked from them, as permuting rows and diffs would give.
        same = len(diff) == 1 or bool((diff == diff[0]).all())
        if not same and len(diff) != len(keys):
            raise ValueError(f"{len(diff)} diffs for {len(keys)} keys")
        if same and len(diff) != len(keys) and not consolidate:
            diff = np.full(len(keys), diff[0], dtype=I64)
        order = None if same else np.empty(len(keys), dtype=I64)
        threads = SORT_THREADS if len(keys) >= SORT_THREAD_ROWS else 1
        native.argsort(keys, keys, order, threads)  # in place
        if consolidate:
            sums = np.empty(len(keys), dtype=I64)
            kept = native.consolidate(keys, diff[:1] if same else diff, order, sums)
            if kept < 0:
                at = -kept - 1
                row = packing.unpack(keys[at : at + 1])[0]
                raise MultiplicityOverflow(what, tuple(int(v) for v in row))
            keys, diff = keys[:kept], sums[:kept]
        elif order is not None:
            diff = diff[order]
        # The rows unpacked from their sorted keys: column-major, without a gather of rows.
        return cls(packing.unpack(keys), diff, packing, keys)

    @classmethod
    def _sort_wide(cls, rows: np.ndarray, diff: np.ndarray, consolidate: bool, what: str) -> Layer:
        """`sort` of rows whose columns do not pack into 64 bits (sorted as tuples)."""
        n = len(rows)
        order = np.lexsort(rows.T[::-1])
        rows = _column_major(rows, order)
        diff = diff[order]
        if consolidate:
            starts = np.ones(len(rows), dtype=bool)
            starts[1:] = np.any(rows[1:] != rows[:-1], axis=1)
            if not starts.all():
                first = np.flatnonzero(starts)
                summed = sums_at(diff, first, _rows_namer(rows), what)
                nonzero = summed != 0
                rows, diff = _column_major(rows, first[nonzero]), summed[nonzero]
            elif not (diff != 0).all():
                nonzero = np.flatnonzero(diff != 0)
                rows, diff = _column_major(rows, nonzero), diff[nonzero]
        layer = cls(rows, diff)
        if len(rows) == n:  # the same rows: they do not pack (fewer may)
            layer._packs = False
        return layer

    @classmethod
    def build(
        cls, rows: np.ndarray | Sequence[np.ndarray], diff: np.ndarray, *, what: str = SUMMING
    ) -> Layer:
        """Rows in any order, equal rows summed, zeros dropped (`sort`)."""
        return cls.sort(rows, diff, consolidate=True, what=what)

    def with_diff(self, diff: np.ndarray, *, symmetric: bool = False) -> Layer:
        """The same rows (and search keys) with other diffs, none of them 0 (`symmetric`: the
        caller knows the new diffs keep the layer its own mirror)."""
        layer = Layer(self.rows, diff, self._packing, self._keys)
        layer._packs, layer._cols, layer._dir = self._packs, self._cols, self._dir
        layer.symmetric = symmetric and self.symmetric
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

    @property
    def unit(self) -> bool:
        """Whether every diff is 1 (a set): then a lookup's diff is whether the row is found,
        and multiplying by the diffs of found rows changes nothing."""
        if self._unit is None:
            self._unit = bool((self.diff == 1).all())
        return self._unit

    def search_keys(self) -> np.ndarray:
        """The keys of whole rows, in row order (so sorted): packed ``uint64`` when the layer
        has a `packing`, `encode` bytes otherwise (``uint64`` zeros for no column). What a
        persisted layer stores; built on first use unless given."""
        if self._keys is None:
            packing = self.packing
            if packing is not None:
                self._keys = packing.pack(self.rows)[0]
            elif self.width:
                self._keys = encode(self.rows)
            else:
                self._keys = np.zeros(len(self), dtype=U64)
        return self._keys

    def col(self, j: int) -> np.ndarray:
        """Column `j` as a contiguous array: the column itself when it is (column-major rows),
        else a copy made once."""
        return self.columns()[j]

    def columns(self) -> tuple[np.ndarray, ...]:
        """Every column, contiguous (made once)."""
        if self._cols is None:
            self._cols = contiguous(self.rows[:, j] for j in range(self.width))
        return self._cols

    def directory(self) -> tuple[np.ndarray, int] | None:
        """The first row at or after each value of the first column (``dir[k - low]``;
        ``dir[span]`` is the row count), and ``low``: None when the column's span is more
        than `DIRECTORY_SPAN` longs per row. Made once."""
        if self._dir is None and len(self) and self.width:
            self._dir = directory_of(self.col(0))
        return self._dir

    def given_directory(self, table: np.ndarray, low: int) -> None:
        """This layer with the directory of its first column that `directory` would make,
        made already (a segment file keeps it: `wcoj_core.store.segments`; read from its
        header and checked there, so that opening reads no row)."""
        self._dir = (table, low)

    def spec(self, probes: int = 0) -> Spec:
        """What the compiled kernel reads of the layer, for a call probing `probes` keys (its
        directory when it has one, or when they are many)."""
        found = self._dir
        if found is None and probes and probes >= DIRECTORY_SHARE * len(self):
            found = self.directory()
        d, low = (None, 0) if found is None else found
        cols, diff = self.columns(), np.ascontiguousarray(self.diff, dtype=I64)
        return (cols, diff, self.unit, d, low)

    def prepare(self, *widths: int) -> None:
        """Make now what searches make on first use (columns, the unit flag), so threads
        searching at once only read (no pass over the rows when the layer was given them)."""
        del widths
        if len(self):
            _ = self.unit, self.columns()

    def ranges(self, keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """For each key (the first ``p`` columns), the half-open range of rows starting with it."""
        return self.ranges_of(columns_of(keys), len(keys))

    def ranges_of(self, cols: Sequence[np.ndarray], m: int) -> tuple[np.ndarray, np.ndarray]:
        """`ranges` of `m` keys given as columns."""
        lo, hi = np.empty(m, dtype=I64), np.empty(m, dtype=I64)
        native.ranges(self.spec(m), contiguous(cols), m, None, None, lo, hi)
        return lo, hi

    def span_of(
        self, cols: Sequence[np.ndarray], m: int, bounds: Sequence[Bound]
    ) -> tuple[np.ndarray, np.ndarray]:
        """The range of each of `m` keys (given as columns), narrowed to the rows whose next
        column satisfies every bound."""
        if not bounds:
            return self.ranges_of(cols, m)
        low, high = inclusive_bounds(bounds, m)
        lo, hi = np.empty(m, dtype=I64), np.empty(m, dtype=I64)
        native.ranges(self.spec(m), contiguous(cols), m, low, high, lo, hi)
        return lo, hi

    def narrow_of(
        self,
        cols: Sequence[np.ndarray],
        m: int,
        lo: np.ndarray,
        hi: np.ndarray,
        bounds: Sequence[Bound],
    ) -> tuple[np.ndarray, np.ndarray]:
        """Ranges `lo`, `hi` of `m` keys narrowed to the rows whose next column satisfies
        every bound."""
        a, b = self.span_of(cols, m, bounds)
        start = np.maximum(lo, a)
        return start, np.maximum(np.minimum(hi, b), start)

    def lookup(self, rows: np.ndarray) -> np.ndarray:
        """The diff of each row (0 when absent)."""
        return self.lookup_of(columns_of(rows), len(rows))

    def lookup_of(self, cols: Sequence[np.ndarray], m: int) -> np.ndarray:
        """`lookup` of `m` rows given as columns (or, given fewer columns than the layer has,
        the diff of the first row starting with each key)."""
        if len(self) == 0:
            return np.zeros(m, dtype=I64)
        if len(cols) != self.width:
            lo, hi = self.ranges_of(cols, m)
            found = hi > lo
            return np.where(found, self.diff[np.minimum(lo, len(self) - 1)], 0).astype(I64)
        return lookup_sum_of([self], cols, m)

    def contains_of(self, cols: Sequence[np.ndarray], m: int) -> np.ndarray:
        """Whether each of `m` rows given as columns is in the layer (with a non-zero diff)."""
        return self.lookup_of(cols, m) != 0

    def permuted(self, order: Sequence[int]) -> Layer:
        """The same rows with columns in `order`, sorted again (a `symmetric` layer's two
        columns swapped are the layer itself)."""
        if tuple(order) == tuple(range(self.width)) or (self.symmetric and tuple(order) == (1, 0)):
            return self
        return Layer.sort([self.col(j) for j in order], self.diff)


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
) -> tuple[np.ndarray, np.ndarray]:
    """The rows (`m`, given as columns) whose diff summed over the layers is not 0: their
    indices, and every row's sum."""
    total = lookup_sum_of(layers, cols, m)
    return np.flatnonzero(total), total


def lookup_sum(layers: Sequence[Layer], rows: np.ndarray) -> np.ndarray:
    """The summed diff of each row over the layers (0 when absent from all)."""
    return lookup_sum_of(layers, columns_of(rows), len(rows))


def mirrored_lookup_sum(layers: Sequence[Layer], mirrored: Layer) -> np.ndarray:
    """`lookup_sum` of the rows of a `symmetric` layer over layers of a relation that is its
    own mirror too (an undirected relation's, in every epoch): each row ``(a, b)`` with
    ``a < b`` is looked up, and its sum is its mirror's. The mirrors are found among the
    layer's own sorted keys; a layer whose rows turn out not to be each other's mirrors is
    looked up whole.

    >>> held = [Layer.build(np.array([[1, 2], [2, 1], [2, 3], [3, 2]]), np.ones(4, dtype=I64))]
    >>> changes = Layer.build(np.array([[1, 2], [1, 4], [2, 1], [4, 1]]), np.ones(4, dtype=I64))
    >>> mirrored_lookup_sum(held, changes.mirrored()).tolist()
    [1, 0, 1, 0]
    """
    n, packing = len(mirrored), mirrored.packing
    if not mirrored.symmetric or packing is None or n % 2:
        return lookup_sum(layers, mirrored.rows)
    a, b = mirrored.col(0), mirrored.col(1)
    low = np.flatnonzero(a < b)
    if 2 * len(low) != n:
        return lookup_sum(layers, mirrored.rows)
    keys = mirrored.search_keys()
    mirrors, inside = packing.pack_columns([b[low], a[low]])
    at = np.searchsorted(keys, mirrors)
    if not inside.all() or not np.array_equal(keys[np.minimum(at, n - 1)], mirrors):
        return lookup_sum(layers, mirrored.rows)
    half = lookup_sum_of(layers, [a[low], b[low]], len(low))
    out = np.empty(n, dtype=I64)
    out[low] = half
    out[at] = half
    return out


def lookup_sum_of(layers: Sequence[Layer], cols: Sequence[np.ndarray], m: int) -> np.ndarray:
    """`lookup_sum` of `m` rows given as columns (the sum is exact; one leaving int64 raises
    `MultiplicityOverflow`, naming the row). A layer wider than the columns gives the diff of
    the first row starting with each key (`Layer.lookup_of`)."""
    held = [layer for layer in layers if len(layer)]
    out = np.zeros(m, dtype=I64)
    if not held or m == 0:
        return out
    if any(layer.width != len(cols) for layer in held):
        found = [layer.lookup_of(cols, m) for layer in held]
        return total([found[0].copy(), *found[1:]], row_namer(cols), OVER_LAYERS)
    probes = contiguous(cols)
    bad = native.lookup([layer.spec(m) for layer in held], probes, m, out)
    if bad >= 0:
        raise MultiplicityOverflow(OVER_LAYERS, row_namer(probes)(bad))
    return out


@dataclass(frozen=True, slots=True)
class Bound:
    """A bound on the column after the key, per key: ``value > v`` (or ``>=``, ``<``, ``<=``)."""

    values: np.ndarray
    lower: bool
    inclusive: bool


def inclusive_bounds(bounds: Sequence[Bound], m: int) -> tuple[np.ndarray, np.ndarray]:
    """`bounds` on `m` keys as one inclusive ``[low, high]`` per key (``low > high``: none).

    >>> low, high = inclusive_bounds([Bound(np.array([3, 2**63 - 1]), True, False)], 2)
    >>> low.tolist(), bool(low[1] > high[1])
    ([4, 1], True)
    """
    low = np.full(m, _MIN, dtype=I64)
    high = np.full(m, _MAX, dtype=I64)
    empty = np.zeros(m, dtype=bool)
    for b in bounds:
        v = np.asarray(b.values, dtype=I64)
        if b.lower:
            edge = _MAX if not b.inclusive else None
            if edge is not None:
                empty |= v == edge
                v = np.where(v == edge, v, v + 1)
            np.maximum(low, v, out=low)
        else:
            edge = _MIN if not b.inclusive else None
            if edge is not None:
                empty |= v == edge
                v = np.where(v == edge, v, v - 1)
            np.minimum(high, v, out=high)
    low[empty], high[empty] = 1, 0
    return low, high


# A filter as the compiled kernel takes it: the new value compared with a prefix column, a
# constant or itself (`native` op and kind codes).
OPS = {"<": 0, "<=": 1, ">": 2, ">=": 3, "=": 4, "!=": 5}
PREFIX_COL, CONSTANT, ITSELF = 0, 1, 2
NativeFilter = tuple[int, int, int]


@dataclass(frozen=True, slots=True)
class Found:
    """Rows `find` found extending keys: each row's key index (`owner`), its value (`rest`,
    one column) and its diff summed over the layers."""

    owner: np.ndarray
    rest: np.ndarray
    diff: np.ndarray

    def __len__(self) -> int:
        return len(self.rest)


def find(
    layers: Sequence[Layer], cols: Sequence[np.ndarray], m: int, bounds: Sequence[Bound] = ()
) -> Found:
    """Every row extending each of `m` keys (given as columns; each layer's rows are the key's
    columns and one more), summed over the layers, in key order, then value order; rows
    whose sum is 0 (a tuple deleted in a later layer) are dropped. `bounds` restrict the value
    (a filter such as ``b < c`` on the value being proposed): the range is narrowed by search,
    so filtered-out values are never produced."""
    p = len(cols)
    for layer in layers:
        if layer.width != p + 1:
            raise ValueError(f"a layer of {layer.width} columns extends keys of {p}, not {p + 1}")
    extras = [np.asarray(b.values, dtype=I64) for b in bounds]
    filters = [
        (OPS[(">" if b.lower else "<") + ("=" if b.inclusive else "")], PREFIX_COL, p + i)
        for i, b in enumerate(bounds)
    ]
    held = [layer for layer in layers if len(layer)]
    ext = ([layer.spec(m) for layer in held], None, tuple(range(p)), True)
    probes = contiguous([*cols, *extras])
    live = np.arange(m, dtype=I64)
    tag = np.zeros(m, dtype=I64)
    weight = np.ones(m, dtype=I64)
    args = (probes, m, weight, None, live, tag, 0, m, [ext], filters)
    counted = native.extend(*args, None, None, None, None, 0)
    n = _checked_outcome(counted, probes, ext[2])
    owner, value = np.empty(n, dtype=I64), np.empty(n, dtype=I64)
    diff, flags = np.empty(n, dtype=I64), np.empty(n, dtype=np.uint8)
    _checked_outcome(native.extend(*args, (value,), owner, diff, flags, n), probes, ext[2])
    return Found(owner, value.reshape(-1, 1), diff)


def _checked_outcome(
    outcome: tuple[int, ...], probes: Sequence[np.ndarray], key: Sequence[int]
) -> int:
    """The rows an extension wrote, or the error it reports raised (see `native_outcome`)."""
    return native_outcome(outcome, probes, [key]).rows


@dataclass(frozen=True, slots=True)
class Outcome:
    """What one `native.extend` call did: the bindings it wrote (or counted), the candidates
    proposed, the validations passed, whether a weight was flagged (left int64), and the exact
    sum of the weights counted (a counting call's; 0 when writing)."""

    rows: int
    proposed: int
    passed: int
    flagged: bool
    total: int


def native_outcome(
    outcome: tuple[int, ...], probes: Sequence[np.ndarray], keys: Sequence[Sequence[int]]
) -> Outcome:
    """What `native.extend` reported; a sum over layers leaving int64 raises
    `MultiplicityOverflow` naming the tuple (the extender's key columns, then the value), so
    does an aggregate's sum (the prefix, and the value whose term left int64)."""
    n, proposed, passed, flagged, err, row, ext, value, high, low = outcome[:10]
    if err == 4:  # an aggregate's term (the prefix and the value) or a prefix's sum
        prefix = tuple(int(c[row]) for c in probes)
        raise MultiplicityOverflow(AGGREGATED, (*prefix, value) if ext else prefix)
    if err == 1:
        key = tuple(int(probes[k][row]) for k in keys[ext])
        raise MultiplicityOverflow(OVER_LAYERS, (*key, value))
    if err:
        raise RuntimeError(f"the kernel's output outgrew its counts at row {row}")
    return Outcome(n, proposed, passed, bool(flagged), high * (1 << 64) + low)


def enumerate_ranges(
    layers: Sequence[Layer], keys: np.ndarray, bounds: Sequence[Bound] = ()
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """`find` for keys given as rows: (key index, value column, diff)."""
    found = find(layers, columns_of(keys), len(keys), bounds)
    return found.owner, found.rest, found.diff


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


def summed_sorted(layers: Sequence[Layer], *, what: str = SUMMING) -> Layer:
    """Layers of one width, each sorted and consolidated, summed into one (as `Layer.build`
    of their rows). Their rows are packed in one box that holds them all, where one fits in
    64 bits: the keys are then a few sorted runs, which a stable sort merges in a pass over
    them (a radix sort of the whole would pass over them several times). Equal rows summed, a
    sum leaving int64 raises `MultiplicityOverflow`, zeros dropped.

    >>> a = Layer.build(np.array([[1, 5], [3, 0]]), np.array([1, 2]))
    >>> b = Layer.build(np.array([[2, 9], [3, 0], [-4, 1]]), np.array([1, -2, 3]))
    >>> s = summed_sorted([a, b])
    >>> s.rows.tolist(), s.diff.tolist()
    ([[-4, 1], [1, 5], [2, 9]], [3, 1, 1])
    """
    live = [layer for layer in layers if len(layer)]
    if len(live) <= 1:
        return live[0] if live else Layer.empty(layers[0].width if layers else 0)
    boxes = [layer.packing for layer in live]
    if any(box is None for box in boxes) or not live[0].width:
        return Layer.build(
            np.concatenate([np.asarray(layer.rows) for layer in live]),
            np.concatenate([np.asarray(layer.diff, dtype=I64) for layer in live]),
            what=what,
        )
    width = live[0].width
    lows = tuple(min(box.lows[j] for box in boxes if box) for j in range(width))
    highs = tuple(max(box.highs[j] for box in boxes if box) for j in range(width))
    bits = tuple((h - lo).bit_length() for lo, h in zip(lows, highs, strict=True))
    if sum(bits) > 64:
        return Layer.build(
            np.concatenate([np.asarray(layer.rows) for layer in live]),
            np.concatenate([np.asarray(layer.diff, dtype=I64) for layer in live]),
            what=what,
        )
    packing = Packing(lows, highs, bits)
    keys = np.concatenate(
        [
            layer.search_keys() if layer.packing == packing else packing.pack(layer.rows)[0]
            for layer in live
        ]
    )
    diff = np.concatenate([np.asarray(layer.diff, dtype=I64) for layer in live])
    order = np.argsort(keys, kind="stable")  # sorted runs: merged
    keys = keys[order]
    sums = np.empty(len(keys), dtype=I64)
    kept = native.consolidate(keys, diff, order, sums)
    if kept < 0:
        at = -kept - 1
        row = packing.unpack(keys[at : at + 1])[0]
        raise MultiplicityOverflow(what, tuple(int(v) for v in row))
    keys, diff = keys[:kept], sums[:kept]
    return Layer(packing.unpack(keys), diff, packing, keys)
