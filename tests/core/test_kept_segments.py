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
    path = root / segment.path / segment.files["rows"].name
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
