"""The executors deployment: the kernel inside Spark tasks, one Spark job per epoch.

The work (`wcoj_core.deploy.work`) is shipped to ``n`` tasks; task ``i`` runs share ``i``, split
by ranges of each rule's delta tuples balanced on the work the counts predict
(`wcoj_core.kernel.join.share_ranges`). Each Python worker keeps the traces in memory between
tasks (`resident_for`), reading only the batches added since; a fresh worker (forked from
`wcoj_core.deploy.daemon`) maps the arrangement files where the state keeps them.

Results leave as batch files: stage 1 writes the changes known consolidated as made; stage 2
(only when an output needs it) sums the other rows, hash-partitioned by tuple. An output only
counted (`Work.counted`) sends two numbers. Tasks stream and spill beyond `Work.memory`; every
file and rule's counts come back as small records, and the files of an attempt Spark gave up on
are deleted (`Written.clean`).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial

import numpy as np
import pyarrow as pa
from pyspark.sql import DataFrame, SparkSession

from wcoj_core.deploy.resident import resident_for
from wcoj_core.deploy.work import (
    Bindings,
    Counted,
    Emitted,
    RuleJob,
    Tallied,
    Work,
    open_layers,
    project,
    run_share,
    task_spill,
)
from wcoj_core.errors import MultiplicityOverflow
from wcoj_core.kernel.join import RuleTally
from wcoj_core.kernel.keys import I64
from wcoj_core.kernel.step import StepCounts
from wcoj_core.spill import Sorter, Spill, merge
from wcoj_core.store.batches import Batches, PartWriter
from wcoj_core.store.manifest import FileRef
from wcoj_core.traces import DIFF

# Record kinds in the rows a task returns.
ROW, FILE, METRIC, COUNT = 0, 1, 2, 3
# Rows per Arrow batch a task sends on.
SEND_ROWS = 1 << 16
# Step fields of a METRIC record (c1), and the rule's joins (c0 = -1).
FIELDS = ("prefixes", "min_sum", "proposed", "validated")


@dataclass(frozen=True, slots=True)
class Written:
    """What a work's job wrote: per output trace, its files and rows and the sum of its diffs;
    and what every rule did."""

    files: Mapping[str, list[str]]
    refs: Mapping[str, list[FileRef]]
    rows: Mapping[str, int]
    totals: Mapping[str, int]
    tallies: Mapping[RuleJob, RuleTally]
    # Outputs only counted (`Work.counted`): their rows and the sum of their weights.
    counted: Mapping[str, tuple[int, int]] = field(default_factory=dict)

    def clean(
        self, batches: Batches, folders: Mapping[str, str], work: Work
    ) -> dict[str, tuple[FileRef, ...]]:
        """Delete every file in the outputs' folders that no record names (left by attempts
        Spark gave up on); give an output no task wrote to an empty file of its schema (as the
        driver writes an empty batch). Every output's files."""
        columns = work.columns()
        out: dict[str, tuple[FileRef, ...]] = {}
        for name, folder in folders.items():
            named = {path.rsplit("/", 1)[-1] for path in self.files.get(name, [])}
            for entry in batches.files.names(folder):
                if entry not in named:
                    batches.remove(f"{folder}/{entry}")
            if not named:
                empty = np.zeros((0, len(columns[name])), dtype=I64)
                out[name] = batches.write(
                    folder, columns[name], empty, np.zeros(0, dtype=I64), work.epoch
                )
                continue
            out[name] = tuple(self.refs.get(name, []))
        return out


def run_on_executors(
    spark: SparkSession, work: Work, folders: Mapping[str, str], tasks: int
) -> Written:
    """Run a work in `tasks` Spark tasks, its outputs written into `folders` (output trace ->
    batch folder) but those only counted (`Work.counted`); one task sums every output itself."""
    columns = work.columns()
    names = list(columns)
    width = max([3, *(len(c) for c in columns.values())])
    direct = frozenset(work.emit) | work.distinct | work.counted
    summed = frozenset(n for n in names if n not in direct)
    schema = _schema(width)
    run_id = uuid.uuid4().hex[:8]
    kernel = partial(_kernel_task, work, dict(folders), names, summed, width, run_id, tasks)
    df: DataFrame = spark.range(0, tasks, 1, tasks).mapInArrow(kernel, schema)
    if summed and tasks > 1:
        keys = ["tag", *(f"c{i}" for i in range(width))]
        sums = partial(_sum_task, work, dict(folders), names, width, run_id)
        df = df.repartition(tasks, *keys).mapInArrow(sums, schema)
    spark.sparkContext.setJobDescription(f"wcoj: epoch {work.epoch} on the executors")
    try:
        records = df.collect()
    finally:
        spark.sparkContext.setJobDescription(None)  # type: ignore[arg-type]
    return _written(work, names, records)


def _schema(width: int) -> str:
    cols = ", ".join(f"c{i} long" for i in range(width))
    return f"kind int, tag int, {cols}, diff long, path string"


def _kernel_task(
    work: Work,
    folders: dict[str, str],
    names: list[str],
    summed: frozenset[str],
    width: int,
    run_id: str,
    total: int,
    batches: Iterator[pa.RecordBatch],
) -> Iterator[pa.RecordBatch]:
    """Stage 1: the shares given to this task (the ids of its input rows), of `total`."""
    from pyspark import TaskContext

    ctx = TaskContext.get()
    attempt = f"{run_id}-s{ctx.stageId()}-a{ctx.attemptNumber()}" if ctx else run_id
    shares = [int(i) for b in batches for i in b.column(0).to_numpy()]
    resident = resident_for(work.root)
    spill = task_spill(work)
    columns = work.columns()
    tag = {n: i for i, n in enumerate(names)}
    out = _Sender(width)
    writers: dict[str, PartWriter] = {}
    kept: dict[str, Sorter] = {}  # summed here (one task), in sorted runs beyond its budget
    counted: dict[str, tuple[int, int]] = {}  # outputs only counted: rows, the weights' sum
    jobs = {job: i for i, job in enumerate(work.rules)}

    def writer(name: str, share: int) -> PartWriter:
        if name not in writers:
            file = f"part-{attempt}-p{share}.snappy.parquet"
            writers[name] = PartWriter(
                resident.batches, folders[name], columns[name], work.epoch, file
            )
        return writers[name]

    try:
        # A change's views arranged through the spill: a first load's is the whole graph.
        layers = open_layers(work, resident, arrange=spill.arranged)
        for share in shares:
            for item in run_share(work, layers, share, total):
                match item:
                    case Emitted(name, rows, diff, _):
                        writer(name, share).write(rows, diff)
                    case Bindings(job, part):
                        rows, diff = project(part, work.plans[job.query].query.head)
                        if job.output not in summed:
                            writer(job.output, share).write(rows, diff)
                        elif total == 1:
                            if job.output not in kept:
                                kept[job.output] = spill.sorter(len(columns[job.output]))
                            kept[job.output].add(rows, diff)
                        else:
                            yield from out.rows(tag[job.output], rows, diff)
                    case Counted(job, rows, total):
                        before = counted.get(job.output, (0, 0))
                        counted[job.output] = (before[0] + rows, before[1] + total)
                    case Tallied(job, tally):
                        yield from out.metrics(jobs[job], tally)
        for name, sorter in kept.items():
            _write_summed(writer(name, shares[0]), sorter, spill)
    finally:
        spill.scratch.close()
    for name, w in writers.items():
        w.close()
        if w.rows:
            yield from out.file(tag[name], w)
    for name, (rows, total) in counted.items():
        yield from out.count(tag[name], rows, total)
    yield from out.flush()


def _write_summed(w: PartWriter, sorter: Sorter, spill: Spill) -> None:
    """What a sorter summed, written a merged chunk at a time."""
    if not sorter.spilled:
        layer = sorter.layer()
        w.write(np.asarray(layer.rows), np.asarray(layer.diff))
        return
    for rows, diff, _ in merge(sorter.take_runs(), sorter.width, block_bytes=spill.merge_bytes):
        w.write(rows, diff)


def _sum_task(
    work: Work,
    folders: dict[str, str],
    names: list[str],
    width: int,
    run_id: str,
    batches: Iterator[pa.RecordBatch],
) -> Iterator[pa.RecordBatch]:
    """Stage 2: sum the rows of each output this task owns, write them; pass records on."""
    from pyspark import TaskContext

    ctx = TaskContext.get()
    part = ctx.partitionId() if ctx else 0
    attempt = f"{run_id}-s{ctx.stageId()}-a{ctx.attemptNumber()}" if ctx else run_id
    columns = work.columns()
    spill = task_spill(work)
    sorters: dict[int, Sorter] = {}  # per output: its rows summed, in runs beyond the budget
    try:
        for b in batches:
            kind = b.column("kind").to_numpy()
            if (kind != ROW).any():
                yield b.filter(pa.array(kind != ROW))
            if not (kind == ROW).any():
                continue
            data = b.filter(pa.array(kind == ROW))
            tags = data.column("tag").to_numpy()
            for t in np.unique(tags):
                mine = data.filter(pa.array(tags == t))
                arity = len(columns[names[int(t)]])
                cols = np.empty((mine.num_rows, arity), dtype=I64, order="F")
                for i in range(arity):
                    cols[:, i] = mine.column(f"c{i}").to_numpy()
                if int(t) not in sorters:
                    sorters[int(t)] = spill.sorter(arity, "summing the output change")
                sorters[int(t)].add(cols, mine.column(DIFF).to_numpy())
        stored = resident_for(work.root).batches
        out = _Sender(width)
        for t, sorter in sorters.items():
            name = names[t]
            w = PartWriter(
                stored,
                folders[name],
                columns[name],
                work.epoch,
                f"part-{attempt}-q{part}.snappy.parquet",
            )
            _write_summed(w, sorter, spill)
            w.close()
            if w.rows:
                yield from out.file(t, w)
        yield from out.flush()
    finally:
        spill.scratch.close()


class _Sender:
    """Builds the records a task returns, in batches of `SEND_ROWS`."""

    def __init__(self, width: int) -> None:
        self.width = width
        self._pending: list[pa.RecordBatch] = []
        self._rows = 0

    def _batch(
        self,
        kind: int,
        tag: np.ndarray,
        cols: Sequence[np.ndarray],
        diff: np.ndarray,
        path: Sequence[str | None],
    ) -> pa.RecordBatch:
        n = len(diff)
        arrays = [pa.array(np.full(n, kind, dtype=np.int32)), pa.array(tag.astype(np.int32))]
        for i in range(self.width):
            arrays.append(
                pa.array(cols[i], type=pa.int64()) if i < len(cols) else pa.nulls(n, pa.int64())
            )
        arrays += [pa.array(diff, type=pa.int64()), pa.array(path, type=pa.string())]
        names = ["kind", "tag", *(f"c{i}" for i in range(self.width)), DIFF, "path"]
        return pa.RecordBatch.from_arrays(arrays, names=names)

    def _add(self, batch: pa.RecordBatch) -> Iterator[pa.RecordBatch]:
        self._pending.append(batch)
        self._rows += batch.num_rows
        if self._rows >= SEND_ROWS:
            yield from self.flush()

    def rows(self, tag: int, rows: np.ndarray, diff: np.ndarray) -> Iterator[pa.RecordBatch]:
        for lo in range(0, len(diff), SEND_ROWS):
            hi = min(lo + SEND_ROWS, len(diff))
            cols = [np.ascontiguousarray(rows[lo:hi, i]) for i in range(rows.shape[1])]
            batch = self._batch(ROW, np.full(hi - lo, tag), cols, diff[lo:hi], [None] * (hi - lo))
            yield from self._add(batch)

    def file(self, tag: int, w: PartWriter) -> Iterator[pa.RecordBatch]:
        if not -(2**63) <= w.total < 2**63:
            raise MultiplicityOverflow("the summed multiplicities of an output change")
        cols = [np.array([w.rows], dtype=I64), np.array([w.total], dtype=I64)]
        ref = w.ref
        assert ref is not None, "a part is closed before it is sent"
        record = f"{w.path}\t{ref.size}\t{ref.sha256}"
        yield from self._add(self._batch(FILE, np.array([tag]), cols, np.zeros(1, I64), [record]))

    def count(self, tag: int, rows: int, total: int) -> Iterator[pa.RecordBatch]:
        """An output only counted: its rows (c0) and the exact sum of its weights, as text (the
        sum of a task's weights may leave int64, as the driver's count may)."""
        cols = [np.array([rows], dtype=I64)]
        batch = self._batch(COUNT, np.array([tag]), cols, np.zeros(1, I64), [str(total)])
        yield from self._add(batch)

    def metrics(self, job: int, tally: RuleTally) -> Iterator[pa.RecordBatch]:
        steps, fields, values = [-1], [0], [tally.joins]
        for k, s in enumerate(tally.steps):
            for f, name in enumerate(FIELDS):
                steps.append(k)
                fields.append(f)
                values.append(getattr(s, name))
        n = len(values)
        cols = [np.array(steps, dtype=I64), np.array(fields, dtype=I64)]
        batch = self._batch(METRIC, np.full(n, job), cols, np.array(values, I64), [None] * n)
        yield from self._add(batch)

    def flush(self) -> Iterator[pa.RecordBatch]:
        yield from self._pending
        self._pending, self._rows = [], 0


def _written(work: Work, names: list[str], records: Sequence[object]) -> Written:
    files: dict[str, list[str]] = {n: [] for n in names}
    refs: dict[str, list[FileRef]] = {n: [] for n in names}
    rows = dict.fromkeys(names, 0)
    totals = dict.fromkeys(names, 0)
    tallies = {job: RuleTally.of(work.rule(job)) for job in work.rules}
    counted = {n: (0, 0) for n in names if n in work.counted}
    jobs = list(work.rules)
    for r in records:
        kind, tag = r["kind"], r["tag"]  # type: ignore[index]
        if kind == COUNT:
            name = names[tag]
            made, total = counted[name]
            counted[name] = (made + r["c0"], total + int(r["path"]))  # type: ignore[index]
        elif kind == FILE:
            name = names[tag]
            path, size, sha = str(r["path"]).split("\t")  # type: ignore[index]
            files[name].append(path)
            refs[name].append(FileRef(path.rsplit("/", 1)[-1], int(size), sha, None))
            rows[name] += r["c0"]  # type: ignore[index]
            totals[name] += r["c1"]  # type: ignore[index]
        elif kind == METRIC:
            tally = tallies[jobs[tag]]
            step, field, value = r["c0"], r["c1"], r[DIFF]  # type: ignore[index]
            if step < 0:
                tally.joins += value
            else:
                s: StepCounts = tally.steps[step]
                setattr(s, FIELDS[field], getattr(s, FIELDS[field]) + value)
    return Written(files, refs, rows, totals, tallies, counted)
