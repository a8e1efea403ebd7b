"""Storage failures while an epoch is applied: a full disk (at the first batch, among the
arrangements, at the commit), an unwritable state, a state under a file. Each is one clear line,
the state stays exactly as before the epoch, and applying the epoch again once the disk has
room gives exactly the state of an undisturbed run (the world both fault modules start from:
`faults_support`; processes killed: `test_faults.py`).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from faults_support import World, assert_as_before, assert_undisturbed, fresh_copy
from reliability_support import (
    fill,
    free,
    manifest_files,
    one_line_error,
    read_only,
    referenced_files,
    run_wcoj,
    small_file_system,
)

from wcoj_core.store import names


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
