"""Segments: layers written once as one file each and mapped on open — identical lookups, every
kind of damage caught and named, opening in milliseconds without reading the data; a segment an
earlier wcoj wrote (state formats 2 and 3) named as one this wcoj does not read."""

from __future__ import annotations

import dataclasses
import json
import os
import time
import tracemalloc
from pathlib import Path

import numpy as np
import pytest

from wcoj_core.errors import DamagedFile
from wcoj_core.kernel.layer import Bound, Layer, find
from wcoj_core.store import names
from wcoj_core.store.manifest import Index, Level, Manifest, Segment, Trace, digest_of
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
    layer = random_layer(np.random.default_rng(1), 1000, 2, False, False)
    segment = write(tmp_path, layer)
    assert (tmp_path / segment.path).is_file()  # the segment is its one file: no folder
    assert Path(segment_path(tmp_path, segment)).stat().st_mode & 0o222 == 0
    opened = open_segment(tmp_path, segment)
    assert not opened.rows.flags.writeable
    assert opened.rows.flags.f_contiguous
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


def test_bytes_flipped_in_the_middle(written: tuple[Path, Segment]) -> None:
    root, segment = written
    path = Path(segment_path(root, segment))
    middle = path.stat().st_size // 2

    def flip(d: bytearray) -> None:
        d[middle] ^= 0xFF

    rewrite(path, flip)  # in place: the stamp changed, so the digest is checked
    message = damage(root, segment)
    assert message.startswith(f"{path}: its sha256 ")
    assert (
        "differs from the manifest's" in message
        and "its bytes changed since it was written" in message
    )


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


def test_an_earlier_wcojs_segment_is_named_not_read(written: tuple[Path, Segment]) -> None:
    """A segment file of layout 1 (state format 3) and a folder of three .npy files (format 2)
    that a format 4 manifest still names: neither is read, each named as an earlier wcoj's (the
    caller rebuilds it from the batches)."""
    root, segment = written
    path = Path(segment_path(root, segment))
    rewrite(path, lambda d: d.__setitem__(slice(8, 12), (1).to_bytes(4, "little")))
    assert damage(root, segment) == (
        f"{path}: a segment file of an earlier wcoj (layout 1), which this one does not read"
    )
    folder = f"arrangements/{names.trace_dir(TRACE)}/{names.segment_name().removesuffix('.seg')}"
    (root / folder).mkdir()
    raw = json.loads(
        Manifest(
            1, 0, traces={TRACE: Trace(TRACE, ("c0", "c1"), (), Index(0, (segment,)))}
        ).to_json()
    )
    ref = ["rows.npy", 8, "0" * 64, [1, 2, 3]]
    raw["traces"][TRACE]["index"]["segments"][0] |= {"path": folder, "files": {"rows": ref}}
    raw["digest"] = digest_of(raw)
    (old,) = Manifest.from_json(json.dumps(raw), "m").traces[TRACE].index.segments  # type: ignore[union-attr]
    assert old.path == folder and old.files == {} and old.rows == segment.rows
    expected = f"{root / folder}: a segment file of an earlier wcoj (state format 2: three .npy files), not read by this one"
    assert damage(root, old) == expected
    assert [str(e) for e in check_segment(root, old)] == [expected]


# -- opening costs O(files) --------------------------------------------------------------------


def rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def test_opening_two_million_rows_reads_no_data(tmp_path: Path) -> None:
    n = 2_000_000
    rng = np.random.default_rng(2)
    rows = np.column_stack([np.arange(n) // 2, rng.integers(0, 1 << 20, size=n)])
    layer = Layer.build(rows, np.ones(n, dtype=np.int64))
    segment = write(tmp_path, layer)
    del layer, rows
    assert segment_bytes(segment) > 30 * n  # 16 B rows + 8 B diff + 8 B keys per row (one file)
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
    assert opened.rows[-1, 0] == n // 2 - 1
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
    """Lookups and ranges on a mapped layer copy nothing and touch a few pages of its `size`
    bytes (each page fault maps its neighbours too: a few probes keep them few)."""
    rng = np.random.default_rng(5)
    probe = np.column_stack([rng.integers(0, n // 2, size=2), rng.integers(0, 1 << 20, size=2)])
    anon, mapped = memory()
    found = opened.lookup(np.concatenate([probe, np.asarray(opened.rows[[n // 3, -1]])]))
    lo, hi = opened.ranges(probe[:, :1])
    assert list(found[-2:]) == [1, 1] and bool((hi - lo <= 2).all())
    anon_after, mapped_after = memory()
    assert anon_after - anon < 1 << 20
    assert mapped_after - mapped < size // 4


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
