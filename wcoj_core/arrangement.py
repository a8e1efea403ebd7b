"""Arrangements: a relation's persisted trace and the views the plans read from it.

Every relation ``R`` has one trace, ``rel/R``, of consolidated update batches. An atom sees it
through an `AtomView` (a fused filter-and-project `Linear` operator: constants select, repeated
variables select equal columns), and the plans read three kinds of views of it:

* **self** — the view's tuples with their multiplicities. Keyed by some columns it *proposes*
  (forward, reverse, ...); keyed by all of them it *validates*. It is the relation trace itself,
  read through the atom's view, so forward and reverse never store a copy.
* **counts[K]** — for each key ``k`` over columns ``K``, the number of view tuples with non-zero
  accumulated multiplicity whose ``K`` columns equal ``k``. When a step completes an atom this is
  the number of distinct candidate values; keyed by more columns it is the support set that
  partial steps propose from and validate against. Counts are persisted as their own trace and
  maintained from each epoch's changes only: a tuple entering the support (multiplicity turning
  non-zero) adds one to its keys, a tuple leaving subtracts one.

Each view reads as of the *old* state (batches before ``t``) or the *new* state (up to ``t``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from wcoj_core import linear
from wcoj_core.query.ir import Const
from wcoj_core.query.plan import Arrangement, AtomView, Kind
from wcoj_core.state import Batch, Manifest, StateStore, Trace
from wcoj_core.updates import DIFF, TIME, consolidate, relation_columns


def relation_trace_name(relation: str) -> str:
    return f"rel/{relation}"


def counts_trace_name(arrangement: Arrangement) -> str:
    return f"counts/{arrangement.view}/{','.join(map(str, arrangement.key))}"


def view_operator(view: AtomView) -> linear.Linear:
    """The linear operator from relation tuples to view tuples (select, then project)."""
    first: dict[int, int] = {}
    for col, p in enumerate(view.pattern):
        if isinstance(p, int):
            first.setdefault(p, col)

    def keep(row: linear.Row) -> Column:
        cond = F.lit(True)
        for col, p in enumerate(view.pattern):
            if isinstance(p, Const):
                cond = cond & (row[f"c{col}"] == F.lit(p.value))
            elif first[p] != col:
                cond = cond & (row[f"c{col}"] == row[f"c{first[p]}"])
        return cond

    def project(row: linear.Row) -> linear.Row:
        return {f"c{j}": row[f"c{first[j]}"] for j in range(view.arity)}

    if view.is_identity:
        return linear.identity()
    return linear.filter_(keep, "select").then(linear.map_(project, "project"))


@dataclass(frozen=True, slots=True)
class Snapshot:
    """What a rule can read at epoch ``time``: the old state (batches before it) and the new one.

    The changes at ``time`` are the trace's batches stamped ``time`` — staged ones (not yet
    committed, when an epoch is being applied) take their place. So the same snapshot serves an
    epoch being applied and an epoch long committed (a backfill re-running history).

    Views are memoized: every rule of every query reading the same view at the same version gets
    the same DataFrame, so each trace is listed and read once per epoch and Spark can reuse the
    exchanges built on it.
    """

    store: StateStore
    manifest: Manifest
    staged: dict[str, Batch]
    time: int
    _memo: dict[tuple[object, ...], DataFrame] = field(default_factory=dict, compare=False)

    def _cached(self, key: tuple[object, ...], build: Callable[[], DataFrame]) -> DataFrame:
        if key not in self._memo:
            self._memo[key] = build()
        return self._memo[key]

    def _changes(self, trace: Trace) -> list[Batch]:
        if trace.name in self.staged:
            return [self.staged[trace.name]]
        return [b for b in trace.batches if b.time == self.time]

    def _batches(self, trace: Trace, new: bool) -> list[Batch]:
        batches = list(trace.visible(self.time, strict=True))
        return batches + self._changes(trace) if new else batches

    def trace(self, name: str) -> Trace:
        found = self.manifest.trace(name)
        if found is None:
            raise KeyError(f"trace {name!r} is not in the state")
        return found

    def is_empty(self, name: str, new: bool) -> bool:
        """True when the collection certainly holds nothing (no stored rows at all)."""
        return sum(b.rows for b in self._batches(self.trace(name), new)) == 0

    def has_changes(self, relation: str) -> bool:
        """True when the relation may have changed at this epoch (stored rows at ``time``)."""
        return sum(b.rows for b in self._changes(self.trace(relation_trace_name(relation)))) > 0

    def delta(self, relation: str) -> DataFrame:
        """The changes of a relation at this epoch, as (c0.., diff)."""
        trace = self.trace(relation_trace_name(relation))
        batches = self._changes(trace)
        return self._cached(("delta", relation), lambda: self.store.read(trace, batches).drop(TIME))

    def accumulated(self, name: str, new: bool) -> DataFrame:
        """A trace accumulated as of old or new: (columns.., diff) with non-zero diffs."""
        trace = self.trace(name)
        batches = self._batches(trace, new)

        def build() -> DataFrame:
            df = self.store.read(trace, batches).drop(TIME)
            # A single batch is consolidated when written; several must be summed.
            return df if len(batches) <= 1 else consolidate(df, trace.columns)

        return self._cached(("acc", name, new), build)

    def self_view(self, view: AtomView, new: bool, linear: bool = False) -> DataFrame:
        """The view's tuples with multiplicities as of old or new: (c0.., diff).

        With `linear` the batches are not summed: a tuple may appear once per batch, with
        multiplicities that add up to its own. That is all a linear use needs (a join that
        multiplies multiplicities, a semi-join followed by a sum) and it spares consolidating
        the whole relation to read a few of its tuples.
        """
        if not linear:
            return self._cached(
                ("self", view, new),
                lambda: view_operator(view).apply(
                    self.accumulated(relation_trace_name(view.relation), new)
                ),
            )
        name = relation_trace_name(view.relation)
        trace = self.trace(name)
        batches = self._batches(trace, new)
        return self._cached(
            ("linear", view, new),
            lambda: view_operator(view).apply(self.store.read(trace, batches).drop(TIME)),
        )

    def delta_view(self, view: AtomView) -> DataFrame:
        """The view's changes at this epoch: (c0.., diff)."""
        return self._cached(
            ("dview", view), lambda: view_operator(view).apply(self.delta(view.relation))
        )

    def counts(self, arrangement: Arrangement, new: bool) -> DataFrame:
        """counts[K] as of old or new: (c<k>.., diff) where diff is the count (> 0)."""
        return self.accumulated(counts_trace_name(arrangement), new)


def support_changes(snapshot: Snapshot, view: AtomView) -> DataFrame:
    """View tuples entering (+1) or leaving (-1) the non-zero support at this epoch.

    Reads the old multiplicities of the changed tuples only (a semi-join of the trace with the
    changes), so the work follows the changes rather than the relation.
    """
    cols = relation_columns(view.arity)
    delta = snapshot.delta_view(view)
    changed = delta.select(*cols)
    if snapshot.is_empty(relation_trace_name(view.relation), new=False):
        old = changed.limit(0).withColumn("_old", F.lit(0).cast("long"))
    else:
        touched = snapshot.self_view(view, new=False, linear=True).join(
            F.broadcast(changed), cols, "left_semi"
        )
        old = consolidate(touched, cols).withColumnRenamed(DIFF, "_old")
    joined = delta.join(old, cols, "left").withColumn("_old", F.coalesce("_old", F.lit(0)))
    was = (F.col("_old") != 0).cast("long")
    now = ((F.col("_old") + F.col(DIFF)) != 0).cast("long")
    return joined.select(*cols, (now - was).alias(DIFF)).where(F.col(DIFF) != 0)


def counts_from_support(support: DataFrame, key: Sequence[int]) -> DataFrame:
    """Group support (+1/-1 per tuple) by the key columns: a counts delta (or base)."""
    cols = [f"c{k}" for k in key]
    grouped = support.groupBy(*cols) if cols else support.groupBy()
    return grouped.agg(F.sum(DIFF).alias(DIFF)).where(F.col(DIFF) != 0)


def counts_columns(arrangement: Arrangement) -> tuple[str, ...]:
    assert arrangement.kind is Kind.COUNTS
    return tuple(f"c{k}" for k in arrangement.key)
