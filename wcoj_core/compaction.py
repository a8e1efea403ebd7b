"""History compaction: a trace's batches up to a frontier merged into one.

A state keeps one batch per trace per epoch: every epoch can be read as of itself, re-run or
corrected. History that will never be re-run can be *compacted*: every trace's batches at or
before a frontier are summed into one batch stamped with the frontier (each tuple once, its
multiplicities summed, zeros dropped), so the trace as of the frontier or any later epoch is
unchanged while its batches (and the manifest) stop growing. The manifest records the frontier:
an epoch at or before it can no longer be applied, replaced or read as of itself.

What the merged batches keep: the figures of the last merged batch; for a relation, the chain of
the frontier (`wcoj_core.lineage`), from which later epochs' chains go on, so nothing later goes
stale; a set relation's ignored changes before the frontier are dropped (no epoch before it will
be derived again). The index is untouched: it covers the same tuples. Reading the merged batches
reads them whole (checked against their digests).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

import numpy as np

from wcoj_core import lineage
from wcoj_core.errors import StateError
from wcoj_core.kernel.layer import Layer
from wcoj_core.spill import Spill, merge
from wcoj_core.store.batches import Batches, BatchWriter
from wcoj_core.store.manifest import Batch, FileRef, Manifest, Trace
from wcoj_core.store.names import new_batch_path

ReadBatch = Callable[[Trace, Batch], Layer]


def _summed(
    trace: Trace,
    batches: list[Batch],
    files: Batches,
    folder: str,
    time: int,
    spill: Spill,
) -> tuple[int, tuple[FileRef, ...]]:
    """Batches summed into one written batch (`BatchWriter`), a file read at a time (each
    checked against its digest), through sorted runs; its rows and files."""
    sorter = spill.sorter(len(trace.columns), "compacting a trace's batches")
    for b in batches:  # every batch and file: the rows read are checked against the manifest's
        read = 0
        for ref in b.files:
            layer = files.read_verified(b.path, trace.columns, (ref,))
            read += len(layer)
            sorter.add(np.asarray(layer.rows), np.asarray(layer.diff))
        if read != b.rows:
            raise StateError(
                f"trace {trace.name!r}: batch {b.path} holds {read:,} rows, its manifest says "
                f"{b.rows:,}; run `wcoj verify --repair`"
            )
    out = BatchWriter(files, folder, trace.columns, time)
    if not sorter.spilled:
        layer = sorter.layer()
        out.write(np.asarray(layer.rows), np.asarray(layer.diff))
    else:
        for rows, diff, _ in merge(sorter.take_runs(), sorter.width, block_bytes=spill.merge_bytes):
            out.write(rows, diff)
    return out.rows, out.close()


def compacted(
    m: Manifest,
    frontier: int,
    relations: list[str],
    files: Batches,
    read_batch: ReadBatch,
    written: list[str],
    spill: Spill | None = None,
) -> Manifest:
    """`m` with every trace's batches at or before `frontier` merged (see the module); the
    merged batches' folders are added to `written` as they are made. With `spill`, batches are
    read a file at a time and summed through sorted runs, the merged batch written a chunk at a
    time: a trace of any size is compacted within the memory budget."""
    if m.frontier is not None and frontier <= m.frontier:
        return m
    # The chain at the frontier is its last epoch's: the frontier need not be an epoch itself
    # (epochs 0, 1, 10 compacted to 9 go on from epoch 1's chain).
    known = lineage.chains(m, relations)
    held = [e for e in known if e <= frontier]
    chain = known[max(held)] if held else ""
    traces = dict(m.traces)
    for name, trace in m.traces.items():
        old = [b for b in trace.batches if b.time <= frontier]
        later = tuple(b for b in trace.batches if b.time > frontier)
        if trace.index is not None and trace.index.time < frontier:
            raise StateError(
                f"trace {name!r}: its index covers epochs up to {trace.index.time}, before the "
                f"frontier {frontier}; compact at or before the index"
            )
        if name.startswith("ignored/"):
            traces[name] = replace(trace, batches=later)
            continue
        if not old or (len(old) == 1 and old[0].time == frontier and not name.startswith("rel/")):
            continue
        folder = new_batch_path(name, frontier, "c")
        written.append(folder)
        if spill is None:
            total = Layer.empty(len(trace.columns))
            for b in old:  # every batch: its rows are checked as it is read, never trusted
                layer = read_batch(trace, b)
                total = Layer.build(
                    np.concatenate([np.asarray(total.rows), np.asarray(layer.rows)]),
                    np.concatenate([np.asarray(total.diff), np.asarray(layer.diff)]),
                )
            rows = len(total)
            refs = files.write(
                folder,
                trace.columns,
                np.asarray(total.rows),
                np.asarray(total.diff),
                frontier,
                threads=True,
            )
        else:
            rows, refs = _summed(trace, old, files, folder, frontier, spill)
        figures = next((b.figures for b in reversed(old) if b.figures is not None), None)
        merged = Batch(
            folder,
            frontier,
            rows,
            refs,
            figures,
            inputs=chain,
            chain=chain if name.startswith("rel/") else "",
        )
        traces[name] = replace(trace, batches=(merged, *later))
    return replace(m, traces=traces, frontier=frontier)
