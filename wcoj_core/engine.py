"""The engine: apply epochs of changes to shared arrangements and maintain query outputs.

``Engine(spark, state_dir, queries)`` plans every query, then for each ``apply_epoch(t, changes)``:

1. **choose** — where the epoch's kernel work runs (`wcoj_core.deploy.choose`: the driver, or
   Spark's executors), and why; both run the same kernel (`wcoj_core.kernel`);
2. **stage** — each relation's changes, consolidated, become a new batch at ``t``;
3. **counts** — every counts arrangement changes by the tuples whose support changed (read
   from the changes and the old multiplicities of those tuples only);
4. **rules** — every delta rule of every query runs against the old/new traces; a query's
   rules are summed into the output's batch at ``t``;
5. **commit** — one new manifest generation records all staged batches and the epoch.

Nothing is visible until the commit, which either happens whole or not at all: a failure in any
phase discards the staged batches and leaves the previous generation as it was. An epoch at or
before the last applied one is refused (`EpochAlreadyApplied`), so nothing is counted twice.

Arrangements are keyed by relation view and key columns and shared by all rules of all queries
the engine serves. Static evaluation is one epoch applied to an empty state.
"""

from __future__ import annotations

import time as clock
import uuid
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import pyarrow as pa
from pyspark.sql import DataFrame, SparkSession

from wcoj_core import deploy
from wcoj_core.deploy import Choice, Limits
from wcoj_core.deploy.batches import BatchFiles, batch_path
from wcoj_core.deploy.driver import run_on_driver
from wcoj_core.deploy.executors import run_on_executors
from wcoj_core.deploy.resident import Resident
from wcoj_core.deploy.sharded import Router, counts_frames, rule_frames, tallies_of, with_deltas
from wcoj_core.deploy.work import RuleJob, TraceRead, Work, open_layers
from wcoj_core.errors import EpochAlreadyApplied, InputError, QueryError, StateError
from wcoj_core.files import LocalFiles
from wcoj_core.kernel.changes import changes_layer
from wcoj_core.kernel.index import EpochLayers
from wcoj_core.kernel.join import RuleTally
from wcoj_core.kernel.layer import Layer
from wcoj_core.query.ir import Query, Var
from wcoj_core.query.plan import Arrangement, DeltaRule, Kind, Plan, Version, plan_query
from wcoj_core.spark import local_parquet_files, parquet_rows, read_local_parquet
from wcoj_core.state import Batch, Manifest, StateStore, Trace, trace_dir
from wcoj_core.traces import (
    counts_trace_name,
    output_trace_name,
    relation_trace_name,
)
from wcoj_core.updates import (
    DIFF,
    TIME,
    consolidate,
    relation_columns,
    total_diff,
    update_schema,
)

# An epoch's changes are first collected with a limit of this many rows (one cheap job for the
# usual small epoch); a larger epoch is counted, then collected whole, which costs Spark less
# than a large limit (a limit gathers its rows through a shuffle to one partition).
DRIVER_PROBE_ROWS = 250_000
# On the executors, Arrow-table changes of at most this many rows travel with the work (else
# they are written to a scratch folder), and a work whose changes hold at most `ONE_TASK_ROWS`
# rows runs in one task (no second stage to sum its outputs across tasks).
INLINE_ROWS = 1_000_000
ONE_TASK_ROWS = 50_000
# Copies of a candidate's columns a step may hold at once (proposals, gathers, validations,
# the next step's prefixes), for `Engine.executor_budget`.
CANDIDATE_COPIES = 24


@dataclass(frozen=True, slots=True)
class StepMetrics:
    """Rows through one step of one rule."""

    query: str
    rule: int
    var: str
    prefixes: int
    min_count_sum: int
    proposed: int
    validated: int


@dataclass(frozen=True, slots=True)
class EpochMetrics:
    """What one epoch did: changes in, rows proposed and validated, output rows, seconds, and
    where it ran (`deployment`) and why (`reason`)."""

    epoch: int
    changes: dict[str, int]
    outputs: dict[str, int]
    steps: tuple[StepMetrics, ...]
    seconds: dict[str, float]
    deployment: str = "driver"
    reason: str = ""
    # Rows out of every lookup the kernel made (its analogue of a binary plan's join rows).
    join_rows: int = 0

    @property
    def proposed(self) -> int:
        return sum(s.proposed for s in self.steps)

    @property
    def validated(self) -> int:
        return sum(s.validated for s in self.steps)

    @property
    def total_seconds(self) -> float:
        return sum(self.seconds.values())

    def to_dict(self) -> dict[str, Any]:
        return {
            "epoch": self.epoch,
            "changes": self.changes,
            "outputs": self.outputs,
            "proposed": self.proposed,
            "validated": self.validated,
            "seconds": {k: round(v, 3) for k, v in self.seconds.items()},
            "deployment": self.deployment,
            "reason": self.reason,
        }


@dataclass(frozen=True, slots=True)
class EpochResult:
    """The exact change of every query's output at an epoch, and the epoch's metrics."""

    epoch: int
    outputs: dict[str, DataFrame]
    metrics: EpochMetrics
    # The sum of each output change's multiplicities, as the kernel's deployment reported it.
    totals: dict[str, int] = field(default_factory=dict)

    def total(self, query: str) -> int:
        """The sum of the multiplicities of `query`'s output change (a count's answer)."""
        if query in self.totals:
            return self.totals[query]
        return total_diff(self.outputs[query])


@dataclass
class _Timer:
    seconds: dict[str, float] = field(default_factory=dict)

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        start = clock.perf_counter()
        try:
            yield
        finally:
            self.seconds[name] = self.seconds.get(name, 0.0) + clock.perf_counter() - start


@dataclass(frozen=True, slots=True)
class WorkOutcome:
    """What a work stored: a staged batch per output trace, each output's diff total, and what
    every rule did."""

    batches: dict[str, Batch]
    totals: dict[str, int]
    tallies: dict[RuleJob, RuleTally]
    layers: EpochLayers | None = None  # what the driver read (to advance its indexes)


class Engine:
    """Incremental worst-case-optimal evaluation of conjunctive queries over epochs.

    `deployment` is ``auto`` (the driver when the epoch and state fit `limits`, see
    `wcoj_core.deploy.choose`), ``driver`` or ``executors``; `executor_tasks` is the number of
    tasks an epoch runs in on the executors (default: Spark's default parallelism), one when
    its changes hold at most `one_task_rows` rows.
    `compact_every` merges a trace's batches once it holds more.
    """

    def __init__(
        self,
        spark: SparkSession,
        state_dir: str,
        queries: Query | Sequence[Query],
        *,
        sizes: Mapping[str, int] | None = None,
        orders: Mapping[str, Mapping[int, Sequence[Var]]] | None = None,
        compact_every: int = 32,
        deployment: str = "auto",
        driver_max_rows: int = deploy.DRIVER_MAX_ROWS,
        driver_epoch_rows: int = deploy.DRIVER_EPOCH_ROWS,
        executor_max_rows: int = deploy.EXECUTOR_MAX_ROWS,
        executor_tasks: int | None = None,
    ) -> None:
        qs = [queries] if isinstance(queries, Query) else list(queries)
        if len({q.name for q in qs}) != len(qs):
            raise QueryError("two queries share a name; give each query its own name")
        self.spark = spark
        self.store = StateStore(spark, state_dir)
        self.queries = {q.name: q for q in qs}
        if sizes is None:
            # Stored rows per relation (no Spark work): good enough to break the planner's ties.
            manifest = self.store.current()
            sizes = {
                rel: trace.rows()
                for rel in {r for q in qs for r in q.relations}
                if (trace := manifest.trace(relation_trace_name(rel))) is not None
            }
        self.plans: dict[str, Plan] = {
            q.name: plan_query(q, sizes, (orders or {}).get(q.name)) for q in qs
        }
        self.relations: dict[str, int] = {}
        for q in qs:
            for rel, arity in q.relations.items():
                if self.relations.setdefault(rel, arity) != arity:
                    raise QueryError(
                        f"relation {rel!r} has arity {self.relations[rel]} in one query and "
                        f"{arity} in {q.name!r}"
                    )
        self.compact_every = compact_every
        self.limits = Limits(deployment, driver_max_rows, driver_epoch_rows, executor_max_rows)
        self.executor_tasks = executor_tasks
        self.one_task_rows = ONE_TASK_ROWS
        self._executors_warm = False
        self.local = isinstance(self.store.files, LocalFiles)
        self._files: BatchFiles | None = None
        self._resident: Resident | None = None

    # -- where the work runs -------------------------------------------------------------------
    @property
    def files(self) -> BatchFiles:
        """The state's batches through pyarrow (made when first needed)."""
        if self._files is None:
            self._files = BatchFiles(self.store.root)
        return self._files

    @property
    def resident(self) -> Resident:
        """The traces this process keeps in memory for the driver deployment."""
        if self._resident is None:
            self._resident = Resident(self.files)
        return self._resident

    def choose(self, manifest: Manifest, names: Sequence[str], changed: int | None) -> Choice:
        """Where a work reading the traces `names` of `manifest` runs (see `deploy.choose`)."""
        held = sum(t.rows() for n in names if (t := manifest.trace(n)) is not None)
        return deploy.choose(self.limits, local=self.local, held=held, changed=changed)

    def executor_budget(self, work: Work) -> int:
        """The candidates a step proposes at once inside an executor: what fits the Python
        worker's memory when ``spark.executor.pyspark.memory`` sets it (several arrays of a
        long per variable, each candidate's, live at once), else the kernel's default."""
        limit = _bytes(self.spark.conf.get("spark.executor.pyspark.memory", None))
        if limit is None:
            return work.budget
        width = max((len(p.query.vars) for p in work.plans.values()), default=1)
        return max(1 << 14, min(work.budget, limit // (8 * CANDIDATE_COPIES * (width + 2))))

    def tasks(self) -> int:
        """The tasks an epoch's work runs in on the executors."""
        return self.executor_tasks or max(1, self.spark.sparkContext.defaultParallelism)

    # -- arrangements ----------------------------------------------------------------------
    @property
    def arrangements(self) -> tuple[Arrangement, ...]:
        """Every arrangement any plan reads, each once."""
        seen: dict[Arrangement, None] = {}
        for plan in self.plans.values():
            for a in plan.arrangements:
                seen.setdefault(a, None)
        return tuple(seen)

    def counts(self) -> list[Arrangement]:
        """The counts arrangements the plans read."""
        return [a for a in self.arrangements if a.kind is Kind.COUNTS]

    def trace_names(self) -> list[str]:
        """The relation and counts traces an epoch reads."""
        return [relation_trace_name(r) for r in sorted(self.relations)] + [
            counts_trace_name(a) for a in self.counts()
        ]

    def _check_served(self, manifest: Manifest) -> None:
        """Refuse a state holding queries (and so arrangements) this engine would not maintain."""
        registered = {
            name.removeprefix("out/") for name in manifest.traces if name.startswith("out/")
        }
        unserved = sorted(registered - set(self.queries))
        if unserved:
            raise StateError(
                f"state {self.store.root} also maintains {', '.join(unserved)}; an engine "
                f"applying epochs to it must serve every query it holds (serving: "
                f"{', '.join(sorted(self.queries))})"
            )

    def registered(self, manifest: Manifest) -> Manifest:
        """The manifest with every trace this engine needs (new ones empty)."""
        m = manifest
        for rel, arity in sorted(self.relations.items()):
            name = relation_trace_name(rel)
            existing = m.trace(name)
            if existing is None:
                m = m.with_trace(Trace(name, tuple(relation_columns(arity))))
            elif len(existing.columns) != arity:
                raise StateError(
                    f"relation {rel!r} is stored with arity {len(existing.columns)} in "
                    f"{self.store.root}, but the query uses arity {arity}"
                )
        for q in self.queries.values():
            if m.trace(output_trace_name(q.name)) is None:
                m = m.with_trace(
                    Trace(output_trace_name(q.name), tuple(relation_columns(len(q.head))))
                )
        for a in self.counts():
            if m.trace(counts_trace_name(a)) is None:
                m = m.with_trace(Trace(counts_trace_name(a), tuple(f"c{k}" for k in a.key)))
        return m

    def _build_counts(self, base: Manifest, m: Manifest, staged: list[str]) -> Manifest:
        """Counts arrangements new to a state holding relations: built from the relations (as
        one work whose changes are the relations' whole contents), stamped the last epoch."""
        missing = [
            a
            for a in self.counts()
            if base.trace(counts_trace_name(a)) is None
            and m.traces[relation_trace_name(a.view.relation)].rows() > 0
        ]
        if not missing or m.epoch is None:
            return m
        names = sorted({relation_trace_name(a.view.relation) for a in missing})
        reads = tuple(
            TraceRead(n, m.traces[n].columns, (), _refs(m.traces[n].batches)) for n in names
        )
        work = Work(self.store.root, m.epoch, self.plans, reads, counts=tuple(missing))
        choice = self.choose(m, names, 0)
        outcome = self.run_work(work, choice, {}, staged, sum(m.traces[n].rows() for n in names))
        for name, batch in outcome.batches.items():
            m = m.with_trace(m.traces[name].with_batch(batch))
        return m

    # -- running a work ----------------------------------------------------------------------
    def run_work(
        self,
        work: Work,
        choice: Choice,
        given: Mapping[str, Layer],
        staged: list[str],
        changed: int,
    ) -> WorkOutcome:
        """Run a work where `choice` says and write its outputs as batches at its epoch (their
        folders are added to `staged` as soon as they may exist). `changed`: the rows of the
        changes it reads (a small work runs in one task on the executors)."""
        if choice.on_driver:
            return self._run_on_driver(work, given, staged)
        work = replace(work, budget=self.executor_budget(work))
        if choice.shards > 1:
            return self._run_sharded(work, choice.shards, staged)
        folders = {name: self._folder(name, work.epoch, "x") for name in work.columns()}
        staged += folders.values()
        # A small work runs in one task; the first on the executors runs in all of them, so
        # that every executor reads the state's traces once, not in a later, timed epoch.
        small = changed <= self.one_task_rows and self._executors_warm
        written = run_on_executors(self.spark, work, folders, 1 if small else self.tasks())
        self._executors_warm = True
        written.clean(self.files, folders, work)
        batches = {n: Batch(folders[n], work.epoch, written.rows[n]) for n in folders}
        return WorkOutcome(batches, dict(written.totals), dict(written.tallies))

    def _run_on_driver(
        self, work: Work, given: Mapping[str, Layer], staged: list[str]
    ) -> WorkOutcome:
        layers = open_layers(work, self.resident, given)
        result = run_on_driver(work, layers)
        columns = work.columns()
        batches: dict[str, Batch] = {}
        totals: dict[str, int] = {}
        for name, (rows, diff) in result.changes.items():
            batches[name] = self.write_batch(name, columns[name], rows, diff, work.epoch, staged)
            totals[name] = int(diff.sum())
        return WorkOutcome(batches, totals, dict(result.tallies), layers)

    def _run_sharded(self, work: Work, shards: int, staged: list[str]) -> WorkOutcome:
        """Run a work on the executors with its arrangements cut into `shards` (see
        `wcoj_core.deploy.sharded`): the relation changes are stored first, then the counts
        changes, then the rules read both as the epoch's stored changes."""
        router = Router.of(shards, max(2, -(-self.tasks() // shards)))
        columns = work.columns()
        batches: dict[str, Batch] = {}

        def store(name: str, df: DataFrame) -> Batch:
            trace = Trace(name, columns[name])
            batch = self.store.write_batch(trace, df, work.epoch, partitions=2)
            staged.append(batch.path)
            batches[name] = batch
            return batch

        for r in work.reads:
            if r.raw or r.inline is not None:
                df = (
                    self.spark.read.parquet(*[self.files.uri(f) for f in r.raw])
                    if r.raw
                    else self.spark.createDataFrame(r.inline)
                )
                store(r.name, consolidate(df.select(*r.columns, DIFF), r.columns))
        stored = {n: ((b.path, b.rows),) for n, b in batches.items()}
        work = with_deltas(work, stored)
        read = {
            r.name.removeprefix("rel/"): self.store.read(
                Trace(r.name, r.columns), _batches(r.delta)
            ).drop(TIME)
            for r in work.reads
            if r.name.startswith("rel/") and any(rows for _, rows in r.delta)
        }
        for name, df in counts_frames(work, router, read).items():
            store(name, df)
        for a in work.counts:
            name = counts_trace_name(a)
            if name not in batches:
                store(name, self._empty(columns[name]))
        work = with_deltas(work, {n: ((b.path, b.rows),) for n, b in batches.items()})
        outputs, observed = rule_frames(self.spark, work, router, read)
        for job in work.rules:
            name = job.output
            if name not in batches:
                store(name, outputs.get(name, self._empty(columns[name])))
        return WorkOutcome(batches, {}, tallies_of(work, observed))

    def _empty(self, columns: Sequence[str]) -> DataFrame:
        return self.spark.createDataFrame([], update_schema(columns, with_time=False))

    def _folder(self, name: str, epoch: int, kind: str) -> str:
        return batch_path(trace_dir(name), epoch, kind)

    def write_batch(
        self,
        name: str,
        columns: Sequence[str],
        rows: np.ndarray,
        diff: np.ndarray,
        epoch: int,
        staged: list[str],
        inputs: str = "",
    ) -> Batch:
        """Write a batch computed on the driver (pyarrow)."""
        folder = self._folder(name, epoch, "k")
        staged.append(folder)
        self.files.write(folder, columns, rows, diff, epoch, threads=True)
        return Batch(folder, epoch, len(diff), inputs)

    # -- epochs ----------------------------------------------------------------------------
    def apply_epoch(
        self, epoch: int, changes: Mapping[str, DataFrame | pa.Table], *, rules: bool = True
    ) -> EpochResult:
        """Apply one epoch of changes; return the exact change of every output at `epoch`.

        A relation's changes are a Spark DataFrame or, already on the driver, an Arrow table
        (``c0 ..``, ``diff`` int64 columns without nulls).

        With ``rules=False`` only the arrangements are updated and the outputs are left as they
        were: a benchmark seeds a large state this way when it measures later epochs only (the
        outputs then hold the changes of later epochs, not their totals).
        """
        base = self.store.current()
        self._check_served(base)
        if self.compact_every and any(
            len(t.batches) > self.compact_every for t in base.traces.values()
        ):
            # Compact before the epoch, as its own commit: a failure here applies nothing.
            self.compact()
            base = self.store.current()
        if base.epoch is not None and epoch <= base.epoch:
            raise EpochAlreadyApplied(
                f"epoch {epoch} cannot be applied to {self.store.root}: epoch {base.epoch} is "
                f"already applied (epochs are applied once, in increasing order)"
            )
        for rel, df in changes.items():
            if rel not in self.relations:
                raise QueryError(
                    f"changes given for relation {rel!r}, which no query uses "
                    f"(used: {', '.join(sorted(self.relations))})"
                )
            self._check_columns(rel, df, epoch)
        timer = _Timer()
        staged: list[str] = []
        scratch: list[str] = []
        try:
            with timer.phase("stage"):
                m = self.registered(base)
                choice = self.choose(m, self.trace_names(), None)
                given: dict[str, Layer] | None = None
                if choice.on_driver:
                    given, choice = self._on_driver(m, changes, choice, fresh=base.epoch is None)
                m = self._build_counts(base, m, staged)
                batches: dict[str, Batch] = {}
                if given is not None:
                    for rel, layer in given.items():
                        name = relation_trace_name(rel)
                        cols = m.traces[name].columns
                        batches[name] = self.write_batch(
                            name, cols, layer.rows, layer.diff, epoch, staged
                        )
                    deltas = {relation_trace_name(r): layer for r, layer in given.items()}
                    changed = {rel for rel, layer in given.items() if len(layer)}
                    work = self._epoch_work(m, epoch, rules, changed, {}, {})
                    rows = sum(len(layer) for layer in given.values())
                else:
                    raw, inline, counted = self._executor_changes(changes, scratch)
                    deltas = {}
                    changed = {rel for rel, n in counted.items() if n}
                    work = self._epoch_work(m, epoch, rules, changed, raw, inline)
                    rows = sum(counted.values())
                    choice = self.choose(m, self.trace_names(), rows)  # now counted: shards?
            with timer.phase("rules"):
                outcome = self.run_work(work, choice, deltas, staged, rows)
                batches |= outcome.batches
                for q in self.queries if rules else ():
                    name = output_trace_name(q)
                    if name not in batches:  # no rule ran: an empty change
                        cols = m.traces[name].columns
                        batches[name] = self.write_batch(
                            name, cols, *_nothing(len(cols)), epoch, staged
                        )
            with timer.phase("commit"):
                committed = self._commit(m, base, epoch, batches)
        except BaseException:
            self.store.discard(staged)
            raise
        finally:
            for folder in scratch:
                self.files.remove(folder)
        if outcome.layers is not None:
            self._advance(outcome.layers, batches)
        metrics = EpochMetrics(
            epoch=epoch,
            changes={rel: batches[relation_trace_name(rel)].rows for rel in sorted(changes)},
            outputs={q: batches[output_trace_name(q)].rows for q in self.queries if rules},
            steps=_steps(outcome.tallies),
            seconds=timer.seconds,
            deployment=choice.deployment.value,
            reason=choice.reason,
            join_rows=sum(t.joins for t in outcome.tallies.values()),
        )
        outputs = {q: batches[output_trace_name(q)] for q in self.queries if rules}
        frames = {
            q: self.store.read(committed.traces[output_trace_name(q)], [b])
            for q, b in outputs.items()
        }
        totals = {  # where the deployment did not sum an output, `EpochResult.total` will
            q: outcome.totals.get(output_trace_name(q), 0)
            for q in outputs
            if output_trace_name(q) in outcome.totals or output_trace_name(q) not in outcome.batches
        }
        return EpochResult(epoch, frames, metrics, totals)

    def _epoch_work(
        self,
        m: Manifest,
        epoch: int,
        rules: bool,
        changed: set[str],
        raw: Mapping[str, tuple[str, ...]],
        inline: Mapping[str, pa.Table],
    ) -> Work:
        """The kernel work of an engine epoch: every counts change, and every rule of every
        query whose delta relation changed and whose other atoms can hold tuples. The relations'
        changes are `raw` files or `inline` tables (the executors'), else given to `open_layers`
        (the driver's)."""
        relation = {relation_trace_name(r): r for r in self.relations}
        reads = tuple(
            TraceRead(
                n,
                m.traces[n].columns,
                _refs(m.traces[n].batches),
                raw=raw.get(relation.get(n, ""), ()),
                inline=inline.get(relation.get(n, "")),
            )
            for n in self.trace_names()
        )
        jobs: list[RuleJob] = []
        distinct: set[str] = set()
        for name, plan in self.plans.items() if rules else ():
            ran = [
                r
                for r in plan.rules
                if plan.query.atoms[r.delta].relation in changed
                and not _reads_empty(plan, r, m, changed)
            ]
            jobs += [RuleJob(name, r.delta, output_trace_name(name)) for r in ran]
            if _distinct_output(plan, m.epoch is None, len(ran)):
                distinct.add(output_trace_name(name))
        counts = tuple(self.counts())
        emit = [relation_trace_name(r) for r in sorted({*raw, *inline})]
        return Work(
            self.store.root,
            epoch,
            self.plans,
            reads,
            counts=counts,
            rules=tuple(jobs),
            emit=(*emit, *(counts_trace_name(a) for a in counts)),
            distinct=frozenset(distinct),
        )

    def _on_driver(
        self, m: Manifest, changes: Mapping[str, DataFrame | pa.Table], choice: Choice, fresh: bool
    ) -> tuple[dict[str, Layer] | None, Choice]:
        """The epoch's changes on the driver, consolidated; or None and the executors' choice
        when they hold more rows than the driver takes (collected up to that many)."""
        budget = self.limits.driver_epoch_rows
        out: dict[str, Layer] = {}
        seen = 0
        for rel, df in sorted(changes.items()):
            cols = relation_columns(self.relations[rel])
            if isinstance(df, DataFrame):
                table = _collect(df.select(*cols, DIFF), budget - seen, fresh=fresh)
            else:
                table = df.select([*cols, DIFF])
            if table is None or table.num_rows > budget - seen:
                return None, self.choose(m, self.trace_names(), budget + 1)
            nulls = [
                c
                for c, col in zip(table.column_names, table.columns, strict=True)
                if col.null_count
            ]
            if nulls:
                raise InputError(
                    f"changes hold null values in {', '.join(nulls)}; every value must be a "
                    "whole number",
                    source=f"relation {rel!r}",
                )
            seen += table.num_rows
            out[rel] = changes_layer(cols, table)
        return out, self.choose(m, self.trace_names(), seen)

    def _executor_changes(
        self, changes: Mapping[str, DataFrame | pa.Table], scratch: list[str]
    ) -> tuple[dict[str, tuple[str, ...]], dict[str, pa.Table], dict[str, int]]:
        """Each relation's changes in a form the executors read, and how many rows they hold.

        An Arrow table (already on the driver) of at most `INLINE_ROWS` rows travels with the
        work; a larger one is written into a scratch folder of the state. A DataFrame that is a
        plain scan of local Parquet files is read from those files when the state is local too;
        any other is written into a scratch folder by Spark (no shuffle). The scratch folders
        are added to `scratch`, for the caller to remove.
        """
        raw: dict[str, tuple[str, ...]] = {}
        inline: dict[str, pa.Table] = {}
        rows: dict[str, int] = {}
        for rel, df in sorted(changes.items()):
            cols = relation_columns(self.relations[rel])
            folder = f"scratch/{uuid.uuid4().hex}"
            if isinstance(df, DataFrame):
                frame = df.select(*cols, DIFF)
                files = local_parquet_files(frame) if self.local else None
                if files is None:
                    scratch.append(folder)
                    frame.write.parquet(self.store.uri(folder))
                    files = [
                        self.files.full(f"{folder}/{f}")
                        for f in self.files.listing(folder)
                        if f.endswith(".parquet")
                    ]
            else:
                table = df.select([*cols, DIFF])
                if table.num_rows <= INLINE_ROWS:
                    inline[rel] = table
                    rows[rel] = int(table.num_rows)
                    continue
                scratch.append(folder)
                files = self.files.write_changes(folder, table)
            raw[rel] = tuple(files)
            rows[rel] = self.files.file_rows(files)
        return raw, inline, rows

    def _advance(self, layers: EpochLayers, batches: Mapping[str, Batch]) -> None:
        """Keep the driver's indexes advanced by the epoch's changes, already in memory."""
        for name, delta in layers.deltas.items():
            batch = batches.get(name)
            if batch is not None and name in layers.traces:
                self.resident.advance(name, layers.traces[name], delta, batch.path)

    def _check_columns(self, rel: str, df: DataFrame | pa.Table, epoch: int) -> list[str]:
        cols = relation_columns(self.relations[rel])
        names: list[str] = df.columns if isinstance(df, DataFrame) else list(df.column_names)
        missing = [c for c in (*cols, DIFF) if c not in names]
        extra = [c for c in names if c not in (*cols, DIFF, TIME)]
        if missing or extra:
            raise InputError(
                f"changes must have columns {[*cols, DIFF]} (and optionally {TIME}); "
                f"missing {missing}, unexpected {extra}",
                source=f"relation {rel!r} at epoch {epoch}",
            )
        return cols

    def _commit(
        self, m: Manifest, base: Manifest, epoch: int, staged: Mapping[str, Batch]
    ) -> Manifest:
        traces = dict(m.traces)
        for name, batch in staged.items():
            traces[name] = traces[name].with_batch(batch)
        return self.store.commit(replace(m, epoch=epoch, traces=traces), expected=base)

    # -- reading ---------------------------------------------------------------------------
    def _accumulated(self, name: str, time: int | None) -> DataFrame:
        m = self.store.current()
        trace = m.trace(name)
        if trace is None:
            raise StateError(f"{name!r} is not in the state at {self.store.root}")
        if time is not None and m.frontier is not None and time < m.frontier:
            raise StateError(
                f"history before epoch {m.frontier} was compacted in {self.store.root}; "
                f"cannot read {name!r} as of epoch {time}"
            )
        df = self.store.read(trace, trace.visible(time)).drop(TIME)
        return consolidate(df, trace.columns)

    def output(self, query: str | None = None, time: int | None = None) -> DataFrame:
        """A query's accumulated output as of `time` (default: the last applied epoch)."""
        name = query or next(iter(self.queries))
        if name not in self.queries:
            raise QueryError(f"unknown query {name!r}; this engine serves {sorted(self.queries)}")
        return self._accumulated(output_trace_name(name), time)

    def relation(self, name: str, time: int | None = None) -> DataFrame:
        """A relation's accumulated contents as of `time`: (c0.., diff)."""
        if name not in self.relations:
            raise QueryError(f"unknown relation {name!r}; known: {sorted(self.relations)}")
        return self._accumulated(relation_trace_name(name), time)

    @property
    def epoch(self) -> int | None:
        """The last applied epoch, or None for a new state."""
        return self.store.current().epoch

    # -- compaction ------------------------------------------------------------------------
    def compact(self, frontier: int | None = None) -> None:
        """Merge every trace's batches at or before `frontier` (default: last epoch) into one.

        A trace of a local state whose batches to merge fit the driver's limit is merged on the
        driver (read with pyarrow, summed, written as the driver writes a batch), without a Spark
        job; any other by Spark. Either way the merged batch holds each tuple once with its
        summed diff, tuples summing to 0 dropped.
        """
        base = self.store.current()
        if base.epoch is None:
            return
        frontier = base.epoch if frontier is None else min(frontier, base.epoch)
        if base.frontier is not None and frontier <= base.frontier:
            return  # the frontier only moves forward
        traces = dict(base.traces)
        staged: list[str] = []
        renamed: dict[str, tuple[list[str], list[str]]] = {}
        try:
            for name, trace in base.traces.items():
                old = trace.visible(frontier)
                if len(old) <= 1:
                    continue
                rows = sum(b.rows for b in old)
                if self.choose(base, [name], 0).on_driver and rows <= self.limits.driver_max_rows:
                    layer = self.files.read_layer(trace.columns, [b.path for b in old if b.rows])
                    batch = self.write_batch(
                        name, trace.columns, layer.rows, layer.diff, frontier, staged
                    )
                else:
                    merged = consolidate(self.store.read(trace, old).drop(TIME), trace.columns)
                    batch = self.store.write_batch(trace, merged, frontier, partitions=2)
                    staged.append(batch.path)
                later = tuple(b for b in trace.batches if b.time > frontier)
                traces[name] = replace(trace, batches=(batch, *later))
                renamed[name] = (
                    [b.path for b in trace.batches],
                    [b.path for b in traces[name].batches],
                )
            self.store.commit(replace(base, traces=traces, frontier=frontier), expected=base)
        except BaseException:
            self.store.discard(staged)
            raise
        if self._resident is not None:
            for name, (before, after) in renamed.items():
                self._resident.rename(name, before, after)


def _bytes(size: str | None) -> int | None:
    """A Spark size setting (``1g``, ``512m``, ``2048k``, bytes) in bytes.

    >>> _bytes("1g"), _bytes("512m"), _bytes(None)
    (1073741824, 536870912, None)
    """
    if not size:
        return None
    units = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}
    text = size.strip().lower().removesuffix("b")
    if text and text[-1] in units:
        return int(float(text[:-1]) * units[text[-1]])
    return int(text)


def _refs(batches: Sequence[Batch]) -> tuple[tuple[str, int], ...]:
    return tuple((b.path, b.rows) for b in batches)


def _batches(refs: Sequence[tuple[str, int]]) -> list[Batch]:
    return [Batch(path, 0, rows) for path, rows in refs]


def _nothing(width: int) -> tuple[np.ndarray, np.ndarray]:
    return np.zeros((0, width), dtype=np.int64), np.zeros(0, dtype=np.int64)


def _steps(tallies: Mapping[RuleJob, RuleTally]) -> tuple[StepMetrics, ...]:
    return tuple(
        StepMetrics(job.query, job.rule, s.var, s.prefixes, s.min_sum, s.proposed, s.validated)
        for job, tally in tallies.items()
        for s in tally.steps
    )


def _reads_empty(plan: Plan, rule: DeltaRule, m: Manifest, changed: set[str]) -> bool:
    """Whether an atom of the rule other than its delta reads a relation holding nothing."""
    for j, version in enumerate(rule.versions):
        if version is Version.DELTA:
            continue
        rel = plan.query.atoms[j].relation
        stored = m.traces[relation_trace_name(rel)].rows()
        if stored == 0 and not (version is Version.NEW and rel in changed):
            return True
    return False


def _distinct_output(plan: Plan, fresh: bool, rules: int) -> bool:
    """True when the rules' output is already consolidated, so summing it would change nothing.

    That holds for one rule on a fresh state (a static evaluation: only the last rule runs) when
    the head keeps every variable. Each trace it reads is consolidated, so the delta tuples, the
    proposals and the validations are all distinct: each full binding is produced once, with a
    product of non-zero multiplicities, and a head holding every variable maps distinct
    bindings to distinct tuples. Skipping the sum spares sorting the whole output (8.9 M
    triangles for web-NotreDame).
    """
    return fresh and rules == 1 and set(plan.query.head) == set(plan.query.vars)


def _collect(rows: DataFrame, budget: int, *, fresh: bool) -> pa.Table | None:
    """A relation's changes on the driver, or None when they hold more than `budget` rows.

    Changes that are nothing but a scan of local Parquet files are counted from the files'
    footers and read with pyarrow, without a Spark job. Others are collected with a limit of
    `DRIVER_PROBE_ROWS` rows first; when that limit is reached, they are counted and then
    collected whole (a fresh state's epoch, usually a whole relation, is counted first).
    """
    files = local_parquet_files(rows)
    if files is not None:
        if parquet_rows(files) > budget:
            return None
        table = read_local_parquet(rows, files)
        if table is not None:
            return table
    probe = min(budget, DRIVER_PROBE_ROWS)
    table = None if fresh else rows.limit(probe + 1).toArrow()
    if table is None or table.num_rows > probe:
        if rows.count() > budget:
            return None
        table = rows.toArrow()
    return table


def evaluate_static(
    spark: SparkSession,
    query: Query,
    relations: Mapping[str, DataFrame],
    state_dir: str,
    *,
    deployment: str = "auto",
) -> EpochResult:
    """Evaluate `query` on whole relations as one epoch applied to an empty state (on the
    driver when the relations fit its limits, see `wcoj_core.deploy.choose`; `deployment`
    forces one)."""
    missing = sorted(set(query.relations) - set(relations))
    if missing:
        raise QueryError(f"no input given for relation(s) {', '.join(missing)} of {query.name}")
    engine = Engine(spark, state_dir, query, deployment=deployment)
    return engine.apply_epoch(0, relations)
