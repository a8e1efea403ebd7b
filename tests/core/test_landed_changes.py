"""Landing an epoch's changes (`wcoj_core.input_land.land`) against a naive sum, on random rows.

Every way changes arrive — an Arrow table, a stream of record batches held whole (an
undirected relation's both directions made at once, `_both_ways`), a stream larger than a
sorted run (summed through the sorter's runs, spilled to scratch files), a layer — must land
as the same consolidated layer: the rows' multiplicities summed, zeros dropped, an undirected
relation read in both directions with its self-loops dropped and counted.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from wcoj_core.input_land import land
from wcoj_core.kernel.layer import Layer
from wcoj_core.meaning import relation_specs
from wcoj_core.spill import Scratch, Spill


def naive(
    rows: np.ndarray, diff: np.ndarray, undirected: bool
) -> tuple[Counter[tuple[int, ...]], int]:
    """The landed layer's rows and multiplicities, and the self-loop tuples dropped."""
    total: Counter[tuple[int, ...]] = Counter()
    loops: Counter[tuple[int, ...]] = Counter()
    for row, d in zip(rows.tolist(), diff.tolist(), strict=True):
        if undirected and row[0] == row[1]:
            loops[tuple(row)] += d
            continue
        total[tuple(row)] += d
        if undirected:
            total[(row[1], row[0])] += d
    return (
        Counter({k: v for k, v in total.items() if v}),
        sum(1 for v in loops.values() if v),
    )


def as_counter(layer: Layer) -> Counter[tuple[int, ...]]:
    rows = np.asarray(layer.rows).tolist()
    found = Counter({tuple(r): int(d) for r, d in zip(rows, np.asarray(layer.diff), strict=True)})
    assert len(found) == len(layer), "a landed layer holds each row once"
    assert sorted(found) == [tuple(r) for r in rows], "a landed layer is sorted"
    assert all(found.values()), "a landed layer holds no zero"
    return found


def changes(seed: int, n: int, span: int, unit: bool) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    rows = rng.integers(-span // 4, span, size=(n, 2))
    diff = np.ones(n, dtype=np.int64) if unit else rng.integers(-2, 3, size=n)
    return rows, diff


def batches(rows: np.ndarray, diff: np.ndarray, size: int) -> pa.RecordBatchReader:
    table = pa.table({"c0": rows[:, 0], "c1": rows[:, 1], "diff": diff})
    return pa.RecordBatchReader.from_batches(table.schema, table.to_batches(max_chunksize=size))


@pytest.mark.parametrize("undirected", [True, False])
@pytest.mark.parametrize("seed", range(6))
def test_every_way_changes_arrive_lands_as_the_naive_sum(
    tmp_path: Path, seed: int, undirected: bool
) -> None:
    span = 1 << 40 if seed == 5 else 40 if seed % 2 else 4000  # (ids wider than 32 bits)
    rows, diff = changes(seed, 3000, span=span, unit=seed % 3 == 0)
    spec = relation_specs({"e": 2}, undirected=["e"] if undirected else [])["e"]
    want, loops = naive(rows, diff, undirected)
    scratch = Scratch(tmp_path / "scratch", lambda _n: None)
    try:
        roomy = Spill(scratch, 1 << 30, 1 << 30, 1 << 20)
        tiny = Spill(scratch, run_bytes=4096, layer_bytes=4096, merge_bytes=8192)
        table = pa.table({"c0": rows[:, 0], "c1": rows[:, 1], "diff": diff})
        ways = {
            "table": land(spec, table),
            "stream, held whole": land(spec, batches(rows, diff, 517), None, roomy),
            "stream, through runs": land(spec, batches(rows, diff, 517), None, tiny),
            "layer": land(spec, Layer.build(rows, diff)),
        }
        assert scratch.spilled > 0, "the tiny runs were written"
    finally:
        scratch.close()
    for way, landed in ways.items():
        assert landed is not None
        assert as_counter(landed.layer) == want, way
        if way != "layer":  # a layer is landed already consolidated (its loops summed)
            assert landed.rows_in == len(diff), way
        if undirected and way != "layer":
            assert landed.self_loops == loops, way
        if undirected and len(landed.layer):
            # marked its own mirror: its columns swapped and sorted again are the layer itself
            layer = landed.layer
            assert layer.symmetric, way
            swapped = Layer.sort([layer.col(1), layer.col(0)], layer.diff)
            assert np.array_equal(swapped.rows, layer.rows), way
            assert np.array_equal(swapped.diff, layer.diff), way


def test_a_stream_past_the_row_budget_is_refused() -> None:
    rows, diff = changes(1, 1000, span=100, unit=True)
    spec = relation_specs({"e": 2}, undirected=["e"])["e"]
    assert land(spec, batches(rows, diff, 100), budget=999) is None
    assert land(spec, batches(rows, diff, 100), budget=1000) is not None


@pytest.mark.parametrize("seed", range(6))
def test_an_undirected_sets_changes_stay_their_own_mirror(seed: int) -> None:
    """An undirected set's effective change and its support change, marked `symmetric` (what
    lets a warm epoch skip sorting them again for the reversed arrangement and count both
    columns once), are their own mirror: checked row by row against the naive mirror, epoch
    after epoch of random insertions and deletions, present edges and absent ones alike."""
    from wcoj_core.indexes import identity
    from wcoj_core.kernel.changes import counted_by, counts_delta, support_delta
    from wcoj_core.kernel.index import EpochLayers
    from wcoj_core.meaning import effects
    from wcoj_core.query.plan import AtomView

    rng = np.random.default_rng(seed)
    spec = relation_specs({"edge": 2}, undirected=["edge"])["edge"]
    held = Layer.empty(2)

    class Opened:  # the relation as held before the epoch, through any view key
        def __init__(self, layer: Layer) -> None:
            self.layer = layer

        def at(self, key):
            return [self.layer] if len(self.layer) else []

        def layers(self, view, order):
            return self.at(None)

    def mirror_of(layer: Layer) -> dict[tuple[int, int], int]:
        rows = np.asarray(layer.rows).tolist()
        return {(b, a): d for (a, b), d in zip(rows, np.asarray(layer.diff).tolist(), strict=True)}

    def as_dict(layer: Layer) -> dict[tuple[int, ...], int]:
        rows = np.asarray(layer.rows).tolist()
        return {tuple(r): d for r, d in zip(rows, np.asarray(layer.diff).tolist(), strict=True)}

    for _ in range(5):
        rows = rng.integers(0, 12, size=(40, 2))
        diff = rng.choice([-1, 1, 2], size=40)
        table = pa.table({"c0": rows[:, 0], "c1": rows[:, 1], "diff": diff})
        landed = land(spec, table)
        assert landed is not None
        eff = effects(spec, landed.layer, Opened(held).at(identity(2)), None)
        change = eff.change
        if len(change):
            assert change.symmetric
            assert as_dict(change) == mirror_of(change)
            layers = EpochLayers({"rel/edge": Opened(held)}, {"rel/edge": change})  # type: ignore[arg-type]
            view = AtomView("edge", (0, 1))
            known = None if eff.held is None else (eff.change, eff.held)
            support = support_delta(layers, view, known)
            if len(support):
                assert support.symmetric and as_dict(support) == mirror_of(support)
                assert counted_by(support, (1,)) == (0,)
                by_second = Counter()
                for (_, b), d in as_dict(support).items():
                    by_second[(b,)] += d
                assert as_dict(counts_delta(support, (0,))) == {
                    k: v for k, v in by_second.items() if v
                }
        total = Counter(as_dict(held))
        for k, v in as_dict(change).items():
            total[k] += v
        held = Layer.build(
            np.array(sorted(k for k, v in total.items() if v), dtype=np.int64).reshape(-1, 2),
            np.array([total[k] for k in sorted(k for k, v in total.items() if v)], dtype=np.int64),
        )
        assert set(np.asarray(held.diff).tolist()) <= {1}  # a set
