"""Layers opened from memory-mapped files: the same answers as the layer built in memory, and
no search that allocates memory in proportion to the layer.

A layer is saved as a persisted arrangement is (`rows` in Fortran order, `diff`, the search
keys of whole rows; its packing and unit flag kept aside) and reopened with
``np.load(mmap_mode="r")``: read-only arrays, so a search that wrote into them would fail.
Rows are drawn packed (small values, and a box of exactly 64 bits whose first column holds one
value) and unpacked (values spanning every long: byte keys), one to three columns wide.
"""

from __future__ import annotations

import tempfile
import tracemalloc
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from wcoj_core.kernel.keys import Packing, encode
from wcoj_core.kernel.layer import (
    Bound,
    Found,
    Layer,
    enumerate_ranges,
    find,
    lookup_sum_of,
)

I64_MIN, I64_MAX = -(2**63), 2**63 - 1
Span = list[tuple[int, int]]  # each column's lowest and highest value
Row = tuple[int, ...]
# Per span, the columns' values; every layer drawn holds a row at each edge of its box.
SPANS: dict[str, Span] = {
    "small": [(-3, 5)] * 3,
    "wide": [(I64_MIN, I64_MAX)] * 3,
    # One value, then 32 + 32 bits: packs into exactly 64 bits, a one-column prefix shifted 64.
    "exact64": [(7, 7), (-(2**31), 2**31 - 1), (-(2**31), 2**31 - 1)],
}


@contextmanager
def mapped(layer: Layer) -> Iterator[Layer]:
    """`layer` saved as three ``.npy`` files and opened again, memory-mapped."""
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        np.save(root / "rows.npy", np.asfortranarray(layer.rows))
        np.save(root / "diff.npy", layer.diff)
        np.save(root / "keys.npy", layer.search_keys())
        rows, diff, keys = (
            np.load(root / f"{n}.npy", mmap_mode="r") for n in ("rows", "diff", "keys")
        )
        assert rows.flags.f_contiguous and not rows.flags.writeable
        yield Layer(rows, diff, layer.packing, keys, unit=layer.unit)


@st.composite
def layer_rows(draw: st.DrawFn) -> tuple[Span, list[Row], list[int]]:
    """A span's columns, rows of one to three of them (the span's edges included) and diffs."""
    width = draw(st.integers(1, 3), label="width")
    span = SPANS[draw(st.sampled_from(sorted(SPANS)), label="span")][:width]
    value = [st.one_of(st.integers(lo, hi), st.sampled_from([lo, hi])) for lo, hi in span]
    rows = draw(st.lists(st.tuples(*value), min_size=1, max_size=40), label="rows")
    rows += [tuple(lo for lo, _ in span), tuple(hi for _, hi in span)]
    diffs = draw(
        st.lists(st.sampled_from([1, 1, 2, -1, -3]), min_size=len(rows), max_size=len(rows))
    )
    return span, rows, diffs


def probes(draw: st.DrawFn, span: Span, rows: list[Row], p: int) -> list[Row]:
    """Keys of `p` columns: stored rows' prefixes, values in and out of the span, the edges."""
    extreme = st.sampled_from([I64_MIN, I64_MAX, 0, -1])
    value = [
        st.one_of(
            st.integers(lo, hi),
            st.integers(lo - 1, hi + 1).filter(lambda v: I64_MIN <= v <= I64_MAX),
            extreme,
        )
        for lo, hi in span[:p]
    ]
    stored = st.sampled_from(rows).map(lambda r: r[:p])
    return draw(
        st.lists(st.one_of(stored, st.tuples(*value)), min_size=1, max_size=8), label=f"keys of {p}"
    )


def as_cols(keys: list[Row], p: int) -> list[np.ndarray]:
    return [np.array([k[j] for k in keys], dtype=np.int64) for j in range(p)]


def draw_bounds(draw: st.DrawFn, span: Span, rows: list[Row], p: int, m: int) -> list[Bound]:
    """Zero to two bounds on column `p`, at the stored values, next to them and at the edges."""
    near = sorted({r[p] + e for r in rows for e in (-1, 0, 1) if I64_MIN <= r[p] + e <= I64_MAX})
    edge = st.one_of(
        st.sampled_from(near), st.sampled_from([I64_MIN, I64_MAX]), st.integers(*span[p])
    )
    out = []
    for lower in draw(st.sampled_from([(), (True,), (False,), (True, False)]), label="bounds"):
        values = draw(st.lists(edge, min_size=m, max_size=m))
        out.append(Bound(np.array(values, dtype=np.int64), lower, draw(st.booleans())))
    return out


def found_lists(f: Found) -> tuple:
    return (
        f.owner.tolist(),
        f.rest.tolist(),
        f.diff.tolist(),
    )


@settings(max_examples=200)  # numpy only, a few files per example
@given(data=layer_rows(), draw=st.data())
def test_a_mapped_layer_answers_like_the_built_one(data, draw) -> None:
    span, rows, diffs = data
    width = len(span)
    built = Layer.build(np.array(rows, dtype=np.int64), np.array(diffs, dtype=np.int64))
    live = [tuple(r) for r in built.rows.tolist()]
    other = Layer.build(
        np.array(rows[::3], dtype=np.int64), -np.ones(len(rows[::3]), dtype=np.int64)
    )
    with mapped(built) as mine:
        mine.prepare(*range(width + 1))
        assert mine.search_keys().tolist() == built.search_keys().tolist()
        for p in range(width + 1):
            keys = probes(draw.draw, span, rows, p)
            cols, m = as_cols(keys, p), len(keys)
            lo, hi = mine.ranges_of(cols, m)
            assert (lo.tolist(), hi.tolist()) == tuple(x.tolist() for x in built.ranges_of(cols, m))
            # ... and both equal a scan.
            for k, a, b in zip(keys, lo.tolist(), hi.tolist(), strict=True):
                at = [i for i, r in enumerate(live) if r[:p] == k]
                assert (a, b) == ((at[0], at[-1] + 1) if at else (a, a))
            assert mine.lookup_of(cols, m).tolist() == built.lookup_of(cols, m).tolist()
            assert mine.contains_of(cols, m).tolist() == built.contains_of(cols, m).tolist()
            pair = [mine, other]
            assert (
                lookup_sum_of(pair, cols, m).tolist()
                == lookup_sum_of([built, other], cols, m).tolist()
            )
            if p == width:
                whole = np.array(keys, dtype=np.int64).reshape(m, p)
                assert mine.lookup(whole).tolist() == built.lookup(whole).tolist()
                continue
            bounds = draw_bounds(draw.draw, span, rows, p, m)
            got = mine.narrow_of(cols, m, lo, hi, bounds)
            want = built.narrow_of(cols, m, lo, hi, bounds)
            assert [x.tolist() for x in got] == [x.tolist() for x in want]
            got, want = mine.span_of(cols, m, bounds), built.span_of(cols, m, bounds)
            assert [x.tolist() for x in got] == [x.tolist() for x in want]
            if p + 1 != width:  # a step proposes one column, the one after its key
                continue
            assert found_lists(find([mine], cols, m, bounds)) == found_lists(
                find([built], cols, m, bounds)
            )
            assert found_lists(find(pair, cols, m, bounds)) == found_lists(
                find([built, other], cols, m, bounds)
            )
            key_rows = np.array(keys, dtype=np.int64).reshape(m, p)
            got = enumerate_ranges(pair, key_rows, bounds)
            want = enumerate_ranges([built, other], key_rows, bounds)
            assert [x.tolist() for x in got] == [x.tolist() for x in want]


def test_a_mapped_layer_reads_its_columns_where_they_lie() -> None:
    built = Layer.build(np.array([[3, 1], [1, 2], [1, 1]]), np.array([1, 1, 1]))
    with mapped(built) as mine:
        assert all(np.shares_memory(mine.col(j), mine.rows) for j in range(2))
        assert mine.col(1).tolist() == built.col(1).tolist() == [1, 2, 1]
    row_major = Layer(np.array([[1, 1], [1, 2]]), np.array([1, 1]))
    assert row_major.col(1).flags.c_contiguous and row_major.col(1) is row_major.col(1)


N = 2_000_000


def big_layer(packs: bool) -> Layer:
    """`N` sorted distinct rows of two columns (packing, or spanning every long) and diffs."""
    i = np.arange(N, dtype=np.int64)
    if packs:
        rows = np.column_stack([i // 4, (i % 4) * 3 - 5])
    else:
        rows = np.column_stack([(i // 4) * (2**40) + I64_MIN, (i % 4) * (2**61) - 2**62])
    rows = np.asfortranarray(rows)
    diff = i % 3 + 1
    packing = Packing.of(rows)
    assert (packing is not None) == packs
    keys = packing.pack(rows)[0] if packing is not None else encode(rows)
    return Layer(rows, diff, packing, keys, unit=False)


@contextmanager
def peak_allocation() -> Iterator[list[int]]:
    """The peak of memory allocated (numpy's arrays included) within the block, in bytes."""
    tracemalloc.start()
    out: list[int] = []
    try:
        yield out
    finally:
        out.append(tracemalloc.get_traced_memory()[1])
        tracemalloc.stop()


def test_the_probe_sees_numpy_allocations() -> None:
    with peak_allocation() as peak:
        np.ones(N, dtype=np.int64).sum()
    assert peak[0] >= 8 * N


def test_searches_on_a_mapped_layer_allocate_nothing_of_its_length() -> None:
    rng = np.random.default_rng(5)
    for packs in (True, False):
        with mapped(big_layer(packs)) as layer:
            stored = layer.rows[rng.integers(0, N, 1000)]
            m = len(stored)
            cols = [np.ascontiguousarray(stored[:, j]) for j in range(2)]
            delta = Layer.build(stored[:10], np.ones(10, dtype=np.int64))
            bounds = [Bound(cols[1] - 1, True, True), Bound(cols[1] + 4, False, False)]
            with peak_allocation() as peak:
                layer.prepare(1, 2)
                layer.col(0), layer.col(1)
                layer.lookup_of(cols, m)
                layer.contains_of(cols, m)
                layer.lookup_of(cols[:1], m)
                lo, hi = layer.ranges_of(cols[:1], m)
                layer.narrow_of(cols[:1], m, lo, hi, bounds)
                layer.span_of(cols[:1], m, bounds)
                find([layer], cols[:1], m, bounds)
                find([layer, delta], cols[:1], m, bounds)
                lookup_sum_of([layer, delta], cols, m)
            assert peak[0] < 8 * N // 16, (packs, peak[0])


def test_what_a_layer_is_given_it_never_recomputes() -> None:
    """The unit flag, keys and packing given are taken as they are (opening costs no pass)."""
    rows = np.asfortranarray(np.array([[1, 2], [1, 5], [4, 0]]))
    packing = Packing.of(rows)
    assert packing is not None
    keys = packing.pack(rows)[0]
    layer = Layer(rows, np.array([2, 2, 2]), packing, keys, unit=True)  # a lie it must not check
    layer.prepare(1, 2)
    assert layer.unit and layer.search_keys() is keys and layer.packing is packing
    assert all(np.shares_memory(c, rows) for c in layer.columns())  # read where they lie
    wide = np.array([[I64_MIN, I64_MIN], [I64_MAX, I64_MAX]])  # 128 bits: no packing
    bytes_keys = encode(wide)
    unpacked = Layer(wide, np.array([1, 1]), None, bytes_keys, unit=True)
    unpacked.prepare(1, 2)
    assert unpacked.packing is None and unpacked.search_keys() is bytes_keys
    assert unpacked.lookup(wide).tolist() == [1, 1]
