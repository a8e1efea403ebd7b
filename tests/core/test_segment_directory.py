"""Segment files that keep their first column's directory (state format 4, layout 2).

A segment of many rows whose first column is dense enough is written with the directory
`Layer.directory` would make (`wcoj_core.store.segments`), and opened with it, mapped: a cold
search then reads a page of it instead of a page per halving of the column. Checked here: the
directory read back is the one made in memory, and searches through it find what searches of the
layer in memory find; a sparse column keeps none; a header whose directory disagrees with the
file is damaged, named; and a state whose every segment keeps a directory stays exact against
the oracle, epoch after epoch, in fresh engines and a warm one.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
from test_engine_state import PATHS, TRIANGLES, Run, epoch_changes

from wcoj_core import indexes
from wcoj_core.kernel.layer import Layer
from wcoj_core.store import segments
from wcoj_core.store.manifest import Level
from wcoj_core.store.segments import DamagedFile, open_segment, write_segment


def layer_of(rows: np.ndarray) -> Layer:
    return Layer.build(rows, np.ones(len(rows), dtype=np.int64))


def same_ranges(got: tuple[np.ndarray, np.ndarray], want: tuple[np.ndarray, np.ndarray]) -> bool:
    """The same rows for every key (where an empty range sits is not an answer)."""
    (lo, hi), (want_lo, want_hi) = got, want
    found = want_hi > want_lo
    return bool(
        np.array_equal(hi - lo, want_hi - want_lo) and np.array_equal(lo[found], want_lo[found])
    )


def written(root: Path, layer: Layer, name: str = "s-0000000000000001.seg"):
    return write_segment(
        root,
        f"arrangements/t/{name}",
        layer,
        level=Level.BASE,
        view=None,
        order=tuple(range(layer.width)),
    )


def test_a_dense_segment_keeps_its_directory_and_finds_the_same_rows(tmp_path: Path) -> None:
    rng = np.random.default_rng(7)
    memory = layer_of(rng.integers(-50, 40_000, size=(120_000, 3)))
    segment = written(tmp_path, memory)
    mapped = open_segment(tmp_path, segment)
    table, low = memory.directory() or (None, 0)
    assert table is not None and mapped._dir is not None
    assert mapped._dir[1] == low and np.array_equal(mapped._dir[0], table)
    assert not mapped._dir[0].flags.writeable  # a view of the read-only mapping, not a copy
    path = tmp_path / segment.path
    base = segments.SEG_HEADER_BYTES + len(memory) * 8 * (3 + 1) + len(memory) * 8
    assert path.stat().st_size == base + 8 * len(table)
    keys = rng.integers(-60, 40_010, size=(5_000, 2))
    for m in (1, 2):
        fresh = open_segment(tmp_path, segment)  # its directory only: none made in memory
        assert same_ranges(fresh.ranges(keys[:, :m]), layer_of(memory.rows).ranges(keys[:, :m]))
    assert segments.check_segment(tmp_path, segment) == []


def test_a_sparse_or_small_segment_keeps_none(tmp_path: Path) -> None:
    rng = np.random.default_rng(8)
    sparse = layer_of(rng.integers(0, 1 << 40, size=(segments.DIRECTORY_MIN_ROWS, 2)))
    small = layer_of(rng.integers(0, 10, size=(1_000, 2)))
    for n, layer in enumerate((sparse, small)):
        segment = written(tmp_path, layer, f"s-000000000000000{n + 1}.seg")
        assert open_segment(tmp_path, segment)._dir is None
        keys = layer.search_keys().dtype.itemsize
        size = segments.SEG_HEADER_BYTES + len(layer) * (8 * 3 + keys)
        assert (tmp_path / segment.path).stat().st_size == size


@pytest.mark.parametrize(
    ("field", "value", "problem"),
    [
        ("entries", 10**9, "not the manifest's segment"),
        ("entries", 5, "size does not match its header"),
        ("low", 3, None),  # the bytes are the digest's: a stamp unchanged is trusted
    ],
)
def test_a_header_that_disagrees_with_its_directory_is_damaged(
    tmp_path: Path, field: str, value: int, problem: str | None
) -> None:
    rng = np.random.default_rng(10)
    segment = written(tmp_path, layer_of(rng.integers(0, 20_000, size=(80_000, 2))))
    path = tmp_path / segment.path
    raw = bytearray(path.read_bytes())
    at = 40 if field == "low" else 48
    raw[at : at + 8] = value.to_bytes(8, "little", signed=True)
    os.chmod(path, 0o644)
    path.write_bytes(bytes(raw))
    if problem is None:  # rewritten in place: its stamp changed, so its digest is checked
        with pytest.raises(DamagedFile, match="sha256"):
            open_segment(tmp_path, segment)
        return
    with pytest.raises(DamagedFile, match=problem):
        open_segment(tmp_path, segment)


@pytest.mark.parametrize("warm", [False, True])
def test_a_state_whose_segments_keep_directories_stays_exact(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, warm: bool
) -> None:
    """Every segment of any size keeps its directory (the threshold lowered to one row): the
    searches of every epoch go through directories read from the files."""
    monkeypatch.setattr(segments, "DIRECTORY_MIN_ROWS", 1)
    indexes.KEPT.clear()
    run = Run(tmp_path / "state", [TRIANGLES, PATHS])
    if warm:
        run.keep = run.engine
    for t in range(12):
        run.step(t, epoch_changes(t, run.graph))
    run.check_accumulated()
    kept = [
        s
        for t in run.engine.access.store.current().traces.values()
        for s in (t.index.segments if t.index is not None else ())
        if s.rows
    ]
    with_directory = [
        s
        for s in kept
        if segments._directory_fields((tmp_path / "state" / s.path).read_bytes()[:64])[1]
    ]
    assert with_directory, "no segment kept a directory"
    indexes.KEPT.clear()


def test_a_reader_takes_a_directory_whatever_the_writers_threshold(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A segment smaller than `DIRECTORY_MIN_ROWS` written with a directory (a writer with a
    lower threshold) opens with it: only what a directory can be is checked."""
    rng = np.random.default_rng(12)
    memory = layer_of(rng.integers(0, 500, size=(2_000, 2)))
    monkeypatch.setattr(segments, "DIRECTORY_MIN_ROWS", 1)
    segment = written(tmp_path, memory)
    monkeypatch.undo()
    assert len(memory) < segments.DIRECTORY_MIN_ROWS
    mapped = open_segment(tmp_path, segment, verify=True)
    assert mapped._dir is not None
    keys = rng.integers(0, 510, size=(300, 2))
    assert same_ranges(mapped.ranges(keys), layer_of(memory.rows).ranges(keys))
