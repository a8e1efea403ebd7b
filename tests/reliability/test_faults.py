"""Faults while an epoch is applied: the driver killed, two writers at once, a full disk, an
unwritable state. Each ends with the state exactly as before the epoch (nothing half applied),
and re-applying the epoch gives exactly the state of an undisturbed run.

The epoch is applied by the ``wcoj apply`` command, in a subprocess where a process has to die
or race; in-process (the test session's Spark) where only the storage misbehaves.
"""

from __future__ import annotations

import csv
import errno
import os
import shutil
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest
from pyspark.sql import SparkSession
from reliability_support import (
    Contents,
    committed_epoch,
    contents,
    errors,
    kill_group,
    manifest_files,
    output_multiset,
    relation_multiset,
    staged_batches,
    start_wcoj,
    wait_for,
)

from wcoj_core import cli
from wcoj_core.naive import naive_eval
from wcoj_core.query.builtins import builtin
from wcoj_core.replay import epoch_stream
from wcoj_core.sources import read_relation

QUERY = "triangles"
GRAPH = "rmat:scale=11,edges=16000,seed=11"


@dataclass(frozen=True)
class World:
    """A state after epoch 0, epoch 1's changes as a file, and the undisturbed result."""

    base: Path
    changes: Path
    base_contents: Contents
    expected: Contents

    def apply_args(self, state: Path) -> list[str]:
        return [
            *["apply", "--query", QUERY, "--state", str(state), "--epoch", "1"],
            *["--changes", f"edge={self.changes}"],
        ]


def write_changes(path: Path, rows: list[tuple[int, int, int]]) -> Path:
    with open(path, "w", newline="") as out:
        writer = csv.writer(out)
        writer.writerow(["c0", "c1", "diff"])
        writer.writerows(rows)
    return path


@pytest.fixture(scope="module")
def world(spark: SparkSession, tmp_path_factory: pytest.TempPathFactory) -> World:
    root = tmp_path_factory.mktemp("faults")
    graph = read_relation(spark, GRAPH, 2, "edge")
    stream = epoch_stream(graph, 2, 0.3, seed=5, undirected=True).collect()
    by_epoch = [[(r["c0"], r["c1"], r["diff"]) for r in stream if r["time"] == t] for t in range(2)]
    assert any(d < 0 for _, _, d in by_epoch[1]), "epoch 1 should delete edges too"
    first = write_changes(root / "epoch-0.csv", by_epoch[0])
    second = write_changes(root / "epoch-1.csv", by_epoch[1])
    base, done = root / "base", root / "undisturbed"
    argv = ["apply", "--query", QUERY, "--state", str(base), "--epoch", "0"]
    assert cli.main([*argv, "--changes", f"edge={first}"]) == 0
    shutil.copytree(base, done)
    world = World(base, second, contents(spark, base), contents(spark, base))
    assert cli.main(world.apply_args(done)) == 0
    expected = contents(spark, done)
    # The undisturbed run itself is checked against the naive oracle.
    edges = relation_multiset(expected, "edge")
    assert output_multiset(expected, QUERY) == naive_eval(builtin(QUERY), {"edge": edges})
    assert expected[0] == 1 and world.base_contents[0] == 0
    return World(base, second, world.base_contents, expected)


def fresh_copy(world: World, where: Path) -> Path:
    state = where / "state"
    shutil.copytree(world.base, state)
    return state


@pytest.mark.parametrize("staged", [1, 3], ids=["while-staging-changes", "while-maintaining"])
def test_a_killed_driver_leaves_the_state_as_before(
    spark: SparkSession, world: World, tmp_path: Path, staged: int
) -> None:
    state = fresh_copy(world, tmp_path)
    before = manifest_files(state)
    # The driver stages its batches in milliseconds, too fast to kill between two of them; the
    # executors' job is slow enough. Both stage and commit through the same manifest protocol.
    proc = start_wcoj(*world.apply_args(state), "--deploy", "executors")
    wait_for(
        lambda: len(staged_batches(state, 1)) >= staged or proc.poll() is not None,
        f"{staged} staged batches of epoch 1",
    )
    assert proc.poll() is None, f"the epoch ended before the kill: {proc.communicate()}"
    kill_group(proc)
    assert proc.returncode == -9
    assert staged_batches(state, 1), "the run was killed before it staged anything"
    assert manifest_files(state) == before
    assert contents(spark, state) == world.base_contents
    # Re-applying the epoch: exactly the undisturbed result (the orphans of the killed run are
    # not part of any manifest).
    assert cli.main(world.apply_args(state)) == 0
    assert contents(spark, state) == world.expected


def test_two_writers_of_one_epoch_one_wins(
    spark: SparkSession, world: World, tmp_path: Path
) -> None:
    state = fresh_copy(world, tmp_path)
    procs = [start_wcoj(*world.apply_args(state)) for _ in range(2)]
    results = [(p, *p.communicate(timeout=900)) for p in procs]
    codes = sorted(p.returncode for p, _, _ in results)
    assert codes == [0, 2], [(p.returncode, err[-2000:]) for p, _, err in results]
    (loser_err,) = [err for p, _, err in results if p.returncode == 2]
    (message,) = errors(loser_err)
    assert "committed by another writer" in message or "already applied" in message, message
    assert "Traceback" not in loser_err
    assert contents(spark, state) == world.expected


@contextmanager
def small_file_system(where: Path) -> Iterator[Path]:
    """A 64 MiB tmpfs mounted at `where` (root only), unmounted afterwards."""
    where.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=64m", "tmpfs", str(where)],
        capture_output=True,
        check=False,
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a small file system here: {mounted.stderr.decode().strip()}")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False)


def fill(folder: Path) -> Path:
    """Write a file until the file system is full; return it."""
    filler = folder / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT)
    try:
        for size in (1 << 20, 1 << 12, 1):
            try:
                while True:
                    os.write(fd, b"\0" * size)
            except OSError as e:
                assert e.errno == errno.ENOSPC, e
    finally:
        os.close(fd)
    return filler


def test_a_full_disk_is_a_clear_error_and_the_state_stays(
    spark: SparkSession, world: World, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with small_file_system(tmp_path / "disk") as disk:
        state = fresh_copy(world, disk)
        before = manifest_files(state)
        filler = fill(disk)
        capsys.readouterr()
        assert cli.main(world.apply_args(state)) == 2
        (message,) = errors(capsys.readouterr().err)
        assert "No space left on device" in message, message
        assert str(state) in message
        assert manifest_files(state) == before
        assert committed_epoch(state) == 0
        assert contents(spark, state) == world.base_contents
        filler.unlink()
        assert cli.main(world.apply_args(state)) == 0
        assert contents(spark, state) == world.expected


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


def test_an_unwritable_state_is_a_clear_error_and_the_state_stays(
    spark: SparkSession, world: World, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    state = fresh_copy(world, tmp_path)
    before = manifest_files(state)
    with read_only(state):
        capsys.readouterr()
        assert cli.main(world.apply_args(state)) == 2
        (message,) = errors(capsys.readouterr().err)
        assert "cannot write a batch" in message, message
        assert any(
            p in message for p in ("Permission denied", "Operation not permitted", "Mkdirs failed")
        ), message
        assert manifest_files(state) == before
        assert contents(spark, state) == world.base_contents
    assert cli.main(world.apply_args(state)) == 0
    assert contents(spark, state) == world.expected


def test_a_state_under_a_file_is_a_clear_error(
    world: World, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory\n")
    assert cli.main(world.apply_args(blocker)) == 2
    (message,) = errors(capsys.readouterr().err)
    assert "exists and is not a directory" in message
    assert cli.main(world.apply_args(blocker / "state")) == 2
    (message,) = errors(capsys.readouterr().err)
    assert str(blocker) in message, message
    assert blocker.read_text() == "not a directory\n"
