"""Segments: layers written once as one file each and mapped on open — identical lookups, every
kind of damage caught and named (at open, or when a search first touches the damaged block),
opening in milliseconds without reading the data; a segment an earlier wcoj wrote (state formats
2 to 4) named as one this wcoj does not read."""

from __future__ import annotations

import dataclasses
import os
import time
import tracemalloc
from pathlib import Path

import numpy as np
import pytest

from wcoj_core.errors import DamagedFile
from wcoj_core.kernel.layer import Bound, Layer, find
from wcoj_core.store import names
from wcoj_core.store.manifest import Index, Level, Manifest, Segment, Trace
from wcoj_core.store.segments import (
    check_segment,
    open_segment,
    segment_bytes,
    segment_path,
    write_segment,
)

TRACE = "rel/edge"


def write(root: Path, layer: Layer, level: Level = Level.BASE) -> Segment:
    return write_segment(
        root,
        names.new_segment_path(TRACE),
        layer,
        level=level,
        view=None,
        order=tuple(range(layer.width)),
    )


def random_layer(rng: np.random.Generator, n: int, width: int, wide: bool, bag: bool) -> Layer:
    if wide:  # spans too wide to pack into 64 bits: byte keys
        rows = rng.integers(-(2**62), 2**62, size=(n, width))
        rows[: n // 2, 0] = rng.integers(-3, 3, size=n // 2)  # equal leading columns too
    else:
        rows = rng.integers(-5, 40, size=(n, width))
    diff = rng.integers(-3, 4, size=n) if bag else np.ones(n, dtype=np.int64)
    return Layer.build(rows, diff)


def same_lookups(a: Layer, b: Layer, rng: np.random.Generator) -> None:
    assert a.width == b.width and len(a) == len(b)
    assert np.array_equal(a.rows, b.rows) and np.array_equal(a.diff, b.diff)
    if a.width == 0 or len(a) == 0:
        return
    assert a.unit == b.unit and a.packing == b.packing
    probes = np.concatenate([a.rows[: len(a) // 2], rng.integers(-6, 41, size=(20, a.width))])
    assert np.array_equal(a.lookup(probes), b.lookup(probes))
    for p in range(1, a.width + 1):
        keys = probes[:, :p]
        for x, y in zip(a.ranges(keys), b.ranges(keys), strict=True):
            assert np.array_equal(x, y)
    if a.width >= 2:  # a step proposes the column after its key
        cols = [probes[:, j] for j in range(a.width - 1)]
        bound = [Bound(np.full(len(probes), 3), True, False)]
        fa, fb = find([a], cols, len(probes), bound), find([b], cols, len(probes), bound)
        assert np.array_equal(fa.rest, fb.rest) and np.array_equal(fa.owner, fb.owner)
        assert np.array_equal(fa.diff, fb.diff)


@pytest.mark.parametrize("width", [0, 1, 2, 3])
@pytest.mark.parametrize("wide", [False, True])
@pytest.mark.parametrize("bag", [False, True])
def test_round_trip_gives_identical_lookups(
    tmp_path: Path, width: int, wide: bool, bag: bool
) -> None:
    rng = np.random.default_rng(width * 4 + wide * 2 + bag)
    for n in (0, 1, 300):
        layer = random_layer(rng, n, width, wide and width > 0, bag)
        segment = write(tmp_path, layer)
        assert segment.rows == len(layer)
        if len(layer) == 0:
            assert segment.files == {}
        else:
            assert segment.packing == layer.packing and segment.unit == layer.unit
            assert set(segment.files) == {"layer"}
            assert segment.files["layer"].name == segment.path.rpartition("/")[2]
            assert names.is_own_segment_file(segment.files["layer"].name)
        # Through the manifest's JSON, as a fresh process reads it.
        columns = tuple(f"c{j}" for j in range(width))
        m = Manifest(1, 0, traces={TRACE: Trace(TRACE, columns, (), Index(0, (segment,)))})
        index = Manifest.from_json(m.to_json(), "m").traces[TRACE].index
        assert index is not None and index.segments == (segment,)
        same_lookups(layer, open_segment(tmp_path, index.segments[0]), rng)
        same_lookups(layer, open_segment(tmp_path, segment, verify=True), rng)


def test_written_files_are_sealed_and_mapped(tmp_path: Path) -> None:
    rows = np.random.default_rng(1).integers(0, 40, size=(1000, 2))
    layer = Layer.build(rows, np.ones(1000, dtype=np.int64))
    segment = write(tmp_path, layer)
    assert (tmp_path / segment.path).is_file()  # the segment is its one file: no folder
    assert Path(segment_path(tmp_path, segment)).stat().st_mode & 0o222 == 0
    opened = open_segment(tmp_path, segment)
    cols, diff = opened.spec()[:2]
    assert cols[0] is None and diff.dtype == np.int32  # the directory stands for it; narrow
    assert cols[1].dtype == np.uint32 and not cols[1].flags.writeable  # the file's, mapped
    assert opened.rows.flags.f_contiguous and np.array_equal(opened.rows, layer.rows)
    assert segment_bytes(segment) == sum(f.size for f in segment.files.values())
    assert not [p for p in (tmp_path / segment.path).parent.iterdir() if p.name.endswith(".tmp")]


# -- damage ------------------------------------------------------------------------------------


@pytest.fixture()
def written(tmp_path: Path) -> tuple[Path, Segment]:
    layer = random_layer(np.random.default_rng(7), 5000, 2, False, True)
    return tmp_path, write(tmp_path, layer)


def rewrite(path: Path, edit) -> None:
    """Edit a sealed file in place (as a user or a bad disk would)."""
    os.chmod(path, 0o644)
    data = bytearray(path.read_bytes())
    edit(data)
    with open(path, "r+b") as f:
        f.seek(0)
        f.write(bytes(data))
        f.truncate(len(data))


def damage(root: Path, segment: Segment, *, verify: bool = False) -> str:
    with pytest.raises(DamagedFile) as e:
        open_segment(root, segment, verify=verify)
    return str(e.value)


def test_a_missing_file(written: tuple[Path, Segment]) -> None:
    root, segment = written
    path = Path(segment_path(root, segment))
    path.unlink()
    assert damage(root, segment) == f"{path}: missing (the manifest names it)"


def test_a_truncated_file(written: tuple[Path, Segment]) -> None:
    root, segment = written
    path = Path(segment_path(root, segment))
    size = path.stat().st_size
    os.chmod(path, 0o644)
    os.truncate(path, size - 8)
    assert damage(root, segment) == (f"{path}: is {size - 8} bytes, the manifest says {size}")


def test_a_damaged_header(written: tuple[Path, Segment]) -> None:
    root, segment = written
    path = Path(segment_path(root, segment))
    rewrite(path, lambda d: d.__setitem__(0, 0))  # the magic
    assert damage(root, segment) == (f"{path}: its header is damaged (not a wcoj segment file)")
    rewrite(path, lambda d: d.__setitem__(0, 0x93))
    open_segment(root, segment)  # restored: the stamp changed, the digest is the same
    n = segment.rows
    rewrite(path, lambda d: d.__setitem__(slice(12, 16), (3).to_bytes(4, "little")))
    message = damage(root, segment)
    assert message.startswith(f"{path}: its header says {n} rows of 3 columns")
    assert message.endswith("which is not the manifest's segment")


def test_a_size_that_disagrees_with_the_header(written: tuple[Path, Segment]) -> None:
    root, segment = written
    path = Path(segment_path(root, segment))
    rewrite(path, lambda d: d.extend(b"\0" * 8))
    files = {"layer": dataclasses.replace(segment.files["layer"], size=path.stat().st_size)}
    message = damage(root, dataclasses.replace(segment, files=files))
    assert message == f"{path}: its size does not match its header (truncated or padded)"


@pytest.mark.parametrize("where", ["middle", "table", "header"])
def test_bytes_flipped_anywhere_are_caught_before_they_are_used(
    written: tuple[Path, Segment], where: str
) -> None:
    """A byte changed below the file system (its stamp kept or not): the header's block and the
    table of block checksums are checked at open, any other block when a search first reads it
    — the search raises rather than answer from it; `verify` reads the file whole."""
    root, segment = written
    path = Path(segment_path(root, segment))
    good = open_segment(root, segment)
    size = path.stat().st_size
    at = {"middle": size // 2, "table": size - 12, "header": 20}[where]
    rewrite(path, lambda d: d.__setitem__(at, d[at] ^ 0xFF))
    if where != "middle":
        assert damage(root, segment).startswith(f"{path}: its ")
        return
    opened = open_segment(root, segment)
    with pytest.raises(DamagedFile, match="does not match its checksum"):
        opened.lookup(np.asarray(good.rows))  # every row: the damaged block too
    with pytest.raises(DamagedFile, match="does not match its checksum"):
        _ = open_segment(root, segment).rows
    assert "does not match its checksum" in damage(root, segment)  # found: not opened again
    assert [e.what for e in check_segment(root, segment)] == [
        "a block of it does not match its checksum (its bytes changed since it was written)"
    ]


def test_a_stale_digest_is_caught_when_verifying(written: tuple[Path, Segment]) -> None:
    root, segment = written
    files = {"layer": dataclasses.replace(segment.files["layer"], sha256="0" * 64)}
    stale = dataclasses.replace(segment, files=files)
    open_segment(root, stale)  # the stamp is the one written: the digest is trusted
    message = damage(root, stale, verify=True)
    assert message.startswith(f"{segment_path(root, segment)}: its sha256 ")


def test_a_size_mismatch(written: tuple[Path, Segment]) -> None:
    root, segment = written
    ref = segment.files["layer"]
    files = {"layer": dataclasses.replace(ref, size=ref.size + 1)}
    message = damage(root, dataclasses.replace(segment, files=files))
    assert message.endswith(f"is {ref.size} bytes, the manifest says {ref.size + 1}")


def test_a_segment_file_of_another_layout_is_named_not_read(
    written: tuple[Path, Segment],
) -> None:
    """A segment file whose header names another layout (an earlier wcoj's) is not read."""
    root, segment = written
    path = Path(segment_path(root, segment))
    rewrite(path, lambda d: d.__setitem__(slice(8, 12), (1).to_bytes(4, "little")))
    assert damage(root, segment) == f"{path}: its header is of another layout (1), not read here"
    assert [str(e) for e in check_segment(root, segment)] == [damage(root, segment)]


# -- opening costs O(files) --------------------------------------------------------------------


def rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def test_opening_two_million_rows_reads_no_data(tmp_path: Path) -> None:
    n = 2_000_000
    rows = np.column_stack([np.arange(n) // 2, (np.arange(n) * 7919) % (1 << 20)])
    layer = Layer.build(rows, np.ones(n, dtype=np.int64))
    segment = write(tmp_path, layer)
    del layer, rows
    # 4 B a row (uint32 second column) and 4 B a value of the first (its directory): no diff
    assert 6 * n < segment_bytes(segment) < 6.1 * n
    for _ in range(3):
        before = rss()
        opened = open_segment(tmp_path, segment)
        grown = rss() - before
        assert grown < 8 * 1024 * 1024, grown  # no page of the data was touched
        del opened
    best = float("inf")
    for _ in range(5):
        tracemalloc.start()
        start = time.perf_counter()
        opened = open_segment(tmp_path, segment)
        best = min(best, time.perf_counter() - start)
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        assert peak < 256 * 1024, peak  # headers only: nothing the size of the data
        del opened
    assert best < 0.05, best  # milliseconds (and generous on a shared machine)
    opened = open_segment(tmp_path, segment)
    assert opened.part(n - 1, n)[0][0, 0] == n // 2 - 1
    searched_in_place(opened, n, segment_bytes(segment))


def memory() -> tuple[int, int]:
    """This process's resident memory: (anonymous, mapped from files), in bytes."""
    found = {}
    with open("/proc/self/status") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key in ("RssAnon", "RssFile"):
                found[key] = int(value.split()[0]) * 1024
    return found["RssAnon"], found["RssFile"]


def searched_in_place(opened: Layer, n: int, size: int) -> None:
    """Lookups and ranges on a mapped layer copy nothing and read a few blocks of its `size`
    bytes: each block read is checked first, so the blocks seen are what was read (the
    resident file pages say less: a fault maps a whole folio of the page cache)."""
    rng = np.random.default_rng(5)
    probe = np.column_stack([rng.integers(0, n // 2, size=2), rng.integers(0, 1 << 20, size=2)])
    ends = [opened.part(i, i + 1)[0] for i in (n // 3, n - 1)]
    anon, _ = memory()
    seen = opened.spec()[6][2]
    before = int(np.count_nonzero(seen))
    found = opened.lookup(np.concatenate([probe, *ends]))
    lo, hi = opened.ranges(probe[:, :1])
    assert list(found[-2:]) == [1, 1] and bool((hi - lo <= 2).all())
    anon_after, _ = memory()
    assert anon_after - anon < 1 << 20
    assert int(np.count_nonzero(seen)) - before <= 3 * 4  # a key's entry, its rows: per probe
    assert int(np.count_nonzero(seen)) < size // 4096 // 8


def test_a_mapped_layer_of_byte_keys_is_searched_in_place(tmp_path: Path) -> None:
    n = 2_000_000
    rng = np.random.default_rng(6)
    wide = rng.integers(0, 1 << 62, size=n)
    rows = np.column_stack([np.arange(n) // 2, wide])
    segment = write(tmp_path, Layer.build(rows, np.ones(n, dtype=np.int64)))
    assert segment.packing is None
    opened = open_segment(tmp_path, segment)
    assert opened.packing is None  # known from the keys: no pass over the rows to find out
    searched_in_place(opened, n, segment_bytes(segment))


def test_a_one_column_layer_whose_directory_stands_for_its_column(tmp_path: Path) -> None:
    """A large one-column layer (a counts arrangement, a unary relation) keeps its directory
    and not its column; a call that proposes its values (a key of no column) gets the column
    made, checked, and finds what the layer in memory finds."""
    rng = np.random.default_rng(9)
    rows = np.unique(rng.integers(0, 150_000, size=200_000)).reshape(-1, 1)
    layer = Layer.build(rows, rng.integers(1, 4, size=len(rows)))
    segment = write(tmp_path, layer)
    opened = open_segment(tmp_path, segment)
    assert opened.spec()[0][0] is None and opened.spec()[4] is not None
    bound = [Bound(np.array([50_000]), True, False)]
    got, want = find([opened], [], 1, bound), find([layer], [], 1, bound)
    assert np.array_equal(got.rest, want.rest) and np.array_equal(got.diff, want.diff)
    probes = rng.integers(0, 150_010, size=(500, 1))
    assert np.array_equal(opened.lookup(probes), layer.lookup(probes))
    assert np.array_equal(opened.rows, layer.rows) and np.array_equal(opened.diff, layer.diff)
