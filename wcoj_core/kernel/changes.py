"""Changes in and out of the kernel: relation changes, counts maintenance, output changes.

* `changes_layer` — an epoch's changes as an Arrow table (data columns and ``diff``), summed
  into a consolidated `Layer`; `changes_table` — the other way, in the stored batch schema.
* `support_delta` / `counts_delta` — a counts arrangement maintained from the changes alone:
  a view tuple whose multiplicity turns non-zero adds one to its key's count, one turning zero
  subtracts one (`support_delta` reads the old multiplicities of the changed tuples only).
* `output_changes` — rules' full bindings projected on the head and summed.

Every sum of multiplicities here is checked: one leaving int64 raises `MultiplicityOverflow`.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pyarrow as pa

from wcoj_core.arrow import long_array, longs
from wcoj_core.kernel.index import EpochLayers
from wcoj_core.kernel.join import head_block
from wcoj_core.kernel.keys import I64
from wcoj_core.kernel.layer import SUMMING, Layer, columns_of, lookup_sum
from wcoj_core.kernel.multiplicity import row_namer, sums_at, total
from wcoj_core.kernel.step import Prefixes
from wcoj_core.query.ir import Var
from wcoj_core.query.plan import AtomView, Version
from wcoj_core.traces import DIFF, TIME, relation_trace_name


def data_rows(table: pa.Table | pa.RecordBatch, columns: Sequence[str]) -> np.ndarray:
    """The data `columns` of a table as a column-major array of longs (no column: width 0).

    >>> data_rows(pa.table({"c0": [1, 2], "c1": [3, 4]}), ["c1"]).tolist()
    [[3], [4]]
    """
    rows = np.empty((table.num_rows, len(columns)), dtype=I64, order="F")
    for i, c in enumerate(columns):
        rows[:, i] = longs(table.column(c))
    return rows


def changes_layer(columns: Sequence[str], table: pa.Table) -> Layer:
    """Changes (an Arrow table with the data `columns` and ``diff``), consolidated.

    >>> t = pa.table({"c0": [2, 1, 2], "c1": [0, 0, 0], "diff": [1, 1, -1]})
    >>> layer = changes_layer(["c0", "c1"], t)
    >>> layer.rows.tolist(), layer.diff.tolist()
    ([[1, 0]], [1])
    """
    rows = data_rows(table, columns)  # column-major: see output_changes
    diff = longs(table.column(DIFF))
    return Layer.build(rows, diff, what="summing the changes")


def batch_schema(columns: Sequence[str]) -> pa.Schema:
    """The schema of a stored batch: the data columns, ``time`` and ``diff``, longs, no nulls."""
    return pa.schema([pa.field(c, pa.int64(), nullable=False) for c in (*columns, TIME, DIFF)])


def changes_table(
    columns: Sequence[str], rows: np.ndarray, diff: np.ndarray, time: int
) -> pa.Table:
    """Rows and diffs as a table in the stored batch schema, stamped `time`.

    >>> changes_table(["c0"], np.array([[4]]), np.array([2]), 7).to_pylist()
    [{'c0': 4, 'time': 7, 'diff': 2}]
    """
    # A contiguous column (a column-major array's) is taken by Arrow without a copy.
    arrays = [long_array(rows[:, j]) for j in range(len(columns))]
    arrays += [long_array(np.full(len(diff), time, dtype=I64)), long_array(diff)]
    return pa.Table.from_arrays(arrays, schema=batch_schema(columns))


def support_delta(
    layers: EpochLayers, view: AtomView, known: tuple[Layer, np.ndarray] | None = None
) -> Layer:
    """View tuples entering (+1) or leaving (-1) the non-zero support at this epoch. `known`:
    a layer of changes and the multiplicities its tuples held before (the relation's change
    and the lookup that made it, `wcoj_core.meaning.Effect.held`), read instead of looking
    them up again when the view's delta is that very layer."""
    name = relation_trace_name(view.relation)
    order = tuple(range(view.arity))
    delta = layers.delta(name, view, order)
    before = layers.layers(name, view, order, Version.OLD)
    if not any(len(layer) for layer in before):
        # Nothing held before (a first load): every tuple of the consolidated delta (no zero)
        # enters the support, and no array of old multiplicities is made.
        if delta.unit:
            return delta
        return delta.with_diff(np.ones(len(delta), dtype=I64), symmetric=True)
    if known is not None and known[0] is delta and len(known[1]) == len(delta):
        old = known[1]
    else:
        old = lookup_sum(before, delta.rows)
    namer = row_namer(columns_of(delta.rows))
    new = total([old.copy(), delta.diff], namer, "summing a tuple's multiplicity and change")
    change = (new != 0).astype(I64) - (old != 0).astype(I64)
    keep = change != 0
    # A `symmetric` delta (an undirected relation's) changes a tuple and its mirror alike, and
    # both held the same before (the relation is its own mirror in every epoch): its support
    # change is its own mirror too, so its counts by either column are one (`counted_by`).
    if keep.all():  # every tuple changed its support (a whole relation): same rows, same keys
        return delta.with_diff(change, symmetric=True)
    out = Layer(delta.rows[keep], change[keep])
    return out.mirrored() if delta.symmetric and len(out) else out


def counted_by(support: Layer, key: Sequence[int]) -> tuple[int, ...]:
    """The columns `counts_delta` groups by for `key`: a `symmetric` layer's counts by its
    second column are those by its first (two arrangements that are one)."""
    key = tuple(key)
    return (0,) if support.symmetric and key == (1,) else key


def counts_delta(support: Layer, key: Sequence[int]) -> Layer:
    """Support changes grouped by the key columns: a counts change.

    A key that is the layer's first columns is grouped as the rows lie (equal keys are
    adjacent: nothing to sort); a `symmetric` layer's counts by its second column are its
    counts by its first; a set's counts by another column of dense values are counted by value.

    >>> support = Layer.build(np.array([[1, 2], [1, 3], [2, 1], [3, 1]]), np.ones(4, dtype=I64))
    >>> counts_delta(support, (0,)).rows.tolist(), counts_delta(support, (0,)).diff.tolist()
    ([[1], [2], [3]], [2, 1, 1])
    >>> counts_delta(support.mirrored(), (1,)).diff.tolist()
    [2, 1, 1]
    >>> by_second = counts_delta(support, (1,))
    >>> by_second.rows.tolist(), by_second.diff.tolist()
    ([[1], [2], [3]], [2, 1, 1])
    """
    key = counted_by(support, key)
    cols = [support.col(k) for k in key]
    n = len(support)
    if len(key) == 1 and n and support.unit and key != (0,):  # by a column not sorted:
        low = int(cols[0].min())  # counted by value where the values are dense (no sort)
        span = int(cols[0].max()) - low + 1
        if span <= 4 * n:
            per = np.bincount(cols[0] - low, minlength=span)
            at = np.flatnonzero(per)
            return Layer((at + low).reshape(-1, 1), per[at], unit=bool(per.max() == 1))
    if not key or key != tuple(range(len(key))) or n == 0:
        return Layer.build(cols, support.diff)
    starts = np.zeros(n, dtype=bool)
    starts[0] = True
    for c in cols:
        np.not_equal(c[1:], c[:-1], out=starts[1:], where=~starts[1:])
    first = np.flatnonzero(starts)
    if support.unit:  # every diff 1: a key's count is the length of its run
        sums = np.diff(first, append=n).astype(I64, copy=False)
        return Layer(_rows_at(cols, first), sums, unit=len(sums) == 0 or bool(sums.max() == 1))
    sums = sums_at(np.asarray(support.diff, dtype=I64), first, row_namer(cols), SUMMING)
    if not sums.all():
        nonzero = sums != 0
        first, sums = first[nonzero], sums[nonzero]
    return Layer(_rows_at(cols, first), sums)


def _rows_at(cols: Sequence[np.ndarray], at: np.ndarray) -> np.ndarray:
    """The rows at positions `at` of the columns `cols`, as one Fortran-order array."""
    rows = np.empty((len(at), len(cols)), dtype=I64, order="F")
    for j, c in enumerate(cols):
        np.take(c, at, out=rows[:, j])
    return rows


def output_changes(
    prefixes: Sequence[Prefixes], head: Sequence[Var], distinct: bool = False
) -> tuple[np.ndarray, np.ndarray]:
    """Rules' full bindings projected on the head and summed: an output change (rows, diff).

    With `distinct` the caller knows each binding gives a different head tuple with a non-zero
    weight (a single rule on a fresh state whose head keeps every variable): the rows are then
    already consolidated, and are returned as they come, unsorted.
    """
    if not prefixes:
        return np.zeros((0, len(head)), dtype=I64), np.zeros(0, dtype=I64)
    # Column-major: each column is filled with one contiguous copy, and read as it is by the
    # sort or by Arrow when the batch is written (a row-major array's columns are strided).
    # One rule's bindings (a static evaluation's) usually hold that array already (`bindings`).
    block = head_block(prefixes[0], head) if len(prefixes) == 1 else None
    if block is not None:
        rows, weight = block, prefixes[0].weight
    else:
        rows = np.empty((sum(len(p) for p in prefixes), len(head)), dtype=I64, order="F")
        for i, v in enumerate(head):
            np.concatenate([p.cols[v] for p in prefixes], out=rows[:, i])
        weight = np.concatenate([p.weight for p in prefixes])
    if distinct:
        return rows, weight
    names = ", ".join(v.name for v in head)
    out = Layer.build(rows, weight, what=f"summing the output change ({names})")
    return out.rows, out.diff
