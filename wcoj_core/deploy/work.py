"""What one epoch (or one epoch-addressed step) asks of the kernel, and how a share of it runs.

A `Work` is plain picklable data: the state's root, the epoch, the plans, the traces to read
(`TraceRead`), the counts changes and the delta rules (`RuleJob`). `open_layers` reads the traces
into `EpochLayers`; `run_share` runs share ``i`` of ``n`` (each rule's i-th range of delta tuples,
balanced on the work the counts predict; share 0 also emits the work's own changes). The driver
runs the shares on threads, the executors one per task.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa

from wcoj_core.deploy.resident import BatchRef, Resident
from wcoj_core.indexes import Opened, ViewKey, open_trace
from wcoj_core.kernel.changes import changes_layer, counts_delta, support_delta
from wcoj_core.kernel.index import EpochLayers
from wcoj_core.kernel.join import (
    CHUNK_ROWS,
    PROPOSAL_BUDGET,
    Pace,
    Part,
    RuleTally,
    count_rule,
    delta_layer,
    run_rule,
    share_ranges,
)
from wcoj_core.kernel.keys import I64
from wcoj_core.kernel.layer import Layer, arranged
from wcoj_core.query.ir import Var
from wcoj_core.query.plan import Arrangement, AtomView, DeltaRule, Plan
from wcoj_core.spill import Spill
from wcoj_core.store.manifest import Segment, Trace
from wcoj_core.store.segments import open_segment
from wcoj_core.traces import counts_trace_name, relation_columns, relation_trace_name


@dataclass(frozen=True, slots=True)
class TraceRead:
    """A trace a work reads: its batches as of the old state (`old`) or, with `trace`, its
    index's mapped files through the view `keys` (`wcoj_core.indexes.open_trace`); and its
    changes at the epoch: batches (`delta`), files, carried columns, or with `mapped` the
    driver's consolidated layer as one segment file (`symmetric`: its own mirror, its reversed
    view the file itself)."""

    name: str
    columns: tuple[str, ...]
    old: tuple[BatchRef, ...]
    delta: tuple[BatchRef, ...] = ()
    raw: tuple[str, ...] = ()
    inline: pa.Table | None = None  # or the changes themselves (a small epoch's)
    trace: Trace | None = None
    keys: frozenset[ViewKey] = frozenset()
    mapped: Segment | None = None
    symmetric: bool = False


@dataclass(frozen=True, slots=True)
class RuleJob:
    """One delta rule to run, and the trace its output change goes to."""

    query: str
    rule: int
    output: str


@dataclass(frozen=True, slots=True)
class Work:
    """Everything one epoch's kernel work needs (see the module)."""

    root: str
    epoch: int
    plans: Mapping[str, Plan]
    reads: tuple[TraceRead, ...]
    counts: tuple[Arrangement, ...] = ()
    rules: tuple[RuleJob, ...] = ()
    # The traces whose epoch changes are outputs of the work (relation changes read raw or
    # carried along, computed counts changes), emitted once, by share 0.
    emit: tuple[str, ...] = ()
    # Outputs known consolidated as the rules make them (no summing needed across shares).
    distinct: frozenset[str] = field(default_factory=frozenset)
    # Distinct outputs only counted, never written (a static count keeping nothing): their
    # rules' bindings are counted and their weights summed (`Counted`), on the driver.
    counted: frozenset[str] = field(default_factory=frozenset)
    # The candidates a step proposes at once (`wcoj_core.kernel.join`): what bounds memory.
    budget: int = PROPOSAL_BUDGET
    # The delta tuples a rule takes at once.
    chunk_rows: int = CHUNK_ROWS
    # The memory budget of a task's process (an executor's Python worker), bytes (0: a default),
    # for what it sums and spills beyond it (`task_spill`).
    memory: int = 0

    def rule(self, job: RuleJob) -> DeltaRule:
        return self.plans[job.query].rules[job.rule]

    def columns(self) -> dict[str, tuple[str, ...]]:
        """Every output trace of the work and its columns, in a stable order."""
        out: dict[str, tuple[str, ...]] = {}
        reads = {r.name: r.columns for r in self.reads}
        for name in self.emit:
            out[name] = reads.get(name, ())
        for a in self.counts:
            out[counts_trace_name(a)] = tuple(f"c{k}" for k in a.key)
        for job in self.rules:
            out[job.output] = tuple(relation_columns(len(self.plans[job.query].query.head)))
        return dict(sorted(out.items()))


@dataclass(frozen=True, slots=True)
class Emitted:
    """Changes of an output trace made by a share (consolidated when `consolidated`)."""

    name: str
    rows: np.ndarray
    diff: np.ndarray
    consolidated: bool


@dataclass(frozen=True, slots=True)
class Bindings:
    """Full bindings of one rule, a part at a time."""

    job: RuleJob
    part: Part


@dataclass(frozen=True, slots=True)
class Counted:
    """A rule's bindings counted (an output of `Work.counted`): how many, their weights' sum."""

    job: RuleJob
    rows: int
    total: int


@dataclass(frozen=True, slots=True)
class Tallied:
    """What one rule did in one share."""

    job: RuleJob
    tally: RuleTally


Made = Emitted | Bindings | Counted | Tallied


def open_layers(
    work: Work,
    resident: Resident,
    given: Mapping[str, Layer] | None = None,
    arrange: Callable[[Layer, AtomView | None, tuple[int, ...]], Layer] | None = None,
) -> EpochLayers:
    """The traces of a work as of its old state, with its changes (`given` ones first, then raw
    files, then stored batches) and the counts changes it computes; a change's views arranged
    by `arrange` (a task's spill: a first load's change is the whole graph)."""
    traces: dict[str, Any] = {
        r.name: opened_trace(work, r, resident)
        if r.trace is not None
        else resident.index(r.name, r.columns, r.old)
        for r in work.reads
    }
    deltas: dict[str, Layer] = {}
    for r in work.reads:
        if given and r.name in given:
            deltas[r.name] = given[r.name]
        elif r.inline is not None:
            deltas[r.name] = changes_layer(r.columns, r.inline)
        elif r.mapped is not None:
            deltas[r.name] = open_segment(work.root, r.mapped)
            if r.symmetric:
                deltas[r.name].mirrored()
        elif r.raw:
            deltas[r.name] = resident.batches.read_files(r.columns, r.raw)
        elif any(b.rows for b in r.delta):
            deltas[r.name] = resident.read(r.columns, r.delta)
    layers = EpochLayers(traces, deltas, arrange=arrange or arranged)  # type: ignore[arg-type]
    by_view: dict[AtomView, list[Arrangement]] = {}
    for a in work.counts:
        by_view.setdefault(a.view, []).append(a)
    for view, arrangements in by_view.items():
        if relation_trace_name(view.relation) not in deltas:
            continue
        support = support_delta(layers, view)
        for a in arrangements:
            deltas[counts_trace_name(a)] = counts_delta(support, a.key)
    return layers


# Traces a worker opened from their indexes, by (root, trace, segments, batches): the latest few.
KEEP_OPENED = 16
_OPENED: dict[tuple[Any, ...], Opened] = {}


def opened_trace(work: Work, read: TraceRead, resident: Resident) -> Opened:
    """A trace of a work as of its epoch, opened from its index (kept for the next tasks of
    this worker: a later epoch's task opens its own)."""
    trace = read.trace
    assert trace is not None
    segments = tuple(s.path for s in trace.index.segments) if trace.index is not None else ()
    batches = tuple(b.path for b in trace.batches if b.time < work.epoch)
    key = (work.root, read.name, work.epoch, segments, batches)
    found = _OPENED.pop(key, None)
    if found is None:
        files = resident.batches
        found = open_trace(
            work.root,
            trace,
            work.epoch,
            read.keys,
            lambda t, b: files.read_verified(b.path, t.columns, b.files, b.rows, b.time),
        )
    _OPENED[key] = found
    while len(_OPENED) > KEEP_OPENED:
        _OPENED.pop(next(iter(_OPENED)))
    return found


def run_share(
    work: Work,
    layers: EpochLayers,
    share: int,
    count: int,
    threads: int = 1,
    whole: bool = False,
) -> Iterator[Made]:
    """Share `share` of `count` of a work: emitted changes (share 0), then each rule's bindings
    on its share of the delta and its tally, on up to `threads` threads
    (`wcoj_core.kernel.join.run_rule`)."""
    if share == 0:
        columns = work.columns()
        for name in work.emit:
            layer = layers.deltas.get(name)
            if layer is None:
                layer = Layer.empty(len(columns[name]))
            yield Emitted(name, layer.rows, layer.diff, True)
    for job in work.rules:
        plan = work.plans[job.query]
        rule = plan.rules[job.rule]
        tally = RuleTally.of(rule)
        d = delta_layer(plan, rule, layers)
        if len(d):
            lo, hi = 0, len(d)
            counting = job.output in work.counted
            if count > 1:
                lo, hi = share_ranges(plan, rule, layers, count, counting=counting)[share]
            pace = Pace(work.chunk_rows, work.budget, threads)
            if counting:
                got = count_rule(plan, rule, layers, tally, (lo, hi), pace=pace)
                yield Counted(job, got.rows, got.total)
                yield Tallied(job, tally)
                continue
            for part in run_rule(plan, rule, layers, tally, (lo, hi), pace=pace, whole=whole):
                yield Bindings(job, part)
        yield Tallied(job, tally)


# A task's budget when the work names none (an executor's Python worker on a cluster).
TASK_MEMORY = 1 << 30


def task_spill(work: Work) -> Spill:
    """Where a task of `work` spills what it sums beyond its budget: a scratch folder in the
    executor's local directories (``SPARK_LOCAL_DIRS``, else the system's temporary folder),
    removed by the caller (``spill.scratch.close()``)."""
    import os
    import tempfile
    from pathlib import Path

    from wcoj_core.budget import MIN_BUDGET, MemoryBudget, Shares
    from wcoj_core.spill import Scratch

    local = (os.environ.get("SPARK_LOCAL_DIRS") or "").split(",")[0] or tempfile.gettempdir()
    shares = Shares.of(MemoryBudget(max(work.memory or TASK_MEMORY, MIN_BUDGET), "a task"))
    scratch = Scratch(Path(local) / "wcoj-scratch", lambda _n: None)
    return Spill.of(scratch, shares)


def project(part: Part, head: Sequence[Var]) -> tuple[np.ndarray, np.ndarray]:
    """A part of bindings projected on the head: output rows (column-major) and weights."""
    prefixes, kept = part
    n = len(prefixes) if kept is None else len(kept)
    rows = np.empty((n, len(head)), dtype=I64, order="F")
    for i, v in enumerate(head):
        col = prefixes.cols[v]
        if kept is None:
            rows[:, i] = col
        else:
            np.take(col, kept, out=rows[:, i], mode="clip")
    weight = prefixes.weight if kept is None else prefixes.weight[kept]
    return rows, weight
