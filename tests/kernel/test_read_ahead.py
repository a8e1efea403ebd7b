"""Reading a cold layer's pages ahead (`_native.c`, "reading ahead from disk").

A search of a mapped layer whose pages are not in memory waits for the disk page after page;
once a call's thread has faulted, the kernel searches the rest of its probes level by level,
all at once, advising the pages of each level (madvise WILLNEED) before reading any. Checked
here: the level-by-level search finds exactly the ranges the loops' own search finds (so the
pages it advises are the pages they read); a cold call reads ahead and then takes no major
fault (and, without reading ahead, does); a warm call reads nothing ahead; and answers are the
same with reading ahead on every call, down to the smallest layers.
"""

from __future__ import annotations

import gc
import os
import resource
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from wcoj_core.errors import WcojError
from wcoj_core.kernel.keys import I64
from wcoj_core.kernel.layer import Layer, lookup_sum_of
from wcoj_core.kernel.native import native, read_ahead_mode
from wcoj_core.store import names
from wcoj_core.store.manifest import Level
from wcoj_core.store.segments import open_segment, segment_files, write_segment

NEVER, FAULTS, ALWAYS = 0, 1, 2


@pytest.fixture()
def ahead() -> Iterator[None]:
    """Leave the process's read-ahead mode as it found it."""
    mode = native.read_ahead()[0]
    yield
    native.read_ahead(mode, 1 << 15)


def passes() -> int:
    return native.read_ahead()[2]


def major_faults() -> int:
    return resource.getrusage(resource.RUSAGE_THREAD).ru_majflt


def ranges(layer: Layer, probes: np.ndarray, seek: bool) -> tuple[np.ndarray, np.ndarray]:
    m, p = probes.shape
    cols = [np.ascontiguousarray(probes[:, j]) for j in range(p)]
    lo, hi = np.empty(m, dtype=I64), np.empty(m, dtype=I64)
    if seek:
        native.seek_ranges(layer.spec(), cols, m, lo, hi)
    else:
        native.ranges(layer.spec(), cols, m, None, None, lo, hi)
    return lo, hi


@given(
    seed=st.integers(0, 2**31),
    n=st.integers(1, 3000),
    width=st.integers(1, 3),
    span=st.sampled_from([2, 30, 1000, 1 << 40]),
    directory=st.booleans(),
)
def test_the_level_by_level_search_finds_the_loops_ranges(seed, n, width, span, directory):
    """Every probe's range (the first 1 to width columns: a key, a whole row), found level by
    level for all probes at once, is the one `ranges` finds probe by probe."""
    rng = np.random.default_rng(seed)
    rows = rng.integers(0, span, size=(n, width))
    rows[: n // 3, 0] = rows[0, 0]  # a hub: one first value over many rows
    layer = Layer.build(rows, np.ones(n, dtype=I64))
    if directory:
        layer.directory()
    m = int(rng.integers(0, 400))
    p = int(rng.integers(1, width + 1))
    probes = np.concatenate(
        [rows[rng.integers(0, n, size=m), :p], rng.integers(-1, span + 1, size=(m, p))]
    )
    lo, hi = ranges(layer, probes, seek=False)
    slo, shi = ranges(layer, probes, seek=True)
    found = hi > lo
    assert np.array_equal(shi > slo, found)
    assert np.array_equal(slo[found], lo[found]) and np.array_equal(shi[found], hi[found])


class Cold:
    """A layer of 1 M rows (two columns of 8 MB) written as a segment file: `open` maps it
    afresh with none of its pages in the page cache (a mapping whose pages this process has
    touched keeps them: each open is a new mapping, the last one let go first)."""

    def __init__(self, root: Path) -> None:
        rng = np.random.default_rng(7)
        n = 1 << 20
        rows = np.column_stack([rng.integers(0, 1 << 17, size=n), rng.integers(0, 1 << 30, size=n)])
        self.built = Layer.build(rows, np.ones(n, dtype=I64))
        self.root = root
        self.segment = write_segment(
            root,
            names.new_segment_path("rel/edge"),
            self.built,
            level=Level.BASE,
            view=None,
            order=(0, 1),
        )
        (self.path,) = segment_files(root, self.segment)

    def open(self, *, evicted: bool) -> Layer:
        gc.collect()  # the last open's mapping let go
        if evicted:
            fd = os.open(self.path, os.O_RDONLY)
            try:
                os.fsync(fd)
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)
        return open_segment(self.root, self.segment)

    def probes(self, m: int, seed: int) -> list[np.ndarray]:
        """m rows of the layer, each first value once (no two probes share a key range),
        taken from the layer built in memory."""
        rng = np.random.default_rng(seed)
        first = np.asarray(self.built.col(0))
        starts = np.flatnonzero(np.diff(first, prepend=first[0] - 1))
        at = np.sort(rng.choice(starts, size=m, replace=False))
        return [np.ascontiguousarray(np.asarray(self.built.col(j))[at]) for j in (0, 1)]


@pytest.mark.parametrize("m", [200, 300])  # each probe's pages / the layer's columns whole
def test_a_cold_lookup_reads_its_pages_ahead_and_faults_no_more(tmp_path, ahead, m):
    """Its segment keeps the first column's directory (format 4): its pages are read ahead
    with the columns'."""
    cold = Cold(tmp_path)
    probes = cold.probes(m, seed=1)

    native.read_ahead(NEVER)
    layer = cold.open(evicted=True)
    assert layer._dir is not None
    before = major_faults()
    plain = lookup_sum_of([layer], probes, m)
    faulted = major_faults() - before
    del layer
    if faulted == 0:
        pytest.skip("the file's pages could not be dropped from the page cache here")

    native.read_ahead(FAULTS)  # a fresh process's state: not known to be cold or warm yet
    layer = cold.open(evicted=True)
    before, made = major_faults(), passes()
    read = lookup_sum_of([layer], probes, m)
    assert np.array_equal(read, plain) and (read == 1).all()
    assert passes() > made, "the cold call read nothing ahead"
    assert major_faults() - before == 0, f"read ahead, it still faulted (without: {faulted})"


def test_a_call_that_faults_reads_the_rest_ahead(tmp_path, ahead):
    """Known warm, then evicted: the first probe faults, and the watch turns reading ahead on
    for the rest of the call (and the calls after it)."""
    cold = Cold(tmp_path)
    probes = cold.probes(400, seed=2)
    native.read_ahead(FAULTS)
    lookup_sum_of([cold.open(evicted=False)], probes, 400)  # warm: nothing to read ahead
    assert native.read_ahead()[1] == 0, "a warm layer's call left reading ahead on"
    layer = cold.open(evicted=True)
    made, before = passes(), major_faults()
    lookup_sum_of([layer], cold.probes(400, seed=3), 400)
    if major_faults() == before:
        pytest.skip("the file's pages could not be dropped from the page cache here")
    assert passes() == made + 1 and native.read_ahead()[1] == 1


def test_a_warm_call_reads_nothing_ahead(tmp_path, ahead):
    cold = Cold(tmp_path)
    layer = cold.open(evicted=False)
    probes = cold.probes(200, seed=4)
    native.read_ahead(FAULTS)
    lookup_sum_of([layer], probes, 200)  # the process's first call: its first probes alone
    made = passes()
    for _ in range(5):
        lookup_sum_of([layer], probes, 200)
    assert passes() == made, "calls on pages in memory read ahead"


def test_the_mode_is_named_by_the_environment() -> None:
    assert read_ahead_mode(None) == FAULTS and read_ahead_mode(" Never ") == NEVER
    with pytest.raises(WcojError, match="WCOJ_READ_AHEAD"):
        read_ahead_mode("sometimes")
    with pytest.raises(ValueError):
        native.read_ahead(3)
