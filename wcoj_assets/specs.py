"""Query specs and the asset graph they imply, computed without Spark, files or environment.

A `QuerySpec` names a query, gives its text and lists its input relations. `Topology` parses and
plans every spec once (with no size statistics, so the plans are the same at definition time and
at run time: the engine is planned the same way) and derives what the Dagster assets need:

* the relations, their arities and meanings (`wcoj_core.meaning.RelationSpec`: set or bag,
  undirected or not);
* the **shared arrangements** the plans read, each once however many rules and queries read it:
  per relation its index segments in every column order a rule probes (``<rel>_forward`` in
  column order 0..k-1, ``<rel>_reverse`` for a binary relation probed by its second column,
  ``<rel>_by_c2_c0_c1`` for other orders, ``<rel>_v0_0_k3_by_c0`` for a view with repeated
  variables or constants) and its counts arrangements (``<rel>_counts_<key>``); the relation
  itself as stored, its batches, is the self arrangement (``<rel>_snapshot``);
* for each delta rule, the arrangements it reads (`rule_reads`).

>>> topo = Topology.of(DEFAULT_SPECS)
>>> topo.relations
{'edge': 2}
>>> [counts_asset_name(a) for a in topo.counts]
['edge_counts_c0', 'edge_counts_c1']
>>> [view_asset_name("edge", v) for v in topo.views["edge"]]
['edge_forward', 'edge_reverse']
>>> topo.rule_reads("triangles", 1)
['edge_counts_c1', 'edge_reverse']
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace

from wcoj_core.errors import QueryError
from wcoj_core.indexes import ViewKey, identity, view_key
from wcoj_core.meaning import RelationSpec, relation_specs
from wcoj_core.query.builtins import BUILTINS
from wcoj_core.query.ir import Const, Query
from wcoj_core.query.parse import parse_query
from wcoj_core.query.plan import Arrangement, AtomView, Kind, Plan, Version, plan_query
from wcoj_core.traces import counts_trace_name, relation_trace_name


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


def _view_prefix(
    view: AtomView | None, relation: str, pattern: tuple[int | Const, ...] | None
) -> str:
    pattern = view.pattern if view is not None and not view.is_identity else pattern
    if pattern is None or pattern == tuple(range(len(pattern))):
        return relation
    parts = [f"k{p.value}".replace("-", "neg") if isinstance(p, Const) else str(p) for p in pattern]
    return f"{relation}_v" + "_".join(parts)


def counts_asset_name(arrangement: Arrangement) -> str:
    """``<rel>_counts_<key columns>``; ``_all`` for the empty key; non-identity views spelled out.

    >>> counts_asset_name(Arrangement(Kind.COUNTS, AtomView("edge", (0, 1)), ()))
    'edge_counts_all'
    >>> counts_asset_name(Arrangement(Kind.COUNTS, AtomView("e", (0, 0, Const(-3))), (0,)))
    'e_v0_0_kneg3_counts_c0'
    """
    view = arrangement.view
    key = "_".join(f"c{k}" for k in arrangement.key) or "all"
    return f"{_view_prefix(view, view.relation, None)}_counts_{key}"


def view_asset_name(relation: str, key: ViewKey) -> str:
    """The asset of a relation's index in one view key (pattern, column order).

    >>> view_asset_name("edge", (None, (0, 1))), view_asset_name("edge", (None, (1, 0)))
    ('edge_forward', 'edge_reverse')
    >>> view_asset_name("r", (None, (2, 0, 1))), view_asset_name("e", ((0, 0, Const(3)), (0,)))
    ('r_by_c2_c0_c1', 'e_v0_0_k3_by_c0')
    """
    pattern, order = key
    by = "_".join(f"c{o}" for o in order)
    if pattern is None:
        if order == tuple(range(len(order))):
            return f"{relation}_forward"
        if order == (1, 0):
            return f"{relation}_reverse"
        return f"{relation}_by_{by}"
    return f"{_view_prefix(None, relation, pattern)}_by_{by}"


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


class _Reads:
    """What a rule reads besides its delta (the `Layers` protocol of the kernel, holding
    nothing): each trace and view key."""

    def __init__(self) -> None:
        self.seen: set[tuple[str, ViewKey]] = set()

    def layers(
        self, name: str, view: AtomView | None, order: tuple[int, ...], version: Version
    ) -> list:
        if version is not Version.DELTA:
            self.seen.add((name, view_key(view, order)))
        return []

    def delta(self, name: str, view: AtomView | None, order: tuple[int, ...]) -> object:
        from wcoj_core.kernel.layer import Layer

        return Layer.empty(len(order))


# -- the topology --------------------------------------------------------------------------------
@dataclass(frozen=True)
class Topology:
    """Parsed queries, their plans, the relations' meanings and the assets they imply."""

    specs: tuple[QuerySpec, ...]
    queries: tuple[Query, ...]
    plans: dict[str, Plan] = field(compare=False)
    relations: dict[str, int] = field(compare=False)
    counts: tuple[Arrangement, ...] = field(compare=False)
    meanings: dict[str, RelationSpec] = field(compare=False, default_factory=dict)
    views: dict[str, tuple[ViewKey, ...]] = field(compare=False, default_factory=dict)

    @staticmethod
    def of(
        specs: Sequence[QuerySpec],
        undirected: Iterable[str] = (),
        sets: Iterable[str] = (),
        bags: Iterable[str] = (),
    ) -> Topology:
        """Parse and plan `specs`; refuse clashing names and undeclared relations.

        `undirected` names binary relations whose landed changes are edges in no particular
        direction, `sets` and `bags` the relations declared with that meaning
        (`wcoj_core.meaning.relation_specs`: undirected relations are sets by default, others
        bags). A relation's meaning holds for every query that reads it, so it is given once
        here rather than per spec.

        >>> Topology.of(DEFAULT_SPECS, undirected=["edge"]).undirected
        frozenset({'edge'})
        >>> Topology.of(DEFAULT_SPECS, undirected=["edges"])
        Traceback (most recent call last):
          ...
        wcoj_core.errors.QueryError: undirected relation 'edges' is read by no query (the relations: edge)
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
        relations = dict(sorted(relations.items()))
        meanings = relation_specs(relations, undirected=undirected, sets=sets, bags=bags)
        seen: dict[Arrangement, None] = {}
        for plan in plans.values():
            for a in plan.arrangements:
                if a.kind is Kind.COUNTS:
                    seen.setdefault(a, None)
        counts = tuple(sorted(seen, key=counts_asset_name))
        reads = _Reads()
        for plan in plans.values():
            for rule in plan.rules:
                _prepare(plan, rule, reads)
        views = {
            rel: tuple(
                sorted(
                    {identity(arity)}
                    | {k for name, k in reads.seen if name == relation_trace_name(rel)},
                    key=lambda k: (
                        k[0] is not None,
                        view_asset_name(rel, k) != f"{rel}_forward",
                        repr(k),
                    ),
                )
            )
            for rel, arity in relations.items()
        }
        topo = Topology(tuple(specs), tuple(queries), plans, relations, counts, meanings, views)
        topo._check_names()
        return topo

    @property
    def undirected(self) -> frozenset[str]:
        return frozenset(r for r, spec in self.meanings.items() if spec.undirected)

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
            for key in self.views[rel]:
                claim(view_asset_name(rel, key), f"an index of relation {rel!r}")
        for a in self.counts:
            claim(counts_asset_name(a), f"arrangement {a}")
        for q in self.queries:
            for i in range(len(q.atoms)):
                claim(rule_asset_name(q.name, i), f"rule {i} of query {q.name!r}")
            claim(query_deltas_asset_name(q.name), f"the changes of query {q.name!r}")
            claim(q.name, f"the output of query {q.name!r}")

    def query(self, name: str) -> Query:
        return next(q for q in self.queries if q.name == name)

    def rule_reads(self, query: str, atom: int) -> list[str]:
        """The arrangement assets (index views and counts) rule `atom` of `query` reads."""
        plan = self.plans[query]
        reads = _Reads()
        _prepare(plan, plan.rules[atom], reads)
        by_trace = {counts_trace_name(a): counts_asset_name(a) for a in self.counts}
        out: set[str] = set()
        for name, key in reads.seen:
            kind, _, rest = name.partition("/")
            if kind == "rel":
                out.add(view_asset_name(rest, key))
            elif name in by_trace:
                out.add(by_trace[name])
        return sorted(out)

    def counts_for(self, relation: str) -> tuple[Arrangement, ...]:
        return tuple(a for a in self.counts if a.view.relation == relation)


def _prepare(plan: Plan, rule: object, reads: _Reads) -> None:
    from wcoj_core.kernel.join import prepare

    prepare(plan, rule, reads)  # type: ignore[arg-type]
