"""`verify_state`: every file of the kept generations read back, each damaged one named with its
trace, the epochs it affects and whether it can be rebuilt."""

from __future__ import annotations

import dataclasses
import os
import random
from collections import Counter
from pathlib import Path

import numpy as np
from oracle import naive_delta
from store_support import epoch

from wcoj_core import cli
from wcoj_core.budget import MemoryBudget
from wcoj_core.check.verify import _summed_figures, verify_state
from wcoj_core.indexes import arrange, rebuilt_index
from wcoj_core.kernel.layer import Layer
from wcoj_core.query.builtins import builtin
from wcoj_core.spill import Scratch, Spill
from wcoj_core.store.batches import Batches
from wcoj_core.store.manifest import Level, Trace
from wcoj_core.store.segments import open_segment
from wcoj_core.store.store import Store


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
    files = Batches(store.root)
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


def _summed(files: Batches, trace: Trace, time: int | None = None) -> Counter:
    """A trace's batches up to `time` summed, in memory (the oracle's view of a stored trace)."""
    layer = files.read_layer(trace.columns, list(trace.visible(time)))
    return Counter(
        {tuple(r): d for r, d in zip(layer.rows.tolist(), layer.diff.tolist(), strict=True)}
    )


def _view(layer: Layer) -> list[tuple[tuple[int, ...], int]]:
    return list(
        zip(
            map(tuple, np.asarray(layer.rows).tolist()),
            np.asarray(layer.diff).tolist(),
            strict=True,
        )
    )


def test_an_arrangement_rebuilt_through_spilled_runs_equals_the_one_built_in_memory(
    tmp_path: Path,
) -> None:
    """`repair`'s rebuild (`rebuilt_index`) under a tiny budget — runs of 4 KiB, so the
    batches and every view go through sorted runs on disk — writes every view's segment with
    exactly the rows and multiplicities of the same rebuild in memory, and of the batches summed
    and arranged in memory (independently of the index)."""
    state = _bag_state(tmp_path)
    store = Store.open(state, create=False)
    files = Batches(store.root)
    m = store.current()
    scratch = Scratch(tmp_path / "scratch", lambda _n: None)
    tiny = Spill(scratch, 1 << 12, 1 << 12, 1 << 12)
    roomy = Spill(Scratch(tmp_path / "roomy", lambda _n: None), 1 << 40, 1 << 40, 1 << 30)
    indexed = [(n, t) for n, t in sorted(m.traces.items()) if t.index is not None]
    assert {"rel/edge"} < {n for n, _ in indexed}  # the relation and its counts
    for name, trace in indexed:
        assert trace.index is not None
        spilled = scratch.spilled
        written: list[str] = []
        small = rebuilt_index(
            store.root, trace, lambda t, b: files.verified_pieces(b, t.columns), written, tiny
        )
        whole = rebuilt_index(
            store.root, trace, lambda t, b: files.verified_pieces(b, t.columns), written, roomy
        )
        assert small is not None and whole is not None
        layer = files.read_layer(trace.columns, list(trace.visible(trace.index.time)))
        keys = sorted({(s.view, s.order) for s in trace.index.segments}, key=repr)
        assert len(small.segments) == len(whole.segments) == len(keys)
        for a, b in zip(small.segments, whole.segments, strict=True):
            key = (None if a.view is None else tuple(a.view), tuple(a.order))
            assert (b.view, b.order, a.level, a.rows) == (a.view, a.order, Level.BASE, b.rows)
            got = open_segment(store.root, a, verify=True)
            assert _view(got) == _view(open_segment(store.root, b, verify=True)), (name, key)
            assert _view(got) == _view(arrange(layer, key)), (name, key)
        if name == "rel/edge":
            assert scratch.spilled > spilled  # the relation went through runs on disk
        store.discard(written)
    scratch.close()


def test_verify_repair_within_its_budget_leaves_a_state_that_answers_as_the_oracle(
    tmp_path: Path, capsys
) -> None:
    """A damaged arrangement of the relation, repaired by `wcoj verify --repair --memory`: the
    state verifies, and its next epoch's output change (the rules read the rebuilt
    arrangements) is the oracle's."""
    state = _bag_state(tmp_path)
    store = Store.open(state, create=False)
    edge = store.current().traces["rel/edge"]
    assert edge.index is not None
    flip_middle(state / edge.index.segments[0].file_path("rows"))
    assert cli.main(["verify", str(state), "--repair", "--memory", "128m"]) == 0
    assert "rebuilt the arrangements of rel/edge" in capsys.readouterr().err
    assert verify_state(store).ok
    assert not list((state / "scratch").glob("*"))  # the repair's runs are gone

    files = Batches(store.root)
    before = _summed(files, store.current().traces["rel/edge"])
    rng = random.Random(11)
    rows = [(rng.randrange(60), rng.randrange(60), 1) for _ in range(300)]
    rows += [(a, b, -1) for (a, b), d in sorted(before.items())[:100] for _ in range(d)]
    changes = tmp_path / "changes-3.csv"
    changes.write_text("c0,c1,diff\n" + "".join(f"{a},{b},{d}\n" for a, b, d in rows))
    argv = ["apply", "--query", "2-paths", "--state", str(state), "--epoch", "3"]
    assert cli.main([*argv, "--changes", f"edge={changes}", "--bag", "edge"]) == 0
    m = store.current()
    after = _summed(files, m.traces["rel/edge"])
    out = m.traces["out/paths2"]
    change = Counter(_summed(files, out, 3))
    change.subtract(_summed(files, out, 2))
    query = builtin("2-paths")
    expected = naive_delta(query, {"edge": before}, {"edge": after})
    assert +change == +expected and -change == -expected and expected
