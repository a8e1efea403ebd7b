"""Query specs and the asset graph they imply, computed without Spark, files or environment.

A `QuerySpec` names a query, gives its text and lists its input relations. `Topology` parses and
plans every spec once (with no size statistics, so the plans are the same at definition time and
at run time) and derives what the Dagster assets need:

* the relations and their arities, which binary relations are undirected (their landed changes
  are read in both directions, see `wcoj_assets.intake`), and the counts arrangements the plans read, each once however
  many rules and queries read it (self views are the relation's own trace: no asset of their own);
* for each delta rule, which assets it reads and at which epoch offset: atoms before the delta
  atom are read *new* (offset 0, the state at ``t``), atoms after it *old* (offset -1, the state
  before ``t``), and the delta atom's relation through its changes at ``t``.

>>> topo = Topology.of(DEFAULT_SPECS)
>>> topo.relations
{'edge': 2}
>>> [counts_asset_name(a) for a in topo.counts]
['edge_counts_c0', 'edge_counts_c1']
>>> sorted(topo.rule_reads("triangles", 1).items())
[('edge_counts_c1', frozenset({0, -1})), ('edge_snapshot', frozenset({0, -1}))]
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace

from wcoj_core.errors import QueryError
from wcoj_core.query.builtins import BUILTINS
from wcoj_core.query.ir import Const, Query
from wcoj_core.query.parse import parse_query
from wcoj_core.query.plan import Arrangement, Kind, Plan, Version, plan_query


@dataclass(frozen=True, slots=True)
class QuerySpec:
    """A query to maintain: its name (the asset prefix), Datalog text and input relations."""

    name: str
    text: str
    relations: tuple[str, ...]


DEFAULT_SPECS: tuple[QuerySpec, ...] = (QuerySpec("triangles", BUILTINS["triangles"], ("edge",)),)


# -- asset names ---------------------------------------------------------------------------------
def deltas_asset_name(relation: str) -> str:
    return f"{relation}_deltas"


def snapshot_asset_name(relation: str) -> str:
    return f"{relation}_snapshot"


def counts_asset_name(arrangement: Arrangement) -> str:
    """``<rel>_counts_<key columns>``; ``_all`` for the empty key; non-identity views spelled out.

    >>> from wcoj_core.query.plan import AtomView
    >>> counts_asset_name(Arrangement(Kind.COUNTS, AtomView("edge", (0, 1)), ()))
    'edge_counts_all'
    >>> counts_asset_name(Arrangement(Kind.COUNTS, AtomView("e", (0, 0, Const(-3))), (0,)))
    'e_v0_0_kneg3_counts_c0'
    """
    view = arrangement.view
    prefix = view.relation
    if not view.is_identity:
        parts = [
            f"k{p.value}".replace("-", "neg") if isinstance(p, Const) else str(p)
            for p in view.pattern
        ]
        prefix += "_v" + "_".join(parts)
    key = "_".join(f"c{k}" for k in arrangement.key) or "all"
    return f"{prefix}_counts_{key}"


def rule_asset_name(query: str, atom: int) -> str:
    return f"{query}_rule_{atom}"


def query_deltas_asset_name(query: str) -> str:
    return f"{query}_deltas"


def head_columns(query: Query) -> list[str]:
    """The names a query's output columns (stored as ``c0 ..``) take for readers: its head
    variables; a repeated variable, or one named like the ``diff`` or ``time`` column, gets its
    position appended.

    >>> head_columns(parse_query("q(a, b, a, diff) :- r(a, b, diff)"))
    ['a', 'b', 'a_2', 'diff_3']
    """
    names: list[str] = []
    for i, v in enumerate(query.head):
        names.append(v.name if v.name not in {*names, "diff", "time"} else f"{v.name}_{i}")
    return names


# -- the topology --------------------------------------------------------------------------------
@dataclass(frozen=True)
class Topology:
    """Parsed queries, their plans and the assets they imply."""

    specs: tuple[QuerySpec, ...]
    queries: tuple[Query, ...]
    plans: dict[str, Plan] = field(compare=False)
    relations: dict[str, int] = field(compare=False)
    counts: tuple[Arrangement, ...] = field(compare=False)
    undirected: frozenset[str] = frozenset()

    @staticmethod
    def of(specs: Sequence[QuerySpec], undirected: Iterable[str] = ()) -> Topology:
        """Parse and plan `specs`; refuse clashing names and undeclared relations.

        `undirected` names binary relations whose landed changes are edges in no particular
        direction: a relation is undirected for every query that reads it, so it is given once
        here rather than per spec.

        >>> Topology.of(DEFAULT_SPECS, undirected=["edge"]).undirected
        frozenset({'edge'})
        >>> Topology.of(DEFAULT_SPECS, undirected=["edges"])
        Traceback (most recent call last):
          ...
        wcoj_core.errors.QueryError: undirected relation 'edges' is read by no query (the relations are edge)
        """
        if not specs:
            raise QueryError("no query specs given; pass at least one QuerySpec")
        queries: list[Query] = []
        for spec in specs:
            if not isinstance(spec, QuerySpec):
                raise QueryError(f"expected a QuerySpec, got {spec!r}")
            query = parse_query(spec.text)
            if query.name != spec.name:
                query = replace(query, name=spec.name)
            declared, used = set(spec.relations), set(query.relations)
            if declared != used:
                raise QueryError(
                    f"query spec {spec.name!r} declares relations {sorted(declared)} but its "
                    f"query reads {sorted(used)}"
                )
            queries.append(query)
        plans = {q.name: plan_query(q, {}) for q in queries}
        if len(plans) != len(queries):
            raise QueryError("two query specs share a name; give each spec its own name")
        relations: dict[str, int] = {}
        for q in queries:
            for rel, arity in q.relations.items():
                if relations.setdefault(rel, arity) != arity:
                    raise QueryError(
                        f"relation {rel!r} has arity {relations[rel]} in one query and {arity} "
                        f"in {q.name!r}"
                    )
        seen: dict[Arrangement, None] = {}
        for plan in plans.values():
            for a in plan.arrangements:
                if a.kind is Kind.COUNTS:
                    seen.setdefault(a, None)
        counts = tuple(sorted(seen, key=counts_asset_name))
        for rel in undirected:
            if rel not in relations:
                raise QueryError(
                    f"undirected relation {rel!r} is read by no query (the relations are "
                    f"{', '.join(sorted(relations))})"
                )
            if relations[rel] != 2:
                raise QueryError(
                    f"undirected relation {rel!r} has arity {relations[rel]}; only a binary "
                    "relation can be undirected"
                )
        topo = Topology(
            tuple(specs),
            tuple(queries),
            plans,
            dict(sorted(relations.items())),
            counts,
            frozenset(undirected),
        )
        topo._check_names()
        return topo

    def _check_names(self) -> None:
        names: dict[str, str] = {}

        def claim(name: str, what: str) -> None:
            if not name.isidentifier():
                raise QueryError(f"asset name {name!r} for {what} is not an identifier")
            if name in names:
                raise QueryError(
                    f"asset name {name!r} is used for both {names[name]} and {what}; rename "
                    f"the query or the relation"
                )
            names[name] = what

        for rel in self.relations:
            claim(deltas_asset_name(rel), f"the changes of relation {rel!r}")
            claim(snapshot_asset_name(rel), f"the snapshot of relation {rel!r}")
        for a in self.counts:
            claim(counts_asset_name(a), f"arrangement {a}")
        for q in self.queries:
            for i in range(len(q.atoms)):
                claim(rule_asset_name(q.name, i), f"rule {i} of query {q.name!r}")
            claim(query_deltas_asset_name(q.name), f"the changes of query {q.name!r}")
            claim(q.name, f"the output of query {q.name!r}")

    def query(self, name: str) -> Query:
        return next(q for q in self.queries if q.name == name)

    def rule_reads(self, query: str, atom: int) -> dict[str, frozenset[int]]:
        """Assets rule `atom` of `query` reads besides its delta, with epoch offsets (0 or -1)."""
        plan = self.plans[query]
        rule = plan.rules[atom]
        reads: dict[str, set[int]] = {}

        def read(name: str, version: Version) -> None:
            reads.setdefault(name, set()).add(0 if version is Version.NEW else -1)

        for j, version in enumerate(rule.versions):
            if j != atom:
                read(snapshot_asset_name(plan.query.atoms[j].relation), version)
        for step in rule.steps:
            for x in step.extenders:
                for a in (x.counts, x.support):
                    if a.kind is Kind.COUNTS:
                        read(counts_asset_name(a), x.version)
                    else:
                        read(snapshot_asset_name(a.view.relation), x.version)
        return {name: frozenset(offsets) for name, offsets in sorted(reads.items())}

    def counts_for(self, relation: str) -> tuple[Arrangement, ...]:
        return tuple(a for a in self.counts if a.view.relation == relation)
