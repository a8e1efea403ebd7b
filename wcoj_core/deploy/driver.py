"""The driver deployment: the kernel on this process, over traces it keeps in memory.

The epoch's work (`wcoj_core.deploy.work`) runs here against the traces as the epoch opened
them: a few thousand changed keys cost lookups, not a pass. Each rule's delta is cut into tasks
(consecutive ranges, run in turn: what progress reports); a large work runs the compiled loops on
up to `WORKERS` threads with the bindings and counts of one thread. The kernel's parameters come
from the budget's shares; bindings go to the output's collector (`wcoj_core.deploy.output`); an
output only counted (`Work.counted`) is counted, nothing written.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import numpy as np

from wcoj_core.budget import Shares
from wcoj_core.deploy.output import Collector, OutputChange, Stream, gather
from wcoj_core.deploy.work import RuleJob, Work, project
from wcoj_core.kernel.index import EpochLayers
from wcoj_core.kernel.join import (
    CHUNK_ROWS,
    Pace,
    RuleTally,
    count_rule,
    delta_layer,
    prepare,
    run_rule,
)
from wcoj_core.kernel.keys import I64
from wcoj_core.kernel.layer import usable_cores
from wcoj_core.spill import Spill

# Threads a work may use, and the delta tuples a work needs before it is worth more than one
# (a small epoch keeps its latency).
WORKERS = max(1, min(4, usable_cores()))
THREAD_ROWS = 50_000
# What a deployment reports as tasks end: (tasks done, tasks).
Progress = Callable[[int, int], None]


@dataclass(frozen=True, slots=True)
class DriverResult:
    """Every output's change and what each rule did."""

    changes: Mapping[str, OutputChange]
    tallies: Mapping[RuleJob, RuleTally]


@dataclass(frozen=True, slots=True)
class _Task:
    index: int
    job: RuleJob
    lo: int
    hi: int


def run_on_driver(
    work: Work,
    layers: EpochLayers,
    *,
    workers: int = WORKERS,
    shares_of: Shares | None = None,
    spill: Spill | None = None,
    streams: Mapping[str, Callable[[], Stream]] | None = None,
    progress: Progress | None = None,
) -> DriverResult:
    """Run a work on this process (see the module). Without `shares_of` and `spill` every
    output is kept in memory, the kernel's own limits bound its steps."""
    tuples = sum(len(delta_layer(work.plans[j.query], work.rule(j), layers)) for j in work.rules)
    threads = workers if workers > 1 and tuples >= THREAD_ROWS else 1
    if threads > 1:
        for job in work.rules:
            prepare(work.plans[job.query], work.rule(job), layers)
    tasks = _tasks(work, layers, shares_of)
    columns = work.columns()
    streams = streams or {}
    limit = shares_of.sink_bytes if shares_of is not None else 1 << 62
    collectors = {
        name: Collector(
            len(columns[name]),
            name in work.distinct,
            limit,
            spill,
            streams.get(name),
            threading.Lock(),
        )
        for name in columns
        if name not in work.emit
    }
    per_job: dict[RuleJob, RuleTally] = {}
    for done, task in enumerate(tasks, 1):
        plan = work.plans[task.job.query]
        rule = work.rule(task.job)
        tally = RuleTally.of(rule)
        out = collectors[task.job.output]
        if task.hi > task.lo:
            width = len(plan.query.vars)
            pace = (
                Pace(CHUNK_ROWS, work.budget, threads)
                if shares_of is None
                else _pace(shares_of, width, threads)
            )
            span = (task.lo, task.hi)
            if task.job.output in work.counted:
                got = count_rule(plan, rule, layers, tally, span, pace=pace)
                out.count(got.rows, got.total)
            else:
                for part in run_rule(plan, rule, layers, tally, span, pace=pace):
                    rows, weight = project(part, plan.query.head)
                    del part
                    out.add(task.index, rows, weight)
        got = per_job.get(task.job)
        per_job[task.job] = tally if got is None else got.plus(tally)
        if progress is not None:
            progress(done, len(tasks))
    changes: dict[str, OutputChange] = {}
    for name in columns:
        if name in work.emit:
            layer = layers.deltas.get(name)
            width = len(columns[name])
            arrays = (
                (np.asarray(layer.rows), np.asarray(layer.diff))
                if layer is not None
                else (np.zeros((0, width), dtype=I64), np.zeros(0, dtype=I64))
            )
            changes[name] = OutputChange(width, arrays)
            continue
        changes[name] = gather(
            [collectors[name]],
            len(columns[name]),
            name in work.distinct,
            streams.get(name),
            name in work.counted,
        )
    return DriverResult(changes, per_job)


def estimate_rows(
    work: Work, layers: EpochLayers, shares_of: Shares, samples: int = 16, each: int = 8
) -> dict[str, float]:
    """Each output's rows before summing, estimated from `samples` ranges of `each` delta
    tuples spread over each rule's delta (their full bindings counted, nothing kept): what
    an epoch checks against the disk before it starts writing an output that cannot fit."""
    out: dict[str, float] = {}
    for job in work.rules:
        plan = work.plans[job.query]
        rule = work.rule(job)
        n = len(delta_layer(plan, rule, layers))
        if n == 0:
            continue
        pace = _pace(shares_of, len(plan.query.vars))
        found = seen = 0
        # Distinct starts, in order (a set, not np.unique: that imports numpy.ma).
        starts = np.linspace(0, max(n - each, 0), min(samples, n)).astype(np.int64).tolist()
        for lo in sorted(set(starts)):
            hi = min(int(lo) + each, n)
            for part in run_rule(plan, rule, layers, RuleTally.of(rule), (int(lo), hi), pace=pace):
                prefixes, kept = part
                found += len(prefixes) if kept is None else len(kept)
            seen += hi - int(lo)
        out[job.output] = out.get(job.output, 0.0) + found * n / max(seen, 1)
    return out


def _pace(shares_of: Shares, width: int, threads: int = 1) -> Pace:
    """The pace of a rule binding `width` variables within the driver's shares."""
    return Pace(shares_of.chunk_rows(width), shares_of.proposals(width), threads)


def _tasks(work: Work, layers: EpochLayers, shares_of: Shares | None) -> list[_Task]:
    """Every rule's delta cut into tasks (see the module); a rule with no delta tuples is one
    empty task (its tally says it ran)."""
    out: list[_Task] = []
    for job in work.rules:
        plan = work.plans[job.query]
        n = len(delta_layer(plan, work.rule(job), layers))
        step = CHUNK_ROWS if shares_of is None else shares_of.chunk_rows(len(plan.query.vars))
        ranges = [(lo, min(lo + step, n)) for lo in range(0, n, step)] or [(0, 0)]
        out += [_Task(len(out) + i, job, lo, hi) for i, (lo, hi) in enumerate(ranges)]
    return out
