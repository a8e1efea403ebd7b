"""Epoch-addressed maintenance: every step reads and writes one epoch, replacing what was there.

`Engine.apply_epoch` applies epochs once, in increasing order. An orchestrator such as Dagster
needs more: re-running any epoch (a backfill, in any order, in one run or many) and correcting
history (new changes for an old epoch, then every later epoch re-derived). `History` splits an
epoch into steps that are each a pure function of stored batches and each write one batch at
that epoch, *replacing* the batch the trace held at that time:

* `ingest(t, rel, changes)` — the relation's consolidated changes at ``t``;
* `arrange(t, counts)` — a counts arrangement's change at ``t``, from the relation's changes at
  ``t`` and its state before ``t`` (so epoch ``t`` needs ``t - 1`` arranged first);
* `rule(query, i, t)` — one delta rule's output change at ``t``, from the changes at ``t``, the
  state before ``t`` and the new state at ``t``; never from earlier outputs;
* `record(name, t, df)` — store a rule's or a query's output change at ``t``.

On a local state whose traces fit the engine's keyed limits, `arrange`, `derive_rule` and
`derive_output` run on the driver like the engine's keyed path (`wcoj_core.keyed`): the traces
a step reads are indexed as of the epoch (their batches before it) and the epoch's batches are
its deltas. An orchestrator walks a range of epochs oldest first, so the index is kept between
epochs and steps (`_Resident`) and advanced by one epoch's batches at a time; each batch the
keyed path writes has the schema Spark's would, and the same provenance.

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
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from wcoj_core import keyed as kd
from wcoj_core.arrangement import (
    Snapshot,
    counts_from_support,
    counts_trace_name,
    relation_trace_name,
    support_changes,
)
from wcoj_core.engine import Engine, observed, output_trace_name
from wcoj_core.errors import ConcurrentCommit, InputError, QueryError, StateError
from wcoj_core.extend import StepObservations
from wcoj_core.files import LocalFiles
from wcoj_core.query.plan import Arrangement, Kind, Version
from wcoj_core.state import Batch, Manifest, Trace
from wcoj_core.updates import DIFF, TIME, consolidate, relation_columns, update_schema

RETRIES = 50
# The as-of indexes `_Resident` keeps per trace besides the one it built from the files.
RESIDENT_KEEP = 4


def rule_trace_name(query: str, rule: int) -> str:
    return f"rule/{query}/{rule}"


@dataclass(frozen=True, slots=True)
class RuleWork:
    """What one delta rule did at an epoch: candidates proposed and tuples validated."""

    proposed: int
    validated: int
    path: str  # "keyed" or "spark"


class History:
    """Epoch-addressed, idempotent steps over the traces of an `Engine`'s state directory."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.store = engine.store
        self.sources = derivations(engine)
        local = isinstance(self.store.files, LocalFiles)
        self._resident = _Resident(self.store.files.root) if local else None

    @property
    def local_root(self) -> str | None:
        """The state's folder when it is on this machine's file system (else None)."""
        return self.store.files.root if self._resident is not None else None

    @property
    def keyed_epoch_rows(self) -> int:
        """The most changed rows an epoch's step takes on the driver (0: never)."""
        return self.engine.keyed_epoch_rows if self._resident is not None else 0

    # -- committing one batch --------------------------------------------------------------
    def _trace(self, name: str, columns: Sequence[str]) -> Trace:
        m = self.engine._register(self.store.current(), [], build_counts=False)
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
            m = self.engine._register(base, [], build_counts=False)
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

    # -- the steps -------------------------------------------------------------------------
    def ingest(self, epoch: int, relation: str, changes: DataFrame | kd.Layer) -> Batch:
        """A relation's changes at `epoch` (c0.., diff), consolidated, replacing earlier ones.

        `changes` is a Spark DataFrame, or a consolidated `kd.Layer` already on the driver (a
        small epoch, written without Spark).
        """
        arity = self.engine.relations.get(relation)
        if arity is None:
            raise QueryError(f"no query uses relation {relation!r}")
        cols = relation_columns(arity)
        name = relation_trace_name(relation)
        if isinstance(changes, kd.Layer):
            if changes.width != arity:
                raise InputError(
                    f"changes have {changes.width} columns, not {arity}",
                    source=f"relation {relation!r} at {epoch}",
                )
            trace = self._trace(name, cols)
            existing = [b for b in trace.batches if b.time == epoch]
            if existing and self._resident is not None:
                stored = self._resident.read(trace, existing)
                if np.array_equal(stored.rows, changes.rows) and np.array_equal(
                    stored.diff, changes.diff
                ):
                    return existing[0]  # a re-run: keep the batch, so nothing derived goes stale
            return self._write_keyed(trace, changes.rows, changes.diff, epoch, "")
        missing = [c for c in (*cols, DIFF) if c not in changes.columns]
        if missing:
            raise InputError(
                f"changes lack columns {missing}", source=f"relation {relation!r} at {epoch}"
            )
        changes = changes.select(*cols, DIFF)
        trace = self.store.current().trace(name)
        existing = [b for b in trace.batches if b.time == epoch] if trace is not None else []
        if existing and trace is not None and self._same(trace, existing[0], changes, cols):
            return existing[0]  # a re-run: keep the batch, so nothing derived goes stale
        return self.record(name, epoch, changes)

    def _same(self, trace: Trace, batch: Batch, changes: DataFrame, cols: Sequence[str]) -> bool:
        """Whether a stored batch holds exactly `changes` (consolidated), as multisets."""
        old = self.store.read(trace, [batch]).select(*cols, DIFF)
        new = consolidate(changes, cols).select(*cols, DIFF)
        return old.exceptAll(new).unionByName(new.exceptAll(old)).limit(1).count() == 0

    def counts(self) -> tuple[Arrangement, ...]:
        """The counts arrangements the engine's plans read."""
        return tuple(a for a in self.engine.arrangements if a.kind is Kind.COUNTS)

    def arrange(self, epoch: int, arrangement: Arrangement) -> Batch:
        """A counts arrangement's change at `epoch`; needs every earlier epoch arranged."""
        snapshot = self.snapshot(epoch)
        name = counts_trace_name(arrangement)
        inputs = digest(snapshot.manifest, self.sources[name], epoch)
        cols = [f"c{k}" for k in arrangement.key]
        trace = self._trace(name, cols)
        relation = relation_trace_name(arrangement.view.relation)
        layers = self._keyed_layers(snapshot.manifest, epoch, [relation])
        if layers is not None:
            if relation in layers.deltas:
                support = kd.support_delta(layers, arrangement.view)
                layer = kd.counts_delta(support, arrangement.key)
            else:
                layer = kd.Layer.empty(len(cols))
            return self._write_keyed(trace, layer.rows, layer.diff, epoch, inputs)
        if snapshot.has_changes(arrangement.view.relation):
            change = counts_from_support(
                support_changes(snapshot, arrangement.view), arrangement.key
            )
        else:
            change = self.engine.spark.createDataFrame([], update_schema(cols, with_time=False))
        batch = self.store.write_batch(trace, change, epoch, inputs=inputs)
        self._replace(name, trace.columns, batch)
        return batch

    def snapshot(self, epoch: int) -> Snapshot:
        return Snapshot(self.store, self.store.current(), {}, epoch)

    def rule(self, query: str, index: int, epoch: int) -> tuple[DataFrame, list[StepObservations]]:
        """One delta rule's output change at `epoch` (c0.., diff; lazy) on Spark's path."""
        df, observations, _ = self._rule(query, index, epoch)
        return df, observations

    def _rule(
        self, query: str, index: int, epoch: int
    ) -> tuple[DataFrame, list[StepObservations], str]:
        plan = self.engine.plans[query]
        rule = plan.rules[index]
        snapshot = self.snapshot(epoch)
        inputs = digest(snapshot.manifest, self.sources[rule_trace_name(query, index)], epoch)
        observations: list[StepObservations] = []
        if self.engine._rule_is_empty(plan, rule, snapshot):
            width = len(plan.query.head)
            schema = update_schema(relation_columns(width), with_time=False)
            return self.engine.spark.createDataFrame([], schema), observations, inputs
        return self.engine.rule_output(plan, rule, snapshot, observations), observations, inputs

    def derive_rule(self, query: str, index: int, epoch: int) -> tuple[Batch, RuleWork]:
        """Compute and store one delta rule's output change at `epoch`, with its provenance."""
        name = rule_trace_name(query, index)
        plan = self.engine.plans[query]
        rule = plan.rules[index]
        snapshot = self.snapshot(epoch)
        layers = self._keyed_layers(snapshot.manifest, epoch, [n for n, _ in self.sources[name]])
        if layers is None:
            df, observations, inputs = self._rule(query, index, epoch)
            batch = self.record(name, epoch, df, inputs)
            proposed = sum(observed(o.proposed, "rows") or 0 for o in observations)
            validated = sum(observed(o.validated, "rows") or 0 for o in observations)
            return batch, RuleWork(proposed, validated, "spark")
        inputs = digest(snapshot.manifest, self.sources[name], epoch)
        trace = self._trace(name, relation_columns(len(plan.query.head)))
        if self.engine._rule_is_empty(plan, rule, snapshot):
            empty = kd.Layer.empty(len(trace.columns))
            return self._write_keyed(trace, empty.rows, empty.diff, epoch, inputs), RuleWork(
                0, 0, "keyed"
            )
        bindings, counts = kd.run_rule(plan, rule, layers, [])
        rows, diff = kd.output_changes([bindings], plan.query.head)
        work = RuleWork(sum(c.proposed for c in counts), sum(c.validated for c in counts), "keyed")
        return self._write_keyed(trace, rows, diff, epoch, inputs), work

    def derive_output(self, query: str, epoch: int) -> Batch:
        """Sum the stored rule outputs at `epoch` and store them as the query's change."""
        manifest = self.store.current()
        name = output_trace_name(query)
        inputs = digest(manifest, self.sources[name], epoch)
        if self._keyed_fits(manifest, epoch, [n for n, _ in self.sources[name]]):
            assert self._resident is not None
            cols = relation_columns(len(self.engine.plans[query].query.head))
            parts = [kd.Layer.empty(len(cols))] + [
                self._resident.read(t, [b for b in t.batches if b.time == epoch])
                for n, _ in self.sources[name]
                if (t := manifest.trace(n)) is not None
            ]
            total = kd.Layer.build(
                np.concatenate([p.rows for p in parts]), np.concatenate([p.diff for p in parts])
            )
            return self._write_keyed(self._trace(name, cols), total.rows, total.diff, epoch, inputs)
        return self.record(name, epoch, self.query_changes(query, epoch, manifest), inputs)

    def negative_changed(
        self, relation: str, epoch: int, limit: int
    ) -> tuple[int, list[tuple[tuple[int, ...], int]]] | None:
        """On the keyed path: tuples changed at `epoch` whose multiplicity as of it is negative.

        Returns their number and the first `limit` of them in tuple order, with their
        multiplicities; None when the step stays on Spark's path.
        """
        name = relation_trace_name(relation)
        layers = self._keyed_layers(self.store.current(), epoch, [name])
        if layers is None:
            return None
        delta = layers.deltas.get(name)
        if delta is None:
            return 0, []
        order = tuple(range(delta.width))
        old = kd.lookup_sum(layers.layers(name, None, order, Version.OLD), delta.rows)
        now = old + delta.diff
        negative = np.flatnonzero(now < 0)  # the delta is sorted, so these are in tuple order
        examples = [(tuple(int(v) for v in delta.rows[i]), int(now[i])) for i in negative[:limit]]
        return len(negative), examples

    def output_figures(self, query: str, epoch: int) -> tuple[int, int] | None:
        """On the keyed path: the output's distinct tuples and its count (summed multiplicity)
        as of `epoch`; None when the step stays on Spark's path.

        The output as of the epoch is the index of its batches before it plus the epoch's batch:
        a tuple of the epoch's batch counts when it enters or leaves the non-zero support.
        """
        name = output_trace_name(query)
        layers = self._keyed_layers(self.store.current(), epoch, [name])
        if layers is None:
            return None
        before = layers.index.traces[name]
        rows, count = self._resident_figures(before)
        delta = layers.deltas.get(name)
        if delta is not None:
            order = tuple(range(delta.width))
            old = kd.lookup_sum(layers.layers(name, None, order, Version.OLD), delta.rows)
            now = old + delta.diff
            rows += _support_change(old, now)
            count += int(delta.diff.sum())
        return rows, count

    def _resident_figures(self, index: kd.TraceIndex) -> tuple[int, int]:
        """Distinct non-zero tuples and summed multiplicity of an indexed trace (base + recent)."""
        rows, count = len(index.base), int(index.base.diff.sum())
        if len(index.recent):
            old = index.base.lookup(index.recent.rows)
            now = old + index.recent.diff
            rows += _support_change(old, now)
            count += int(index.recent.diff.sum())
        return rows, count

    # -- the keyed path --------------------------------------------------------------------
    def _keyed_fits(self, manifest: Manifest, epoch: int, names: Sequence[str]) -> bool:
        """Whether a step reading `names` at `epoch` runs on the driver (the engine's limits)."""
        engine = self.engine
        if self._resident is None or engine.keyed_epoch_rows <= 0:
            return False
        traces = [t for n in names if (t := manifest.trace(n)) is not None]
        changed = sum(b.rows for t in traces for b in t.batches if b.time == epoch)
        held = sum(t.rows(epoch) for t in traces)
        return changed <= engine.keyed_epoch_rows and held <= engine.keyed_max_rows

    def _keyed_layers(
        self, manifest: Manifest, epoch: int, names: Sequence[str]
    ) -> kd.EpochLayers | None:
        """The traces as of `epoch`: indexed before it, its own batches as deltas; or None.

        None when the step stays on Spark's path (a remote state, the keyed path turned off, or
        traces beyond the engine's keyed limits).
        """
        if not self._keyed_fits(manifest, epoch, names):
            return None
        assert self._resident is not None
        registered = self.engine._register(manifest, [], build_counts=False)
        index = kd.KeyedIndex(self.store.files.root)
        deltas: dict[str, kd.Layer] = {}
        for name in names:
            trace = registered.traces[name]
            index.traces[name] = self._resident.before(trace, epoch)
            now = [b for b in trace.batches if b.time == epoch]
            if any(b.rows for b in now):
                deltas[name] = self._resident.read(trace, now)
        return kd.EpochLayers(index, deltas)

    def _write_keyed(
        self, trace: Trace, rows: np.ndarray, diff: np.ndarray, epoch: int, inputs: str
    ) -> Batch:
        """Write a batch computed on the driver and commit it in place of the epoch's batch."""
        assert self._resident is not None
        batch = replace(self._resident.write(trace, rows, diff, epoch), inputs=inputs)
        self._replace(trace.name, trace.columns, batch)
        return batch

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


def _support_change(old: np.ndarray, now: np.ndarray) -> int:
    """Tuples entering the non-zero support minus tuples leaving it (multiplicities old -> now)."""
    return int(
        np.count_nonzero((old == 0) & (now != 0)) - np.count_nonzero((old != 0) & (now == 0))
    )


class _Resident:
    """Traces indexed as of an epoch (their batches before it), kept for the next step.

    A step over a range of epochs asks for ``t0``, ``t0 + 1``, ... in turn: each index is the
    previous one advanced by one epoch's batches (`kd.TraceIndex.advanced`), so only the first
    reads the trace's files. Several steps walk the same range one after another (the counts,
    then each rule), so the index built from the files is kept besides the latest few, and a
    step starting where another started reuses it. An index is found by the batch paths it
    covers: a replaced batch (corrected history) has a new path, so nothing stale is reused.
    """

    def __init__(self, root: str) -> None:
        self.files = kd.KeyedIndex(root)
        self._built: dict[str, list[kd.TraceIndex]] = {}
        self._latest: dict[str, list[kd.TraceIndex]] = {}
        self._views: dict[str, tuple[kd.Layer, dict[tuple[object, ...], kd.Layer]]] = {}

    def read(self, trace: Trace, batches: Sequence[Batch]) -> kd.Layer:
        return self.files.read(trace, batches)

    def write(self, trace: Trace, rows: np.ndarray, diff: np.ndarray, time: int) -> Batch:
        return self.files.write(trace, rows, diff, time)

    def before(self, trace: Trace, epoch: int) -> kd.TraceIndex:
        """The trace's batches with time before `epoch`, indexed."""
        index = self._find(trace, epoch)
        self._share_views(trace.name, index)
        return index

    def _find(self, trace: Trace, epoch: int) -> kd.TraceIndex:
        wanted = [b for b in trace.batches if b.time < epoch]
        paths = tuple(b.path for b in wanted)
        start = None
        for index in self._known(trace.name):
            if index.paths == paths:
                return index
            covered = len(index.paths)
            if paths[:covered] == index.paths and (start is None or covered > len(start.paths)):
                start = index
        if start is None:
            start = kd.TraceIndex(
                trace.columns, self.read(trace, wanted), kd.Layer.empty(len(trace.columns)), paths
            )
            built = self._built.setdefault(trace.name, [])
            built[:] = [*built[-(RESIDENT_KEEP - 1) :], start]
            return start
        index = start
        for b in wanted[len(start.paths) :]:
            index = index.advanced(self.read(trace, [b]), b.path)
        latest = self._latest.setdefault(trace.name, [])
        latest[:] = [*latest[-(RESIDENT_KEEP - 1) :], index]
        return index

    def _known(self, name: str) -> list[kd.TraceIndex]:
        return [*self._built.get(name, []), *self._latest.get(name, [])]

    def _share_views(self, name: str, index: kd.TraceIndex) -> None:
        """Give `index` every view of its base layer that a step built on a sibling index.

        Indexes walked by different steps share a base layer but each memoizes the views it was
        asked for; without sharing, a rule reading another view than the step before it would
        sort the whole base again at every epoch.
        """
        pool = self._views.get(name)
        if pool is None or pool[0] is not index.base:
            pool = (index.base, {})
            self._views[name] = pool
        for other in [*self._known(name), index]:
            if other.base is index.base:
                pool[1].update({k: v for k, v in other.derived.items() if k[0] == "base"})
        index.derived.update(pool[1])


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
