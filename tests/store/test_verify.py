"""`verify_state`: every file of the kept generations read back, each damaged one named with its
trace, the epochs it affects and whether it can be rebuilt."""

from __future__ import annotations

import dataclasses
import os
import random
from pathlib import Path

import numpy as np
from store_support import epoch

from wcoj_core import cli
from wcoj_core.budget import MemoryBudget
from wcoj_core.deploy.batches import BatchFiles
from wcoj_core.spill import Scratch, Spill
from wcoj_core.store.store import Store
from wcoj_core.store.verify import _summed_figures, verify_state


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
    # Batches: 2 traces x 3 epochs, one data file each; segments: 3 of one file each.
    assert report.files == 6 + 3
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
    rows = tmp_path / segment.file_path("layer")
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
        segment.file_path("layer"),
        f"{out.path}/{out.files[0].name}",
        "manifests/0000000001.json",
    }
    b = by_path[batch_file]
    assert (b.trace, b.since, b.rebuildable, b.current) == ("rel/edge", 1, False, True)
    assert "sha256" in b.what and b.generations == (2, 3, 4)
    s = by_path[segment.file_path("layer")]
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


def _bag_state(tmp_path: Path, epochs: int = 3) -> Path:
    """A directed bag of random edges (repeats, deletions) through `wcoj apply` in-process,
    with 2-paths: outputs with multiplicities above one and tuples deleted again."""
    rng = random.Random(7)
    state = tmp_path / "state"
    live: list[tuple[int, int]] = []
    for t in range(epochs):
        rows = [(rng.randrange(60), rng.randrange(60), 1) for _ in range(900)]
        gone = rng.sample(live, min(len(live), 200))
        rows += [(a, b, -1) for a, b in gone]
        for a, b in gone:
            live.remove((a, b))
        live += [(a, b) for a, b, _ in rows if _ > 0]
        changes = tmp_path / f"changes-{t}.csv"
        changes.write_text("c0,c1,diff\n" + "".join(f"{a},{b},{d}\n" for a, b, d in rows))
        argv = ["apply", "--query", "2-paths", "--state", str(state), "--epoch", str(t)]
        assert cli.main([*argv, "--changes", f"edge={changes}", "--bag", "edge"]) == 0
    return state


def test_figures_are_summed_through_sorted_runs_exactly_as_in_memory(tmp_path: Path) -> None:
    """A trace's figures checked through spilled sorted runs (runs of 64 KiB: many runs, a
    k-way merge) equal the figures of the whole trace read into memory, for every trace."""
    store = Store.open(_bag_state(tmp_path), create=False)
    files = BatchFiles(store.root)
    m = store.current()
    scratch = Scratch(tmp_path / "scratch", lambda _n: None)
    small = Spill(scratch, 1 << 16, 1 << 16, 1 << 16)
    checked = 0
    for name, trace in sorted(m.traces.items()):
        batches = trace.visible(m.epoch)
        layer = files.read_layer(trace.columns, list(batches))
        diff = np.asarray(layer.diff)
        whole = (len(diff), int(diff.sum()), int((diff < 0).sum()))
        spilled_before = scratch.spilled
        assert _summed_figures(files, trace.columns, batches, small) == whole, name
        if name == "out/paths2":
            assert scratch.spilled > spilled_before  # the output went through runs on disk
            assert whole[0] > 10_000 and whole[1] > whole[0]  # multiplicities above one
        checked += 1
    scratch.close()
    assert checked >= 3


def test_a_wrong_figure_in_the_manifest_is_named(tmp_path: Path) -> None:
    store = Store.open(_bag_state(tmp_path), create=False)
    assert verify_state(store).ok
    m = store.current()
    trace = m.traces["out/paths2"]
    last = trace.batches[-1]
    assert last.figures is not None
    rows, count, negative = last.figures
    forged = dataclasses.replace(last, figures=(rows, count + 1, negative))
    store.commit(m.with_trace(trace.replacing(forged)), m)
    report = verify_state(store, memory=MemoryBudget.of("256m"))
    (damage,) = report.damaged
    assert damage.trace == "out/paths2" and "its figures (rows, count, negative)" in damage.what
    assert (
        f"{(rows, count + 1, negative)}" in damage.what
        and f"{(rows, count, negative)}" in damage.what
    )
