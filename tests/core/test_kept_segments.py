"""A warm engine's kept segments (`wcoj_core.indexes.KEPT`) against the naive oracle.

One engine applies epoch after epoch: its segments stay mapped between epochs, get a directory
on their second use, and its recent segments are summed in memory. Every epoch's output change
and the accumulated output must equal the oracle's; a segment file rewritten in place between
two epochs (its stamp changes) is opened and checked again, found damaged, and rebuilt from the
batches, the answers still exact.
"""

from __future__ import annotations

import os
import random
from pathlib import Path

from test_engine_state import PATHS, TRIANGLES, Run, epoch_changes, specs

from wcoj_core import indexes
from wcoj_core.engine import Engine


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
