"""A warm engine's kept segments (`wcoj_core.indexes.KEPT`) against the naive oracle.

One engine applies epoch after epoch: its segments stay mapped between epochs, get a directory
on their second use, and its recent segments are summed in memory. Every epoch's output change
and the accumulated output must equal the oracle's; a segment file rewritten in place between
two epochs (its stamp changes) is opened and checked again, found damaged, and rebuilt from the
batches, the answers still exact. A copied state's segments are hashed by its first epoch only:
that epoch's commit records their new stamps.
"""

from __future__ import annotations

import os
import random
import shutil
from pathlib import Path

import pytest
from test_engine_state import PATHS, TRIANGLES, Run, epoch_changes, specs

from wcoj_core import indexes
from wcoj_core.engine import Engine
from wcoj_core.store import segments


def warm_run(root: Path) -> Run:
    run = Run(root, [TRIANGLES, PATHS])
    run.keep = Engine(None, str(root), run.queries, relations=specs(run.queries))
    return run


def test_a_warm_engine_with_kept_segments_stays_exact(tmp_path: Path) -> None:
    indexes.KEPT.clear()
    run = warm_run(tmp_path / "state")
    for t in range(14):
        run.step(t, epoch_changes(t, run.graph))
        run.check_accumulated()
    held = run.engine.store.current().traces["rel/edge"].index
    assert held is not None
    assert sum(s.level.value == "recent" for s in held.segments) >= 2, "recent segments summed"
    assert any(layer._dir is not None for _, _, layer in indexes.KEPT._held.values())


def test_a_segment_rewritten_between_warm_epochs_is_checked_again(tmp_path: Path) -> None:
    indexes.KEPT.clear()
    root = tmp_path / "state"
    run = warm_run(root)
    for t in range(5):
        run.step(t, epoch_changes(t, run.graph))
    index = run.engine.store.current().traces["rel/edge"].index
    assert index is not None
    segment = next(s for s in index.segments if s.rows)
    path = root / segment.file_path("layer")
    data = bytearray(path.read_bytes())
    at = random.Random(1).randrange(len(data) - 16, len(data))  # in the data, past the header
    data[at] ^= 0xFF
    os.chmod(path, 0o644)
    path.write_bytes(bytes(data))  # in place: the same inode, a new mtime
    result = run.step(5, epoch_changes(5, run.graph))
    run.check_accumulated()
    assert any("rel/edge" in line for line in result.metrics.rebuilt), result.metrics.rebuilt
    for t in range(6, 9):
        run.step(t, epoch_changes(t, run.graph))
        run.check_accumulated()


def _descriptors() -> int:
    return len(os.listdir("/proc/self/fd"))


def test_kept_segments_hold_a_bounded_number_of_descriptors(tmp_path: Path) -> None:
    """Each kept segment's mapping holds a file descriptor (Python's ``mmap``): a
    process opening state after state keeps at most `most` segments, so its descriptors stay
    bounded (a test worker passed 1,024 of them before, which ``select`` refuses), and the
    default bound follows the process's descriptor limit."""
    import resource

    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    assert indexes.kept_most() <= max(8, min(128, soft // 12))
    kept = indexes.KeptSegments(most=4)
    run = warm_run(tmp_path / "state")
    for t in range(6):
        run.step(t, epoch_changes(t, run.graph))
    store = run.engine.store
    segments = [
        s
        for trace in store.current().traces.values()
        if trace.index is not None
        for s in trace.index.segments
        if s.rows
    ]
    assert len(segments) > 4
    indexes.KEPT.clear()
    before = _descriptors()
    for segment in segments:
        kept.open(store.root, segment)
    assert len(kept._held) == 4
    assert _descriptors() - before <= 4  # one file per segment


def test_a_copied_state_hashes_no_segment_whole(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A copy of a state has the same bytes under new inodes and times: no epoch reads a
    segment whole to trust it (each block an epoch reads is checked against its checksum as it
    is first read, whatever the stamps say). A file whose bytes changed in the copy is still
    caught."""
    indexes.KEPT.clear()
    original = tmp_path / "state"
    run = Run(original, [TRIANGLES, PATHS])
    for t in range(4):
        run.step(t, epoch_changes(t, run.graph))
    copy = tmp_path / "copy"
    shutil.copytree(original, copy)
    hashed: list[str] = []
    sha256_file = segments.sha256_file

    def counted(path):  # type: ignore[no-untyped-def]
        hashed.append(os.fspath(path))
        return sha256_file(path)

    monkeypatch.setattr(segments, "sha256_file", counted)
    run.root = copy
    for t in range(4, 7):
        indexes.KEPT.clear()  # each epoch a fresh process: nothing mapped or verified before
        run.step(t, epoch_changes(t, run.graph))
        run.check_accumulated()
    assert hashed == [], hashed
    # Bytes changed in a copy (its table of block checksums): found damaged on open, rebuilt
    # from the batches, and the answers stay exact.
    again = tmp_path / "again"
    shutil.copytree(copy, again)
    index = run.engine.store.current().traces["rel/edge"].index
    assert index is not None
    segment = max(index.segments, key=lambda s: s.rows)
    path = again / segment.file_path("layer")
    data = bytearray(path.read_bytes())
    data[-8] ^= 0xFF
    path.write_bytes(bytes(data))
    run.root = again
    indexes.KEPT.clear()
    result = run.step(7, epoch_changes(7, run.graph))
    run.check_accumulated()
    assert any("rel/edge" in line for line in result.metrics.rebuilt), result.metrics.rebuilt
