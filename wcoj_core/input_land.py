"""An epoch's landed changes, as the engine reads them: consolidated layers on the driver.

`land` turns a relation's changes at an epoch (an Arrow table, a stream of record batches, a
Spark DataFrame or a stored `Layer`) into one consolidated `Layer` of its data columns, an
undirected relation's read both ways, self-loops dropped (`_both_ways`). Record batches are
summed into sorted runs of the budget's run size (`wcoj_core.spill.Sorter`), spilled and merged
into a mapped layer: a file of any size lands within the budget. Only a DataFrame needs Spark.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa

from wcoj_core.arrow import longs
from wcoj_core.errors import InputError, listed
from wcoj_core.kernel.changes import changes_layer, data_rows
from wcoj_core.kernel.keys import I64, U64, Packing
from wcoj_core.kernel.layer import Layer
from wcoj_core.kernel.native import native
from wcoj_core.meaning import RelationSpec
from wcoj_core.store.location import Location
from wcoj_core.traces import DIFF, TIME, relation_columns

if TYPE_CHECKING:
    from wcoj_core.spill import Sorter, Spill

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

# An epoch's changes are first collected with a limit of this many rows (one cheap job for the
# usual small epoch); a larger epoch is counted, then collected whole, which costs Spark less
# than a large limit (a limit gathers its rows through a shuffle to one partition).
DRIVER_PROBE_ROWS = 250_000

Changes = Any  # pa.Table | pa.RecordBatchReader | DataFrame | Layer
# Progress callback: rows landed so far.
Landing = Any


@dataclass(frozen=True, slots=True)
class Landed:
    """A relation's landed changes at an epoch: consolidated, as the relation reads them (both
    directions for an undirected one, each edge once when `ranked`); rows read, self-loops
    dropped, and whether its ids are relabelled by rank (`by_rank`)."""

    layer: Layer
    rows_in: int
    self_loops: int = 0
    ranked: bool = False


def is_dataframe(changes: Changes) -> bool:
    return not isinstance(changes, pa.Table | pa.RecordBatchReader | Layer) and hasattr(
        changes, "sparkSession"
    )


def check_columns(spec: RelationSpec, changes: Changes, epoch: int) -> None:
    """Refuse changes without the relation's columns (``c0 ..``, ``diff``; ``time`` allowed)."""
    if isinstance(changes, Layer):
        if changes.width != spec.arity:
            raise InputError(
                f"changes have {changes.width} columns, the relation {spec.arity}",
                source=f"relation {spec.name!r} at epoch {epoch}",
            )
        return
    cols = relation_columns(spec.arity)
    if isinstance(changes, pa.Table):
        names = list(changes.column_names)
    elif isinstance(changes, pa.RecordBatchReader):
        names = list(changes.schema.names)
    else:
        names = list(changes.columns)
    missing = [c for c in (*cols, DIFF) if c not in names]
    extra = [c for c in names if c not in (*cols, DIFF, TIME)]
    if missing or extra:
        raise InputError(
            f"changes must have columns {[*cols, DIFF]} (and optionally {TIME}); "
            f"missing {listed(missing)}, unexpected {listed(extra)}",
            source=f"relation {spec.name!r} at epoch {epoch}",
        )


def land(
    spec: RelationSpec,
    changes: Changes,
    budget: int | None = None,
    spill: Spill | None = None,
    progress: Any = None,
    ranked: bool = False,
) -> Landed | None:
    """The changes as a consolidated layer on the driver, or None when they hold more than
    `budget` rows (None: no limit; a DataFrame is not collected then). With `spill`, a table
    or stream larger than a sorted run is landed in runs (see the module); `progress` is told
    the rows landed so far. `ranked` (an undirected relation whose ids nothing reads back, read
    by atoms that each match only edges from lower to higher, `plan.oriented`): its ids
    relabelled by (degree, id) rank where their span allows, each edge held once (`by_rank`)."""
    landed = _land(spec, changes, budget, spill, progress, ranked)
    if landed is None or not ranked or landed.ranked or not spec.undirected:
        return landed
    layer = by_rank(landed.layer)
    return landed if layer is None else Landed(layer, landed.rows_in, landed.self_loops, True)


def _land(
    spec: RelationSpec,
    changes: Changes,
    budget: int | None,
    spill: Spill | None,
    progress: Any,
    ranked: bool,
) -> Landed | None:
    cols = relation_columns(spec.arity)
    if isinstance(changes, Layer):
        if not spec.undirected:
            return Landed(changes, len(changes))
        held = [(changes.col(0), changes.col(1), np.asarray(changes.diff, dtype=I64))]
        return _both_ways(held, len(changes), ranked)
    if not isinstance(changes, pa.RecordBatchReader | pa.Table):  # a DataFrame
        changes = _collect(changes.select(*cols, DIFF), budget, spill)
        if changes is None:
            return None
    if isinstance(changes, pa.RecordBatchReader):
        return _streamed(spec, changes, budget, spill, progress, ranked)
    table = changes.select([*cols, DIFF])
    if budget is not None and table.num_rows > budget:
        return None
    if spec.undirected or (spill is not None and table.nbytes > spill.run_bytes):
        batches = table.to_batches(max_chunksize=1 << 20)  # (both directions in one sort)
        return _streamed(spec, batches, budget, spill, progress, ranked)
    _refuse_nulls(table, spec)
    return Landed(changes_layer(cols, table), table.num_rows)


def _refuse_nulls(table: pa.Table | pa.RecordBatch, spec: RelationSpec) -> None:
    nulls = [c for c, col in zip(table.column_names, table.columns, strict=True) if col.null_count]
    if nulls:
        raise InputError(
            f"changes hold null values in {', '.join(nulls)}; every value must be a whole number",
            source=f"relation {spec.name!r}",
        )


def _streamed(
    spec: RelationSpec,
    batches: Iterable[pa.RecordBatch],
    budget: int | None,
    spill: Spill | None,
    progress: Any,
    ranked: bool = False,
) -> Landed | None:
    """Record batches landed through sorted runs (see the module); None past `budget` rows;
    `ranked`: as `land` (done here when the batches are held)."""
    from wcoj_core.spill import Scratch, Spill

    if spill is None:  # no budget given: one run holds everything (as a table would)
        spill = Spill(Scratch(None, lambda _: None), 1 << 62, 1 << 62, 1 << 30)
    sorter = spill.sorter(spec.arity, "summing the changes")
    loops = spill.sorter(spec.arity, "summing the changes") if spec.undirected else None
    rows_in = 0
    # A reader's batch (a block of a file) is added a slice at a time: at most a quarter of a
    # sorted run, both directions of an undirected relation included.
    piece = max(1 << 12, spill.run_bytes // (4 * 8 * (spec.arity + 1) * (2 if loops else 1)))
    # An undirected relation's slices are held as read while both their directions fit one
    # sorted run (`_both_ways` then makes them once, as one sort's columns); past that, they
    # go through the sorter like any other.
    held: list[tuple[np.ndarray, np.ndarray, np.ndarray]] | None = [] if loops else None
    held_bytes = 0
    for whole in batches:
        for at in range(0, whole.num_rows, piece):
            part = whole.slice(at, piece)
            if held is not None and part.num_rows:
                a, b, diff = _columns(spec, part)
                held.append((a, b, diff))
                held_bytes += 2 * 8 * 3 * len(diff)
                rows_in += part.num_rows
                if held_bytes > spill.run_bytes:
                    assert loops is not None
                    for a, b, diff in held:
                        _add_both(a, b, diff, sorter, loops)
                    held = None
            else:
                rows_in = _add(spec, part, sorter, loops, rows_in)
            if budget is not None and rows_in > budget:
                return None
            if progress is not None:
                progress(rows_in)
    if held is not None:
        return _both_ways(held, rows_in, ranked)
    layer = sorter.layer()
    if loops is None:
        return Landed(layer, rows_in)
    # every row went in both ways with one diff: the summed layer is its own mirror
    return Landed(layer.mirrored() if len(layer) else layer, rows_in, len(loops.layer()))


def _columns(
    spec: RelationSpec, batch: pa.RecordBatch
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A binary relation's slice of landed rows as its two columns and diffs (views of the
    batch's buffers where they are longs)."""
    batch = batch.select([*relation_columns(spec.arity), DIFF])
    _refuse_nulls(batch, spec)
    return longs(batch.column(0)), longs(batch.column(1)), longs(batch.column(DIFF))


def _both_ways(
    held: Sequence[tuple[np.ndarray, np.ndarray, np.ndarray]], rows_in: int, ranked: bool
) -> Landed:
    """An undirected relation's landed slices (columns and diffs, as read) summed into one
    layer of both directions, self-loops dropped: each column of the sort made once, with
    no row array and no second pass (as the sorter would give them)."""
    kept: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
    loops: list[tuple[np.ndarray, np.ndarray]] = []
    for a, b, diff in held:
        loop = a == b
        if loop.any():
            loops.append((a[loop], diff[loop]))
            keep = ~loop
            a, b, diff = a[keep], b[keep], diff[keep]
        kept.append((a, b, diff))
    layer, ranked = _both_keys(kept, ranked)
    if layer is None:  # the ids span more than 32 bits: rows sorted as columns
        a, b, d = (np.concatenate([t[i] for t in kept]) for i in range(3))
        both = [np.concatenate([a, b]), np.concatenate([b, a])]
        layer = Layer.build(both, np.concatenate([d, d]), what="summing the changes")
    del kept
    if len(layer) and not ranked:
        layer.mirrored()
    dropped = 0
    if loops:  # the self-loop tuples whose multiplicities do not sum to 0, as the sorter counts
        looped = np.concatenate([v for v, _ in loops])
        dropped = len(
            Layer.build(
                [looped, looped], np.concatenate([d for _, d in loops]), what="summing the changes"
            )
        )
    return Landed(layer, rows_in, dropped, ranked)


def _both_keys(
    kept: Sequence[tuple[np.ndarray, np.ndarray, np.ndarray]], ranked: bool
) -> tuple[Layer | None, bool]:
    """Slices of edges (no self-loop) summed both ways as one layer, each edge packed straight
    into its two keys (no column of both directions is made; the diffs neither, when every
    edge has the same); None when the ids' span does not pack twice into 64 bits. `ranked`:
    the ids relabelled by `degree_ranks` as they are packed, when it gives them, and each edge
    packed once, from its lower rank to its higher; whether it did."""
    m = sum(len(d) for _, _, d in kept)
    if m == 0:
        return Layer.empty(2), False
    low = min(min(int(a.min()), int(b.min())) for a, b, d in kept if len(d))
    high = max(max(int(a.max()), int(b.max())) for a, b, d in kept if len(d))
    rank = degree_ranks([c for a, b, _ in kept for c in (a, b)], low, high) if ranked else None
    base = low
    if rank is not None:
        low, high = 0, len(rank) - 1
    bits = (high - low).bit_length()
    if 2 * bits > 64:
        return None, False
    packing = Packing((low, low), (high, high), (bits, bits))
    ways = 1 if rank is not None else 2
    keys = np.empty(ways * m, dtype=U64)
    at = 0
    for a, b, diff in kept:
        k = len(diff)
        if rank is not None:
            a, b = rank[a - base], rank[b - base]
            a, b = np.minimum(a, b), np.maximum(a, b)
        for j, pair in enumerate([(a, b), (b, a)][:ways]):
            into = keys[j * m + at : j * m + at + k]
            native.pack(pair, k, packing.lows, packing.highs, packing.bits, into, None)
        at += k
    d0 = next(int(d[0]) for _, _, d in kept if len(d))
    if all(bool((d == d0).all()) for _, _, d in kept):
        diffs = np.full(1, d0, dtype=I64)  # one for all
    else:
        one_way = np.concatenate([d for _, _, d in kept])
        diffs = np.concatenate([one_way] * ways)
    layer = Layer.from_keys(keys, packing, diffs, consolidate=True, what="summing the changes")
    return layer, rank is not None


def degree_ranks(columns: Sequence[np.ndarray], low: int, high: int) -> np.ndarray | None:
    """Each id in ``[low, high]`` (at ``id - low``) mapped to its rank by (degree, id): how
    often it appears in `columns`, ties by id; None when the span is sparse (more than four
    ids for each value given): its table would cost more than the values.

    >>> degree_ranks([np.array([5, 5, 7]), np.array([6, 7, 7])], 5, 7).tolist()
    [1, 0, 2]
    """
    span = high - low + 1
    if span > 4 * sum(len(c) for c in columns) + (1 << 16):
        return None
    degree = np.zeros(span, dtype=I64)
    for c in columns:
        degree += np.bincount(c - low, minlength=span)
    rank = np.empty(span, dtype=I64)
    rank[np.argsort(degree, kind="stable")] = np.arange(span, dtype=I64)
    return rank


def by_rank(layer: Layer) -> Layer | None:
    """A landed undirected relation's edges relabelled by (degree, id) rank (`degree_ranks`),
    each once, from lower rank to higher, sorted again; None when the ids are sparse. A
    one-to-one relabelling leaves a clique count (`wcoj_core.query.plan.order_free`) the same,
    ranking makes a vertex propose only among neighbours of higher degree, and a query whose
    every atom matches only edges from lower to higher (`plan.oriented`) finds the same
    bindings in the one direction: half the rows to sort and search."""
    if not len(layer):
        return None
    a, b = layer.col(0), layer.col(1)
    low, high = int(a.min()), int(a.max())
    rank = degree_ranks([a], low, high)
    if rank is None:
        return None
    a, b = rank[a - low], rank[b - low]
    up = np.flatnonzero(a < b)
    return Layer.build([a[up], b[up]], np.asarray(layer.diff)[up])


def _add(
    spec: RelationSpec, batch: pa.RecordBatch, sorter: Sorter, loops: Sorter | None, rows_in: int
) -> int:
    """One slice of landed rows added to the sorter (an undirected relation's both ways, its
    self-loops apart); the rows landed so far."""
    cols = relation_columns(spec.arity)
    if batch.num_rows:
        batch = batch.select([*cols, DIFF])
        _refuse_nulls(batch, spec)
        rows = data_rows(batch, cols)
        diff = longs(batch.column(DIFF))
        if loops is None:
            sorter.add(rows, diff)
        else:
            _add_both(rows[:, 0], rows[:, 1], diff, sorter, loops)
    return rows_in + batch.num_rows


def _add_both(
    a: np.ndarray, b: np.ndarray, diff: np.ndarray, sorter: Sorter, loops: Sorter
) -> None:
    """An undirected relation's rows (columns `a`, `b`) added both ways, self-loops apart."""
    loop = a == b
    if loop.any():
        picked = np.flatnonzero(loop)
        loops.add(np.stack([a[picked], b[picked]], axis=1), diff[picked])
        kept = np.flatnonzero(~loop)
        a, b, diff = a[kept], b[kept], diff[kept]
    both = np.empty((2 * len(diff), 2), dtype=I64, order="F")
    both[: len(diff), 0], both[: len(diff), 1] = a, b
    both[len(diff) :, 0], both[len(diff) :, 1] = b, a
    sorter.add(both, np.concatenate([diff, diff]))


def _collect(
    rows: DataFrame, budget: int | None, spill: Spill | None = None
) -> pa.Table | pa.RecordBatchReader | None:
    """A DataFrame's rows on the driver, or None beyond `budget` rows: collected with a limit of
    `DRIVER_PROBE_ROWS` first, then counted and collected whole, or with `spill` written as
    Parquet into the scratch folder and read back a batch at a time."""
    probe = DRIVER_PROBE_ROWS if budget is None else min(budget, DRIVER_PROBE_ROWS)
    table = rows.limit(probe + 1).toArrow()
    if table.num_rows > probe:
        if budget is not None and rows.count() > budget:
            return None
        if spill is not None:
            folder = spill.scratch.path("frame")
            rows.write.parquet(Location.of(folder).spark_uri())
            found = sorted(str(p) for p in folder.glob("*.parquet"))
            return _parquet_stream(found, rows.columns)
        table = rows.toArrow()
    return table


def _parquet_stream(files: Sequence[str], columns: Sequence[str]) -> pa.RecordBatchReader:
    """Parquet files' `columns` as int64 record batches, a batch at a time."""
    import pyarrow.parquet as pq

    schema = pa.schema([pa.field(c, pa.int64()) for c in columns])

    def batches() -> Iterable[pa.RecordBatch]:
        for f in files:
            for b in pq.ParquetFile(f).iter_batches(batch_size=1 << 20, columns=list(columns)):
                if b.num_rows:
                    yield from pa.Table.from_batches([b]).cast(schema).to_batches()

    return pa.RecordBatchReader.from_batches(schema, iter(batches()))
