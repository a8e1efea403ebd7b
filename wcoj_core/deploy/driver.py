"""The driver deployment: the kernel on this process, over traces it keeps in memory.

The epoch's work (`wcoj_core.deploy.work`) runs here, against a `Resident` of the state's
traces: an epoch that touches a few thousand keys costs lookups of those keys, not a pass over
the arrangements. A work of many delta tuples is cut into shares run on up to `WORKERS` threads
(numpy releases the GIL in its searches, gathers and arithmetic) and put back in share order:
the bindings, their order and every count are those of one share.

What it computes comes back as arrays; the caller writes the batches (`BatchFiles.write`).
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np

from wcoj_core.deploy.work import Bindings, Emitted, Made, RuleJob, Tallied, Work, run_share
from wcoj_core.kernel.changes import output_changes
from wcoj_core.kernel.index import EpochLayers
from wcoj_core.kernel.join import Part, Prefixes, RuleTally, bindings, delta_layer, prepare
from wcoj_core.kernel.keys import I64


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
    """Every output's change (consolidated rows and diffs) and what each rule did."""

    changes: Mapping[str, tuple[np.ndarray, np.ndarray]]
    tallies: Mapping[RuleJob, RuleTally]


def run_on_driver(work: Work, layers: EpochLayers, *, workers: int = WORKERS) -> DriverResult:
    """Run a work on this process (see the module)."""
    tuples = sum(len(delta_layer(work.plans[j.query], work.rule(j), layers)) for j in work.rules)
    count = 2 * workers if workers > 1 and tuples >= THREAD_ROWS else 1
    if count > 1:
        for job in work.rules:
            prepare(work.plans[job.query], work.rule(job), layers)
        with ThreadPoolExecutor(workers) as pool:
            try:
                made = list(
                    pool.map(lambda i: _lean(run_share(work, layers, i, count)), range(count))
                )
            except BaseException:  # a Ctrl-C, a failed share: no share starts after it
                pool.shutdown(wait=False, cancel_futures=True)
                raise
    else:
        made = [_lean(run_share(work, layers, 0, 1))]
    return _collect(work, made)


def _lean(items: Iterator[Made]) -> list[Made]:
    """A share's results, each part of bindings without the proposals it was validated from.

    A part is the step's whole proposal set (up to the kernel's budget of rows, every bound
    column) and the positions of the proposals that survived validation. Kept as made, every
    part would keep its proposals alive until the epoch's parts are collected: a 3.7 M-edge epoch
    into a 3.7 M-edge R-MAT graph was killed at 23.6 GB; with each part whose survivors are fewer
    than half its proposals cut down to them at once, as here, it peaked at 11.8 GB.
    """
    out: list[Made] = []
    for item in items:
        if isinstance(item, Bindings):
            prefixes, kept = item.part
            if kept is not None and 2 * len(kept) < len(prefixes):
                item = Bindings(item.job, (prefixes.take(kept), None))
        out.append(item)
    return out


def _collect(work: Work, shares: list[list[Made]]) -> DriverResult:
    """The shares' results, in share order, summed per output."""
    columns = work.columns()
    emitted: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    parts: dict[RuleJob, list[Part]] = {job: [] for job in work.rules}
    tallies: dict[RuleJob, RuleTally] = {}
    for share in shares:
        for item in share:
            match item:
                case Emitted(name, rows, diff, _):
                    emitted[name] = (rows, diff)
                case Bindings(job, part):
                    parts[job].append(part)
                case Tallied(job, tally):
                    tallies[job] = tally if job not in tallies else tallies[job].plus(tally)
        share.clear()  # the parts are now only referenced by `parts`
    per_output: dict[str, list[Prefixes]] = {}
    for job in work.rules:
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
    return DriverResult(changes, tallies)
