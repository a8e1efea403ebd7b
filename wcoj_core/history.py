"""Epoch-addressed maintenance: every step reads and writes one epoch, replacing what was there.

`Engine.apply_epoch` applies epochs once, in increasing order. An orchestrator such as Dagster
needs more: re-running any epoch (a backfill, in any order, in one run or many) and correcting
history (new changes for an old epoch, then every later epoch re-derived). `History` splits an
epoch into steps that are each a pure function of stored batches and each write one batch at
that epoch, *replacing* the batch the trace held at that time:

* `ingest(t, rel, changes)` — the relation's consolidated changes at ``t``;
* `arrange(t, counts)` — a counts arrangement's change at ``t``, from the relation's changes at
  ``t`` and its state before ``t`` (so epoch ``t`` needs ``t - 1`` arranged first);
* `derive_rule(query, i, t)` — one delta rule's output change at ``t``, from the changes at
  ``t``, the state before ``t`` and the new state at ``t``; never from earlier outputs;
* `derive_output(query, t)` — the sum of the query's rule outputs at ``t``;
* `record(name, t, df)` — store any change at ``t``.

The kernel steps (`arrange`, `derive_rule`) run where the engine's `choose` says, like an epoch
of `Engine.apply_epoch`: on the driver, over traces it keeps in memory as of the epoch
(`Resident`: a range of epochs walked oldest first advances them one epoch's batches at a
time), or inside Spark's executors. Each reads its traces as of the epoch — the batches before
it as the old state, the epoch's own batches as its changes — and writes batches of the same
schema and provenance either way.

Every derived batch records its provenance: a digest of the batches it was computed from. When
history is corrected (an input batch replaced), `stale` names every derived batch whose inputs
are no longer the ones it would be computed from now — directly or through another stale batch
— which is what a backfill from the corrected epoch must rebuild.

Replacing (rather than appending) makes every step idempotent: running it twice, or re-running it
after its inputs were corrected, stores exactly one answer per epoch. Each step commits its own
manifest generation and retries when another writer committed first.
"""

from __future__ import annotations

import bisect
import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

import numpy as np
import pyarrow as pa
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from wcoj_core import deploy
from wcoj_core.deploy import Choice
from wcoj_core.deploy.work import RuleJob, TraceRead, Work, open_layers
from wcoj_core.engine import Engine
from wcoj_core.errors import ConcurrentCommit, InputError, QueryError, StateError
from wcoj_core.kernel.changes import changes_layer
from wcoj_core.kernel.index import EpochLayers
from wcoj_core.kernel.join import RuleTally
from wcoj_core.kernel.layer import Layer, lookup_sum
from wcoj_core.query.plan import Arrangement, Kind, Version
from wcoj_core.state import Batch, Manifest, Trace
from wcoj_core.traces import (
    counts_trace_name,
    output_trace_name,
    relation_trace_name,
    rule_trace_name,
)
from wcoj_core.updates import DIFF, TIME, consolidate, relation_columns, update_schema

RETRIES = 50


@dataclass(frozen=True, slots=True)
class RuleWork:
    """What one delta rule did at an epoch: candidates proposed and tuples validated, and
    where it ran (``driver`` or ``executors``)."""

    proposed: int
    validated: int
    deployment: str


class History:
    """Epoch-addressed, idempotent steps over the traces of an `Engine`'s state directory."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.store = engine.store
        self.sources = derivations(engine)

    @property
    def local_root(self) -> str | None:
        """The state's folder when it is on this machine's file system (else None)."""
        return self.store.files.root if self.engine.local else None

    @property
    def driver_epoch_rows(self) -> int:
        """The most changed rows an epoch's step may take on the driver (0: never)."""
        limits = self.engine.limits
        if not self.engine.local or limits.mode == "executors":
            return 0
        return limits.driver_epoch_rows

    # -- committing one batch --------------------------------------------------------------
    def _trace(self, name: str, columns: Sequence[str]) -> Trace:
        m = self.engine.registered(self.store.current())
        return m.trace(name) or Trace(name, tuple(columns))

    def _replace(self, name: str, columns: Sequence[str], batch: Batch) -> None:
        for _ in range(RETRIES):
            base = self.store.current()
            if base.frontier is not None and batch.time <= base.frontier:
                self.store.discard([batch.path])
                raise StateError(
                    f"epoch {batch.time} is at or before the compaction frontier "
                    f"{base.frontier} of {self.store.root}; it can no longer be rewritten"
                )
            m = self.engine.registered(base)
            trace = m.trace(name) or Trace(name, tuple(columns))
            epoch = max(batch.time, base.epoch if base.epoch is not None else batch.time)
            new = replace(m.with_trace(trace.replacing(batch)), epoch=epoch)
            try:
                self.store.commit(new, expected=base)
                return
            except ConcurrentCommit:
                continue
        self.store.discard([batch.path])
        raise StateError(f"{self.store.root}: gave up committing {name!r} after {RETRIES} tries")

    def record(self, name: str, epoch: int, df: DataFrame, inputs: str = "") -> Batch:
        """Store update rows (trace columns + diff) as the trace's batch at `epoch`.

        `inputs` is the batch's provenance (`digest`, taken from the manifest `df` was read
        from); a derived batch recorded without it is never current.
        """
        cols = [c for c in df.columns if c not in (TIME, DIFF)]
        trace = self._trace(name, cols)
        out = consolidate(df.select(*cols, DIFF), cols)
        batch = self.store.write_batch(trace, out, epoch, 2, inputs=inputs)
        self._replace(name, trace.columns, batch)
        return batch

    def _commit_written(
        self, name: str, columns: Sequence[str], batch: Batch, inputs: str
    ) -> Batch:
        batch = replace(batch, inputs=inputs)
        self._replace(name, columns, batch)
        return batch

    def _write(
        self, trace: Trace, rows: np.ndarray, diff: np.ndarray, epoch: int, inputs: str
    ) -> Batch:
        """Write a batch computed on the driver and commit it in place of the epoch's batch."""
        staged: list[str] = []
        try:
            batch = self.engine.write_batch(
                trace.name, trace.columns, rows, diff, epoch, staged, inputs
            )
        except BaseException:
            self.store.discard(staged)
            raise
        self._replace(trace.name, trace.columns, batch)
        return batch

    # -- the steps -------------------------------------------------------------------------
    def ingest(self, epoch: int, relation: str, changes: DataFrame | pa.Table) -> Batch:
        """A relation's changes at `epoch` (c0.., diff), consolidated, replacing earlier ones.

        `changes` is a Spark DataFrame, or an Arrow table already on the driver (a small epoch,
        consolidated and written without Spark). Identical changes re-ingested keep the stored
        batch, so nothing derived from it goes stale.
        """
        arity = self.engine.relations.get(relation)
        if arity is None:
            raise QueryError(f"no query uses relation {relation!r}")
        cols = relation_columns(arity)
        name = relation_trace_name(relation)
        source = f"relation {relation!r} at {epoch}"
        if isinstance(changes, DataFrame):
            missing = [c for c in (*cols, DIFF) if c not in changes.columns]
            if missing:
                raise InputError(f"changes lack columns {missing}", source=source)
            changes = changes.select(*cols, DIFF)
            trace = self.store.current().trace(name)
            existing = [b for b in trace.batches if b.time == epoch] if trace is not None else []
            if existing and trace is not None and self._same(trace, existing[0], changes, cols):
                return existing[0]
            return self.record(name, epoch, changes)
        missing = [c for c in (*cols, DIFF) if c not in changes.column_names]
        if missing:
            raise InputError(f"changes lack columns {missing}", source=source)
        layer = changes_layer(cols, changes)
        trace = self._trace(name, cols)
        existing = [b for b in trace.batches if b.time == epoch]
        if existing and self.engine.local:
            stored = self.engine.files.read_layer(cols, [b.path for b in existing if b.rows])
            if np.array_equal(stored.rows, layer.rows) and np.array_equal(stored.diff, layer.diff):
                return existing[0]
        return self._write(trace, layer.rows, layer.diff, epoch, "")

    def _same(self, trace: Trace, batch: Batch, changes: DataFrame, cols: Sequence[str]) -> bool:
        """Whether a stored batch holds exactly `changes` (consolidated), as multisets."""
        old = self.store.read(trace, [batch]).select(*cols, DIFF)
        new = consolidate(changes, cols).select(*cols, DIFF)
        return old.exceptAll(new).unionByName(new.exceptAll(old)).limit(1).count() == 0

    def counts(self) -> tuple[Arrangement, ...]:
        """The counts arrangements the engine's plans read."""
        return tuple(a for a in self.engine.arrangements if a.kind is Kind.COUNTS)

    def _reads(self, manifest: Manifest, epoch: int, names: Sequence[str]) -> tuple[TraceRead, ...]:
        """The traces as of `epoch`: their batches before it, and its own as the changes."""
        registered = self.engine.registered(manifest)
        out = []
        for name in names:
            trace = registered.traces[name]
            old = tuple((b.path, b.rows) for b in trace.batches if b.time < epoch)
            now = tuple((b.path, b.rows) for b in trace.batches if b.time == epoch)
            out.append(TraceRead(name, trace.columns, old, now))
        return tuple(out)

    def _choose(self, manifest: Manifest, epoch: int, names: Sequence[str]) -> Choice:
        """Where a step reading `names` at `epoch` runs (the engine's limits)."""
        traces = [t for n in names if (t := manifest.trace(n)) is not None]
        changed = sum(b.rows for t in traces for b in t.batches if b.time == epoch)
        held = sum(t.rows(epoch, strict=True) for t in traces)
        engine = self.engine
        return deploy.choose(engine.limits, local=engine.local, held=held, changed=changed)

    def _kernel(
        self, work: Work, names: Sequence[str], manifest: Manifest, epoch: int
    ) -> tuple[dict[str, Batch], dict[RuleJob, RuleTally], Choice]:
        """Run a kernel step's work where `_choose` says; its batches, staged not committed."""
        choice = self._choose(manifest, epoch, names)
        changed = sum(rows for r in work.reads for _, rows in r.delta)
        staged: list[str] = []
        try:
            outcome = self.engine.run_work(work, choice, {}, staged, changed)
        except BaseException:
            self.store.discard(staged)
            raise
        return outcome.batches, dict(outcome.tallies), choice

    def arrange(self, epoch: int, arrangement: Arrangement) -> Batch:
        """A counts arrangement's change at `epoch`; needs every earlier epoch arranged."""
        manifest = self.store.current()
        name = counts_trace_name(arrangement)
        inputs = digest(manifest, self.sources[name], epoch)
        cols = [f"c{k}" for k in arrangement.key]
        trace = self._trace(name, cols)
        relation = relation_trace_name(arrangement.view.relation)
        reads = self._reads(manifest, epoch, [relation])
        work = Work(
            self.store.root,
            epoch,
            self.engine.plans,
            reads,
            counts=(arrangement,),
            emit=(name,),
        )
        batches, _, _ = self._kernel(work, [relation], manifest, epoch)
        return self._commit_written(name, trace.columns, batches[name], inputs)

    def derive_rule(self, query: str, index: int, epoch: int) -> tuple[Batch, RuleWork]:
        """Compute and store one delta rule's output change at `epoch`, with its provenance."""
        name = rule_trace_name(query, index)
        plan = self.engine.plans[query]
        manifest = self.store.current()
        names = [n for n, _ in self.sources[name]]
        inputs = digest(manifest, self.sources[name], epoch)
        trace = self._trace(name, relation_columns(len(plan.query.head)))
        reads = self._reads(manifest, epoch, names)
        job = RuleJob(query, index, name)
        work = Work(self.store.root, epoch, self.engine.plans, reads, rules=(job,))
        batches, tallies, choice = self._kernel(work, names, manifest, epoch)
        steps = tallies[job].steps if job in tallies else []
        work_done = RuleWork(
            sum(s.proposed for s in steps),
            sum(s.validated for s in steps),
            choice.deployment.value,
        )
        return self._commit_written(name, trace.columns, batches[name], inputs), work_done

    def derive_output(self, query: str, epoch: int) -> Batch:
        """Sum the stored rule outputs at `epoch` and store them as the query's change."""
        manifest = self.store.current()
        name = output_trace_name(query)
        inputs = digest(manifest, self.sources[name], epoch)
        names = [n for n, _ in self.sources[name]]
        if self._choose(manifest, epoch, names).on_driver:
            cols = relation_columns(len(self.engine.plans[query].query.head))
            paths = [
                b.path
                for n in names
                if (t := manifest.trace(n)) is not None
                for b in t.batches
                if b.time == epoch and b.rows
            ]
            total = self.engine.files.read_layer(cols, paths)
            return self._write(self._trace(name, cols), total.rows, total.diff, epoch, inputs)
        return self.record(name, epoch, self.query_changes(query, epoch, manifest), inputs)

    def _driver_layers(self, epoch: int, names: Sequence[str]) -> EpochLayers | None:
        """The traces as of `epoch` on the driver (its batches before it indexed, its own as
        changes), or None when a step reading them runs on the executors."""
        manifest = self.store.current()
        if not self._choose(manifest, epoch, names).on_driver:
            return None
        reads = self._reads(manifest, epoch, names)
        work = Work(self.store.root, epoch, self.engine.plans, reads)
        return open_layers(work, self.engine.resident)

    def negative_changed(
        self, relation: str, epoch: int, limit: int
    ) -> tuple[int, list[tuple[tuple[int, ...], int]]] | None:
        """On the driver: tuples changed at `epoch` whose multiplicity as of it is negative.

        Returns their number and the first `limit` of them in tuple order, with their
        multiplicities; None when the step runs on the executors.
        """
        name = relation_trace_name(relation)
        layers = self._driver_layers(epoch, [name])
        if layers is None:
            return None
        delta = layers.deltas.get(name)
        if delta is None:
            return 0, []
        order = tuple(range(delta.width))
        old = lookup_sum(layers.layers(name, None, order, Version.OLD), delta.rows)
        now = old + delta.diff
        negative = np.flatnonzero(now < 0)  # the delta is sorted, so these are in tuple order
        examples = [(tuple(int(v) for v in delta.rows[i]), int(now[i])) for i in negative[:limit]]
        return len(negative), examples

    def output_figures(self, query: str, epoch: int) -> tuple[int, int] | None:
        """On the driver: the output's distinct tuples and its count (summed multiplicity) as
        of `epoch`; None when the step runs on the executors.

        The output as of the epoch is the index of its batches before it plus the epoch's batch:
        a tuple of the epoch's batch counts when it enters or leaves the non-zero support.
        """
        name = output_trace_name(query)
        layers = self._driver_layers(epoch, [name])
        if layers is None:
            return None
        before = layers.traces[name]
        rows, count = _figures(before.base, before.recent)
        delta = layers.deltas.get(name)
        if delta is not None:
            order = tuple(range(delta.width))
            old = lookup_sum(layers.layers(name, None, order, Version.OLD), delta.rows)
            rows += _support_change(old, old + delta.diff)
            count += int(delta.diff.sum())
        return rows, count

    # -- provenance ------------------------------------------------------------------------
    def stale(self, manifest: Manifest | None = None) -> dict[str, list[int]]:
        """Every derived trace's epochs whose batch is not what it would be computed from now.

        A batch is stale when the batches it was computed from have been replaced since, or
        when one of them is itself stale. Reads the manifest only (no Spark work).
        """
        manifest = manifest or self.store.current()
        digests = _Digests(manifest)
        stale: dict[str, set[int]] = {}
        for name, inputs in self.sources.items():  # sources come before their readers
            trace = manifest.trace(name)
            stale[name] = {
                b.time
                for b in (trace.batches if trace is not None else ())
                if b.inputs != digests.of(inputs, b.time) or _reads_stale(inputs, stale, b.time)
            }
        return {name: sorted(times) for name, times in stale.items() if times}

    def changes(self, name: str, epoch: int, manifest: Manifest | None = None) -> DataFrame:
        """A trace's stored change at `epoch` (columns.., diff)."""
        trace = (manifest or self.store.current()).trace(name)
        if trace is None:
            raise StateError(f"{name!r} is not in the state at {self.store.root}")
        return self.store.read(trace, [b for b in trace.batches if b.time == epoch]).drop(TIME)

    def query_changes(self, query: str, epoch: int, manifest: Manifest | None = None) -> DataFrame:
        """The sum of a query's stored rule outputs at `epoch`, consolidated (not yet recorded)."""
        plan = self.engine.plans[query]
        cols = relation_columns(len(plan.query.head))
        manifest = manifest or self.store.current()
        frames = [
            self.changes_or_empty(rule_trace_name(query, r.delta), cols, epoch, manifest)
            for r in plan.rules
        ]
        total = frames[0]
        for f in frames[1:]:
            total = total.unionByName(f)
        return consolidate(total, cols)

    def changes_or_empty(
        self, name: str, cols: Sequence[str], epoch: int, manifest: Manifest | None = None
    ) -> DataFrame:
        manifest = manifest or self.store.current()
        if manifest.trace(name) is None:
            return self.engine.spark.createDataFrame([], update_schema(cols, with_time=False))
        return self.changes(name, epoch, manifest)

    def output(self, query: str, epoch: int) -> DataFrame:
        """A query's accumulated output as of `epoch` (c0.., diff)."""
        return self.engine.output(query, epoch)

    def relation(self, relation: str, epoch: int) -> DataFrame:
        """A relation's accumulated contents as of `epoch` (c0.., diff)."""
        return self.engine.relation(relation, epoch)

    def negative(self, relation: str, epoch: int) -> DataFrame:
        """Tuples whose accumulated multiplicity at `epoch` is negative."""
        return self.relation(relation, epoch).where(F.col(DIFF) < 0)


def _figures(base: Layer, recent: Layer) -> tuple[int, int]:
    """Distinct non-zero tuples and summed multiplicity of a trace held as base + recent."""
    rows, count = len(base), int(base.diff.sum())
    if len(recent):
        old = base.lookup(recent.rows)
        rows += _support_change(old, old + recent.diff)
        count += int(recent.diff.sum())
    return rows, count


def _support_change(old: np.ndarray, now: np.ndarray) -> int:
    """Tuples entering the non-zero support minus tuples leaving it (multiplicities old -> now)."""
    return int(
        np.count_nonzero((old == 0) & (now != 0)) - np.count_nonzero((old != 0) & (now == 0))
    )


# A derived trace's batch at t is computed from, per source trace, the batches up to t
# ("upto"), before t ("before"), or at t alone ("at").
Sources = tuple[tuple[str, str], ...]


def derivations(engine: Engine) -> dict[str, Sources]:
    """What each derived trace is computed from, sources listed before their readers.

    Counts from their relation up to the epoch; a rule from its query's relations up to the
    epoch and from exactly the counts its steps read, as of the version it reads them (new: up
    to the epoch, old: before it); a query's change from its rules' changes at the epoch.
    """
    out: dict[str, Sources] = {}
    for a in engine.arrangements:
        if a.kind is Kind.COUNTS:
            out[counts_trace_name(a)] = ((relation_trace_name(a.view.relation), "upto"),)
    for query, plan in engine.plans.items():
        relations = sorted({relation_trace_name(r) for r in plan.query.relations})
        for rule in plan.rules:
            reads: dict[str, str] = {}
            for step in rule.steps:
                for x in step.extenders:
                    for a in (x.counts, x.support):
                        if a.kind is Kind.COUNTS:
                            name = counts_trace_name(a)
                            new = x.version is Version.NEW or reads.get(name) == "upto"
                            reads[name] = "upto" if new else "before"
            out[rule_trace_name(query, rule.delta)] = (
                *((n, "upto") for n in relations),
                *sorted(reads.items()),
            )
        out[output_trace_name(query)] = tuple(
            (rule_trace_name(query, r.delta), "at") for r in plan.rules
        )
    return out


def digest(manifest: Manifest, sources: Sources, epoch: int) -> str:
    """A short digest of the batches a derived batch at `epoch` is computed from."""
    return _Digests(manifest).of(sources, epoch)


class _Digests:
    """Digests of many epochs' inputs over one manifest, each source's batches hashed once.

    Per source, a running hash over its batches in time order gives "every batch up to t" in one
    lookup, so naming the stale batches of a long history costs time linear in its batches.
    """

    def __init__(self, manifest: Manifest) -> None:
        self.manifest = manifest
        self._chains: dict[str, tuple[list[int], list[str], list[str]]] = {}

    def _chain(self, name: str) -> tuple[list[int], list[str], list[str]]:
        """The source's batch times, identities and running hashes, in time order.

        A derived batch is a pure function of its inputs, so its identity is its provenance
        (recomputing it from the same inputs changes nothing downstream); an input batch's
        identity is its path.
        """
        if name not in self._chains:
            trace = self.manifest.trace(name)
            batches = sorted(trace.batches, key=lambda b: b.time) if trace is not None else []
            hashes: list[str] = []
            h = ""
            for b in batches:
                h = hashlib.sha256(f"{h}\0{b.inputs or b.path}".encode()).hexdigest()
                hashes.append(h)
            ids = [b.inputs or b.path for b in batches]
            self._chains[name] = ([b.time for b in batches], ids, hashes)
        return self._chains[name]

    def of(self, sources: Sources, epoch: int) -> str:
        parts: list[str] = []
        for name, mode in sources:
            times, ids, hashes = self._chain(name)
            if mode == "at":  # the batch at the epoch alone
                i = bisect.bisect_left(times, epoch)
                parts.append(ids[i] if i < len(times) and times[i] == epoch else "")
            else:  # every batch up to (or before) the epoch: the running hash
                cut = bisect.bisect_right if mode == "upto" else bisect.bisect_left
                i = cut(times, epoch)
                parts.append(hashes[i - 1] if i else "")
        return hashlib.sha256(
            "|".join(f"{n}={p}" for (n, _), p in zip(sources, parts, strict=True)).encode()
        ).hexdigest()[:20]


def _reads_stale(sources: Sources, stale: Mapping[str, set[int]], epoch: int) -> bool:
    for name, mode in sources:
        times = stale.get(name)
        if not times:
            continue
        if mode == "at" and epoch in times:
            return True
        if mode == "upto" and min(times) <= epoch:
            return True
        if mode == "before" and min(times) < epoch:
            return True
    return False


__all__ = ["History", "RuleWork", "derivations", "digest", "output_trace_name", "rule_trace_name"]
