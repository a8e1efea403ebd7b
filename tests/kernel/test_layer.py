"""The kernel's layers on their own: search keys, consolidation, lookups and bounded ranges.

Plain numpy: no Spark, no files. Every search is checked against a scan, packed keys and byte
keys alike, at the edges of a long too.
"""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from wcoj_core.errors import MultiplicityOverflow
from wcoj_core.kernel.keys import encode
from wcoj_core.kernel.layer import (
    Bound,
    Layer,
    enumerate_ranges,
    lookup_sum,
    mirrored_lookup_sum,
    summed_sorted,
)


def test_encoding_orders_rows_like_tuples_including_negatives() -> None:
    rng = np.random.default_rng(3)
    rows = rng.integers(-(2**62), 2**62, size=(500, 3))
    rows[:100, 0] = rng.integers(-3, 3, size=100)  # many equal first columns
    order = np.argsort(encode(rows), kind="stable")
    assert [tuple(r) for r in rows[order]] == sorted(tuple(r) for r in rows)


def test_layer_consolidates_and_looks_up() -> None:
    rows = np.array([[1, 2], [0, 5], [1, 2], [3, 3], [0, 5]])
    diff = np.array([1, 2, -1, 4, 1])
    layer = Layer.build(rows, diff)
    assert layer.rows.tolist() == [[0, 5], [3, 3]]  # (1, 2) summed to zero
    assert layer.diff.tolist() == [3, 4]
    assert lookup_sum([layer], np.array([[3, 3], [1, 2], [0, 5]])).tolist() == [4, 0, 3]
    lo, hi = layer.ranges(np.array([[0], [2], [3]]))
    assert (hi - lo).tolist() == [1, 0, 1]


def test_ranges_sum_layers_and_drop_what_cancels() -> None:
    base = Layer.build(np.array([[1, 10], [1, 11], [2, 20]]), np.array([1, 1, 1]))
    later = Layer.build(np.array([[1, 11], [1, 12], [2, 20]]), np.array([-1, 2, 1]))
    owner, rest, diff = enumerate_ranges([base, later], np.array([[1], [2], [9]]))
    got = sorted(zip(owner.tolist(), rest[:, 0].tolist(), diff.tolist(), strict=True))
    assert got == [(0, 10, 1), (0, 12, 2), (1, 20, 2)]


def test_bounds_narrow_a_range_to_the_values_a_filter_keeps() -> None:
    rows = np.array([[1, v] for v in range(10)] + [[2, v] for v in range(5)])
    layer = Layer.build(rows, np.ones(len(rows), dtype=np.int64))
    keys = np.array([[1], [2]])
    bounds = [
        Bound(np.array([3, 1]), lower=True, inclusive=False),  # value > 3 / > 1
        Bound(np.array([7, 9]), lower=False, inclusive=True),  # value <= 7 / <= 9
    ]
    owner, rest, _ = enumerate_ranges([layer], keys, bounds)
    got = sorted(zip(owner.tolist(), rest[:, 0].tolist(), strict=True))
    assert got == [(0, 4), (0, 5), (0, 6), (0, 7), (1, 2), (1, 3), (1, 4)]


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
    layer = Layer.build(np.array(rows, dtype=np.int64), np.array(diffs, dtype=np.int64))
    if live:
        spans = [max(r[j] for r in live) - min(r[j] for r in live) for j in (0, 1)]
        packable = sum(s.bit_length() for s in spans) <= 64  # else searched as bytes
        assert (layer.packing is None) == (not packable)
    assert [tuple(r) for r in layer.rows.tolist()] == sorted(live)
    lo, hi = SPANS[span]
    values = st.one_of(st.integers(lo, hi), st.sampled_from([I64_MIN, I64_MAX, lo, hi, 0]))
    stored = st.sampled_from(rows)
    keys = probes.draw(
        st.lists(st.one_of(stored, st.tuples(values, values)), min_size=1, max_size=10), "keys"
    )
    looked = lookup_sum([layer], np.array(keys, dtype=np.int64).reshape(-1, 2))
    assert looked.tolist() == [live.get(k, 0) for k in keys]
    firsts = [k[0] for k in keys]
    # Bounds also at the stored values and next to them, where off-by-one errors show.
    near = sorted({v + e for _, v in rows for e in (-1, 0, 1) if I64_MIN <= v + e <= I64_MAX})
    edges = st.one_of(values, st.sampled_from(near))
    lower = probes.draw(st.lists(edges, min_size=len(keys), max_size=len(keys)), "lower")
    upper = probes.draw(st.lists(edges, min_size=len(keys), max_size=len(keys)), "upper")
    strict = probes.draw(st.tuples(st.booleans(), st.booleans()), "strict")
    bounds = [
        Bound(np.array(lower, dtype=np.int64), lower=True, inclusive=not strict[0]),
        Bound(np.array(upper, dtype=np.int64), lower=False, inclusive=not strict[1]),
    ]
    owner, rest, diff = enumerate_ranges(
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


@settings(max_examples=200)
@given(
    width=st.integers(1, 3),
    parts=st.lists(
        st.lists(st.tuples(st.integers(0, 3), st.integers(-2, 2)), max_size=12), max_size=4
    ),
    wide=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_sorted_layers_summed_by_a_merge_equal_a_naive_sum(width, parts, wide, seed) -> None:
    """`summed_sorted` (the fold of a trace's recent segments) against a Counter over every
    layer's rows: boxes that differ between layers, rows that cancel across them, and rows
    too wide to pack (the fallback)."""
    rng = np.random.default_rng(seed)
    layers, naive = [], Counter()
    for part in parts:
        rows = np.array(
            [[v * (2**40 if wide and j else 1) + j for j in range(width)] for v, _ in part],
            dtype=np.int64,
        ).reshape(-1, width)
        rows += rng.integers(-5, 5, size=rows.shape) * (rng.random() < 0.5)
        diff = np.array([d for _, d in part], dtype=np.int64)
        layers.append(Layer.build(rows, diff))
        for r, d in zip(rows.tolist(), diff.tolist(), strict=True):
            naive[tuple(r)] += d
    summed = summed_sorted(layers) if layers else Layer.empty(width)
    expect = sorted((r, d) for r, d in naive.items() if d)
    assert [tuple(r) for r in np.asarray(summed.rows).tolist()] == [r for r, _ in expect]
    assert np.asarray(summed.diff).tolist() == [d for _, d in expect]
    if len(summed) and summed.packing is not None:
        assert np.array_equal(summed.search_keys(), summed.packing.pack(summed.rows)[0])


def test_sorted_layers_summed_raise_an_overflow() -> None:
    big = Layer.build(np.array([[1], [2]]), np.array([2**62, 1]))
    with pytest.raises(MultiplicityOverflow):
        summed_sorted([big, big])


@settings(max_examples=200)
@given(
    held=st.lists(st.tuples(st.integers(0, 6), st.integers(0, 6)), max_size=20),
    changed=st.lists(st.tuples(st.integers(0, 6), st.integers(0, 6)), max_size=12),
    lopsided=st.booleans(),
)
def test_a_mirrored_lookup_equals_a_whole_one(held, changed, lopsided) -> None:
    """`mirrored_lookup_sum` (half an undirected change looked up, the rest read from the
    mirrors) equals `lookup_sum` over a relation held in both directions; a layer marked
    symmetric whose rows are not each other's mirrors is looked up whole."""

    def both(pairs):
        rows = [(a, b) for a, b in pairs if a != b] + [(b, a) for a, b in pairs if a != b]
        return np.array(rows, dtype=np.int64).reshape(-1, 2)

    rows = both(held)
    layers = [Layer.build(rows, np.ones(len(rows), dtype=np.int64))] if len(rows) else []
    rows = both(changed)
    if lopsided and len(rows):
        rows = rows[: len(rows) // 2 + 1]  # not its own mirror: the whole lookup
    if not len(rows):
        return
    layer = Layer.build(rows, np.arange(1, len(rows) + 1, dtype=np.int64))
    layer.symmetric = True
    assert mirrored_lookup_sum(layers, layer).tolist() == lookup_sum(layers, layer.rows).tolist()
