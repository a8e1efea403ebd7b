"""The planner: golden `explain()` texts, and invariants checked on every rule of every plan.

Golden files live in ``tests/core/golden/<name>.txt``. After a deliberate planner change,
regenerate them with ``WCOJ_REGEN_GOLDEN=1 pytest tests/core/test_plan.py``, then read the diff:
a golden file is only as good as the review it got.

The invariants are checked on the plans of every built-in query and of random queries drawn by
Hypothesis (2-5 atoms over relations of arity 1-3, shared and repeated variables, constants and
filters), with the planner's own variable orders and with every order `valid_orders` allows.
"""

from __future__ import annotations

import itertools
import math
import os
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from wcoj_core.errors import QueryError
from wcoj_core.query.builtins import BUILTINS, builtin
from wcoj_core.query.explain import explain
from wcoj_core.query.ir import Atom, CmpOp, Const, Filter, Query, Term, Var
from wcoj_core.query.parse import parse_query
from wcoj_core.query.plan import (
    DeltaRule,
    Plan,
    Version,
    atom_view,
    implied_filters,
    plan_query,
    valid_orders,
)

GOLDEN = Path(__file__).parent / "golden"
REGEN = os.environ.get("WCOJ_REGEN_GOLDEN") == "1"

# Queries beyond the built-ins, each exercising one planner feature.
CUSTOM: dict[str, str] = {
    # A ternary relation selected by a constant; two atoms share the view r[c0, 7, c1].
    "ternary-constant": "p(a, b, c) :- r(a, 7, b), s(b, c), r(c, 7, a)",
    # A repeated variable: e(a, a) reads the diagonal of e, a different view from e(a, b).
    "repeated-variable": "p(a, b) :- e(a, a), e(a, b)",
    # Filters against constants, on start variables and on extended ones.
    "constant-filter": "p(a, b, c) :- e(a, b), e(b, c), a != 5, c > 3, 2 <= b",
    # Two components joined only by a filter: a cartesian product extended through support sets.
    "cartesian": "p(a, c) :- e(a, b), f(c, d), a < c",
    # Each atom is fully bound by the other's variables: both rules only validate.
    "fully-bound": "p(a, b) :- r(a, b), s(b, a)",
    # An atom without variables is a start check in every other rule.
    "ground-atom": "p(a) :- e(a, b), g(1, 2)",
}

GOLDEN_QUERIES: dict[str, Query] = {
    **{name: builtin(name) for name in BUILTINS},
    **{name: parse_query(text) for name, text in CUSTOM.items()},
}


# --- golden explain texts -------------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(GOLDEN_QUERIES))
def test_explain_matches_golden(name: str) -> None:
    text = explain(plan_query(GOLDEN_QUERIES[name]))
    path = GOLDEN / f"{name}.txt"
    if REGEN:
        GOLDEN.mkdir(exist_ok=True)
        path.write_text(text)
        return
    if not path.exists():
        pytest.fail(f"{path} is missing; create it with WCOJ_REGEN_GOLDEN=1 and review it")
    assert text == path.read_text(), (
        f"explain() of {name!r} changed; if the change is intended, regenerate with "
        f"WCOJ_REGEN_GOLDEN=1 pytest {Path(__file__).name} and review the diff"
    )


def test_no_stale_golden_files() -> None:
    if REGEN:
        for path in GOLDEN.glob("*.txt"):
            if path.stem not in GOLDEN_QUERIES:
                path.unlink()
    assert sorted(p.stem for p in GOLDEN.glob("*.txt")) == sorted(GOLDEN_QUERIES)


def test_explain_is_deterministic() -> None:
    for query in GOLDEN_QUERIES.values():
        assert explain(plan_query(query)) == explain(plan_query(parse_query(str(query))))


# --- invariants -----------------------------------------------------------------------------------


def expected_versions(n: int, delta: int) -> tuple[Version, ...]:
    return tuple(
        Version.NEW if j < delta else Version.DELTA if j == delta else Version.OLD for j in range(n)
    )


def check_views(plan: Plan) -> None:
    """Each atom's view selects its constants and repeated variables; columns are its variables."""
    assert plan.filters == (*plan.query.filters, *plan.implied)
    for j, atom in enumerate(plan.query.atoms):
        view = plan.views[j]
        assert view == atom_view(atom)
        assert plan.atom_vars[j] == atom.vars
        assert view.relation == atom.relation
        assert len(view.pattern) == atom.arity
        assert view.arity == len(atom.vars)
        for term, p in zip(atom.terms, view.pattern, strict=True):
            if isinstance(term, Const):
                assert p == term
            else:
                assert p == atom.vars.index(term)


def check_rule(plan: Plan, rule: DeltaRule) -> None:
    """Every invariant of one delta rule; the failure message names the query and the rule."""
    query = plan.query
    n = len(query.atoms)
    i = rule.delta
    where = f"{query} rule {i}"
    atom_vars = plan.atom_vars

    # Visibility: atoms before the delta atom read the new state, atoms after it the old one.
    assert rule.versions == expected_versions(n, i), where

    # The order starts with the delta atom's variables and binds every variable exactly once.
    assert rule.start == query.atoms[i].vars, where
    assert rule.order[: len(rule.start)] == rule.start, where
    assert len(set(rule.order)) == len(rule.order), where
    assert set(rule.order) == set(query.vars), where

    # Start checks: exactly the other atoms whose variables the delta atom binds.
    start = set(rule.start)
    assert [c.atom for c in rule.checks] == [
        j for j in range(n) if j != i and set(atom_vars[j]) <= start
    ], where
    for c in rule.checks:
        assert (c.version, c.view) == (rule.versions[c.atom], plan.views[c.atom]), where

    # Steps: every atom holding the step variable extends; keys are the bound view columns.
    bound = set(start)
    completions: Counter[int] = Counter()
    arrangements = set(plan.arrangements)
    for step in rule.steps:
        assert step.var not in bound, where
        holders = [j for j in range(n) if step.var in atom_vars[j]]
        assert i not in holders, where
        assert [x.atom for x in step.extenders] == holders, f"{where}, step {step.var}"
        for x in step.extenders:
            vs = atom_vars[x.atom]
            assert (x.version, x.view) == (rule.versions[x.atom], plan.views[x.atom]), where
            assert x.key == tuple(k for k, u in enumerate(vs) if u in bound), where
            assert x.value == vs.index(step.var), where
            assert x.completes == (set(vs) <= bound | {step.var}), where
            assert {x.counts, x.support} <= arrangements, where
            completions[x.atom] += x.completes
        bound.add(step.var)
    assert bound == set(query.vars), where

    # Each other atom multiplies in exactly once: as a start check or where it completes.
    checked = {c.atom for c in rule.checks}
    for j in range(n):
        if j != i:
            assert completions[j] == (0 if j in checked else 1), f"{where}, atom {j}"

    # Each filter applies exactly once, as soon as its last variable is bound.
    placed: Counter[Filter] = Counter(rule.start_filters)
    for f in rule.start_filters:
        assert f.vars <= start, where
    bound = set(start)
    for step in rule.steps:
        bound.add(step.var)
        placed.update(step.filters)
        for f in step.filters:
            assert f.vars <= bound, f"{where}: {f} applies before its variables are bound"
            assert step.var in f.vars, f"{where}: {f} could apply before {step.var}"
    assert placed == Counter(plan.filters), where


def check_greedy_order(plan: Plan, rule: DeltaRule) -> None:
    """Without forced orders, each step binds a variable touching the most atoms already touched."""
    bound = set(rule.start)
    for step in rule.steps:

        def touched(v: Var, bound: set[Var] = bound) -> int:
            return sum(v in vs and any(u in bound for u in vs) for vs in plan.atom_vars)

        remaining = [v for v in plan.query.vars if v not in bound]
        assert touched(step.var) == max(map(touched, remaining)), f"{plan.query} rule {rule.delta}"
        bound.add(step.var)


def bad_orders(query: Query, delta: int) -> list[tuple[Var, ...]]:
    """Orders `plan_query` must refuse for rule `delta`."""
    start = query.atoms[delta].vars
    order = valid_orders(query, delta)[0]
    bad = [(*order, Var("zz_unknown"))]
    if order:
        bad.append(order[:-1])  # a variable missing
        bad.append((*order, order[0]))  # a variable twice
        bad.append((*order[:-1], Var("zz_unknown")))  # a variable replaced
    if start and len(order) > len(start):
        bad.append((order[len(start)], *start, *order[len(start) + 1 :]))  # not starting with start
    if len(start) >= 2:
        bad.append((start[1], start[0], *order[2:]))  # start variables out of their order
    return bad


def check_query(query: Query) -> None:
    """Every invariant, with the chosen orders and with every valid order of every rule."""
    plan = plan_query(query)
    check_views(plan)
    assert len(plan.rules) == len(query.atoms)
    for i, rule in enumerate(plan.rules):
        assert rule.delta == i
        check_rule(plan, rule)
        check_greedy_order(plan, rule)
    for i in range(len(query.atoms)):
        orders = valid_orders(query, i)
        assert (
            len(set(orders))
            == len(orders)
            == math.factorial(len(query.vars) - len(query.atoms[i].vars))
        )
        for order in orders:
            forced = plan_query(query, orders={i: order})
            assert forced.rules[i].order == order
            check_rule(forced, forced.rules[i])
        for order in bad_orders(query, i):
            with pytest.raises(QueryError, match="variable order"):
                plan_query(query, orders={i: order})


@pytest.mark.parametrize("name", list(BUILTINS))
def test_invariants_of_builtins(name: str) -> None:
    check_query(builtin(name))


@pytest.mark.parametrize("name", list(CUSTOM))
def test_invariants_of_custom_queries(name: str) -> None:
    check_query(GOLDEN_QUERIES[name])


RELATIONS = {"u": 1, "e": 2, "f": 2, "t": 3}
VARS = tuple(Var(v) for v in "abcde")


@st.composite
def queries(draw: st.DrawFn) -> Query:
    """A random valid query: 2-5 atoms, shared and repeated variables, constants, filters."""
    atoms = []
    for _ in range(draw(st.integers(2, 5))):
        relation = draw(st.sampled_from(sorted(RELATIONS)))
        terms: list[Term] = []
        for _ in range(RELATIONS[relation]):
            # One term in six is a constant; the rest are variables from a small shared pool.
            if draw(st.integers(0, 5)) == 0:
                terms.append(Const(draw(st.integers(-1, 3))))
            else:
                terms.append(draw(st.sampled_from(VARS)))
        atoms.append(Atom(relation, tuple(terms)))
    bound = sorted({v for a in atoms for v in a.vars}, key=str)
    filters = []
    if bound:
        for _ in range(draw(st.integers(0, 4))):
            left: Term = draw(st.sampled_from(bound))
            right: Term = draw(
                st.one_of(st.sampled_from(bound), st.builds(Const, st.integers(-1, 3)))
            )
            op = draw(st.sampled_from(list(CmpOp)))
            if draw(st.booleans()):
                left, right, op = right, left, op.flipped()
            filters.append(Filter(left, op, right))
    head = draw(st.lists(st.sampled_from(bound), unique=True)) if bound else []
    return Query("q", tuple(head), tuple(atoms), tuple(filters))


@settings(max_examples=150)
@given(queries())
def test_invariants_of_random_queries(query: Query) -> None:
    check_query(query)


# --- implied filters ------------------------------------------------------------------------------

a, b, c, d = (Var(v) for v in "abcd")


@pytest.mark.parametrize(
    ("filters", "implied"),
    [
        ([Filter(a, CmpOp.LT, b), Filter(b, CmpOp.LT, c)], [Filter(a, CmpOp.LT, c)]),
        ([Filter(a, CmpOp.LE, b), Filter(b, CmpOp.LE, c)], [Filter(a, CmpOp.LE, c)]),
        ([Filter(a, CmpOp.LE, b), Filter(b, CmpOp.LT, c)], [Filter(a, CmpOp.LT, c)]),
        # '>' reads right to left: c < b < a.
        ([Filter(a, CmpOp.GT, b), Filter(b, CmpOp.GE, c)], [Filter(c, CmpOp.LT, a)]),
        # A chain implies every longer pair.
        (
            [Filter(a, CmpOp.LT, b), Filter(b, CmpOp.LT, c), Filter(c, CmpOp.LE, d)],
            [Filter(a, CmpOp.LT, c), Filter(a, CmpOp.LT, d), Filter(b, CmpOp.LT, d)],
        ),
        # Stated pairs are never restated, in either direction.
        ([Filter(a, CmpOp.LT, b), Filter(b, CmpOp.LT, c), Filter(c, CmpOp.GT, a)], []),
        # '!=' and '=' are not orders: nothing follows from them here.
        ([Filter(a, CmpOp.NE, b), Filter(b, CmpOp.NE, c)], []),
        ([Filter(a, CmpOp.LT, b), Filter(b, CmpOp.NE, c)], []),
        ([Filter(a, CmpOp.EQ, b), Filter(b, CmpOp.EQ, c)], []),
        # Comparisons with constants take no part.
        ([Filter(a, CmpOp.LT, Const(3)), Filter(Const(3), CmpOp.LT, b)], []),
    ],
)
def test_implied_filters(filters: list[Filter], implied: list[Filter]) -> None:
    assert list(implied_filters(filters)) == implied


def test_builtin_implied_filters() -> None:
    assert [str(f) for f in plan_query(builtin("triangles")).implied] == ["a < c"]
    assert [str(f) for f in plan_query(builtin("4-cliques")).implied] == [
        "a < c",
        "a < d",
        "b < d",
    ]
    for name in ("directed-triangles", "3-cycles", "4-cycles", "2-paths"):
        assert plan_query(builtin(name)).implied == ()


def _order_filters(filters: Sequence[Filter]) -> list[Filter]:
    return [
        f
        for f in filters
        if isinstance(f.left, Var)
        and isinstance(f.right, Var)
        and f.op in (CmpOp.LT, CmpOp.LE, CmpOp.GT, CmpOp.GE)
    ]


@settings(max_examples=150)
@given(queries())
def test_implied_filters_are_sound_and_new(query: Query) -> None:
    """Every assignment satisfying the stated order filters satisfies the implied ones.

    A domain with as many values as variables realizes every relative order of the variables, so
    brute force over it decides soundness for order comparisons over all integers.
    """
    stated = _order_filters(query.filters)
    implied = implied_filters(query.filters)
    stated_pairs = {frozenset((f.left, f.right)) for f in stated}
    for f in implied:
        assert isinstance(f.left, Var) and isinstance(f.right, Var) and f.left != f.right
        assert f.op in (CmpOp.LT, CmpOp.LE)
        assert frozenset((f.left, f.right)) not in stated_pairs, f"{f} restates a filter"
    names = sorted({v for f in stated for v in f.vars}, key=str)
    for values in itertools.product(range(len(names)), repeat=len(names)):
        binding = dict(zip(names, values, strict=True))
        if all(f.holds(binding) for f in stated):
            for f in implied:
                assert f.holds(binding), f"{f} does not follow from {[str(s) for s in stated]}"


# -- bounded planning (issue 27, H1) ------------------------------------------------------------


def _reference_order(query: Query, delta: int, sizes: dict[str, int]) -> list[Var]:
    """The variable-order heuristic as first written: every remaining variable scored afresh at
    every step (quadratic per rule), the least score taken."""
    atom_vars = [a.vars for a in query.atoms]
    order = list(atom_vars[delta])
    bound = set(order)
    remaining = [v for v in query.vars if v not in bound]
    while remaining:

        def score(v: Var) -> tuple[int, float, int]:
            holding = [i for i, vs in enumerate(atom_vars) if v in vs]
            linked = [i for i in holding if any(u in bound for u in atom_vars[i])]
            est = min(
                max(float(sizes.get(query.atoms[i].relation, 1000)), 1.0)
                ** ((len(atom_vars[i]) - sum(u in bound for u in atom_vars[i])) / len(atom_vars[i]))
                for i in holding
            )
            return (-len(linked), est, query.vars.index(v))

        best = min(remaining, key=score)
        order.append(best)
        bound.add(best)
        remaining.remove(best)
    return order


@st.composite
def wide_queries(draw: st.DrawFn) -> tuple[Query, dict[str, int]]:
    """Queries of up to 12 atoms over up to 10 variables, relations of arity 1-4 and sizes."""
    names = [Var(f"v{i}") for i in range(draw(st.integers(2, 10)))]
    arity = {r: draw(st.integers(1, 4)) for r in ("r", "s", "t")}
    atoms = []
    for _ in range(draw(st.integers(1, 12))):
        rel = draw(st.sampled_from(sorted(arity)))
        atoms.append(Atom(rel, tuple(draw(st.sampled_from(names)) for _ in range(arity[rel]))))
    bound = sorted({v for a in atoms for v in a.vars}, key=lambda v: v.name)
    filters = []
    for _ in range(draw(st.integers(0, 4))):
        left, right = draw(st.sampled_from(bound)), draw(st.sampled_from(bound))
        if left != right:
            filters.append(Filter(left, draw(st.sampled_from(list(CmpOp))), right))
    sizes = {r: draw(st.integers(0, 10**6)) for r in arity if draw(st.booleans())}
    return Query("q", tuple(bound), tuple(atoms), tuple(filters)), sizes


@given(wide_queries())
@settings(max_examples=200)
def test_the_incremental_order_is_the_quadratic_heuristics(drawn: tuple[Query, dict]) -> None:
    """The planner's incremental scores choose the orders the plain heuristic chooses, and each
    step's filters are those whose last variable it binds, in the query's order."""
    query, sizes = drawn
    plan = plan_query(query, sizes)
    for rule in plan.rules:
        assert list(rule.order) == _reference_order(query, rule.delta, sizes)
        bound = set(rule.start)
        pending = [f for f in plan.filters if not f.vars <= bound]
        for step in rule.steps:
            bound.add(step.var)
            ready = tuple(f for f in pending if f.vars <= bound)
            pending = [f for f in pending if f not in ready]
            assert step.filters == ready


def chain(n: int, filters: bool = False) -> Query:
    xs = [Var(f"x{i}") for i in range(n + 1)]
    atoms = tuple(Atom("e", (xs[i], xs[i + 1])) for i in range(n))
    order = tuple(Filter(xs[i], CmpOp.LT, xs[i + 1]) for i in range(n)) if filters else ()
    return Query("p", (xs[0], xs[-1]), atoms, order)


@pytest.mark.parametrize("n", [40, 100, 256])
def test_a_chain_of_hundreds_of_atoms_plans_in_bounded_time(n: int) -> None:
    """Issue 27's H1: a chain of 40 atoms took 3.1 s to explain, 100 atoms 66 s. Now a rule is
    ordered in about its terms times a logarithm: 256 atoms (with a filter per atom, whose
    implied pairs are not derived past `IMPLIED_VARS`) within seconds. Seconds of this thread's
    CPU, not of the clock: at load 25 the clock gave 13 s for 100 atoms (2.2x the bound) while
    the planning itself took what it takes on an idle machine."""
    from wcoj_core.query.plan import IMPLIED_VARS

    start = time.thread_time()
    plan = plan_query(chain(n, filters=True))
    assert time.thread_time() - start < 4.0 * (n / 100) ** 2 + 2.0
    assert len(plan.rules) == n and (plan.implied == ()) == (n + 1 > IMPLIED_VARS)
    assert [str(v) for v in plan.rules[0].order[:3]] == ["x0", "x1", "x2"]


def test_a_query_beyond_the_limit_is_refused_in_one_line() -> None:
    from wcoj_core.query.plan import MAX_ATOMS

    plan_query(chain(MAX_ATOMS))
    start = time.thread_time()  # CPU, not the clock (see the test above)
    with pytest.raises(QueryError, match=r"has 2,000 atoms; wcoj plans queries of up to 256"):
        plan_query(chain(2000))
    assert time.thread_time() - start < 1.0
