"""The keyed path (`wcoj_core.keyed`): its sorted layers, and the engine taking it.

The oracle tests in `test_engine_oracle.py` run random queries through the keyed path and
through both Spark paths, interleaved. These tests cover what they cannot see: the layers'
binary searches on their own, the keyed path doing the same work as the Spark path (same
prefixes, same counts, same output), its index following other writers and compactions, and a
failed write leaving the state as it was.
"""

from __future__ import annotations

import random
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pyspark.sql import DataFrame, SparkSession

from wcoj_core import keyed
from wcoj_core.engine import Engine
from wcoj_core.errors import StateError
from wcoj_core.naive import naive_eval
from wcoj_core.query.builtins import builtin
from wcoj_core.query.ir import CmpOp, Var

TRIANGLES = builtin("triangles")


# -- layers ---------------------------------------------------------------------------------------


def test_encoding_orders_rows_like_tuples_including_negatives() -> None:
    rng = np.random.default_rng(3)
    rows = rng.integers(-(2**62), 2**62, size=(500, 3))
    rows[:100, 0] = rng.integers(-3, 3, size=100)  # many equal first columns
    order = np.argsort(keyed.encode(rows), kind="stable")
    assert [tuple(r) for r in rows[order]] == sorted(tuple(r) for r in rows)


def test_layer_consolidates_and_looks_up() -> None:
    rows = np.array([[1, 2], [0, 5], [1, 2], [3, 3], [0, 5]])
    diff = np.array([1, 2, -1, 4, 1])
    layer = keyed.Layer.build(rows, diff)
    assert layer.rows.tolist() == [[0, 5], [3, 3]]  # (1, 2) summed to zero
    assert layer.diff.tolist() == [3, 4]
    assert keyed.lookup_sum([layer], np.array([[3, 3], [1, 2], [0, 5]])).tolist() == [4, 0, 3]
    lo, hi = layer.ranges(np.array([[0], [2], [3]]))
    assert (hi - lo).tolist() == [1, 0, 1]


def test_ranges_sum_layers_and_drop_what_cancels() -> None:
    base = keyed.Layer.build(np.array([[1, 10], [1, 11], [2, 20]]), np.array([1, 1, 1]))
    later = keyed.Layer.build(np.array([[1, 11], [1, 12], [2, 20]]), np.array([-1, 2, 1]))
    owner, rest, diff = keyed.enumerate_ranges([base, later], np.array([[1], [2], [9]]))
    got = sorted(zip(owner.tolist(), rest[:, 0].tolist(), diff.tolist(), strict=True))
    assert got == [(0, 10, 1), (0, 12, 2), (1, 20, 2)]


def test_bounds_narrow_a_range_to_the_values_a_filter_keeps() -> None:
    rows = np.array([[1, v] for v in range(10)] + [[2, v] for v in range(5)])
    layer = keyed.Layer.build(rows, np.ones(len(rows), dtype=np.int64))
    keys = np.array([[1], [2]])
    bounds = [
        keyed.Bound(np.array([3, 1]), lower=True, inclusive=False),  # value > 3 / > 1
        keyed.Bound(np.array([7, 9]), lower=False, inclusive=True),  # value <= 7 / <= 9
    ]
    owner, rest, _ = keyed.enumerate_ranges([layer], keys, bounds)
    got = sorted(zip(owner.tolist(), rest[:, 0].tolist(), strict=True))
    assert got == [(0, 4), (0, 5), (0, 6), (0, 7), (1, 2), (1, 3), (1, 4)]
    p = keyed.Prefixes({Var("b"): np.array([3, 1])}, np.ones(2, dtype=np.int64))
    from wcoj_core.query.ir import Filter

    kept = Filter(Var("c"), CmpOp.NE, Var("b"))
    made, left = keyed._bounds(Var("c"), [Filter(Var("b"), CmpOp.LT, Var("c")), kept], p)
    assert [(b.lower, b.inclusive, b.values.tolist()) for b in made] == [(True, False, [3, 1])]
    assert left == [kept]  # a range cannot apply !=: it is filtered after proposing


I64_MIN, I64_MAX = -(2**63), 2**63 - 1
SPANS = {"packed": (-3, 5), "wide": (I64_MIN, I64_MAX)}


@st.composite
def layer_rows(draw: st.DrawFn) -> tuple[str, list[tuple[int, int]], list[int]]:
    """Rows of two columns, small (one packed integer each) or spanning every long (bytes)."""
    span = draw(st.sampled_from(sorted(SPANS)), label="span")
    lo, hi = SPANS[span]
    values = st.one_of(st.integers(lo, hi), st.sampled_from([lo, hi, 0]))
    rows = draw(st.lists(st.tuples(values, values), min_size=1, max_size=40), label="rows")
    diffs = draw(st.lists(st.integers(-2, 2), min_size=len(rows), max_size=len(rows)))
    if span == "wide":  # two columns of 64 bits each: too wide to pack, searched as bytes
        rows += [(I64_MIN, I64_MIN), (I64_MAX, I64_MAX)]
        diffs += [1, 1]
    return span, rows, diffs


@settings(max_examples=400)  # numpy only: many examples cost about a second
@given(data=layer_rows(), probes=st.data())
def test_layer_searches_equal_a_scan_packed_or_not(data, probes) -> None:
    """Lookups, ranges and bounded ranges against a plain scan, at the edges of a long too."""
    span, rows, diffs = data
    summed: Counter = Counter()
    for r, d in zip(rows, diffs, strict=True):
        summed[r] += d
    live = {r: d for r, d in summed.items() if d}
    layer = keyed.Layer.build(np.array(rows, dtype=np.int64), np.array(diffs, dtype=np.int64))
    if live:
        assert (layer.packing is None) == (span == "wide")
    assert [tuple(r) for r in layer.rows.tolist()] == sorted(live)
    lo, hi = SPANS[span]
    values = st.one_of(st.integers(lo, hi), st.sampled_from([I64_MIN, I64_MAX, lo, hi, 0]))
    stored = st.sampled_from(rows)
    keys = probes.draw(
        st.lists(st.one_of(stored, st.tuples(values, values)), min_size=1, max_size=10), "keys"
    )
    looked = keyed.lookup_sum([layer], np.array(keys, dtype=np.int64).reshape(-1, 2))
    assert looked.tolist() == [live.get(k, 0) for k in keys]
    firsts = [k[0] for k in keys]
    # Bounds also at the stored values and next to them, where off-by-one errors show.
    near = sorted({v + e for _, v in rows for e in (-1, 0, 1) if I64_MIN <= v + e <= I64_MAX})
    edges = st.one_of(values, st.sampled_from(near))
    lower = probes.draw(st.lists(edges, min_size=len(keys), max_size=len(keys)), "lower")
    upper = probes.draw(st.lists(edges, min_size=len(keys), max_size=len(keys)), "upper")
    strict = probes.draw(st.tuples(st.booleans(), st.booleans()), "strict")
    bounds = [
        keyed.Bound(np.array(lower, dtype=np.int64), lower=True, inclusive=not strict[0]),
        keyed.Bound(np.array(upper, dtype=np.int64), lower=False, inclusive=not strict[1]),
    ]
    owner, rest, diff = keyed.enumerate_ranges(
        [layer], np.array(firsts, dtype=np.int64).reshape(-1, 1), bounds
    )
    got = sorted(zip(owner.tolist(), rest[:, 0].tolist(), diff.tolist(), strict=True))

    def passes(v: int, i: int) -> bool:
        above = v > lower[i] if strict[0] else v >= lower[i]
        below = v < upper[i] if strict[1] else v <= upper[i]
        return above and below

    expected = sorted(
        (i, b, d)
        for i, a in enumerate(firsts)
        for (x, b), d in live.items()
        if x == a and passes(b, i)
    )
    assert got == expected


# -- the engine on the keyed path ------------------------------------------------------------------


def edge_frame(spark: SparkSession, changes: Counter) -> DataFrame:
    rows = [(a, b, d) for (a, b), d in changes.items() if d]
    return spark.createDataFrame(rows, "c0 long, c1 long, diff long")


def graph_epochs(seed: int, epochs: int = 4) -> list[Counter]:
    """A random graph, then epochs inserting and deleting undirected edges."""
    rng = random.Random(seed)
    present: set[tuple[int, int]] = set()
    out = []
    for t in range(epochs + 1):
        change: Counter = Counter()
        for _ in range(300 if t == 0 else 40):
            a, b = rng.sample(range(60), 2)
            if (a, b) not in present:
                present |= {(a, b), (b, a)}
                change[(a, b)] += 1
                change[(b, a)] += 1
        if t:
            for a, b in rng.sample(sorted(present), 15):
                if (a, b) in present:
                    present -= {(a, b), (b, a)}
                    change[(a, b)] -= 1
                    change[(b, a)] -= 1
        out.append(change)
    return out


def collected(df: DataFrame) -> Counter:
    found: Counter = Counter()
    for r in df.collect():
        found[(r["c0"], r["c1"], r["c2"])] += r["diff"]
    return Counter({k: v for k, v in found.items() if v})


def test_keyed_path_does_the_same_work_as_the_spark_path(
    small: SparkSession, tmp_path: Path
) -> None:
    """Same epochs both ways: same output, same prefixes and counts; fewer proposals at most."""
    epochs = graph_epochs(seed=11)
    fast = Engine(small, str(tmp_path / "keyed"), TRIANGLES)
    # The large-epoch Spark path reads consolidated views, so its row counts are exact too.
    slow = Engine(small, str(tmp_path / "spark"), TRIANGLES, keyed_epoch_rows=0, small_epoch_rows=0)
    graph: Counter = Counter()
    for t, change in enumerate(epochs):
        before = naive_eval(TRIANGLES, {"edge": dict(graph)})
        graph.update(change)
        after = naive_eval(TRIANGLES, {"edge": {k: v for k, v in graph.items() if v}})
        a = fast.apply_epoch(t, {"edge": edge_frame(small, change)})
        b = slow.apply_epoch(t, {"edge": edge_frame(small, change)})
        assert (a.metrics.path, b.metrics.path) == ("keyed", "spark")
        expected = Counter(after)
        expected.subtract(before)
        expected = Counter({k: v for k, v in expected.items() if v})
        assert collected(a.outputs["triangles"]) == expected == collected(b.outputs["triangles"])
        assert a.metrics.join_rows > 0
        mine = {(s.rule, s.var): s for s in a.metrics.steps}
        theirs = {(s.rule, s.var): s for s in b.metrics.steps}
        assert mine.keys() == theirs.keys()
        for key, s in mine.items():
            o = theirs[key]
            assert (s.prefixes, s.min_count_sum, s.validated) == (
                o.prefixes or 0,
                o.min_count_sum or 0,
                o.validated or 0,
            ), key
            # The order filters narrow the keyed path's ranges; Spark filters after proposing.
            assert s.proposed is not None and s.proposed <= (o.proposed or 0), key
        assert sum(s.proposed or 0 for s in mine.values()) < sum(
            s.proposed or 0 for s in theirs.values()
        )
    assert collected(fast.output()) == collected(slow.output())


def test_the_index_follows_another_writer_and_a_compaction(
    small: SparkSession, tmp_path: Path
) -> None:
    """Two engines take turns on one state; compaction every 2 batches; oracle after each."""
    state = str(tmp_path / "state")
    epochs = graph_epochs(seed=5, epochs=6)
    engines = [Engine(small, state, TRIANGLES, compact_every=2) for _ in range(2)]
    graph: Counter = Counter()
    for t, change in enumerate(epochs):
        engine = engines[(t // 2) % 2]  # 0, 0, 1, 1, 0, 0, 1
        graph.update(change)
        result = engine.apply_epoch(t, {"edge": edge_frame(small, change)})
        assert result.metrics.path == "keyed"
        expected = naive_eval(TRIANGLES, {"edge": {k: v for k, v in graph.items() if v}})
        assert collected(engine.output()) == Counter(expected), f"epoch {t}"
    index = engines[0]._keyed
    assert index is not None
    manifest = engines[0].store.current()
    for name, trace in index.traces.items():
        # After its last epoch the index may lag the other engine's commits, never disagree.
        paths = tuple(b.path for b in manifest.traces[name].batches)
        assert paths[: len(trace.paths)] == trace.paths or trace.paths == paths


def test_a_failed_keyed_write_applies_nothing(
    small: SparkSession, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    state = tmp_path / "state"
    epochs = graph_epochs(seed=2, epochs=1)
    engine = Engine(small, str(state), TRIANGLES)
    engine.apply_epoch(0, {"edge": edge_frame(small, epochs[0])})
    before = engine.store.current()
    writes = []
    real = keyed.KeyedIndex.write

    def failing(self, trace, rows, diff, time):  # the third write of the epoch fails
        writes.append(trace.name)
        if len(writes) == 3:
            raise StateError(f"state {self.root}: cannot write a batch (No space left on device)")
        return real(self, trace, rows, diff, time)

    monkeypatch.setattr(keyed.KeyedIndex, "write", failing)
    with pytest.raises(StateError, match="No space left"):
        engine.apply_epoch(1, {"edge": edge_frame(small, epochs[1])})
    assert engine.store.current() == before
    traces = state / "traces"
    live = {b.path for t in before.traces.values() for b in t.batches}
    on_disk = {f"traces/{d.name}/{b.name}" for d in traces.iterdir() for b in d.iterdir()}
    assert on_disk == live, "the staged batches were removed"
    monkeypatch.setattr(keyed.KeyedIndex, "write", real)
    result = engine.apply_epoch(1, {"edge": edge_frame(small, epochs[1])})
    assert result.metrics.path == "keyed"
    graph = Counter(epochs[0])
    graph.update(epochs[1])
    expected = naive_eval(TRIANGLES, {"edge": {k: v for k, v in graph.items() if v}})
    assert collected(engine.output()) == Counter(expected)


def test_the_path_choice(small: SparkSession, tmp_path: Path) -> None:
    """Too many changes, or an arrangement too big for the driver, stay on Spark's path."""
    epochs = graph_epochs(seed=9, epochs=3)
    engine = Engine(small, str(tmp_path / "state"), TRIANGLES, keyed_epoch_rows=20)
    assert engine.apply_epoch(0, {"edge": edge_frame(small, epochs[0])}).metrics.path == "spark"
    assert sum(1 for d in epochs[1].values() if d) > 20
    assert engine.apply_epoch(1, {"edge": edge_frame(small, epochs[1])}).metrics.path == "spark"
    engine.keyed_epoch_rows = 10_000
    engine.keyed_max_rows = 10
    assert engine.apply_epoch(2, {"edge": edge_frame(small, epochs[2])}).metrics.path == "spark"
    engine.keyed_max_rows = 10**9
    assert engine.apply_epoch(3, {"edge": edge_frame(small, epochs[3])}).metrics.path == "keyed"
