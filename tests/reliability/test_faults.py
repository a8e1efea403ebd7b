"""Faults while an epoch is applied: the process killed at any point (compaction included),
two writers at once. Each ends with the state exactly as before the epoch (nothing half
applied), and applying the epoch again gives exactly the state of an undisturbed run. (Full
disks and unwritable states: `test_faults_disk.py`; the world both start from:
`faults_support`.)

The epoch is applied by the ``wcoj apply`` script in a subprocess, on the one-pass engine: the
driver maps the arrangement files, stages one batch folder per changed trace under ``traces/``
and one segment folder per advanced index under ``arrangements/``, then commits one manifest.
The moments to kill are found by watching those folders (and the manifest's temporary file)
appear. State contents (every trace's batches, every index's segments, read back and checked
against their digests) are compared with an undisturbed run, itself checked against the naive
oracle.
"""

from __future__ import annotations

import os
import shutil
import signal
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
from faults_support import VERTICES, World, assert_as_before, assert_undisturbed, fresh_copy
from reliability_support import (
    MOMENTS,
    History,
    contents,
    fingerprint,
    manifest_files,
    new_folders,
    open_store,
    referenced_files,
    run_wcoj,
    signal_when,
    staged_folders,
    start_wcoj,
    stderr_lines,
    summed,
    wcoj_here,
    write_changes,
)


@pytest.mark.parametrize("moment", [m for m in MOMENTS if m != "compaction-staged"])
def test_a_killed_writer_leaves_the_state_as_before(
    world: World, tmp_path: Path, moment: str
) -> None:
    state = fresh_copy(world, tmp_path)
    before = manifest_files(state)
    files = referenced_files(state)
    folders = set(staged_folders(state))
    proc, _, _ = signal_when(state, world.apply_args(state), moment, signal.SIGKILL)
    assert proc.returncode == -9, proc.returncode
    if manifest_files(state) != before:
        # Killed after the manifest's link: the epoch is committed, whole.
        assert moment.startswith("manifest-"), moment
        assert_undisturbed(world, state)
        return
    assert new_folders(state, folders), "nothing was staged"
    assert_as_before(world, state, before, files)
    # Applying the epoch again gives exactly the undisturbed result: the killed run's staged
    # folders belong to no manifest.
    done = run_wcoj(*world.apply_args(state))
    assert done.code == 0, done.err
    assert_undisturbed(world, state)


@dataclass(frozen=True)
class Compaction:
    """Epoch 2 applied with ``--keep-epochs 1`` to the undisturbed state after epoch 1: its
    commit also merges every trace's batches up to epoch 1 (`wcoj_core.compaction`)."""

    argv: list[str]
    expected: dict[str, str]


@pytest.fixture(scope="module")
def compaction(world: World, tmp_path_factory: pytest.TempPathFactory) -> Compaction:
    root = tmp_path_factory.mktemp("compaction")
    rng = np.random.default_rng(5)
    held = sorted(world.history.graph(1))
    gone = [held[i] for i in rng.choice(len(held), 2_000, replace=False)]
    fresh = {(int(a), int(b)) for a, b in rng.integers(0, VERTICES, (2_000, 2)) if a != b}
    changes = write_changes(
        root / "e2.csv", [(a, b, -1) for a, b in gone] + [(a, b, 1) for a, b in fresh]
    )

    def argv(state: Path) -> list[str]:
        return [
            *["apply", "--query", "triangles", "--state", str(state), "--epoch", "2"],
            *["--changes", f"edge={changes}", "--undirected", "edge", "--keep-epochs", "1"],
        ]

    done = root / "undisturbed"
    shutil.copytree(world.done, done, symlinks=True)
    applied = run_wcoj(*argv(done))
    assert applied.code == 0, applied.err
    assert open_store(done).current().frontier == 1
    epochs = [*world.history.epochs, [(a, b, -1) for a, b in gone] + [(a, b, 1) for a, b in fresh]]
    held_after = History(epochs)
    assert summed(contents(done, ["out/triangles"]), "out/triangles") == held_after.answer(2)
    return Compaction(argv(Path("STATE")), fingerprint(done))


def test_a_writer_killed_while_compacting_leaves_the_state_as_before(
    world: World, compaction: Compaction, tmp_path: Path
) -> None:
    """SIGKILL as soon as the compaction (inside epoch 2's commit) stages its first merged
    batch: the state is exactly the one after epoch 1; re-running gives the undisturbed,
    compacted state."""
    state = tmp_path / "state"
    shutil.copytree(world.done, state, symlinks=True)
    argv = [str(state) if a == "STATE" else a for a in compaction.argv]
    before = manifest_files(state)
    files = referenced_files(state)
    expected_before = fingerprint(state)
    proc, _, _ = signal_when(state, argv, "compaction-staged", signal.SIGKILL)
    assert proc.returncode == -9
    assert manifest_files(state) == before
    assert referenced_files(state) == files
    assert fingerprint(state) == expected_before
    done = run_wcoj(*argv)
    assert done.code == 0, done.err
    assert fingerprint(state) == compaction.expected


@pytest.mark.spark
def test_a_killed_writer_with_its_rules_in_the_executors(world: World, tmp_path: Path) -> None:
    """``--deploy executors``: the changes are staged as batches before Spark's job runs the
    rules; the whole process group (driver and JVM) is killed then."""
    state = fresh_copy(world, tmp_path)
    before = manifest_files(state)
    files = referenced_files(state)
    folders = set(staged_folders(state))
    signal_when(
        state,
        world.apply_args(state, "--deploy", "executors"),
        "first-batch-staged",
        signal.SIGKILL,
    )
    assert new_folders(state, folders)
    assert_as_before(world, state, before, files)
    done = run_wcoj(*world.apply_args(state))
    assert done.code == 0, done.err
    assert_undisturbed(world, state)


@pytest.mark.parametrize("round_", range(2))
def test_two_writers_of_one_epoch_one_wins(world: World, tmp_path: Path, round_: int) -> None:
    state = fresh_copy(world, tmp_path)
    procs = [start_wcoj(*world.apply_args(state)) for _ in range(2)]
    results = [(p, *p.communicate(timeout=900)) for p in procs]
    codes = sorted(p.returncode for p, _, _ in results)
    assert codes == [0, 2], [(p.returncode, err[-2000:]) for p, _, err in results]
    ((loser_err),) = [err for p, _, err in results if p.returncode == 2]
    lines = stderr_lines(loser_err)
    assert len(lines) == 1 and "Traceback" not in loser_err, loser_err
    assert "committed by another writer" in lines[0] or "already applied" in lines[0], lines
    assert len(manifest_files(state)) == 2
    assert_undisturbed(world, state)


def test_a_killed_writer_then_an_hour_later_its_orphans_are_pruned(
    world: World, tmp_path: Path
) -> None:
    """The folders a killed writer staged are removed by a later commit once they are older than
    an hour (`ORPHAN_AGE`), never before (a writer at work keeps its files)."""
    import time

    from wcoj_core.store.store import ORPHAN_AGE

    state = fresh_copy(world, tmp_path)
    folders = set(staged_folders(state))
    signal_when(state, world.apply_args(state), "third-staged", signal.SIGKILL)
    orphans = new_folders(state, folders)
    assert orphans
    assert run_wcoj(*world.apply_args(state)).code == 0
    assert set(orphans) <= set(staged_folders(state)), "young orphans were pruned"
    when = time.time() - ORPHAN_AGE - 60
    for rel in orphans:
        os.utime(state / rel, (when, when))
    corrected = world.history.epochs[1][:-5]
    fix = write_changes(tmp_path / "fix.csv", corrected)
    argv = world.apply_args(state, "--replace")
    argv[argv.index(f"edge={world.history.files[1]}")] = f"edge={fix}"
    done = wcoj_here(*argv)
    assert done.code == 0, done.err
    assert not set(orphans) & set(staged_folders(state)), "old orphans were kept"
