"""Hypothesis strategies shared by the oracle tests: random queries and random update streams.

No Spark here: the kernel's tests (`tests/kernel`) draw from these too.
"""

from __future__ import annotations

from hypothesis import strategies as st

from wcoj_core.query.ir import Aggregate, Atom, CmpOp, Const, Filter, Query, Var

ARITY = {"r": 2, "s": 2, "t": 3, "u": 1}
VARS = [Var(n) for n in "abcd"]
DOMAIN = st.integers(0, 3)

Rel = dict[tuple[int, ...], int]
Updates = list[tuple[tuple[int, ...], int]]


@st.composite
def queries(draw: st.DrawFn, aggregates: bool = False) -> Query:
    """Cyclic and acyclic queries over binary, ternary and unary relations, with repeated
    relations, constants, repeated variables, filters and projections; with `aggregates`,
    some aggregate their groups (count() or sum(x)). (Opt-in: a draw added to every query
    would change the examples a derandomized profile gives every other test.)"""
    n_atoms = draw(st.integers(1, 4))
    atoms = []
    for _ in range(n_atoms):
        rel = draw(st.sampled_from(sorted(ARITY)))
        term = (
            st.one_of(st.sampled_from(VARS), DOMAIN.map(Const))
            if draw(st.booleans())
            else st.sampled_from(VARS)
        )
        terms = [draw(term) for _ in range(ARITY[rel])]
        atoms.append(Atom(rel, tuple(terms)))
    bound = sorted({v for a in atoms for v in a.vars}, key=lambda v: v.name)
    if not bound:
        # Every atom is all constants: still a valid query (a product of scalars).
        head: tuple[Var, ...] = ()
        return Query("q", head, tuple(atoms))
    filters = []
    for _ in range(draw(st.integers(0, 2))):
        left = draw(st.sampled_from(bound))
        op = draw(st.sampled_from(list(CmpOp)))
        right = draw(st.one_of(st.sampled_from(bound), DOMAIN.map(Const)))
        if right != left:
            filters.append(Filter(left, op, right))
    head = tuple(draw(st.lists(st.sampled_from(bound), max_size=3)))
    aggregate = None
    if aggregates:
        aggregate = draw(st.sampled_from([None, Aggregate(), *(Aggregate(v) for v in bound)]))
    return Query("q", head, tuple(atoms), tuple(filters), aggregate)


def updates(arity: int) -> st.SearchStrategy[Updates]:
    """Inserts, deletes and multiplicities above one of tuples over a small domain."""
    tuple_ = st.tuples(*[DOMAIN] * arity)
    diff = st.sampled_from([1, 1, 1, 2, -1, -2])
    return st.lists(st.tuples(tuple_, diff), max_size=10)
