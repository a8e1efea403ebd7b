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

Replacing (rather than appending) makes every step idempotent: running it twice, or re-running it
after its inputs were corrected, stores exactly one answer per epoch. Each step commits its own
manifest generation and retries when another writer committed first.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from wcoj_core.arrangement import (
    Snapshot,
    counts_from_support,
    counts_trace_name,
    relation_trace_name,
    support_changes,
)
from wcoj_core.engine import Engine, output_trace_name
from wcoj_core.errors import ConcurrentCommit, InputError, QueryError, StateError
from wcoj_core.extend import StepObservations
from wcoj_core.query.plan import Arrangement, Kind
from wcoj_core.state import Batch, Trace
from wcoj_core.updates import DIFF, TIME, consolidate, relation_columns, update_schema

RETRIES = 50


def rule_trace_name(query: str, rule: int) -> str:
    return f"rule/{query}/{rule}"


class History:
    """Epoch-addressed, idempotent steps over the traces of an `Engine`'s state directory."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.store = engine.store

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

    def record(self, name: str, epoch: int, df: DataFrame) -> Batch:
        """Store update rows (trace columns + diff) as the trace's batch at `epoch`."""
        cols = [c for c in df.columns if c not in (TIME, DIFF)]
        trace = self._trace(name, cols)
        batch = self.store.write_batch(trace, consolidate(df.select(*cols, DIFF), cols), epoch, 2)
        self._replace(name, trace.columns, batch)
        return batch

    # -- the steps -------------------------------------------------------------------------
    def ingest(self, epoch: int, relation: str, changes: DataFrame) -> Batch:
        """A relation's changes at `epoch` (c0.., diff), consolidated, replacing earlier ones."""
        arity = self.engine.relations.get(relation)
        if arity is None:
            raise QueryError(f"no query uses relation {relation!r}")
        cols = relation_columns(arity)
        missing = [c for c in (*cols, DIFF) if c not in changes.columns]
        if missing:
            raise InputError(
                f"changes lack columns {missing}", source=f"relation {relation!r} at {epoch}"
            )
        return self.record(relation_trace_name(relation), epoch, changes.select(*cols, DIFF))

    def counts(self) -> tuple[Arrangement, ...]:
        """The counts arrangements the engine's plans read."""
        return tuple(a for a in self.engine.arrangements if a.kind is Kind.COUNTS)

    def arrange(self, epoch: int, arrangement: Arrangement) -> Batch:
        """A counts arrangement's change at `epoch`; needs every earlier epoch arranged."""
        snapshot = self.snapshot(epoch)
        name = counts_trace_name(arrangement)
        cols = [f"c{k}" for k in arrangement.key]
        if snapshot.has_changes(arrangement.view.relation):
            change = counts_from_support(
                support_changes(snapshot, arrangement.view), arrangement.key
            )
        else:
            change = self.engine.spark.createDataFrame([], update_schema(cols, with_time=False))
        trace = self._trace(name, cols)
        batch = self.store.write_batch(trace, change, epoch)
        self._replace(name, trace.columns, batch)
        return batch

    def snapshot(self, epoch: int) -> Snapshot:
        return Snapshot(self.store, self.store.current(), {}, epoch)

    def rule(self, query: str, index: int, epoch: int) -> tuple[DataFrame, list[StepObservations]]:
        """One delta rule's output change at `epoch` (c0.., diff; lazy) and its observations."""
        plan = self.engine.plans[query]
        rule = plan.rules[index]
        snapshot = self.snapshot(epoch)
        observations: list[StepObservations] = []
        if self.engine._rule_is_empty(plan, rule, snapshot):
            width = len(plan.query.head)
            schema = update_schema(relation_columns(width), with_time=False)
            return self.engine.spark.createDataFrame([], schema), observations
        return self.engine.rule_output(plan, rule, snapshot, observations), observations

    def changes(self, name: str, epoch: int) -> DataFrame:
        """A trace's stored change at `epoch` (columns.., diff)."""
        trace = self.store.current().trace(name)
        if trace is None:
            raise StateError(f"{name!r} is not in the state at {self.store.root}")
        return self.store.read(trace, [b for b in trace.batches if b.time == epoch]).drop(TIME)

    def query_changes(self, query: str, epoch: int) -> DataFrame:
        """The sum of a query's stored rule outputs at `epoch`, consolidated (not yet recorded)."""
        plan = self.engine.plans[query]
        cols = relation_columns(len(plan.query.head))
        frames = [
            self.changes_or_empty(rule_trace_name(query, r.delta), cols, epoch) for r in plan.rules
        ]
        total = frames[0]
        for f in frames[1:]:
            total = total.unionByName(f)
        return consolidate(total, cols)

    def changes_or_empty(self, name: str, cols: Sequence[str], epoch: int) -> DataFrame:
        if self.store.current().trace(name) is None:
            return self.engine.spark.createDataFrame([], update_schema(cols, with_time=False))
        return self.changes(name, epoch)

    def output(self, query: str, epoch: int) -> DataFrame:
        """A query's accumulated output as of `epoch` (c0.., diff)."""
        return self.engine.output(query, epoch)

    def relation(self, relation: str, epoch: int) -> DataFrame:
        """A relation's accumulated contents as of `epoch` (c0.., diff)."""
        return self.engine.relation(relation, epoch)

    def negative(self, relation: str, epoch: int) -> DataFrame:
        """Tuples whose accumulated multiplicity at `epoch` is negative."""
        return self.relation(relation, epoch).where(F.col(DIFF) < 0)


__all__ = ["History", "output_trace_name", "rule_trace_name"]
