"""An epoch's rules in one Spark job in the executors: what the driver hands over and what comes
back.

The driver maps the old state, lands the changes and computes the counts changes
(`wcoj_core.epoch`); the epoch's changes are written as batches first, and each task opens the old
state itself: replicated (`executors`), it maps the arrangement files through
`wcoj_core.indexes.open_trace` and, on a state the executors reach as files, the epoch's
consolidated layers as one segment each (`TraceRead.mapped`, removed after the job); sharded
(`sharded`, a state on other storage only: `routes`, `OVER_FILES`), prefixes are routed to the
shard owning each key. The tasks write the outputs' batches or only count (`Work.counted`); the
driver gets the batches, each output's diff sum and what every rule did.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from wcoj_core.deploy import Choice
from wcoj_core.deploy.work import RuleJob, TraceRead, Work
from wcoj_core.errors import MultiplicityOverflow
from wcoj_core.kernel.join import RuleTally
from wcoj_core.store.manifest import Batch, FileRef, Manifest, Segment, Trace
from wcoj_core.store.names import new_batch_path

if TYPE_CHECKING:
    from wcoj_core.served import Served, StateAccess
    from wcoj_core.store.files import Files


@dataclass(frozen=True, slots=True)
class Outcome:
    """What the executors wrote: a batch per output trace (figures not yet known), the sum of
    each output's diffs, and what every rule did; for an output only counted, no batch but its
    rows and the sum of their weights (`counted`)."""

    batches: dict[str, Batch]
    totals: dict[str, int]
    tallies: dict[RuleJob, RuleTally]
    how: str = ""  # how a sharded work ran otherwise than routed (for the epoch's reason)
    counted: dict[str, tuple[int, int]] = field(default_factory=dict)


def run_rules(
    served: Served,
    state: StateAccess,
    m: Manifest,
    epoch: int,
    choice: Choice,
    jobs: Sequence[RuleJob],
    changes: Mapping[str, Batch],
    written: list[str],
    distinct: frozenset[str] = frozenset(),
    counted: frozenset[str] = frozenset(),
    mapped: Mapping[str, Segment] | None = None,
    symmetric: frozenset[str] = frozenset(),
) -> Outcome:
    """Run `jobs` in the executors over the old state of `m` plus the epoch's `changes` (batches
    written, or for a replicated work segment files the tasks map: `mapped`, `symmetric`); staged
    folders go to `written`. Outputs in `distinct` are written consolidated by each task; those
    also in `counted` only counted (replicated works)."""
    state.spark(f"the kernel runs in Spark's executors ({choice.reason})")  # started, and why
    routed = routes(served, state, m, epoch, choice)
    reads = tuple(
        TraceRead(
            name,
            m.traces[name].columns,
            tuple(b for b in m.traces[name].batches if b.time < epoch),
            (changes[name],) if name in changes else (),
            trace=m.traces[name] if not routed or _mapped(state, m.traces[name]) else None,
            keys=served.views[name],
            mapped=None if routed else (mapped or {}).get(name),
            symmetric=name in symmetric,
        )
        for name in _read(served)
    )
    work = Work(
        state.store.root,
        epoch,
        served.plans,
        reads,
        rules=tuple(jobs),
        distinct=distinct,
        counted=counted & distinct,
    )
    work = _budgeted(served, state, work)
    try:
        if routed:
            work = replace(work, counted=frozenset())
            return _sharded(served, state, work, choice.shards, changes, written)
        outcome = _replicated(state, work, epoch, changes, written)
        if choice.shards > 1:
            return replace(outcome, how=OVER_FILES)
        return outcome
    except Exception as e:
        overflow = overflow_in(e)
        if overflow is not None:
            raise overflow from None
        raise


def _read(served: Served) -> list[str]:
    """The traces an executors' work reads: every relation's and every counts trace."""
    return [*(f"rel/{r}" for r in served.relations), *served.counts_traces]


def routes(served: Served, state: StateAccess, m: Manifest, epoch: int, choice: Choice) -> bool:
    """Whether a work at `epoch` runs as routed stages over shards: more than one shard whose
    tasks cannot search the arrangement files (`_in_files`), or `StateAccess.routed`. On files
    the tasks search the mapped arrangements, as replicated ones do: file pages, not their
    memory."""
    if choice.shards <= 1:
        return False
    if state.routed:
        return True
    return not all(_in_files(state, m.traces[name], epoch) for name in _read(served))


def _in_files(state: StateAccess, trace: Trace, epoch: int) -> bool:
    """Whether the executors' tasks open `trace` from files: it has arrangement files (an
    index), or held nothing before `epoch` (a first load: the epoch's change is all of it), on
    a state they reach as files."""
    if _mapped(state, trace):
        return True
    return state.local and not any(b.time < epoch for b in trace.batches)


def _mapped(state: StateAccess, trace: Trace) -> bool:
    """Whether tasks map a trace's arrangement files: it has an index, on a state they reach as
    files. Otherwise a routed task cuts its shard from the batches (never the whole trace read
    into a worker, as opening a trace without an index would)."""
    return state.local and trace.index is not None and bool(trace.index.segments)


OVER_FILES = "its rules in tasks searching the mapped arrangement files (a shard buys no memory)"


def overflow_in(e: BaseException) -> MultiplicityOverflow | None:
    """The `MultiplicityOverflow` a task raised, read back from the error Spark reports (a
    Python worker's traceback, or the Java arithmetic error of a Spark SQL sum), so that an
    overflow reads the same on every deployment."""
    text = str(e)
    found = _TASK_OVERFLOW.search(text)
    if found is not None:
        row = found.group("row")
        values = tuple(int(v) for v in row.strip("()").split(",") if v.strip()) if row else None
        return MultiplicityOverflow(found.group("what"), values)
    if "ARITHMETIC_OVERFLOW" in text or "long overflow" in text:
        return MultiplicityOverflow("a sum of multiplicities computed by Spark")
    return None


_TASK_OVERFLOW = re.compile(
    r"MultiplicityOverflow: multiplicity overflow in (?P<what>.+?)(?: at (?P<row>\([-0-9, ]*\)))?: "
)


def _replicated(
    state: StateAccess,
    work: Work,
    epoch: int,
    changes: Mapping[str, Batch],
    written: list[str],
) -> Outcome:
    from wcoj_core.deploy.executors import run_on_executors

    spark = state.spark("the kernel runs in Spark's executors")
    folders = {
        name: new_batch_path(name, epoch, "x")
        for name in work.columns()
        if name not in work.counted
    }
    written += folders.values()
    rows = sum(
        r.mapped.rows if r.mapped is not None else sum(b.rows for b in r.delta) for r in work.reads
    )
    tasks = 1 if rows <= state.one_task_rows and state.executors_warm else state.tasks()
    result = run_on_executors(spark, work, folders, tasks)
    state.executors_warm = True
    refs = result.clean(state.batches, folders, work)
    batches = {
        name: Batch(folder, epoch, result.rows[name], refs[name])
        for name, folder in folders.items()
    }
    totals = {name: result.totals[name] for name in folders}
    return Outcome(batches, totals, dict(result.tallies), counted=dict(result.counted))


def _budgeted(served: Served, state: StateAccess, work: Work) -> Work:
    """The work with the kernel's pieces sized for an executor's Python worker:
    `Served.worker_bytes` in this process tree, else ``spark.executor.pyspark.memory``, else
    `work.TASK_MEMORY`."""
    from dataclasses import replace

    from wcoj_core.budget import MIN_BUDGET, MemoryBudget, Shares
    from wcoj_core.deploy.work import TASK_MEMORY

    spark = state.spark("the kernel runs in Spark's executors")
    limit = (
        served.worker_bytes
        or _bytes(spark.conf.get("spark.executor.pyspark.memory", None))
        or TASK_MEMORY
    )
    width = max((len(p.query.vars) for p in work.plans.values()), default=1)
    worker = Shares.of(MemoryBudget(max(limit, MIN_BUDGET), "an executor's Python worker"))
    budget = max(1 << 10, min(work.budget, worker.proposals(width)))
    return replace(work, budget=budget, chunk_rows=worker.chunk_rows(width), memory=limit)


def _sharded(
    served: Served,
    state: StateAccess,
    work: Work,
    shards: int,
    changes: Mapping[str, Batch],
    written: list[str],
) -> Outcome:
    """The rules as routed Spark stages over sharded arrangements (`wcoj_core.deploy.sharded`);
    the outputs summed and written by Spark, their files hashed here."""
    from wcoj_core.deploy.sharded import Router, rule_frames, tallies_of
    from wcoj_core.updates import update_schema

    spark = state.spark("the kernel runs sharded in Spark's executors")
    router = Router.of(shards, max(2, -(-state.tasks() // shards)))
    read = {}
    for name, batch in changes.items():
        if name.startswith("rel/") and batch.rows:
            columns = served.trace_columns(name)
            read[name.removeprefix("rel/")] = (
                spark.read.schema(update_schema(columns))
                .parquet(*state.batches.checked_uris(batch))  # its listed files, not the folder
                .drop("time")
            )
    outputs, observed = rule_frames(spark, work, router, read)
    state.executors_warm = True
    batches: dict[str, Batch] = {}
    totals: dict[str, int] = {}
    from pyspark.sql import functions as F

    for name, columns in work.columns().items():
        folder = new_batch_path(name, work.epoch, "s")
        written.append(folder)
        df = outputs.get(name)
        if df is None:
            df = spark.createDataFrame([], update_schema(columns, with_time=False))
        out = df.select(
            *[F.col(c).cast("long") for c in columns],
            F.lit(work.epoch).cast("long").alias("time"),
            F.col("diff").cast("long"),
        )
        out.coalesce(2).write.mode("errorifexists").parquet(state.store.files.spark_uri(folder))
        refs = _hashed(state.store.files, folder)
        rows, total = _footer_figures(state.store.files, folder, refs)
        batches[name] = Batch(folder, work.epoch, rows, refs)
        totals[name] = total
    return Outcome(batches, totals, tallies_of(work, observed))


def _hashed(files: Files, folder: str) -> tuple[FileRef, ...]:
    """The Parquet files Spark wrote into a batch folder, each with its size and digest."""
    found = sorted(n for n in files.names(folder) if n.endswith(".parquet"))
    return tuple(files.ref(f"{folder}/{name}") for name in found)


def _footer_figures(files: Files, folder: str, refs: Sequence[FileRef]) -> tuple[int, int]:
    """Rows and summed diff of a batch Spark wrote."""
    import pyarrow.parquet as pq

    from wcoj_core.arrow import longs
    from wcoj_core.kernel.multiplicity import exact_sum

    rows = total = 0
    for ref in refs:
        path = files.full(f"{folder}/{ref.name}")
        table = pq.ParquetFile(path, filesystem=files.fs).read(columns=["diff"])
        rows += table.num_rows
        total += exact_sum(longs(table.column("diff")))
    return rows, total


def _bytes(size: str | None) -> int | None:
    """A Spark memory setting (``1g``, ``512m``, ``2048k``, or a number of MiB: the unit
    Spark reads ``spark.executor.pyspark.memory`` in) in bytes.

    >>> _bytes("1g"), _bytes("512m"), _bytes("2048"), _bytes(None)
    (1073741824, 536870912, 2147483648, None)
    """
    if not size:
        return None
    units = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}
    text = size.strip().lower().removesuffix("b")
    if text and text[-1] in units:
        return int(float(text[:-1]) * units[text[-1]])
    return int(float(text) * (1 << 20))
