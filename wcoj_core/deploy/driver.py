"""The driver deployment: the kernel on this process, over traces it keeps in memory.

The epoch's work (`wcoj_core.deploy.work`) runs here, against a `Resident` of the state's
traces: an epoch that touches a few thousand keys costs lookups of those keys, not a pass over
the arrangements. A work of many delta tuples runs the kernel's compiled loops on up to
`WORKERS` threads (each loop cuts its prefixes into chunks and puts the chunks' bindings back
in order: the bindings, their order and every count are those of one thread); a small one
stays on this thread, keeping its latency.

What it computes comes back as arrays; the caller writes the batches (`BatchFiles.write`).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from wcoj_core.deploy.work import (
    Bindings,
    Counted,
    Emitted,
    Made,
    RuleJob,
    Tallied,
    Work,
    run_share,
)
from wcoj_core.kernel.changes import output_changes
from wcoj_core.kernel.index import EpochLayers
from wcoj_core.kernel.join import Part, RuleTally, bindings, delta_layer, prepare
from wcoj_core.kernel.keys import I64
from wcoj_core.kernel.step import Prefixes


def _cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


# Threads a work may use, and the delta tuples a work needs before it is worth more than one
# (a small epoch keeps its latency).
WORKERS = max(1, min(4, _cores()))
THREAD_ROWS = 50_000


@dataclass(frozen=True, slots=True)
class DriverResult:
    """Every output's change (consolidated rows and diffs), or for an output only counted
    (`Work.counted`) its rows and the sum of their diffs; and what each rule did."""

    changes: Mapping[str, tuple[np.ndarray, np.ndarray]]
    tallies: Mapping[RuleJob, RuleTally]
    counted: Mapping[str, tuple[int, int]]


def run_on_driver(work: Work, layers: EpochLayers, *, workers: int = WORKERS) -> DriverResult:
    """Run a work on this process (see the module)."""
    tuples = sum(len(delta_layer(work.plans[j.query], work.rule(j), layers)) for j in work.rules)
    threads = workers if tuples >= THREAD_ROWS else 1
    if threads > 1:
        for job in work.rules:
            prepare(work.plans[job.query], work.rule(job), layers)
    # Every binding is kept here until the outputs are summed: each rule's chunk is one part.
    return _collect(work, [list(run_share(work, layers, 0, 1, threads, whole=True))])


def _collect(work: Work, shares: list[list[Made]]) -> DriverResult:
    """The shares' results, in share order, summed per output."""
    columns = work.columns()
    emitted: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    parts: dict[RuleJob, list[Part]] = {job: [] for job in work.rules}
    tallies: dict[RuleJob, RuleTally] = {}
    counted: dict[str, tuple[int, int]] = {}
    for share in shares:
        for item in share:
            match item:
                case Counted(job, rows, total):
                    before = counted.get(job.output, (0, 0))
                    counted[job.output] = (before[0] + rows, before[1] + total)
                case Emitted(name, rows, diff, _):
                    emitted[name] = (rows, diff)
                case Bindings(job, part):
                    parts[job].append(part)
                case Tallied(job, tally):
                    tallies[job] = tally if job not in tallies else tallies[job].plus(tally)
        share.clear()  # the parts are now only referenced by `parts`
    per_output: dict[str, list[Prefixes]] = {}
    for job in work.rules:
        if job.output in counted:
            continue
        plan = work.plans[job.query]
        found = parts.pop(job)
        if found:
            per_output.setdefault(job.output, []).append(bindings(plan, work.rule(job), found))
        else:
            per_output.setdefault(job.output, [])
    changes = dict(emitted)
    for name, prefixes in per_output.items():
        head = work.plans[next(j.query for j in work.rules if j.output == name)].query.head
        if prefixes:
            changes[name] = output_changes(prefixes, head, name in work.distinct)
        else:
            width = len(columns[name])
            changes[name] = (np.zeros((0, width), dtype=I64), np.zeros(0, dtype=I64))
    return DriverResult(changes, tallies, counted)
