"""Faults while an epoch is applied: the process killed at any point, two writers at once, a
full disk, an unwritable state. Each ends with the state exactly as before the epoch (nothing
half applied), and applying the epoch again gives exactly the state of an undisturbed run.

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
import subprocess
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
from reliability_support import (
    MOMENTS,
    History,
    build_state,
    contents,
    fill,
    fingerprint,
    free,
    hashes,
    manifest_files,
    new_folders,
    one_line_error,
    open_store,
    referenced_files,
    run_wcoj,
    signal_when,
    small_file_system,
    staged_folders,
    start_wcoj,
    stderr_lines,
    summed,
    wcoj_here,
    write_changes,
)

from wcoj_core.store import names


@dataclass(frozen=True)
class World:
    """A state after epoch 0, epoch 1's changes, and the undisturbed state after epoch 1."""

    history: History
    base: Path
    base_print: dict[str, str]
    done: Path
    expected: dict[str, str]

    def apply_args(self, state: Path, *extra: str) -> list[str]:
        return self.history.apply_args(state, 1, *extra)


def random_history(seed: int = 11, vertices: int = 20_000, edges: int = 200_000) -> History:
    """A random undirected graph: 90% of its edges at epoch 0; at epoch 1 the other 10%
    inserted and 5% of the first ones deleted (named in the other direction)."""
    rng = np.random.default_rng(seed)
    a = rng.integers(0, vertices, 3 * edges)
    b = rng.integers(0, vertices, 3 * edges)
    keep = a != b
    pairs = np.unique(np.stack([np.minimum(a, b), np.maximum(a, b)], 1)[keep], axis=0)
    pairs = pairs[rng.permutation(len(pairs))[:edges]]
    cut = int(0.9 * len(pairs))
    first, later = pairs[:cut], pairs[cut:]
    gone = first[rng.choice(cut, len(pairs) // 20, replace=False)]
    epoch0 = [(int(x), int(y), 1) for x, y in first]
    epoch1 = [(int(x), int(y), 1) for x, y in later] + [(int(y), int(x), -1) for x, y in gone]
    return History([epoch0, epoch1])


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> World:
    root = tmp_path_factory.mktemp("faults")
    history = random_history().write(root / "in")
    base, done = root / "base", root / "undisturbed"
    build_state(history, base, 0)
    shutil.copytree(base, done, symlinks=True)
    applied = run_wcoj(*history.apply_args(done, 1, "--json"))
    assert applied.code == 0, applied.err
    # The undisturbed run itself is checked against the naive oracle.
    held = contents(done, ["rel/edge", "out/triangles"])
    assert summed(held, "rel/edge") == history.graph(1)
    answer = history.answer(1)
    assert summed(held, "out/triangles") == answer
    assert applied.payload["count"] == sum(answer.values()) > 0
    return World(history, base, fingerprint(base), done, fingerprint(done))


def fresh_copy(world: World, where: Path) -> Path:
    state = where / "state"
    shutil.copytree(world.base, state, symlinks=True)
    return state


def assert_as_before(
    world: World, state: Path, before: dict[str, bytes], files: dict[str, str]
) -> None:
    """The state is its previous generation: manifests byte-identical, every file they name
    byte-identical, the same contents; anything new is a folder wcoj names as its own."""
    assert manifest_files(state) == before
    assert referenced_files(state) == files
    assert fingerprint(state) == world.base_print
    now = hashes(state)
    for rel in set(now) - set(hashes(world.base)):
        parts = rel.split("/")
        assert parts[0] in (names.TRACES, names.ARRANGEMENTS, names.MANIFESTS, names.SCRATCH), rel
        if parts[0] == names.MANIFESTS:
            assert names.is_manifest_temp(parts[1]), rel
        elif len(parts) >= 3:
            assert names.is_own_batch(parts[2]) or names.is_own_segment(parts[2]), rel


def assert_undisturbed(world: World, state: Path) -> None:
    assert fingerprint(state) == world.expected


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
    fresh = {(int(a), int(b)) for a, b in rng.integers(0, 20_000, (2_000, 2)) if a != b}
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


@pytest.fixture(scope="module")
def footprint(world: World, tmp_path_factory: pytest.TempPathFactory) -> tuple[int, int]:
    """What epoch 1 takes on a small tmpfs, and what its manifest takes there (bytes), measured
    by an undisturbed run: once for every full-disk case."""
    with small_file_system(tmp_path_factory.mktemp("footprint") / "disk") as disk:
        trial = fresh_copy(world, disk / "trial")
        start = free(disk)
        assert run_wcoj(*world.apply_args(trial)).code == 0
        used = start - free(disk)
        manifest = max((trial / names.MANIFESTS).glob("*.json")).stat().st_blocks * 512
    return used, manifest


def full_disk_case(
    world: World,
    footprint: tuple[int, int],
    tmp_path: Path,
    leave: Callable[[int, int], int],
    what: str = "",
) -> None:
    """Apply epoch 1 to a state on a tmpfs that has `leave(*footprint)` bytes free: what the
    epoch takes on such a file system, and what its manifest takes (`footprint`)."""
    used, manifest = footprint
    with small_file_system(tmp_path / "disk") as disk:
        state = fresh_copy(world, disk)
        before = manifest_files(state)
        files = referenced_files(state)
        filler = fill(disk, leave=leave(used, manifest))
        done = run_wcoj(*world.apply_args(state))
        one_line_error(done, "No space left on device", str(state), what)
        assert_as_before(world, state, before, files)
        filler.unlink()
        done = run_wcoj(*world.apply_args(state))
        assert done.code == 0, done.err
        assert_undisturbed(world, state)


def test_a_full_disk_is_a_clear_error_and_the_state_stays(
    world: World, footprint: tuple[int, int], tmp_path: Path
) -> None:
    """The state on a full tmpfs: the epoch's first batch does not fit; one line, the state as
    before; after freeing space the re-run gives the undisturbed state."""
    full_disk_case(world, footprint, tmp_path, lambda total, manifest: 0, "cannot write a batch")


def test_a_disk_full_at_the_commit_is_a_clear_error(
    world: World, footprint: tuple[int, int], tmp_path: Path
) -> None:
    """Room for every batch and segment of the epoch but not for its manifest."""
    full_disk_case(
        world, footprint, tmp_path, lambda total, manifest: total - manifest, "cannot commit"
    )


@pytest.mark.parametrize("share", [0.3, 0.6, 0.9])
def test_a_disk_full_while_writing_arrangements_is_a_clear_error(
    world: World, footprint: tuple[int, int], tmp_path: Path, share: float
) -> None:
    """Room for the epoch's batches, not for all of its segments."""
    full_disk_case(world, footprint, tmp_path, lambda total, manifest: int(share * total))


@contextmanager
def read_only(folder: Path) -> Iterator[None]:
    """Make a folder tree unwritable: immutable for root (who ignores modes), else read-only."""
    if os.geteuid() == 0:
        subprocess.run(["chattr", "-R", "+i", str(folder)], check=True)
        try:
            yield
        finally:
            subprocess.run(["chattr", "-R", "-i", str(folder)], check=True)
        return
    modes = {p: p.stat().st_mode for p in [folder, *folder.rglob("*")]}
    for p in modes:
        p.chmod(0o555 if p.is_dir() else 0o444)
    try:
        yield
    finally:
        for p, mode in modes.items():
            p.chmod(mode)


UNWRITABLE = [
    ".",
    names.TRACES,
    names.MANIFESTS,
    pytest.param(
        names.ARRANGEMENTS,
    ),
]


@pytest.mark.parametrize("part", UNWRITABLE)
def test_an_unwritable_state_is_a_clear_error_and_the_state_stays(
    world: World, tmp_path: Path, part: str
) -> None:
    state = fresh_copy(world, tmp_path)
    before = manifest_files(state)
    files = referenced_files(state)
    with read_only(state / part):
        done = run_wcoj(*world.apply_args(state))
        line = one_line_error(done, str(state))
        assert "cannot" in line and any(
            p in line for p in ("Permission denied", "Operation not permitted")
        ), line
    assert_as_before(world, state, before, files)
    done = run_wcoj(*world.apply_args(state))
    assert done.code == 0, done.err
    assert_undisturbed(world, state)


def test_a_state_under_a_file_is_a_clear_error(world: World, tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory\n")
    one_line_error(run_wcoj(*world.apply_args(blocker)), "exists and is not a directory")
    one_line_error(run_wcoj(*world.apply_args(blocker / "state")), str(blocker))
    assert blocker.read_text() == "not a directory\n"


def test_a_killed_writer_then_an_hour_later_its_orphans_are_pruned(
    world: World, tmp_path: Path
) -> None:
    """The folders a killed writer staged are removed by a later commit once they are older than
    an hour (`ORPHAN_AGE`), never before (a writer at work keeps its files)."""
    import time

    from wcoj_core.store.store import ORPHAN_AGE

    state = fresh_copy(world, tmp_path)
    folders = set(staged_folders(state))
    signal_when(state, world.apply_args(state), "sixth-folder-staged", signal.SIGKILL)
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
