"""The driver deployment: the kernel on this process, over traces it keeps in memory.

The epoch's work (`wcoj_core.deploy.work`) runs here, against the state's traces as the epoch
opened them: an epoch that touches a few thousand keys costs lookups of those keys, not a pass
over the arrangements. Each rule's delta tuples are cut into *tasks* (consecutive ranges): a
small delta is one task; a larger one as many as `WORKERS` threads share (balanced on the work
its first step's counts predict); a delta too large to weigh at once into ranges of the rule's
chunk size, which the threads take one after another as they finish (numpy releases the GIL in
its searches, gathers and arithmetic).

Memory is bounded by the budget's shares (`wcoj_core.budget.Shares`), passed to the kernel as
its parameters: the candidates a step proposes at once and the delta tuples a rule takes at once
are sized for the rule's width. Each part of full bindings is projected on the head and handed
to the thread's collector at once (`wcoj_core.deploy.output`): small outputs are summed in
memory as before, large ones spilled.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np

from wcoj_core.budget import Shares
from wcoj_core.deploy.output import Collector, OutputChange, Stream, gather
from wcoj_core.deploy.work import RuleJob, Work, project
from wcoj_core.kernel.index import EpochLayers
from wcoj_core.kernel.join import (
    CHUNK_ROWS,
    RuleTally,
    delta_layer,
    prepare,
    run_rule,
    shares,
    weights,
)
from wcoj_core.kernel.keys import I64
from wcoj_core.kernel.multiplicity import exact_sum
from wcoj_core.spill import Spill


def _cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


# Threads a work may use, and the delta tuples a work needs before it is worth more than one
# (a small epoch keeps its latency).
WORKERS = max(1, min(4, _cores()))
THREAD_ROWS = 50_000
# A rule's delta of at most this many tuples is cut by tuple count alone, one of at most
# `WEIGH_MAX_ROWS` by the work its first step's counts predict (a count per tuple costs a
# lookup and an array as long as the delta), a larger one into ranges of its chunk size.
WEIGH_ROWS = 100_000
WEIGH_MAX_ROWS = 4_000_000

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
    counting: frozenset[str] = frozenset(),
) -> DriverResult:
    """Run a work on this process (see the module). Without `shares_of` and `spill` every
    output is kept in memory, the kernel's own limits bound its steps. The outputs in
    `counting` are only counted (rows and the sum of their weights)."""
    tuples = sum(len(delta_layer(work.plans[j.query], work.rule(j), layers)) for j in work.rules)
    threads = workers if workers > 1 and tuples >= THREAD_ROWS else 1
    if threads > 1:
        for job in work.rules:
            prepare(work.plans[job.query], work.rule(job), layers)
    tasks = _tasks(work, layers, threads, shares_of)
    columns = work.columns()
    streams = streams or {}
    locks = {name: threading.Lock() for name in columns}
    limit = shares_of.sink_bytes if shares_of is not None else 1 << 62
    collectors = [
        {
            name: Collector(
                len(columns[name]),
                name in work.distinct,
                limit,
                spill,
                streams.get(name),
                locks[name],
            )
            for name in columns
            if name not in work.emit
        }
        for _ in range(threads)
    ]
    tallies: dict[int, RuleTally] = {}
    lock = threading.Lock()
    taken = iter(tasks)
    done = [0]

    def worker(i: int) -> None:
        mine = collectors[i]
        while True:
            with lock:
                task = next(taken, None)
            if task is None:
                return
            plan = work.plans[task.job.query]
            rule = work.rule(task.job)
            tally = RuleTally.of(rule)
            if task.hi > task.lo:
                width = len(plan.query.vars)
                budget = work.budget if shares_of is None else shares_of.proposals(width)
                chunk = CHUNK_ROWS if shares_of is None else shares_of.chunk_rows(width)
                for part in run_rule(
                    plan,
                    rule,
                    layers,
                    tally,
                    (task.lo, task.hi),
                    chunk_rows=chunk,
                    budget=budget,
                ):
                    out = mine[task.job.output]
                    if task.job.output in counting:
                        prefixes, kept = part
                        weight = prefixes.weight if kept is None else prefixes.weight[kept]
                        out.count(len(weight), exact_sum(weight))
                        continue
                    rows, weight = project(part, plan.query.head)
                    del part
                    out.add(task.index, rows, weight)
            with lock:
                tallies[task.index] = tally
                done[0] += 1
                if progress is not None:
                    progress(done[0], len(tasks))

    if threads > 1:
        with ThreadPoolExecutor(threads) as pool:
            for f in [pool.submit(worker, i) for i in range(threads)]:
                f.result()
    else:
        worker(0)
    per_job: dict[RuleJob, RuleTally] = {}
    for task in tasks:
        got = tallies[task.index]
        per_job[task.job] = got if task.job not in per_job else per_job[task.job].plus(got)
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
            [c[name] for c in collectors],
            len(columns[name]),
            name in work.distinct,
            streams.get(name),
            name in counting,
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
        width = len(plan.query.vars)
        found = seen = 0
        for lo in np.unique(np.linspace(0, max(n - each, 0), min(samples, n)).astype(np.int64)):
            hi = min(int(lo) + each, n)
            for part in run_rule(
                plan,
                rule,
                layers,
                RuleTally.of(rule),
                (int(lo), hi),
                chunk_rows=shares_of.chunk_rows(width),
                budget=shares_of.proposals(width),
            ):
                prefixes, kept = part
                found += len(prefixes) if kept is None else len(kept)
            seen += hi - int(lo)
        out[job.output] = out.get(job.output, 0.0) + found * n / max(seen, 1)
    return out


def _tasks(work: Work, layers: EpochLayers, threads: int, shares_of: Shares | None) -> list[_Task]:
    """Every rule's delta cut into tasks (see the module); a rule with no delta tuples is one
    empty task (its tally says it ran)."""
    out: list[_Task] = []
    for job in work.rules:
        plan = work.plans[job.query]
        rule = work.rule(job)
        n = len(delta_layer(plan, rule, layers))
        if threads == 1 and (shares_of is None or n <= shares_of.chunk_rows(len(plan.query.vars))):
            ranges = [(0, n)]
        elif n <= WEIGH_MAX_ROWS:
            sizes = weights(plan, rule, layers) if n > WEIGH_ROWS else np.ones(n, dtype=I64)
            ranges = [r for r in shares(sizes, 2 * threads) if r[1] > r[0]] or [(0, 0)]
        else:
            assert shares_of is not None or threads > 1
            step = CHUNK_ROWS if shares_of is None else shares_of.chunk_rows(len(plan.query.vars))
            ranges = [(lo, min(lo + step, n)) for lo in range(0, n, step)]
        out += [_Task(len(out) + i, job, lo, hi) for i, (lo, hi) in enumerate(ranges)]
    return out
