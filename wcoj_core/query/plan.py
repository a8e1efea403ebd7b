"""Query -> Plan: one delta rule per atom, each a sequence of GenericJoin steps.

For atom ``i`` the rule joins the change of atom ``i`` with every other atom; atoms before ``i``
see the *new* state (time <= t), atoms after ``i`` the *old* state (time < t). Summed over ``i``,
the rules give exactly ``Q(new) - Q(old)`` (a telescoping sum), so updates that arrive together are
never counted twice.

Each rule binds the delta atom's variables first, then one variable per step. The next variable
is the one constrained by the most atoms that already have a bound variable; ties go to the
smallest estimated candidate count, then to the first variable in query order. At each step every
atom containing the variable is an `Extender`: it counts its candidates per prefix, the one with
the fewest proposes, the others validate. An atom whose variables all become bound *completes* at
that step: it proposes or validates with its tuples' multiplicities; before that it only
constrains by support (does any tuple with this prefix exist?), so each atom's multiplicity
multiplies in exactly once.

A rule of an aggregate query (`Query.aggregate`) binds, among the variables linked to those
bound, the head's first, then the others, the summed variable last: when the last variable is
not the head's, the kernel counts its candidates per group (weighted, or summed times their
values) instead of enumerating them (`wcoj_core.kernel.join`). A count per vertex of the
cliques of an undirected relation also carries the cliques' own plan (`members`), which the
kernel runs instead.

Atoms see their relation through an `AtomView`: constants select, a repeated variable selects
equal columns, and the view's columns are the atom's distinct variables. Atoms with the same view
share arrangements.

Planning is bounded: ordering a rule's variables costs about its atoms' terms times a logarithm
(the scores of the variables next to the one just bound are updated, a heap gives the best), so
a query of `n` atoms plans in about ``n^2 log n`` (a rule per atom, each binding every variable);
a query of more than `MAX_ATOMS` atoms is refused in one line (and one wider than the kernel
runs by `check_width`, which the engine calls), and filters implied by transitivity are derived
only among at most `IMPLIED_VARS` compared variables (they are implied: leaving them out changes
no result).

>>> from wcoj_core.query.parse import parse_query
>>> plan = plan_query(parse_query("p(a, b, c) :- e(a, b), e(b, c), e(a, c)"))
>>> [str(step.var) for step in plan.rules[0].steps]
['c']
>>> [(x.atom, x.version.value, x.completes) for x in plan.rules[0].steps[0].extenders]
[(1, 'old', True), (2, 'old', True)]
"""

from __future__ import annotations

import dataclasses
import heapq
import itertools
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum

from wcoj_core.errors import QueryError
from wcoj_core.query.ir import Atom, CmpOp, Const, Filter, Query, Var

# The most atoms a query may have: a plan holds one delta rule per atom, each binding every
# variable, so a plan's size (and the time to make it) grows with the square of its atoms.
MAX_ATOMS = 256
# The most columns the kernel's layers and prefixes hold: a relation's arity and a query's head
# are at most this wide, and a rule binds at most one variable more (its last step extends a
# prefix of all the others).
MAX_COLUMNS = 32
# Filters implied by transitivity are derived among at most this many compared variables.
IMPLIED_VARS = 64


class Version(Enum):
    """Which state of a relation a rule reads."""

    OLD = "old"  # time < t
    NEW = "new"  # time <= t
    DELTA = "delta"  # the changes at t


class Kind(Enum):
    """The kind of a shared arrangement."""

    SELF = "self"  # tuples with multiplicity: proposes (when completing) and validates
    COUNTS = "counts"  # key -> number of tuples with non-zero multiplicity


@dataclass(frozen=True, slots=True)
class AtomView:
    """A relation seen through an atom's constants and repeated variables.

    `pattern` has one entry per relation column: the index of the view column it feeds (the
    atom's distinct variables in order of first occurrence) or a `Const` it must equal.
    """

    relation: str
    pattern: tuple[int | Const, ...]

    @property
    def arity(self) -> int:
        return len({p for p in self.pattern if isinstance(p, int)})

    @property
    def is_identity(self) -> bool:
        return self.pattern == tuple(range(len(self.pattern)))

    def __str__(self) -> str:
        if self.is_identity:
            return self.relation
        cols = ", ".join(str(p) if isinstance(p, Const) else f"c{p}" for p in self.pattern)
        return f"{self.relation}[{cols}]"


def atom_view(atom: Atom) -> AtomView:
    """The view of an atom and, implicitly, its variables in view-column order.

    >>> str(atom_view(Atom("e", (Var("x"), Var("x"), Const(3)))))
    'e[c0, c0, 3]'
    """
    index: dict[Var, int] = {}
    pattern: list[int | Const] = []
    for term in atom.terms:
        if isinstance(term, Var):
            pattern.append(index.setdefault(term, len(index)))
        else:
            pattern.append(term)
    return AtomView(atom.relation, tuple(pattern))


@dataclass(frozen=True, slots=True)
class Arrangement:
    """A shared, persisted index: a kind, a view and the view columns it is keyed by."""

    kind: Kind
    view: AtomView
    key: tuple[int, ...] = ()

    def __str__(self) -> str:
        key = ",".join(f"c{k}" for k in self.key)
        return f"{self.view}.{self.kind.value}" + (f"[{key}]" if self.kind is Kind.COUNTS else "")


@dataclass(frozen=True, slots=True)
class Extender:
    """One atom constraining the next variable at one step.

    `key` lists the view columns bound before the step; `value` is the view column of the new
    variable. Counting reads ``counts[key]``. Proposing and validating read the atom's tuples
    when the step `completes` the atom, otherwise ``counts[key + value]`` as a support set.
    """

    atom: int
    version: Version
    view: AtomView
    key: tuple[int, ...]
    value: int
    completes: bool

    @property
    def counts(self) -> Arrangement:
        return Arrangement(Kind.COUNTS, self.view, self.key)

    @property
    def support(self) -> Arrangement:
        if self.completes:
            return Arrangement(Kind.SELF, self.view)
        return Arrangement(Kind.COUNTS, self.view, tuple(sorted((*self.key, self.value))))


@dataclass(frozen=True, slots=True)
class Check:
    """An atom whose variables are all bound by the delta atom: validated before any step."""

    atom: int
    version: Version
    view: AtomView


@dataclass(frozen=True, slots=True)
class Step:
    """Bind one variable: count, propose the fewest, validate; then apply the ready filters."""

    var: Var
    extenders: tuple[Extender, ...]
    filters: tuple[Filter, ...]


@dataclass(frozen=True, slots=True)
class DeltaRule:
    """The rule for changes to atom `delta`: start from its tuples, then extend step by step."""

    delta: int
    versions: tuple[Version, ...]
    start: tuple[Var, ...]
    checks: tuple[Check, ...]
    start_filters: tuple[Filter, ...]
    steps: tuple[Step, ...]

    @property
    def order(self) -> tuple[Var, ...]:
        """The full variable order: the delta atom's variables, then one per step."""
        return self.start + tuple(s.var for s in self.steps)


@dataclass(frozen=True, slots=True)
class Plan:
    """A query, its atoms' views, its implied filters and one delta rule per atom."""

    query: Query
    views: tuple[AtomView, ...]
    atom_vars: tuple[tuple[Var, ...], ...]
    filters: tuple[Filter, ...]
    implied: tuple[Filter, ...]
    rules: tuple[DeltaRule, ...]
    # An aggregate counting the cliques at each member (`members`): the cliques' own plan, each
    # of whose full bindings adds its weight to the group of each of its variables.
    members: Plan | None = None
    arrangements: tuple[Arrangement, ...] = field(init=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "arrangements", self._arrangements())

    def _arrangements(self) -> tuple[Arrangement, ...]:
        """Every arrangement the rules read, deduplicated, in a stable order (found once)."""
        seen: dict[Arrangement, None] = {}
        for view in self.views:
            seen.setdefault(Arrangement(Kind.SELF, view), None)
        for rule in self.rules + (() if self.members is None else self.members.rules):
            for step in rule.steps:
                for x in step.extenders:
                    seen.setdefault(x.counts, None)
                    seen.setdefault(x.support, None)
        return tuple(sorted(seen, key=lambda a: (str(a.view), a.kind.value, a.key)))


def implied_filters(filters: Sequence[Filter]) -> tuple[Filter, ...]:
    """Order comparisons between variables implied by transitivity and not already stated.

    >>> a, b, c = Var("a"), Var("b"), Var("c")
    >>> [str(f) for f in implied_filters([Filter(a, CmpOp.LT, b), Filter(b, CmpOp.LE, c)])]
    ['a < c']
    """
    # strict[x][y] is True for x < y, False for x <= y; absent when unknown.
    rel: dict[tuple[Var, Var], bool] = {}
    compared = {t for f in filters for t in (f.left, f.right) if isinstance(t, Var)}
    if len(compared) > IMPLIED_VARS:  # a closure cubic in them, a result quadratic: skipped
        return ()
    for f in filters:
        if not (isinstance(f.left, Var) and isinstance(f.right, Var)):
            continue
        match f.op:
            case CmpOp.LT | CmpOp.LE:
                x, y, strict = f.left, f.right, f.op is CmpOp.LT
            case CmpOp.GT | CmpOp.GE:
                x, y, strict = f.right, f.left, f.op is CmpOp.GT
            case _:
                continue
        rel[(x, y)] = rel.get((x, y), False) or strict
    stated = set(rel)
    names = sorted({v for pair in rel for v in pair}, key=lambda v: v.name)
    for k in names:
        for i in names:
            for j in names:
                if (i, k) in rel and (k, j) in rel and i != j:
                    strict = rel[(i, k)] or rel[(k, j)]
                    rel[(i, j)] = rel.get((i, j), False) or strict
    out = []
    for (x, y), strict in sorted(rel.items(), key=lambda kv: (kv[0][0].name, kv[0][1].name)):
        if (x, y) not in stated and (y, x) not in stated:
            out.append(Filter(x, CmpOp.LT if strict else CmpOp.LE, y))
    return tuple(out)


def _estimate(atom_size: float, arity: int, bound: int) -> float:
    """Candidates per prefix of an atom with `bound` of `arity` columns bound (AGM-style)."""
    if arity == 0:
        return 1.0
    return max(atom_size, 1.0) ** ((arity - bound) / arity)


@dataclass(frozen=True, slots=True)
class _Shape:
    """What every rule of a query plans from, found once per query: each atom's view, its
    distinct variables and its relation's size, each variable's position and the atoms holding
    it (in atom order)."""

    views: tuple[AtomView, ...]
    atom_vars: tuple[tuple[Var, ...], ...]
    sizes: tuple[float, ...]
    position: dict[Var, int]
    holders: dict[Var, tuple[int, ...]]

    @classmethod
    def of(cls, query: Query, sizes: Mapping[str, int]) -> _Shape:
        atom_vars = tuple(a.vars for a in query.atoms)
        holders: dict[Var, list[int]] = {}
        for i, vs in enumerate(atom_vars):
            for v in vs:
                holders.setdefault(v, []).append(i)
        return cls(
            tuple(atom_view(a) for a in query.atoms),
            atom_vars,
            tuple(float(sizes.get(a.relation, 1000)) for a in query.atoms),
            {v: i for i, v in enumerate(query.vars)},
            {v: tuple(atoms) for v, atoms in holders.items()},
        )


class _Scores:
    """The variable-order heuristic's score of each unbound variable of a rule, kept up to date
    as variables are bound: binding a variable rescores only the variables sharing an atom with
    it, and a heap gives the best one, so ordering a rule costs about its atoms' terms times a
    logarithm.

    A variable's score is (minus the atoms holding it that already hold a bound variable, the
    fewest candidates any atom holding it estimates, its position in the query): the least
    wins (see the module)."""

    def __init__(self, shape: _Shape, start: Sequence[Var]) -> None:
        self.shape = shape
        self.bound: set[Var] = set(start)
        self.held = [sum(u in self.bound for u in vs) for vs in shape.atom_vars]  # per atom
        self.score: dict[Var, tuple[int, float, int]] = {}
        self.heap: list[tuple[tuple[int, float, int], Var]] = []
        for v in shape.position:
            if v not in self.bound:
                self._rescore(v)

    def _rescore(self, v: Var) -> None:
        shape, held = self.shape, self.held
        atoms = shape.holders[v]
        linked = sum(held[i] > 0 for i in atoms)
        est = min(_estimate(shape.sizes[i], len(shape.atom_vars[i]), held[i]) for i in atoms)
        score = (-linked, est, shape.position[v])
        self.score[v] = score
        heapq.heappush(self.heap, (score, v))

    def take(self, rank: Mapping[Var, int] | None = None) -> Var:
        """The best unbound variable, now bound; with `rank`, the best linked one of the least
        rank (scanned)."""
        if rank is not None:
            free = (u for u in self.shape.position if u not in self.bound)
            v = min(free, key=lambda u: (self.score[u][0] == 0, rank[u], self.score[u]))
        else:
            while True:
                score, v = heapq.heappop(self.heap)
                if v not in self.bound and self.score[v] == score:
                    break
        self.bound.add(v)
        touched: dict[Var, None] = {}
        for i in self.shape.holders[v]:
            self.held[i] += 1
            for u in self.shape.atom_vars[i]:
                if u not in self.bound:
                    touched.setdefault(u, None)
        for u in touched:
            self._rescore(u)
        return v


def _choose_order(shape: _Shape, start: Sequence[Var], query: Query) -> list[Var]:
    """A rule's variable order (an aggregate query's: see the module)."""
    scores = _Scores(shape, start)
    order = list(start)
    rank = None
    if query.aggregate is not None:
        last = query.aggregate.var
        rank = {v: 0 if v in query.head else 2 if v == last else 1 for v in shape.position}
    while len(order) < len(shape.position):
        order.append(scores.take(rank))
    return order


def _versions(n: int, delta: int) -> tuple[Version, ...]:
    return tuple(
        Version.DELTA if j == delta else (Version.NEW if j < delta else Version.OLD)
        for j in range(n)
    )


def plan_rule(
    query: Query,
    delta: int,
    order: Sequence[Var] | None = None,
    sizes: Mapping[str, int] | None = None,
    filters: Sequence[Filter] | None = None,
    shape: _Shape | None = None,
) -> DeltaRule:
    """Plan the delta rule of atom `delta`, with a given or chosen variable order (`shape`:
    what `plan_query` found once for every rule)."""
    shape = shape or _Shape.of(query, sizes or {})
    views, atom_vars = shape.views, shape.atom_vars
    start = atom_vars[delta]
    all_filters = list(query.filters if filters is None else filters)
    if order is None:
        order = _choose_order(shape, start, query)
    else:
        order = list(order)
        if tuple(order[: len(start)]) != start or sorted(order, key=str) != sorted(
            query.vars, key=str
        ):
            raise QueryError(
                f"variable order {[str(v) for v in order]} for rule {delta} must start with the "
                f"delta atom's variables {[str(v) for v in start]} and bind every variable once"
            )
    versions = _versions(len(query.atoms), delta)
    bound = set(start)
    checks = tuple(
        Check(j, versions[j], views[j])
        for j in range(len(query.atoms))
        if j != delta and set(atom_vars[j]) <= bound
    )
    # Each filter waits for its unbound variables; one is ready at the step binding its last.
    waiting = [len(f.vars - bound) for f in all_filters]
    waits_on: dict[Var, list[int]] = {}
    for k, f in enumerate(all_filters):
        for v in f.vars - bound:
            waits_on.setdefault(v, []).append(k)
    start_filters = tuple(f for f, w in zip(all_filters, waiting, strict=True) if w == 0)
    steps = []
    for var in order[len(start) :]:
        extenders = []
        for j in shape.holders[var]:
            if j == delta:
                continue
            vs = atom_vars[j]
            key = tuple(vs.index(u) for u in vs if u in bound)
            completes = all(u in bound or u == var for u in vs)
            extenders.append(Extender(j, versions[j], views[j], key, vs.index(var), completes))
        bound.add(var)
        ready = []
        for k in waits_on.get(var, ()):
            waiting[k] -= 1
            if waiting[k] == 0:
                ready.append(k)
        steps.append(Step(var, tuple(extenders), tuple(all_filters[k] for k in sorted(ready))))
    return DeltaRule(delta, versions, start, checks, start_filters, tuple(steps))


def plan_query(
    query: Query,
    sizes: Mapping[str, int] | None = None,
    orders: Mapping[int, Sequence[Var]] | None = None,
    undirected: Collection[str] = (),
) -> Plan:
    """Plan every delta rule of `query`.

    `sizes` (relation -> tuple count) breaks ties between variables; `orders` forces the
    variable order of chosen rules (tests use it to exercise every order; then no `members`
    plan is made); `undirected` names the undirected relations (for `members`).
    """
    if len(query.atoms) > MAX_ATOMS:
        raise QueryError(
            f"query {query.name} has {len(query.atoms):,} atoms; wcoj plans queries of up to "
            f"{MAX_ATOMS} atoms (one delta rule per atom, each binding every variable)"
        )
    implied = implied_filters(query.filters)
    filters = (*query.filters, *implied)
    shape = _Shape.of(query, sizes or {})
    rules = tuple(
        plan_rule(query, i, (orders or {}).get(i), sizes, filters, shape)
        for i in range(len(query.atoms))
    )
    cliques = None if orders else members(query, undirected)
    return Plan(
        query=query,
        views=shape.views,
        atom_vars=shape.atom_vars,
        filters=filters,
        implied=implied,
        rules=rules,
        members=None if cliques is None else plan_query(cliques, sizes),
    )


def check_width(query: Query) -> None:
    """Refuse a query wider than the kernel runs (`MAX_COLUMNS`), naming what is too wide (the
    engine plans no other; the planner itself plans any width, for `explain`)."""
    rel, arity = max(query.relations.items(), key=lambda kv: kv[1])
    wide = [
        (arity > MAX_COLUMNS, f"relation {rel!r} has arity {arity}"),
        (len(query.head) > MAX_COLUMNS, f"its head has {len(query.head)} variables"),
        (len(query.vars) > MAX_COLUMNS + 1, f"its body binds {len(query.vars)} variables"),
    ]
    for too, what in wide:
        if too:
            raise QueryError(
                f"query {query.name}: {what}; wcoj runs relations and heads of at most "
                f"{MAX_COLUMNS} columns and bodies of at most {MAX_COLUMNS + 1} variables"
            )


def valid_orders(query: Query, delta: int) -> list[tuple[Var, ...]]:
    """Every variable order a rule may use: the delta atom's variables, then any permutation."""
    start = query.atoms[delta].vars
    rest = [v for v in query.vars if v not in start]
    return [start + perm for perm in itertools.permutations(rest)]


def order_free(query: Query, undirected: Collection[str]) -> bool:
    """Whether `query`'s output has as many tuples, of the same weights, under any one-to-one
    relabelling of the values: a clique over one undirected binary relation (an atom on each
    pair of its variables, once; no constant), its head every variable, its filters strict
    comparisons of two variables that order them all. Each clique then has exactly one ordering
    the filters admit whatever the labels, its weight the product of its edges' either way. A
    count of it may read its relation relabelled (`wcoj_core.input_land.by_rank`).

    >>> from wcoj_core.query.builtins import builtin
    >>> [order_free(builtin(q), ["edge"]) for q in ("triangles", "4-cliques", "4-cycles")]
    [True, True, False]
    """
    terms = [t for a in query.atoms for t in a.terms]
    relations = {a.relation for a in query.atoms}
    if query.aggregate is not None or len(relations) != 1 or relations - set(undirected):
        return False
    if any(len(a.terms) != 2 for a in query.atoms) or not all(isinstance(t, Var) for t in terms):
        return False
    pairs = {frozenset(a.terms) for a in query.atoms}
    cliques = {frozenset(p) for p in itertools.combinations(query.vars, 2)}
    filters = query.filters
    if len(query.atoms) != len(cliques) or pairs != cliques or set(query.head) != set(query.vars):
        return False
    strict = all(f.op in (CmpOp.LT, CmpOp.GT) and len(f.vars) == 2 for f in filters)
    return strict and {f.vars for f in (*filters, *implied_filters(filters))} == cliques


def counted(query: Query, undirected: Collection[str]) -> Query:
    """The query a count of `query` from nothing may run instead: an order-free one
    (`order_free`) with its filters the chain that orders the variables of its last atom first
    (any chain counts each clique once) and each atom written from its lower variable to its
    higher (the same atom of a relation that is its own mirror, `oriented`), else `query`.
    From nothing, the last atom's rule runs alone (the others read an old state that is empty):
    it then binds each clique's two lowest vertices and extends only upwards — with the ids
    relabelled by (degree, id) rank (`wcoj_core.input_land.by_rank`), through the neighbours of
    higher rank, few even at a hub: the degree ordering of clique listing.

    >>> from wcoj_core.query.builtins import builtin
    >>> str(counted(builtin("triangles"), ["edge"]))
    'triangles(a, b, c) :- edge(a, b), edge(c, b), edge(a, c), a < c, c < b'
    """
    if not order_free(query, undirected):
        return query
    last = query.atoms[-1].vars
    chain = [*last, *(v for v in query.vars if v not in last)]
    filters = tuple(Filter(x, CmpOp.LT, y) for x, y in itertools.pairwise(chain))
    atoms = tuple(Atom(a.relation, tuple(sorted(a.vars, key=chain.index))) for a in query.atoms)
    return dataclasses.replace(query, atoms=atoms, filters=filters)


def members(query: Query, undirected: Collection[str]) -> Query | None:
    """The cliques an aggregate counts at each member, when it is one: ``count()`` per vertex
    `v` over a clique of one undirected relation whose filters order its other variables (as
    ``triangles-per-vertex``: each clique holding `v` is then one binding, the others' order
    fixed), else None. The cliques, each once (`order_free`: every variable ordered), credit
    their weight to each of their vertices (distinct: an undirected relation has no loops)
    and find each clique once, where the aggregate's rules find it once per member.

    >>> from wcoj_core.query.builtins import builtin
    >>> str(members(builtin("triangles-per-vertex"), ["edge"]))
    'triangles_per_vertex(a, b, c) :- edge(a, b), edge(b, c), edge(a, c), a < b, b < c'
    >>> [members(builtin(q), ["edge"]) is None for q in ("degrees", "edge-support")]
    [False, True]
    """
    agg = query.aggregate
    if agg is None or agg.var is not None or len(query.head) != 1:
        return None
    chain = tuple(Filter(x, CmpOp.LT, y) for x, y in itertools.pairwise(query.vars))
    cliques = dataclasses.replace(query, head=query.vars, filters=chain, aggregate=None)
    rest = set(query.vars) - set(query.head)
    order = {f.vars for f in (*query.filters, *implied_filters(query.filters))}
    strict = all(f.op in (CmpOp.LT, CmpOp.GT) and f.vars <= rest for f in query.filters)
    pairs = {frozenset(p) for p in itertools.combinations(rest, 2)}
    fits = strict and order == pairs and order_free(cliques, undirected)
    return cliques if fits else None


def oriented(query: Query) -> bool:
    """Whether every atom of an order-free query (`order_free`) binds its first variable below
    its second (stated or implied by its filters): its relation's edges from higher to lower
    are then never matched, and a count may hold each edge once, from lower to higher.

    >>> from wcoj_core.query.builtins import builtin
    >>> [oriented(q) for q in (builtin("triangles"), counted(builtin("4-cliques"), ["edge"]))]
    [True, True]
    """
    below = {
        (f.left, f.right) if f.op is CmpOp.LT else (f.right, f.left)
        for f in (*query.filters, *implied_filters(query.filters))
        if f.op in (CmpOp.LT, CmpOp.GT)
    }
    return all(a.vars in below for a in query.atoms)
