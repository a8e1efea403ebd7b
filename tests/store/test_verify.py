"""`verify_state`: every file of the kept generations read back, each damaged one named with its
trace, the epochs it affects and whether it can be rebuilt."""

from __future__ import annotations

import os
from pathlib import Path

from store_support import epoch

from wcoj_core.store.store import Store
from wcoj_core.store.verify import verify_state


def flip_middle(path: Path) -> None:
    os.chmod(path, 0o644)
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))


def test_a_sound_state_verifies(tmp_path: Path) -> None:
    store = Store.open(tmp_path, create=True)
    assert verify_state(store).ok
    for t in range(3):
        epoch(store, t)
    report = verify_state(store)
    assert report.ok and report.generation == 3 and report.generations == (1, 2, 3)
    # Batches: 2 traces x 3 epochs, one data file each; segments: 3 of 3 files.
    assert report.files == 6 + 9
    assert report.bytes > 0


def test_damaged_files_are_named_with_what_they_affect(tmp_path: Path) -> None:
    store = Store.open(tmp_path, create=True)
    for t in range(4):
        epoch(store, t)
    m = store.current()
    edge = m.traces["rel/edge"]
    batch = edge.batches[1]  # time 1
    batch_file = f"{batch.path}/{batch.files[0].name}"
    flip_middle(tmp_path / batch_file)
    assert edge.index is not None
    segment = edge.index.segments[0]
    rows = tmp_path / segment.file_path("rows")
    os.chmod(rows, 0o644)
    os.truncate(rows, rows.stat().st_size - 1)
    out = m.traces["out/tri"].batches[3]
    (tmp_path / out.path / out.files[0].name).unlink()
    old = tmp_path / "manifests" / "0000000001.json"
    old.write_text(old.read_text()[:-20])

    report = verify_state(store)
    assert not report.ok
    by_path = {d.path: d for d in report.damaged}
    assert set(by_path) == {
        batch_file,
        segment.file_path("rows"),
        f"{out.path}/{out.files[0].name}",
        "manifests/0000000001.json",
    }
    b = by_path[batch_file]
    assert (b.trace, b.since, b.rebuildable, b.current) == ("rel/edge", 1, False, True)
    assert "sha256" in b.what and b.generations == (2, 3, 4)
    s = by_path[segment.file_path("rows")]
    assert (s.trace, s.since, s.rebuildable, s.generations) == ("rel/edge", 3, True, (4,))
    assert "bytes, the manifest says" in s.what
    o = by_path[f"{out.path}/{out.files[0].name}"]
    assert (o.trace, o.since, o.what, o.rebuildable) == ("out/tri", 3, "missing", False)
    mf = by_path["manifests/0000000001.json"]
    assert mf.since is None and not mf.current and "damaged manifest" in mf.what
    line = b.describe()
    assert line.startswith(f"{batch_file} (trace rel/edge): its sha256 ")
    assert line.endswith("; affects epochs 1 and later; not rebuildable")
    assert s.describe().endswith("; affects epochs 3 and later; rebuildable from the batches")
