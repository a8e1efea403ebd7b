"""Helpers of the state's tests: batches staged as real folders, layers, ages of files."""

from __future__ import annotations

import os
import time
from pathlib import Path

import numpy as np

from wcoj_core.kernel.layer import Layer
from wcoj_core.store import names
from wcoj_core.store.manifest import Batch, Index, Level, Manifest, Segment, Trace
from wcoj_core.store.segments import write_segment
from wcoj_core.store.store import Store

HOUR = 3600.0


def local(store: Store) -> Path:
    root = store.local_root
    assert root is not None
    return root


def stage_batch(store: Store, trace: str, t: int, content: bytes = b"rows") -> Batch:
    """A batch folder with one data file and a ``_SUCCESS`` marker, as a writer leaves it."""
    rel = names.new_batch_path(trace, t, "k")
    folder = local(store) / rel
    folder.mkdir(parents=True)
    (folder / "part-0-000.snappy.parquet").write_bytes(content + str(t).encode())
    (folder / "_SUCCESS").write_bytes(b"")
    return Batch(rel, t, 1, store.batch_files(rel), (t + 1, t + 1, 0), landed=f"l{t}")


def stage_segment(store: Store, trace: str, layer: Layer, level: Level = Level.BASE) -> Segment:
    rel = names.new_segment_path(trace)
    return write_segment(
        local(store), rel, layer, level=level, view=None, order=tuple(range(layer.width))
    )


def small_layer(seed: int, n: int = 50, width: int = 2) -> Layer:
    rng = np.random.default_rng(seed)
    return Layer.build(rng.integers(0, 100, size=(n, width)), np.ones(n, dtype=np.int64))


def epoch(store: Store, t: int, traces: tuple[str, ...] = ("rel/edge", "out/tri")) -> Manifest:
    """Commit epoch `t`: a new batch per trace, and a fresh index for the first trace."""
    before = store.current()
    m = Manifest(before.generation, t, before.frontier, before.plan, dict(before.traces))
    for name in traces:
        trace = m.trace(name) or Trace(name, ("c0", "c1"))
        trace = trace.replacing(stage_batch(store, name, t))
        if name == traces[0]:
            seg = stage_segment(store, name, small_layer(t))
            trace = trace.with_index(Index(t, (seg,)))
        m = m.with_trace(trace)
    return store.commit(m, before)


def age(path: Path, seconds: float) -> None:
    """Make a file or folder look `seconds` old (not following links)."""
    when = time.time() - seconds
    os.utime(path, (when, when), follow_symlinks=False)


def snapshot(root: Path) -> dict[str, bytes | str]:
    """Every file under `root` (links as their targets, not followed), by relative path."""
    out: dict[str, bytes | str] = {}
    for folder, dirs, files in os.walk(root):
        for name in [*files, *dirs]:
            p = Path(folder, name)
            rel = str(p.relative_to(root))
            if p.is_symlink():
                out[rel] = f"-> {os.readlink(p)}"
            elif p.is_file():
                out[rel] = p.read_bytes()
    return out
