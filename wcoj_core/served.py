"""What an engine serves and the state it serves it from: the two things an epoch is handed.

`Served` is planned once and frozen: the queries, each relation's `RelationSpec`, the plans, the
counts traces and index views they read, the `StatePlan`, the `Limits` and the budget's shares.
`StateAccess` reaches the state: its `Store`, `Batches`, the `SparkStarter` and
`executors_warm`. `wcoj_core.engine.Engine` is a façade over one of each; the modules below it
take these two, never the engine.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from wcoj_core.budget import MemoryBudget, Shares
from wcoj_core.deploy import ONE_TASK_ROWS, Limits
from wcoj_core.errors import QueryError, StateError
from wcoj_core.indexes import ViewKey, counts_names, plan_views
from wcoj_core.kernel.layer import Layer
from wcoj_core.meaning import Meaning, RelationSpec, relation_specs
from wcoj_core.query.ir import Query, Var
from wcoj_core.query.plan import Arrangement, Plan, check_width, plan_query
from wcoj_core.session import SparkStarter
from wcoj_core.store import manifest as mf
from wcoj_core.store.batches import Batches
from wcoj_core.store.store import Store
from wcoj_core.traces import output_trace_name, relation_columns, relation_trace_name

if TYPE_CHECKING:
    import numpy as np
    from pyspark.sql import SparkSession

__all__ = ["Served", "StateAccess", "served_specs"]


def served_specs(
    queries: Sequence[Query],
    relations: Mapping[str, RelationSpec] | None = None,
    undirected: Sequence[str] = (),
) -> dict[str, RelationSpec]:
    """Each relation the queries read, with its spec: `relations` when given (checked against
    the arities the queries use), else `relation_specs` (the relations in `undirected` are
    undirected sets, the others bags). A `QueryError` names what does not fit."""
    if not queries:
        raise QueryError("an engine needs at least one query")
    if len({q.name for q in queries}) != len(queries):
        raise QueryError("two queries share a name; give each query its own name")
    arities: dict[str, int] = {}
    for q in queries:
        for rel, arity in q.relations.items():
            if arities.setdefault(rel, arity) != arity:
                raise QueryError(
                    f"relation {rel!r} has arity {arities[rel]} in one query and {arity} in "
                    f"{q.name!r}"
                )
    specs = (
        dict(relations) if relations is not None else relation_specs(arities, undirected=undirected)
    )
    missing = sorted(set(arities) - set(specs))
    if missing:
        raise QueryError(f"no relation spec for {', '.join(missing)}")
    specs = {r: specs[r] for r in sorted(arities)}
    for rel, spec in specs.items():
        if spec.arity != arities[rel]:
            raise QueryError(
                f"relation {rel!r} is declared with arity {spec.arity}, the queries use "
                f"{arities[rel]}"
            )
    return specs


@dataclass(frozen=True, slots=True)
class Served:
    """What an engine serves, planned once (see the module): `relations` and their arities,
    `keep_rules`, `landing_rows` (cap per epoch), `compact_every` (0: never), `budget` and its
    `shares`, `worker_bytes` (an executor's Python worker; 0: the kernel's own limits)."""

    queries: dict[str, Query]
    specs: dict[str, RelationSpec]
    relations: dict[str, int]
    plans: dict[str, Plan]
    counts_traces: dict[str, tuple[str, ...]]
    views: dict[str, frozenset[ViewKey]]
    record: mf.StatePlan
    limits: Limits
    budget: MemoryBudget
    shares: Shares
    keep_rules: bool = False
    landing_rows: int | None = None
    compact_every: int = 0
    worker_bytes: int = 0

    @classmethod
    def plan(
        cls,
        queries: Sequence[Query],
        specs: Mapping[str, RelationSpec],
        sizes: Mapping[str, int],
        orders: Mapping[str, Mapping[int, Sequence[Var]]] | None,
        *,
        limits: Limits,
        shares: Shares,
        budget: MemoryBudget | None = None,
        keep_rules: bool = False,
        landing_rows: int | None = None,
        compact_every: int = 0,
        worker_bytes: int = 0,
        since: Mapping[str, int] | None = None,
    ) -> Served:
        """Plan every query over shared arrangements (`specs` from `served_specs`; `sizes`
        each relation's rows, for the variable orders; `since` the epoch each query attached
        to the state after its first was attached at)."""
        for q in queries:
            check_width(q)  # before any input is read
        by_name = {q.name: q for q in queries}
        undirected = [r for r, s in specs.items() if s.undirected]
        plans = {
            q.name: plan_query(q, sizes, (orders or {}).get(q.name), undirected) for q in queries
        }
        arities: dict[str, int] = {}  # in the order the queries name them
        for q in queries:
            for rel, arity in q.relations.items():
                arities.setdefault(rel, arity)
        counts = counts_names(plans.values())
        widths = {relation_trace_name(r): a for r, a in arities.items()}
        widths |= {name: len(cols) for name, cols in counts.items()}
        widths |= {
            output_trace_name(q): len(by_name[q].head) for q in _indexed_outputs(by_name, specs)
        }
        record = mf.StatePlan(
            {
                rel: mf.RelationPlan(spec.arity, spec.meaning, spec.undirected)
                for rel, spec in specs.items()
            },
            {
                name: mf.QueryPlan(str(q), tuple(sorted(q.relations)), (since or {}).get(name))
                for name, q in sorted(by_name.items())
            },
        )
        return cls(
            by_name,
            dict(specs),
            arities,
            plans,
            counts,
            plan_views(plans.values(), widths),
            record,
            limits,
            shares.budget if budget is None else budget,
            shares,
            keep_rules,
            landing_rows,
            compact_every,
            worker_bytes,
        )

    @property
    def arrangements(self) -> tuple[Arrangement, ...]:
        """Every arrangement any plan reads, each once."""
        seen: dict[Arrangement, None] = {}
        for plan in self.plans.values():
            for a in plan.arrangements:
                seen.setdefault(a, None)
        return tuple(seen)

    def indexed_outputs(self) -> list[str]:
        """The queries whose output tuples may be held other than once (a bag read, a variable
        dropped, an aggregate), whose figures then need lookups."""
        return _indexed_outputs(self.queries, self.specs)

    def indexed(self) -> list[str]:
        """Every trace an epoch opens: relations, counts, indexed outputs."""
        return sorted(self.views)

    def trace_columns(self, name: str) -> list[str]:
        kind, _, rest = name.partition("/")
        if kind in ("rel", "ignored"):
            return relation_columns(self.relations[rest])
        if kind == "counts":
            return list(self.counts_traces[name])
        if kind == "out":
            return relation_columns(len(self.queries[rest].head))
        if kind == "rule":
            return relation_columns(len(self.queries[rest.rsplit("/", 1)[0]].head))
        raise StateError(f"unknown trace {name!r}")

    def check(self, manifest: mf.Manifest, root: str) -> None:
        """Refuse a state (at `root`) that serves something else than this."""
        held = manifest.plan
        if held is None:
            if manifest.epoch is not None:
                raise StateError(f"state {root} records no plan; it cannot be checked")
            return
        mine = self.record
        for rel, spec in mine.relations.items():
            theirs = held.relations.get(rel)
            if theirs is not None and theirs != spec:
                raise StateError(
                    f"state {root} holds relation {rel!r} as {_describe(theirs)}; "
                    f"this run declares it {_describe(spec)}: use the same declaration, or a "
                    "new state"
                )
        for name, q in held.queries.items():
            ours = mine.queries.get(name)
            if ours is None:
                raise StateError(
                    f"state {root} also maintains query {name!r} ({q.text}); an "
                    f"engine applying epochs to it must serve every query it holds (serving: "
                    f"{', '.join(mine.queries)})"
                )
            if ours.text != q.text:
                raise StateError(
                    f"state {root} maintains query {name!r} as `{q.text}`; this run "
                    f"gives `{ours.text}`: a state keeps one query of a name — give this one "
                    "another name (wcoj attach adds it), or detach the kept one first (wcoj detach)"
                )

    def pending(self, manifest: mf.Manifest) -> list[str]:
        """The queries this serves that a state holding epochs does not keep yet: each is
        attached (`wcoj_core.attach`) before an epoch is applied."""
        held = manifest.plan.queries if manifest.plan is not None else {}
        return [] if manifest.epoch is None else sorted(set(self.queries) - set(held))

    def since(self, query: str) -> int | None:
        """The epoch `query` was attached at (None: it is kept from the state's first)."""
        return self.record.queries[query].since

    def registered(self, manifest: mf.Manifest) -> mf.Manifest:
        """The manifest with every trace this serves (new ones empty)."""
        m = manifest
        names = [relation_trace_name(r) for r in self.relations]
        names += list(self.counts_traces) + [output_trace_name(q) for q in self.queries]
        for name in names:
            if m.trace(name) is None:
                m = m.with_trace(mf.Trace(name, tuple(self.trace_columns(name))))
        return m

    def compaction_due(self, m: mf.Manifest, epoch: int) -> int | None:
        """The frontier to compact to with epoch `epoch`'s commit, or None."""
        n = self.compact_every
        if n <= 0 or (m.epoch is not None and epoch < m.epoch):
            return None
        if max((len(t.batches) for t in m.traces.values()), default=0) <= 2 * n:
            return None
        frontier = epoch - n
        return frontier if m.frontier is None or frontier > m.frontier else None


def _indexed_outputs(queries: Mapping[str, Query], specs: Mapping[str, RelationSpec]) -> list[str]:
    out = []
    for name, q in sorted(queries.items()):
        sets = all(specs[r].meaning is Meaning.SET for r in q.relations)
        if not (sets and set(q.head) == set(q.vars)) or q.aggregate is not None:
            out.append(name)
    return out


def _describe(p: mf.RelationPlan) -> str:
    return f"{'an undirected ' if p.undirected else 'a '}{p.meaning.value} of arity {p.arity}"


class StateAccess:
    """The state an engine works on and how to reach it: `persist_index` (arrangement files kept),
    `executor_tasks` (None: Spark's parallelism), `one_task_rows` (a small work in one task once
    `executors_warm`), `routed` (force routed stages: tests and measurements)."""

    routed: bool = False

    def __init__(
        self, store: Store, starter: SparkStarter, *, executor_tasks: int | None = None
    ) -> None:
        self.store = store
        self.starter = starter
        self.executor_tasks = executor_tasks
        self.one_task_rows = ONE_TASK_ROWS
        self.executors_warm = False
        self.persist_index = self.local
        self.batches = Batches(store.files)

    @classmethod
    def open(
        cls,
        state_dir: str,
        starter: SparkStarter,
        *,
        create: bool = True,
        executor_tasks: int | None = None,
    ) -> StateAccess:
        """The state at `state_dir` (made when `create`)."""
        return cls(Store.open(state_dir, create=create), starter, executor_tasks=executor_tasks)

    def spark(self, reason: str) -> SparkSession:
        """The Spark session, started now (announced with `reason`) if it is not running."""
        return self.starter(reason)

    @property
    def local(self) -> bool:
        return self.store.files.location.local

    def scratch_root(self) -> Path | None:
        """Where an epoch spills: the state's ``scratch/`` folder (None for a state on remote
        storage: the system's temporary folder)."""
        from wcoj_core.store.names import SCRATCH

        return self.store.files.path / SCRATCH if self.local else None

    def tasks(self) -> int:
        """The tasks an epoch's work runs in on the executors."""
        spark = self.spark("the kernel runs in Spark's executors")
        return self.executor_tasks or max(1, spark.sparkContext.defaultParallelism)

    def read_batch(self, trace: mf.Trace, batch: mf.Batch) -> Layer:
        """A stored batch read whole: exactly its listed files, checked against their sizes,
        digests, the batch's rows and its epoch."""
        return self.batches.read_verified(
            batch.path, trace.columns, batch.files, batch.rows, batch.time
        )

    def read_chunks(
        self, trace: mf.Trace, batch: mf.Batch
    ) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        """A stored batch a record batch at a time (rows and diffs), with the same checks as
        `read_batch`: sizes, digests, the batch's rows and its epoch."""
        return self.batches.verified_pieces(batch, trace.columns)
