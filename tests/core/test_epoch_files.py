"""An epoch's files written on the process's file threads (`wcoj_core.store.files.soon`).

A warm epoch hands its batches and its segments' files to the file threads as soon as their
changes are known (the relations' and the counts' before the rules run) and takes them when it
makes the manifest; a small segment it wrote is then held by the process as the arrays it wrote
(`KeptSegments.hold`), checked by its file's stamp like a mapped one. Each test checks the
answers against the naive oracle: what the threads write is what a write on the main thread
would have written, a failure there fails the epoch with nothing staged left behind, and a
held segment rewritten in place is opened and checked again.
"""

from __future__ import annotations

import os
import random
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from test_engine_state import (
    TRIANGLES,
    Run,
    assert_unchanged,
    epoch_changes,
    new_run,
    observe,
    specs,
    table,
)

from wcoj_core import indexes
from wcoj_core.deploy.batches import BatchFiles
from wcoj_core.engine import Engine
from wcoj_core.errors import StateError
from wcoj_core.store import segments


def warm_run(root: Path) -> Run:
    run = Run(root, [TRIANGLES])
    run.keep = Engine(None, str(root), run.queries, relations=specs(run.queries))
    return run


def test_a_warm_epoch_writes_its_files_on_the_file_threads(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    indexes.KEPT.clear()
    run = warm_run(tmp_path / "state")
    for t in range(3):
        run.step(t, epoch_changes(t, run.graph))
    where: list[tuple[str, str]] = []
    write_batch, write_file = BatchFiles.write_encoded, segments._write_file

    def batch(self: BatchFiles, rel: str, *args: Any) -> Any:
        where.append(("batch", threading.current_thread().name))
        return write_batch(self, rel, *args)

    def segment(*args: Any) -> Any:
        where.append(("segment", threading.current_thread().name))
        return write_file(*args)

    monkeypatch.setattr(BatchFiles, "write_encoded", batch)
    monkeypatch.setattr(segments, "_write_file", segment)
    run.step(3, epoch_changes(3, run.graph))
    monkeypatch.undo()
    run.check_accumulated()
    assert {kind for kind, _ in where} == {"batch", "segment"}
    assert all(name.startswith("wcoj-sync-") for _, name in where), where


def test_a_segment_held_as_written_and_rewritten_in_place_is_checked_again(
    tmp_path: Path,
) -> None:
    """The last epoch's recent segment is held as the arrays written (no mapping); rewritten in
    place before the next epoch (a new stamp), it is opened, found damaged and rebuilt."""
    indexes.KEPT.clear()
    root = tmp_path / "state"
    run = warm_run(root)
    for t in range(4):
        run.step(t, epoch_changes(t, run.graph))
    index = run.engine.store.current().traces["rel/edge"].index
    assert index is not None
    newest = index.segments[-1]
    assert newest.level.value == "recent" and newest.rows
    held = indexes.KEPT._held[(str(root), newest.path)][2]
    assert not isinstance(held.diff, np.memmap), "held as the arrays written"
    assert np.array_equal(segments.open_segment(str(root), newest).diff, held.diff)
    path = root / newest.file_path("layer")
    data = bytearray(path.read_bytes())
    at = random.Random(2).randrange(len(data) - 16, len(data))  # in the data, past the header
    data[at] ^= 0xFF
    os.chmod(path, 0o644)
    path.write_bytes(bytes(data))  # in place: the same inode, a new mtime
    result = run.step(4, epoch_changes(4, run.graph))
    run.check_accumulated()
    assert any("rel/edge" in line for line in result.metrics.rebuilt), result.metrics.rebuilt
    for t in range(5, 8):
        run.step(t, epoch_changes(t, run.graph))
        run.check_accumulated()


@pytest.mark.parametrize("which", ["batch", "segment"])
def test_a_file_thread_failing_fails_the_epoch_and_leaves_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, which: str
) -> None:
    """A write on the file threads that fails (a full disk, say) fails the epoch with its
    message; every file the epoch staged is removed once every write it started has ended, and
    the epoch then applies normally."""
    root = tmp_path / "state"
    run = new_run(root, [TRIANGLES], epochs=2)
    before = observe(run.engine, root)
    changes = epoch_changes(2, run.graph)
    full = OSError(28, "No space left on device")
    calls: list[str] = []
    put, write_sealed = BatchFiles.put, segments.write_sealed

    def batch(self: BatchFiles, path: str, data: Any) -> Any:
        calls.append(path)
        if "out" in path.split("/")[-3]:  # the output's batch fails, the others are written
            raise full
        return put(self, path, data)

    def sealed(target: str, write: Any, **kwargs: Any) -> Any:
        calls.append(target)
        if len(calls) == 2:
            raise full
        return write_sealed(target, write, **kwargs)

    with monkeypatch.context() as patch:
        if which == "batch":
            patch.setattr(BatchFiles, "put", batch)
        else:
            patch.setattr(segments, "write_sealed", sealed)
        with pytest.raises(StateError, match="No space left on device"):
            run.engine.apply(2, {"edge": table(changes)})
    assert len(calls) >= 2
    assert_unchanged(run.engine, root, before)
    run.step(2, changes)
    run.check_accumulated()
