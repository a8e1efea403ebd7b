"""The engine: apply epochs of changes to shared arrangements and maintain query outputs.

``Engine(spark, state_dir, queries)`` plans every query, then for each ``apply_epoch(t, changes)``:

1. **stage** — each relation's changes are consolidated and written as a new batch at ``t``;
2. **counts** — every counts arrangement is updated from the tuples whose support changed
   (read from the changes and the old multiplicities of those tuples only);
3. **rules** — every delta rule of every query runs against the old/new views; a query's rules
   are summed, consolidated and written as the output's batch at ``t`` (one Spark job each);
4. **commit** — one new manifest generation records all staged batches and the epoch.

Nothing is visible until the commit, which either happens whole or not at all: a failure in any
phase discards the staged batches and leaves the previous generation as it was. An epoch at or
before the last applied one is refused (`EpochAlreadyApplied`), so nothing is counted twice.

Arrangements are keyed by relation view and key columns and shared by all rules of all queries
the engine serves. Static evaluation is one epoch applied to an empty state.
"""

from __future__ import annotations

import time as clock
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from typing import Any

import pyarrow as pa
from pyspark.sql import DataFrame, Observation, SparkSession
from pyspark.sql import functions as F

from wcoj_core import keyed as kd
from wcoj_core.arrangement import (
    Snapshot,
    counts_from_support,
    counts_trace_name,
    relation_trace_name,
    support_changes,
)
from wcoj_core.errors import EpochAlreadyApplied, InputError, QueryError, StateError
from wcoj_core.extend import (
    WEIGHT,
    StepObservations,
    StepViews,
    apply_filters,
    check,
    extend,
    var_col,
)
from wcoj_core.files import LocalFiles
from wcoj_core.query.ir import Query, Var
from wcoj_core.query.plan import Arrangement, AtomView, DeltaRule, Kind, Plan, Version, plan_query
from wcoj_core.spark import local_parquet_files, parquet_rows, read_local_parquet
from wcoj_core.state import Batch, Manifest, StateStore, Trace
from wcoj_core.updates import (
    DIFF,
    TIME,
    consolidate,
    relation_columns,
    total_diff,
    update_schema,
)

# An epoch changing at most this many relation rows is small: its prefix sets are computed
# once per step and broadcast against the arrangements, which are streamed (never shuffled).
SMALL_EPOCH_ROWS = 200_000
# The keyed path (`wcoj_core.keyed`) serves epochs changing at most this many relation rows, on
# a local state whose relation and counts traces hold at most `KEYED_MAX_ROWS` rows in all,
# the epoch's included (the driver keeps them in memory: about 30 bytes a row per sort order).
KEYED_EPOCH_ROWS = 10_000_000
KEYED_MAX_ROWS = 100_000_000
# An epoch's changes are first collected with a limit of this many rows (one cheap job for the
# usual small epoch); a larger epoch is counted, then collected whole, which costs Spark less
# than a large limit (a limit gathers its rows through a shuffle to one partition).
KEYED_PROBE_ROWS = 250_000


def output_trace_name(query: str) -> str:
    return f"out/{query}"


@dataclass(frozen=True, slots=True)
class StepMetrics:
    """Rows through one step of one rule (``None`` when Spark skipped the phase entirely)."""

    query: str
    rule: int
    var: str
    prefixes: int | None
    min_count_sum: int | None
    proposed: int | None
    validated: int | None


@dataclass(frozen=True, slots=True)
class EpochMetrics:
    """What one epoch did: changes in, rows proposed and validated, output rows, seconds."""

    epoch: int
    changes: dict[str, int]
    outputs: dict[str, int]
    steps: tuple[StepMetrics, ...]
    seconds: dict[str, float]
    # Rows out of every lookup of the keyed path (its analogue of join output rows; the Spark
    # path's joins are counted by Spark's own SQL metrics instead, so it leaves this 0).
    join_rows: int = 0
    path: str = "spark"  # which path applied the epoch: "spark" or "keyed"

    @property
    def proposed(self) -> int:
        return sum(s.proposed or 0 for s in self.steps)

    @property
    def validated(self) -> int:
        return sum(s.validated or 0 for s in self.steps)

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
            "path": self.path,
        }


@dataclass(frozen=True, slots=True)
class EpochResult:
    """The exact change of every query's output at an epoch, and the epoch's metrics."""

    epoch: int
    outputs: dict[str, DataFrame]
    metrics: EpochMetrics
    # The sum of each output change's multiplicities, where the path computed it on the driver.
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


def observed(obs: Observation, key: str) -> int | None:
    """An observed metric, or None when Spark never ran the observed part of the plan."""
    try:
        value = (obs.get or {}).get(key)
    except Exception:  # the subtree was pruned (for example, joined with an empty side)
        return None
    return None if value is None else int(value)


class Engine:
    """Incremental worst-case-optimal evaluation of conjunctive queries over epochs.

    `compact_every` merges a trace's batches once it holds more; an epoch changing at most
    `small_epoch_rows` relation rows runs its rules broadcasting prefixes (see `SMALL_EPOCH_ROWS`);
    `cache_state` keeps the batches read in Spark's memory for later epochs. An epoch changing at
    most `keyed_epoch_rows` rows of a local state of at most `keyed_max_rows` arrangement rows
    runs on the driver's resident index instead (`wcoj_core.keyed`); 0 turns that path off.
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
        small_epoch_rows: int = SMALL_EPOCH_ROWS,
        cache_state: bool = True,
        keyed_epoch_rows: int = KEYED_EPOCH_ROWS,
        keyed_max_rows: int = KEYED_MAX_ROWS,
    ) -> None:
        qs = [queries] if isinstance(queries, Query) else list(queries)
        if len({q.name for q in qs}) != len(qs):
            raise QueryError("two queries share a name; give each query its own name")
        self.spark = spark
        self.store = StateStore(spark, state_dir, cache=cache_state)
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
        self.small_epoch_rows = small_epoch_rows
        self.keyed_epoch_rows = keyed_epoch_rows
        self.keyed_max_rows = keyed_max_rows
        self._keyed = (
            kd.KeyedIndex(self.store.files.root)
            if isinstance(self.store.files, LocalFiles)
            else None
        )

    # -- arrangements ----------------------------------------------------------------------
    @property
    def arrangements(self) -> tuple[Arrangement, ...]:
        """Every arrangement any plan reads, each once."""
        seen: dict[Arrangement, None] = {}
        for plan in self.plans.values():
            for a in plan.arrangements:
                seen.setdefault(a, None)
        return tuple(seen)

    def _counts(self) -> list[Arrangement]:
        return [a for a in self.arrangements if a.kind is Kind.COUNTS]

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

    def _register(
        self, manifest: Manifest, staged_paths: list[str], build_counts: bool = True
    ) -> Manifest:
        """Add the traces this engine needs; build missing counts from the committed state.

        With ``build_counts=False`` a missing counts trace starts empty: it is then built epoch by
        epoch (see `wcoj_core.history`).
        """
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
        for a in self._counts():
            name = counts_trace_name(a)
            if m.trace(name) is not None:
                continue
            trace = Trace(name, tuple(f"c{k}" for k in a.key))
            relation = m.traces[relation_trace_name(a.view.relation)]
            if build_counts and m.epoch is not None and relation.rows() > 0:
                snap = Snapshot(self.store, m, {}, m.epoch + 1)
                ones = snap.self_view(a.view, new=False).withColumn(DIFF, F.lit(1).cast("long"))
                batch = self.store.write_batch(trace, counts_from_support(ones, a.key), m.epoch)
                staged_paths.append(batch.path)
                trace = trace.with_batch(batch)
            m = m.with_trace(trace)
        return m

    # -- epochs ----------------------------------------------------------------------------
    def apply_epoch(
        self, epoch: int, changes: Mapping[str, DataFrame | pa.Table], *, rules: bool = True
    ) -> EpochResult:
        """Apply one epoch of changes; return the exact change of every output at `epoch`.

        A relation's changes are a Spark DataFrame or, already on the driver, an Arrow table
        (``c0 ..``, ``diff`` int64 columns without nulls, as `wcoj_core.sources` reads a small
        local file); a table the keyed path cannot take is handed to Spark.

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
        for rel in changes:
            if rel not in self.relations:
                raise QueryError(
                    f"changes given for relation {rel!r}, which no query uses "
                    f"(used: {', '.join(sorted(self.relations))})"
                )
        if rules:
            small = self._keyed_changes(base, epoch, changes)
            if small is not None:
                return self._apply_keyed(base, epoch, small)
        frames = {
            rel: df if isinstance(df, DataFrame) else self.spark.createDataFrame(df)
            for rel, df in changes.items()
        }
        return self._apply_spark(base, epoch, frames, rules)

    def _apply_spark(
        self, base: Manifest, epoch: int, changes: Mapping[str, DataFrame], rules: bool
    ) -> EpochResult:
        """Apply an epoch with Spark's dataflow (stage, counts, rules, commit)."""
        timer = _Timer()
        staged_paths: list[str] = []
        try:
            with timer.phase("stage"):
                m = self._register(base, staged_paths)
                staged = self._stage(m, epoch, changes, staged_paths)
            with timer.phase("counts"):
                staged |= self._maintain_counts(m, epoch, staged, staged_paths)
            snapshot = Snapshot(self.store, m, staged, epoch)
            with timer.phase("rules"):
                outputs, steps = (
                    self._run_rules(snapshot, staged, staged_paths) if rules else ({}, [])
                )
            with timer.phase("commit"):
                committed = self._commit(m, base, epoch, staged)
        except BaseException:
            self.store.discard(staged_paths)
            raise
        metrics = EpochMetrics(
            epoch=epoch,
            changes={
                rel: staged[relation_trace_name(rel)].rows
                for rel in sorted(changes)
                if relation_trace_name(rel) in staged
            },
            outputs={q: outputs[q].rows for q in outputs},
            steps=tuple(steps),
            seconds=timer.seconds,
        )
        frames = {
            q: self.store.read(committed.traces[output_trace_name(q)], [b])
            for q, b in outputs.items()
        }
        return EpochResult(epoch, frames, metrics)

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

    # -- the keyed path -----------------------------------------------------------------------
    def _keyed_traces(self) -> list[str]:
        return [relation_trace_name(r) for r in sorted(self.relations)] + [
            counts_trace_name(a) for a in self._counts()
        ]

    def _keyed_changes(
        self, base: Manifest, epoch: int, changes: Mapping[str, DataFrame | pa.Table]
    ) -> dict[str, kd.Layer] | None:
        """The epoch's changes on the driver, when the keyed path can serve it; else None.

        It serves an epoch of a local state whose traces this engine reads hold, with the epoch,
        at most `keyed_max_rows` rows, changing at most `keyed_epoch_rows` rows. The changes are
        collected with a limit of `KEYED_PROBE_ROWS` rows (of `keyed_epoch_rows`, if fewer)
        first; when that limit is reached, they are counted and then collected whole. A fresh
        state's epoch (usually a whole relation) is counted first. Changes that are nothing but
        a scan of local Parquet files are counted from the files' footers and read with pyarrow,
        without a Spark job. A change with a null stays on Spark's path.
        """
        if self._keyed is None or self.keyed_epoch_rows <= 0:
            return None
        held = sum(t.rows() for n in self._keyed_traces() if (t := base.trace(n)) is not None)
        budget = min(self.keyed_epoch_rows, self.keyed_max_rows - held)
        if budget < 0:
            return None
        out: dict[str, kd.Layer] = {}
        for rel, df in sorted(changes.items()):
            if rel not in self.relations:
                return None  # refused with its message on Spark's path
            cols = self._check_columns(rel, df, epoch)
            table: pa.Table | None
            if isinstance(df, DataFrame):
                table = self._collect(df.select(*cols, DIFF), budget, fresh=base.epoch is None)
            else:
                table = df.select([*cols, DIFF])
            if table is None:
                return None
            rows: int = table.num_rows
            if rows > budget or any(c.null_count for c in table.columns):
                return None
            budget -= rows
            out[rel] = kd.changes_layer(cols, table)
        return out

    @staticmethod
    def _collect(rows: DataFrame, budget: int, *, fresh: bool) -> pa.Table | None:
        """A relation's changes on the driver, or None when they hold more than `budget` rows."""
        files = local_parquet_files(rows)
        if files is not None:
            if parquet_rows(files) > budget:
                return None
            table = read_local_parquet(rows, files)
            if table is not None:
                return table
        probe = min(budget, KEYED_PROBE_ROWS)
        table = None if fresh else rows.limit(probe + 1).toArrow()
        if table is None or table.num_rows > probe:
            if rows.count() > budget:
                return None
            table = rows.toArrow()
        return table

    def _apply_keyed(
        self, base: Manifest, epoch: int, changes: Mapping[str, kd.Layer]
    ) -> EpochResult:
        """Apply a small epoch on the driver's resident index (see `wcoj_core.keyed`)."""
        index = self._keyed
        assert index is not None
        timer = _Timer()
        staged_paths: list[str] = []
        staged: dict[str, Batch] = {}
        deltas: dict[str, kd.Layer] = {}
        joins: list[int] = []
        outputs: dict[str, Batch] = {}
        totals: dict[str, int] = {}
        steps: list[StepMetrics] = []

        def stage(trace: Trace, layer: kd.Layer) -> None:
            batch = index.write(trace, layer.rows, layer.diff, epoch)
            staged_paths.append(batch.path)
            staged[trace.name] = batch
            deltas[trace.name] = layer

        try:
            with timer.phase("stage"):
                m = self._register(base, staged_paths)
                index.sync(m, self._keyed_traces())
                for rel, layer in sorted(changes.items()):
                    stage(m.traces[relation_trace_name(rel)], layer)
            layers = kd.EpochLayers(index, deltas)
            with timer.phase("counts"):
                by_view: dict[AtomView, list[Arrangement]] = {}
                for a in self._counts():
                    by_view.setdefault(a.view, []).append(a)
                for view, arrangements in by_view.items():
                    if relation_trace_name(view.relation) not in deltas:
                        continue
                    support = kd.support_delta(layers, view)
                    for a in arrangements:
                        stage(m.traces[counts_trace_name(a)], kd.counts_delta(support, a.key))
            snapshot = Snapshot(self.store, m, staged, epoch)
            with timer.phase("rules"):
                for name, plan in self.plans.items():
                    found: list[kd.Prefixes] = []
                    for rule in plan.rules:
                        if self._rule_is_empty(plan, rule, snapshot):
                            continue
                        bindings, counts = kd.run_rule(plan, rule, layers, joins)
                        found.append(bindings)
                        steps.extend(
                            StepMetrics(
                                name,
                                rule.delta,
                                c.var,
                                c.prefixes,
                                c.min_sum,
                                c.proposed,
                                c.validated,
                            )
                            for c in counts
                        )
                    trace = m.traces[output_trace_name(name)]
                    distinct = _distinct_output(plan, base.epoch is None, len(found))
                    rows, diff = kd.output_changes(found, plan.query.head, distinct)
                    totals[name] = int(diff.sum())
                    batch = index.write(trace, rows, diff, epoch)
                    staged_paths.append(batch.path)
                    staged[trace.name] = batch
                    outputs[name] = batch
            with timer.phase("commit"):
                committed = self._commit(m, base, epoch, staged)
        except BaseException:
            self.store.discard(staged_paths)
            raise
        for name, layer in deltas.items():
            index.traces[name] = index.traces[name].advanced(layer, staged[name].path)
        metrics = EpochMetrics(
            epoch=epoch,
            changes={rel: staged[relation_trace_name(rel)].rows for rel in sorted(changes)},
            outputs={q: b.rows for q, b in outputs.items()},
            steps=tuple(steps),
            seconds=timer.seconds,
            join_rows=sum(joins),
            path="keyed",
        )
        frames = {
            q: self.store.read(committed.traces[output_trace_name(q)], [b])
            for q, b in outputs.items()
        }
        return EpochResult(epoch, frames, metrics, totals)

    def _stage(
        self, m: Manifest, epoch: int, changes: Mapping[str, DataFrame], staged_paths: list[str]
    ) -> dict[str, Batch]:
        staged: dict[str, Batch] = {}
        for rel, df in sorted(changes.items()):
            cols = self._check_columns(rel, df, epoch)
            trace = m.traces[relation_trace_name(rel)]
            batch = self.store.write_batch(trace, consolidate(df.select(*cols, DIFF), cols), epoch)
            staged_paths.append(batch.path)
            staged[trace.name] = batch
        return staged

    def _maintain_counts(
        self, m: Manifest, epoch: int, staged: dict[str, Batch], staged_paths: list[str]
    ) -> dict[str, Batch]:
        snapshot = Snapshot(self.store, m, staged, epoch)
        by_view: dict[AtomView, list[Arrangement]] = {}
        for a in self._counts():
            by_view.setdefault(a.view, []).append(a)
        out: dict[str, Batch] = {}
        for view, arrangements in by_view.items():
            if not snapshot.has_changes(view.relation):
                continue
            changes = support_changes(snapshot, view)
            if len(arrangements) > 1:
                changes = changes.persist()
            for a in arrangements:
                trace = m.traces[counts_trace_name(a)]
                batch = self.store.write_batch(trace, counts_from_support(changes, a.key), epoch)
                staged_paths.append(batch.path)
                out[trace.name] = batch
            changes.unpersist()
        return out

    def _rule_is_empty(self, plan: Plan, rule: DeltaRule, snapshot: Snapshot) -> bool:
        atoms = plan.query.atoms
        if not snapshot.has_changes(atoms[rule.delta].relation):
            return True
        for j, version in enumerate(rule.versions):
            if version is not Version.DELTA and snapshot.is_empty(
                relation_trace_name(atoms[j].relation), new=version is Version.NEW
            ):
                return True
        return False

    def rule_output(
        self,
        plan: Plan,
        rule: DeltaRule,
        snapshot: Snapshot,
        observations: list[StepObservations],
        materialize: Callable[[DataFrame], DataFrame] | None = None,
    ) -> DataFrame:
        """The output change produced by one delta rule: (c0.., diff), not consolidated.

        With `materialize` (for a small epoch) each step computes its proposals once, then
        broadcasts them against the arrangements (see `wcoj_core.extend`).
        """
        atom_vars = plan.atom_vars
        start = atom_vars[rule.delta]
        df = snapshot.delta_view(plan.views[rule.delta]).select(
            *[F.col(f"c{i}").alias(var_col(v)) for i, v in enumerate(start)],
            F.col(DIFF).alias(WEIGHT),
        )
        for c in rule.checks:
            vs = atom_vars[c.atom]
            tuples = snapshot.self_view(c.view, new=c.version is Version.NEW).select(
                *[F.col(f"c{i}").alias(var_col(v)) for i, v in enumerate(vs)], DIFF
            )
            df = check(df, [var_col(v) for v in vs], tuples)
        df = apply_filters(df, rule.start_filters)
        small = materialize is not None
        for step in rule.steps:
            views = StepViews(
                counts=lambda x: snapshot.counts(x.counts, new=x.version is Version.NEW),
                support=lambda x: (
                    snapshot.self_view(x.view, new=x.version is Version.NEW, linear=small)
                    if x.completes
                    else snapshot.counts(x.support, new=x.version is Version.NEW)
                ),
                materialize=materialize,
            )
            obs = StepObservations(step.var.name)
            observations.append(obs)
            df = extend(df, step, atom_vars, views, obs)
        head = plan.query.head
        return df.select(
            *[F.col(var_col(v)).alias(f"c{i}") for i, v in enumerate(head)],
            F.col(WEIGHT).alias(DIFF),
        )

    def _run_rules(
        self, snapshot: Snapshot, staged: dict[str, Batch], staged_paths: list[str]
    ) -> tuple[dict[str, Batch], list[StepMetrics]]:
        outputs: dict[str, Batch] = {}
        steps: list[StepMetrics] = []
        kept: list[DataFrame] = []

        def keep(df: DataFrame) -> DataFrame:
            kept.append(df.cache())
            kept[-1].count()
            return kept[-1]

        changed = sum(b.rows for name, b in staged.items() if name.startswith("rel/"))
        materialize = keep if changed <= self.small_epoch_rows else None
        try:
            return self._rules_into(snapshot, staged, staged_paths, outputs, steps, materialize)
        finally:
            for df in kept:
                df.unpersist()

    def _rules_into(
        self,
        snapshot: Snapshot,
        staged: dict[str, Batch],
        staged_paths: list[str],
        outputs: dict[str, Batch],
        steps: list[StepMetrics],
        materialize: Callable[[DataFrame], DataFrame] | None,
    ) -> tuple[dict[str, Batch], list[StepMetrics]]:
        for name, plan in self.plans.items():
            trace = snapshot.manifest.traces[output_trace_name(name)]
            cols = list(trace.columns)
            ran: list[tuple[int, list[StepObservations]]] = []
            frames = []
            for rule in plan.rules:
                if self._rule_is_empty(plan, rule, snapshot):
                    continue
                obs: list[StepObservations] = []
                frames.append(self.rule_output(plan, rule, snapshot, obs, materialize))
                ran.append((rule.delta, obs))
            if frames:
                total = frames[0]
                for f in frames[1:]:
                    total = total.unionByName(f)
                fresh = snapshot.manifest.epoch is None
                distinct = _distinct_output(plan, fresh, len(frames))
                out = total if distinct else consolidate(total, cols)
            else:
                out = self.spark.createDataFrame([], update_schema(cols, with_time=False))
            batch = self.store.write_batch(trace, out, snapshot.time, partitions=2)
            staged_paths.append(batch.path)
            outputs[name] = batch
            staged[trace.name] = batch
            for rule_index, obs in ran:
                for o in obs:
                    steps.append(
                        StepMetrics(
                            query=name,
                            rule=rule_index,
                            var=o.var,
                            prefixes=observed(o.prefixes, "rows"),
                            min_count_sum=observed(o.prefixes, "min_sum"),
                            proposed=observed(o.proposed, "rows"),
                            validated=observed(o.validated, "rows"),
                        )
                    )
        return outputs, steps

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

        On a local state with the keyed path on, a trace whose batches to merge hold at most
        `keyed_max_rows` rows is merged on the driver: read with pyarrow, summed and written as
        the keyed path writes a batch (`KeyedIndex.read`, `KeyedIndex.write`), without a Spark
        job. Any other trace is merged by Spark. Either way the merged batch holds each tuple
        once with its summed diff, tuples summing to 0 dropped.
        """
        base = self.store.current()
        if base.epoch is None:
            return
        frontier = base.epoch if frontier is None else min(frontier, base.epoch)
        if base.frontier is not None and frontier <= base.frontier:
            return  # the frontier only moves forward
        traces = dict(base.traces)
        staged_paths: list[str] = []
        try:
            for name, trace in base.traces.items():
                old = trace.visible(frontier)
                if len(old) <= 1:
                    continue
                index = self._compaction_index(old)
                if index is not None:
                    layer = index.read(trace, old)
                    batch = index.write(trace, layer.rows, layer.diff, frontier)
                else:
                    merged = consolidate(self.store.read(trace, old).drop(TIME), trace.columns)
                    batch = self.store.write_batch(trace, merged, frontier, partitions=2)
                staged_paths.append(batch.path)
                later = tuple(b for b in trace.batches if b.time > frontier)
                traces[name] = replace(trace, batches=(batch, *later))
            after = self.store.commit(
                replace(base, traces=traces, frontier=frontier), expected=base
            )
            if self._keyed is not None:
                self._keyed.remap(base, after)
        except BaseException:
            self.store.discard(staged_paths)
            raise

    def _compaction_index(self, batches: Sequence[Batch]) -> kd.KeyedIndex | None:
        """The keyed index when `compact` merges these batches on the driver (see `compact`)."""
        if self.keyed_epoch_rows > 0 and sum(b.rows for b in batches) <= self.keyed_max_rows:
            return self._keyed
        return None


def _distinct_output(plan: Plan, fresh: bool, rules: int) -> bool:
    """True when the rules' output is already consolidated, so summing it would change nothing.

    That holds for one rule on a fresh state (a static evaluation: only the last rule runs) when
    the head keeps every variable. Each view it reads is a single batch, consolidated when it was
    written, so the delta tuples, the proposals and the validations are all distinct: each full
    binding is produced once, with a product of non-zero multiplicities, and a head holding every
    variable maps distinct bindings to distinct tuples. Skipping the sum spares a hash
    aggregation over the whole output (8.9 M triangles for web-NotreDame).
    """
    return fresh and rules == 1 and set(plan.query.head) == set(plan.query.vars)


def evaluate_static(
    spark: SparkSession,
    query: Query,
    relations: Mapping[str, DataFrame],
    state_dir: str,
    *,
    keyed: bool = True,
) -> EpochResult:
    """Evaluate `query` on whole relations as one epoch applied to an empty state.

    A local state takes the keyed path when the relations fit its limits (see `Engine`);
    ``keyed=False`` keeps the evaluation on Spark's path.
    """
    missing = sorted(set(query.relations) - set(relations))
    if missing:
        raise QueryError(f"no input given for relation(s) {', '.join(missing)} of {query.name}")
    engine = Engine(spark, state_dir, query, keyed_epoch_rows=KEYED_EPOCH_ROWS if keyed else 0)
    return engine.apply_epoch(0, relations)
