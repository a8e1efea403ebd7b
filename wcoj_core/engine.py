"""The engine: one epoch-addressed way to apply epochs to a state, for the CLI and Dagster alike.

``Engine(spark, state_dir, queries, relations=...)`` plans every query over shared
arrangements. ``apply(t, changes)`` applies epoch ``t`` in one pass and one commit
(`wcoj_core.epoch`); with ``replace=True`` it replaces whatever ``t`` held (a re-run, a
corrected epoch), and later epochs derived from what ``t`` held before become *stale*
(`wcoj_core.lineage`). Before any epoch is applied, the stale epochs before it are derived
again, oldest first, from the landed changes the state keeps: an epoch never reads a stale one.

Without ``replace`` an epoch at or before the state's last is refused (`EpochAlreadyApplied`):
epochs are applied once, in increasing order — the command line's contract.

The state records what it serves (`StatePlan`: every relation's arity and meaning, every
query's normalized text); an engine planning something else over it is refused, naming both.

Spark is optional: an engine over a local state reads and writes with pyarrow and numpy and
runs the kernel on this process. Spark is started (through the `SparkStarter` given) only for
what needs it: changes given as a DataFrame that is not a plain local Parquet scan, a state on
remote storage, the executors deployment, reading traces as DataFrames.

The engine is a façade over two parts (`wcoj_core.served`): what it serves, planned once and
frozen (`Served`), and the state it serves it from (`StateAccess`). An epoch
(`wcoj_core.epoch.EpochPass`), the executors' Spark job and the readers of a state are handed
those, never the engine: nothing in `wcoj_core` below this module imports it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from wcoj_core import deploy, lineage
from wcoj_core.budget import MemoryBudget, Shares
from wcoj_core.deploy import Limits
from wcoj_core.epoch import (
    EpochMetrics,
    EpochPass,
    EpochResult,
    StepMetrics,
    ignored_trace_name,
)
from wcoj_core.errors import DamagedBatch, EpochAlreadyApplied, QueryError, StateError
from wcoj_core.input_land import Changes, check_columns, is_dataframe
from wcoj_core.kernel.layer import Layer
from wcoj_core.meaning import Meaning, RelationSpec
from wcoj_core.query.ir import Query, Var
from wcoj_core.served import Served, StateAccess, served_specs
from wcoj_core.session import SparkStarter, starter_of
from wcoj_core.store import manifest as mf
from wcoj_core.store.batches import Batches
from wcoj_core.store.store import Store
from wcoj_core.traces import output_trace_name, relation_trace_name

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

__all__ = [
    "Engine",
    "EpochMetrics",
    "EpochResult",
    "StepMetrics",
    "evaluate_static",
]

# The most landed rows an epoch takes: none (they are summed in sorted runs within the memory
# budget, `wcoj_core.input_land`); a caller may set a limit.
LANDING_ROWS: int | None = None
# The largest epoch number (epochs are days, counters, ...; far below int64).
MAX_EPOCH = 2**62


@dataclasses.dataclass(frozen=True, slots=True)
class _Given:
    """What an engine was made with: what it plans again when the state's queries change."""

    queries: tuple[Query, ...]
    relations: Mapping[str, RelationSpec] | None
    undirected: Sequence[str]
    sizes: Mapping[str, int] | None
    orders: Mapping[str, Mapping[int, Sequence[Var]]] | None


class Engine:
    """Incremental worst-case-optimal evaluation of conjunctive queries over epochs.

    `spark` is a `SparkSession`, a `SparkStarter` (started when some work needs Spark) or None
    (a default starter). `relations` gives each relation's `RelationSpec`; by default
    (`relation_specs`) the relations named in `undirected` are undirected sets and the others
    bags. `keep_rules` stores each delta rule's output change as a trace of its own (the
    Dagster pipeline shows them). `deployment` is ``auto``, ``driver`` or ``executors``.
    `memory` is the process's memory budget (`wcoj_core.budget.MemoryBudget`, bytes, a size
    such as ``"4g"``; None: the machine's default): every stage of an epoch sizes its pieces
    by it and spills beyond it. `progress` is told, on one line, how a long epoch goes.
    """

    def __init__(
        self,
        spark: SparkSession | SparkStarter | None,
        state_dir: str,
        queries: Query | Sequence[Query],
        *,
        relations: Mapping[str, RelationSpec] | None = None,
        undirected: Sequence[str] = (),
        sizes: Mapping[str, int] | None = None,
        orders: Mapping[str, Mapping[int, Sequence[Var]]] | None = None,
        keep_rules: bool = False,
        deployment: str = "auto",
        driver_max_rows: int = deploy.DRIVER_MAX_ROWS,
        driver_epoch_rows: int = deploy.DRIVER_EPOCH_ROWS,
        executor_max_rows: int = deploy.EXECUTOR_MAX_ROWS,
        executor_tasks: int | None = None,
        landing_rows: int | None = LANDING_ROWS,
        compact_every: int = 0,
        create: bool = True,
        memory: MemoryBudget | int | str | None = None,
        progress: Callable[[str], None] | None = None,
        shares: Shares | None = None,
        auto_attach: bool = False,
    ) -> None:
        from wcoj_core.deploy.driver import WORKERS

        self.auto_attach = auto_attach
        budget = MemoryBudget.of(memory) if shares is None else shares.budget
        given = [queries] if isinstance(queries, Query) else list(queries)
        served_specs(given, relations, undirected)  # the caller's queries and relations, checked
        starter = starter_of(spark)
        self.access = StateAccess.open(
            state_dir, starter, create=create, executor_tasks=executor_tasks
        )
        manifest = self.store.current()
        # What each stage may hold (`shares` given: tests forcing every stage to spill).
        shares = Shares.of(budget, WORKERS) if shares is None else shares
        worker_bytes = 0
        split = None
        if deployment == "executors" or not self.access.local:
            # The epochs run in the executors: the budget is split with Spark (`_split`).
            split = Shares.of(budget, WORKERS).for_spark(starter.master, _cores(starter.master))
            shares, worker_bytes = split.driver, split.worker_bytes
        self._given = _Given(tuple(given), relations, undirected, sizes, orders)
        self._planning: dict[str, Any] = {
            "limits": Limits(deployment, driver_max_rows, driver_epoch_rows, executor_max_rows),
            "shares": shares,
            "budget": budget,
            "keep_rules": keep_rules,
            "landing_rows": landing_rows,
            "compact_every": compact_every,
            "worker_bytes": worker_bytes,
        }
        self.served = self._served(manifest)
        self.progress = progress
        self._recounted: tuple[tuple[int, int], dict[str, int]] | None = None  # `recount`'s
        self.check_plan(manifest)
        if split is not None and not starter.started:
            # This process keeps its share, the JVM's heap is set to its own (unless ``--conf``
            # set it), and each executor's Python worker sizes its pieces by its share.
            for key, value in split.conf().items():
                starter.conf.setdefault(key, value)

    def _served(self, manifest: mf.Manifest) -> Served:
        """What this engine serves over a state whose current manifest is `manifest`: the
        queries it was given and every query the state keeps (adopted from its plan, read
        with the state's relations: an engine never drops a query a state keeps)."""
        from wcoj_core.query.parse import parse_query

        given, sizes = self._given.queries, self._given.sizes
        held = manifest.plan or mf.StatePlan()
        names = {q.name for q in given}
        adopted = [parse_query(q.text) for n, q in held.queries.items() if n not in names]
        specs = served_specs(given, self._given.relations, self._given.undirected)
        for q in adopted:
            for rel in q.relations:
                r = held.relations[rel]
                specs.setdefault(rel, RelationSpec(rel, r.arity, r.meaning, r.undirected))
        qs = [*given, *adopted]
        if sizes is None:
            sizes = {
                rel: trace.rows()
                for rel in specs
                if (trace := manifest.trace(relation_trace_name(rel))) is not None
            }
        since = {n: q.since for n, q in held.queries.items() if q.since is not None}
        orders = self._given.orders
        return Served.plan(
            qs, served_specs(qs, specs), sizes, orders, since=since, **self._planning
        )

    # -- what the engine serves (`Served`) and the state it serves it from (`StateAccess`) --
    @property
    def queries(self) -> dict[str, Query]:
        return self.served.queries

    @property
    def budget(self) -> MemoryBudget:
        return self.served.budget

    @property
    def limits(self) -> Limits:
        return self.served.limits

    @limits.setter
    def limits(self, limits: Limits) -> None:
        self.served = dataclasses.replace(self.served, limits=limits)

    def trace_columns(self, name: str) -> list[str]:
        return self.served.trace_columns(name)

    def check_plan(self, manifest: mf.Manifest) -> None:
        """Refuse a state that serves something else than this engine (see the module); a
        query the state keeps that this engine does not serve yet is adopted."""
        held = manifest.plan.queries if manifest.plan is not None else {}
        if any(n not in self.queries or self.served.since(n) != q.since for n, q in held.items()):
            self.served = self._served(manifest)
        self.served.check(manifest, self.store.root)

    def _attached(self, base: mf.Manifest) -> mf.Manifest:
        """`base`, or the manifest after attaching the queries this serves that a state
        holding epochs does not keep (`auto_attach`; else refused naming what to do)."""
        pending = self.served.pending(base)
        if not pending:
            return base
        if not self.auto_attach:
            root = self.store.root
            raise StateError(
                f"the state at {root} holds epochs up to {base.epoch} and does not keep query "
                f"{', '.join(pending)}: attach it first (wcoj attach {root} --query ..., or "
                "Engine.attach), which makes its output from the kept arrangements"
            )
        self.attach(pending)
        return self.store.current()

    def attach(self, names: Sequence[str] | None = None) -> Any:
        """Attach the queries `names` this engine serves (default: every one the state does
        not keep) to a state that holds epochs (`wcoj_core.attach.attach`); what it did."""
        from wcoj_core.attach import attach

        base = self.store.current()
        self.check_plan(base)
        names = self.served.pending(base) if names is None else list(names)
        unknown = sorted(set(names) - set(self.queries))
        if unknown:
            raise QueryError(f"this engine does not serve {', '.join(unknown)}")
        done = attach(self.served, self.access, names)
        self.served = self._served(self.store.current())
        return done

    def detach(self, names: Sequence[str]) -> mf.Manifest:
        """Remove the queries `names` from the state with their own traces
        (`wcoj_core.attach.detach`); this engine no longer serves them."""
        from wcoj_core.attach import detach

        committed = detach(self.store, names)
        kept = tuple(q for q in self._given.queries if q.name not in names)
        self._given = dataclasses.replace(self._given, queries=kept)
        self.served = self._served(committed)
        return committed

    @property
    def store(self) -> Store:
        return self.access.store

    @property
    def starter(self) -> SparkStarter:
        return self.access.starter

    @property
    def batches(self) -> Batches:
        """The state's batches through pyarrow."""
        return self.access.batches

    @property
    def local(self) -> bool:
        return self.access.local

    @property
    def persist_index(self) -> bool:
        """Arrangement files are kept (`StateAccess.persist_index`)."""
        return self.access.persist_index

    @persist_index.setter
    def persist_index(self, keep: bool) -> None:
        self.access.persist_index = keep

    def spark(self, reason: str) -> SparkSession:
        """The Spark session, started now (announced with `reason`) if it is not running."""
        return self.access.spark(reason)

    def read_batch(self, trace: mf.Trace, batch: mf.Batch) -> Layer:
        """A stored batch read whole: exactly its listed files, checked against their sizes,
        digests, the batch's rows and its epoch."""
        return self.access.read_batch(trace, batch)

    def _pass(
        self,
        base: mf.Manifest,
        epoch: int,
        changes: Mapping[str, Changes],
        *,
        dry: bool = False,
        count_only: bool = False,
    ) -> EpochPass:
        return EpochPass(
            self.served,
            self.access,
            base,
            epoch,
            changes,
            dry=dry,
            count_only=count_only,
            progress=self.progress,
        )

    # -- epochs ----------------------------------------------------------------------------
    def apply(
        self, epoch: int, changes: Mapping[str, Changes], *, replace: bool = False
    ) -> EpochResult:
        """Apply epoch `epoch` (see the module); the result of the epoch itself (stale epochs
        derived first are named in `EpochResult.rebuilt_epochs`)."""
        if isinstance(epoch, bool) or not isinstance(epoch, int) or not 0 <= epoch <= MAX_EPOCH:
            raise StateError(f"epoch {epoch!r} is not a whole number from 0 to 2**62")
        base = self.store.current()
        self.check_plan(base)
        base = self._attached(base)
        if not replace and base.epoch is not None and epoch <= base.epoch:
            raise EpochAlreadyApplied(
                f"epoch {epoch} cannot be applied to {self.store.root}: epoch {base.epoch} is "
                f"already applied (epochs are applied once, in increasing order)"
            )
        if base.frontier is not None and epoch <= base.frontier:
            raise StateError(
                f"epoch {epoch} is at or before the compaction frontier {base.frontier} of "
                f"{self.store.root}; it can no longer be rewritten"
            )
        for rel, df in changes.items():
            if rel not in self.served.specs:
                raise QueryError(
                    f"changes given for relation {rel!r}, which no query uses "
                    f"(used: {', '.join(sorted(self.served.specs))})"
                )
            check_columns(self.served.specs[rel], df, epoch)
            if is_dataframe(df):
                self.spark("changes given as a Spark DataFrame")
        rebuilt: list[EpochResult] = []
        for stale in self.stale(base):
            if stale >= epoch:
                break
            rebuilt.append(self._pass(base, stale, self.stored_changes(base, stale)).run())
            base = self.store.current()
        result = self._pass(base, epoch, changes).run()
        return dataclasses.replace(result, rebuilt=tuple(rebuilt)) if rebuilt else result

    def compact(self, frontier: int | None = None) -> mf.Manifest:
        """Merge every trace's batches at or before `frontier` (default: the last epoch) into
        one, in one commit (`wcoj_core.compaction`); the committed manifest."""
        from wcoj_core.compaction import compacted

        base = self.store.current()
        if base.epoch is None:
            return base
        frontier = base.epoch if frontier is None else min(frontier, base.epoch)
        written: list[str] = []
        from wcoj_core.spill import Scratch, Spill

        scratch = Scratch(self.access.scratch_root(), lambda _n: None)
        spill = Spill.of(scratch, self.served.shares)
        try:
            relations = [relation_trace_name(r) for r in self.served.relations]
            new = compacted(
                base, frontier, relations, self.batches, self.read_batch, written, spill
            )
            if new is base:
                return base
            return self.store.commit(new, expected=base)
        except BaseException:
            self.store.discard(written)
            raise
        finally:
            scratch.close()

    def evaluate(self, changes: Mapping[str, Changes], *, count_only: bool = False) -> EpochResult:
        """The epoch after the state's last (0 for a new state) computed from `changes` and
        written nowhere: a static evaluation when the state is new (`wcoj count`). With
        `count_only`, an output whose tuples the kernel makes distinct is only counted, not
        made: its change (`EpochResult.changes`) is then None."""
        base = self.store.current()
        self.check_plan(base)
        base = self._attached(base)
        for rel, df in changes.items():
            if rel not in self.served.specs:
                raise QueryError(f"changes given for relation {rel!r}, which no query uses")
            check_columns(self.served.specs[rel], df, 0)
        epoch = 0 if base.epoch is None else base.epoch + 1
        return self._pass(base, epoch, changes, dry=True, count_only=count_only).run()

    def recount(self, epoch: int) -> dict[str, int]:
        """Each query's change total at `epoch` derived again, on this process, from the landed
        changes the state keeps, by a pass that writes nothing and counts what the kernel can
        count without making it: independent of the stored changes, their files and figures
        (what `wcoj_core.audit_sample` checks a stored change's sum against). The last one is
        kept for the generation it read: an audit of each query recounts once. A trace with
        nothing before the epoch (a first load) is read as empty, not as its index less the
        epoch's batch."""
        m = self.store.current()
        if self._recounted is None or self._recounted[0] != (m.generation, epoch):
            served = dataclasses.replace(self.served, limits=Limits("driver"))
            base = dataclasses.replace(
                m,
                traces={
                    name: t if any(b.time < epoch for b in t.batches) else mf.Trace(name, t.columns)
                    for name, t in m.traces.items()
                },
            )
            changes = self.stored_changes(m, epoch)
            done = EpochPass(
                served, self.access, base, epoch, changes, dry=True, count_only=True
            ).run()
            self._recounted = ((m.generation, epoch), dict(done.totals))
        return self._recounted[1]

    def refresh(self) -> list[EpochResult]:
        """Derive every stale epoch again, oldest first (after a correction, to bring the
        state up to date without waiting for the next epoch); their results."""
        done: list[EpochResult] = []
        base = self.store.current()
        self.check_plan(base)
        base = self._attached(base)
        for stale in self.stale(base):
            done.append(self._pass(base, stale, self.stored_changes(base, stale)).run())
            base = self.store.current()
        return done

    def stale(self, manifest: mf.Manifest | None = None) -> list[int]:
        """The state's stale epochs (see `wcoj_core.lineage`)."""
        m = manifest or self.store.current()
        return lineage.stale_epochs(m, [relation_trace_name(r) for r in self.served.relations])

    def stored_changes(self, manifest: mf.Manifest, epoch: int) -> dict[str, Layer]:
        """The landed changes of an epoch the state holds, as its relations read them (what
        deriving it again starts from): a relation's change, plus, for a set, what changed
        nothing."""
        out: dict[str, Layer] = {}
        for rel, spec in self.served.specs.items():
            layers = []
            for name in (relation_trace_name(rel), ignored_trace_name(rel)):
                trace = manifest.trace(name)
                if trace is None:
                    continue
                layers += [self.read_batch(trace, b) for b in trace.batches if b.time == epoch]
            if not layers:
                continue
            total = layers[0]
            for layer in layers[1:]:
                from wcoj_core.kernel.layer import merged

                total = merged(total, layer)
            if spec.meaning is Meaning.SET:
                import numpy as np

                total = total.with_diff(np.sign(total.diff).astype(np.int64))
            out[rel] = total
        return out

    @property
    def epoch(self) -> int | None:
        """The last applied epoch, or None for a new state."""
        return self.store.current().epoch

    # -- reading ---------------------------------------------------------------------------
    def figures(self, name: str, time: int | None = None) -> tuple[int, int, int]:
        """A trace's figures (distinct tuples, count, negative tuples) as of `time` (default:
        the last epoch), from the manifest."""
        trace = self.store.current().trace(name)
        return trace.figures_at(time) if trace is not None else (0, 0, 0)

    def count(self, query: str | None = None, time: int | None = None) -> int:
        """A query's output count (summed multiplicity) as of `time`, from the manifest."""
        return self.figures(output_trace_name(query or next(iter(self.queries))), time)[1]

    def change(self, query: str, epoch: int) -> Any:
        """A query's stored change at `epoch` as an Arrow table (``c0 ..``, ``diff``), read
        from exactly the files the manifest lists (`wcoj_core.state_read.change_table`)."""
        from wcoj_core.state_read import change_table

        return change_table(self.access, output_trace_name(query), epoch)

    def change_batches(self, query: str, epoch: int) -> Any:
        """A query's stored change at `epoch` as a stream of record batches (``c0 ..``,
        ``diff``), a file of its batch at a time (each checked against its digest): what a
        caller writing an output of any size reads. Refused as `state_read.change_batches`
        refuses; a file that commits retire while it is streamed is a `StateError` saying so."""
        import pyarrow as pa

        from wcoj_core.kernel.changes import batch_schema, changes_table
        from wcoj_core.state_read import change_batches

        m = self.store.current()
        trace, batches = change_batches(self.access, output_trace_name(query), epoch, m)
        cols = list(trace.columns)
        schema = batch_schema(cols).remove(len(cols))  # without time

        def read() -> Any:
            for batch in batches:
                for ref in batch.files:
                    try:
                        layer = self.batches.read_verified(batch.path, cols, (ref,))
                    except DamagedBatch:
                        now = self.store.current()
                        if now.generation == m.generation or batch.path in now.paths():
                            raise
                        raise StateError(
                            f"the change of {query!r} at epoch {epoch} was retired by later "
                            f"commits of {self.store.root} while it was read (generation "
                            f"{m.generation}, now {now.generation}); read it again"
                        ) from None
                    table = changes_table(cols, layer.rows, layer.diff, epoch)
                    yield from table.drop_columns(["time"]).to_batches()

        return pa.RecordBatchReader.from_batches(schema, read())

    def _accumulated(self, name: str, time: int | None) -> DataFrame:
        from wcoj_core.state_read import accumulated

        return accumulated(self.access, name, time)

    def output(self, query: str | None = None, time: int | None = None) -> DataFrame:
        """A query's accumulated output as of `time` (default: the last epoch), in Spark."""
        name = query or next(iter(self.queries))
        if name not in self.queries:
            raise QueryError(f"unknown query {name!r}; this engine serves {sorted(self.queries)}")
        return self._accumulated(output_trace_name(name), time)

    def relation(self, name: str, time: int | None = None) -> DataFrame:
        """A relation's accumulated contents as of `time`, in Spark: (c0.., diff)."""
        if name not in self.served.relations:
            raise QueryError(f"unknown relation {name!r}; known: {sorted(self.served.relations)}")
        return self._accumulated(relation_trace_name(name), time)


def _cores(master: str | None) -> int:
    """The cores a local master runs tasks on (1 for a cluster's: its executors are not here).

    >>> _cores("local[3]"), _cores("local"), _cores("spark://h:7077")
    (3, 1, 1)
    """
    import os

    if master is None or master in ("local[*]", "local[*, 4]"):
        return os.cpu_count() or 1
    if master == "local":
        return 1
    if master.startswith("local["):
        inner = master[6:].split("]")[0].split(",")[0].strip()
        if inner == "*":
            return os.cpu_count() or 1
        return max(1, int(inner)) if inner.isdigit() else 1
    return 1


def evaluate_static(
    spark: SparkSession | SparkStarter | None,
    query: Query,
    relations: Mapping[str, Changes],
    state_dir: str,
    *,
    deployment: str = "auto",
    specs: Mapping[str, RelationSpec] | None = None,
) -> EpochResult:
    """Evaluate `query` on whole relations as one epoch applied to an empty state."""
    missing = sorted(set(query.relations) - set(relations))
    if missing:
        raise QueryError(f"no input given for relation(s) {', '.join(missing)} of {query.name}")
    engine = Engine(spark, state_dir, query, relations=specs, deployment=deployment)
    return engine.apply(0, relations)
