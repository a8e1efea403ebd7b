"""The naive oracle: hand-computed cases and a cross-check against brute-force enumeration; and
`fold_epoch`, the oracle of an epoch landed on a set or a bag (`wcoj_core.meaning`)."""

from __future__ import annotations

import itertools
import math
import random
import time
from collections import Counter

import pytest
from hypothesis import given
from hypothesis import strategies as st
from oracle import Relations, accumulate, fold_epoch, naive_delta, naive_eval

from wcoj_core.errors import QueryError
from wcoj_core.query.builtins import builtin
from wcoj_core.query.ir import Atom, CmpOp, Const, Filter, Query, Var
from wcoj_core.query.parse import parse_query

TRIANGLE = parse_query("t(a, b, c) :- e(a, b), e(b, c), e(a, c)")


def test_triangle_multiplicities_multiply() -> None:
    rels = {"e": {(1, 2): 2, (2, 3): 3, (1, 3): 1, (3, 4): 5}}
    assert naive_eval(TRIANGLE, rels) == Counter({(1, 2, 3): 6})


def test_deletion_gives_negative_multiplicity() -> None:
    rels = {"e": {(1, 2): 2, (2, 3): -1, (1, 3): 1}}
    assert naive_eval(TRIANGLE, rels) == Counter({(1, 2, 3): -2})


def test_zero_multiplicities_are_ignored_and_missing_relations_are_empty() -> None:
    assert naive_eval(TRIANGLE, {"e": {(1, 2): 0, (2, 3): 1, (1, 3): 1}}) == Counter()
    assert naive_eval(TRIANGLE, {}) == Counter()


def test_repeated_variable_within_an_atom() -> None:
    q = parse_query("p(a) :- e(a, a)")
    rels = {"e": {(1, 1): 2, (1, 2): 7, (3, 3): -1}}
    assert naive_eval(q, rels) == Counter({(1,): 2, (3,): -1})


def test_constants_must_match() -> None:
    q = parse_query("p(b) :- e(1, b), f(b, -2)")
    rels = {"e": {(1, 5): 2, (2, 6): 1, (1, 7): 1}, "f": {(5, -2): 3, (7, 0): 1, (6, -2): 1}}
    assert naive_eval(q, rels) == Counter({(5,): 6})


def test_filters() -> None:
    q = parse_query("p(a, b) :- e(a, b), a < b, b != 3, a >= 0")
    rels = {"e": {(0, 1): 1, (2, 1): 1, (1, 3): 1, (-1, 4): 1, (2, 5): 4}}
    assert naive_eval(q, rels) == Counter({(0, 1): 1, (2, 5): 4})


def test_filter_against_a_constant_on_the_left() -> None:
    q = parse_query("p(a) :- e(a), 2 <= a")
    assert naive_eval(q, {"e": {(1,): 1, (2,): 1, (3,): 2}}) == Counter({(2,): 1, (3,): 2})


def test_repeated_relation_contributes_one_factor_per_atom() -> None:
    q = parse_query("p(a) :- e(a), e(a)")
    assert naive_eval(q, {"e": {(1,): 3, (2,): -2}}) == Counter({(1,): 9, (2,): 4})


def test_head_projection_sums_multiplicities() -> None:
    q = parse_query("p(a) :- e(a, b)")
    rels = {"e": {(1, 2): 2, (1, 3): 3, (1, 4): -5, (2, 2): 1, (3, 1): 1, (3, 2): -1}}
    # (1,) sums to zero and disappears; (3,) too.
    assert naive_eval(q, rels) == Counter({(2,): 1})


def test_empty_head_counts_bindings() -> None:
    q = parse_query("p() :- e(a, b), e(b, c)")
    assert naive_eval(q, {"e": {(1, 2): 2, (2, 3): 1, (2, 4): 1}}) == Counter({(): 4})


def test_cartesian_product_of_disconnected_atoms() -> None:
    q = parse_query("p(a, b) :- e(a), f(b)")
    rels = {"e": {(1,): 2, (2,): 1}, "f": {(7,): 3, (8,): -1}}
    assert naive_eval(q, rels) == Counter({(1, 7): 6, (1, 8): -2, (2, 7): 3, (2, 8): -1})


def test_nullary_relation_scales_the_result() -> None:
    q = parse_query("p(a) :- r(), e(a)")
    assert naive_eval(q, {"r": {(): -2}, "e": {(1,): 3}}) == Counter({(1,): -6})
    assert naive_eval(q, {"r": {}, "e": {(1,): 3}}) == Counter()


def test_wrong_arity_tuple_is_reported() -> None:
    with pytest.raises(QueryError, match=r"relation 'e' holds the tuple \(1,\) of arity 1"):
        naive_eval(TRIANGLE, {"e": {(1,): 1}})


def test_builtin_triangles_counts_each_undirected_triangle_once() -> None:
    edges = [(1, 2), (2, 3), (1, 3), (3, 4), (2, 4)]
    symmetric = {e: 1 for a, b in edges for e in ((a, b), (b, a))}
    assert naive_eval(builtin("triangles"), {"edge": symmetric}) == Counter(
        {(1, 2, 3): 1, (2, 3, 4): 1}
    )
    assert naive_eval(builtin("4-cycles"), {"edge": symmetric}) == Counter({(1, 2, 4, 3): 1})


def test_builtin_3_cycles_rotates_smallest_first() -> None:
    edge = {(3, 1): 1, (1, 2): 1, (2, 3): 1, (2, 1): 1}
    assert naive_eval(builtin("3-cycles"), {"edge": edge}) == Counter({(1, 2, 3): 1})


def test_naive_delta_keeps_negative_changes() -> None:
    q = parse_query("p(a, c) :- e(a, b), e(b, c)")
    before = {"e": {(1, 2): 1, (2, 3): 1}}
    after = {"e": {(1, 2): 1, (2, 4): 2}}
    assert naive_delta(q, before, after) == Counter({(1, 3): -1, (1, 4): 2})
    assert naive_delta(q, after, after) == Counter()


def test_accumulate() -> None:
    ups = [((1,), 0, 1), ((1,), 2, -1), ((2,), 1, 3), ((2,), 1, -3), ((3,), 2, 4)]
    assert accumulate(ups, 0) == Counter({(1,): 1})
    assert accumulate(ups, 1) == Counter({(1,): 1})
    assert accumulate(ups, 2) == Counter({(3,): 4})
    assert accumulate(ups, 2, strict=True) == Counter({(1,): 1})
    assert accumulate([], 5) == Counter()


def test_fast_enough_on_a_few_hundred_edges() -> None:
    # ~300 directed edges of a dense random-ish graph; 4-cliques has six atoms.
    edges = {(a, b): 1 for a in range(40) for b in range(40) if a != b and (a * 7 + b * 3) % 10 < 2}
    assert 250 <= len(edges) <= 400
    start = time.perf_counter()
    for name in ("4-cliques", "4-cycles", "triangles", "2-paths"):
        naive_eval(builtin(name), {"edge": edges})
    assert time.perf_counter() - start < 10


# --- cross-check against brute force ------------------------------------------------------------

ARITIES = {"r": 2, "s": 1, "t": 3}
VARS = [Var(n) for n in "abcd"]
TERMS = st.one_of(st.sampled_from(VARS), st.integers(0, 2).map(Const))


@st.composite
def small_queries(draw: st.DrawFn) -> Query:
    """A random valid query over r/2, s/1, t/3 with up to four atoms and three filters."""
    relations = draw(st.lists(st.sampled_from(sorted(ARITIES)), min_size=1, max_size=4))
    atoms = [Atom(rel, tuple(draw(TERMS) for _ in range(ARITIES[rel]))) for rel in relations]
    bound = sorted({v for a in atoms for v in a.vars}, key=lambda v: v.name)
    if not bound:
        return Query("q", (), tuple(atoms))
    var = st.sampled_from(bound)
    head = draw(st.lists(var, max_size=3))
    filters = draw(
        st.lists(
            st.builds(
                Filter,
                var,
                st.sampled_from(list(CmpOp)),
                st.one_of(var, st.integers(0, 2).map(Const)),
            ),
            max_size=3,
        )
    )
    return Query("q", tuple(head), tuple(atoms), tuple(filters))


def relation(arity: int) -> st.SearchStrategy[dict[tuple[int, ...], int]]:
    row = st.tuples(*[st.integers(0, 2)] * arity)
    return st.dictionaries(row, st.integers(-3, 3), max_size=8)


RELATIONS = st.fixed_dictionaries({name: relation(arity) for name, arity in ARITIES.items()})


def brute_force(query: Query, relations: Relations) -> Counter[tuple[int, ...]]:
    """Try every assignment of the variables over the active domain."""
    domain = sorted(
        {x for rows in relations.values() for row in rows for x in row}
        | {t.value for a in query.atoms for t in a.terms if isinstance(t, Const)}
    )
    variables = query.vars
    out: Counter[tuple[int, ...]] = Counter()
    for assignment in itertools.product(domain, repeat=len(variables)):
        binding = dict(zip(variables, assignment, strict=True))

        def value(term: Var | Const, binding: dict[Var, int] = binding) -> int:
            return binding[term] if isinstance(term, Var) else term.value

        if not all(f.holds(binding) for f in query.filters):
            continue
        weight = math.prod(
            relations.get(a.relation, {}).get(tuple(value(t) for t in a.terms), 0)
            for a in query.atoms
        )
        if weight:
            out[tuple(binding[v] for v in query.head)] += weight
    return Counter({row: m for row, m in out.items() if m != 0})


@given(small_queries(), RELATIONS)
def test_naive_eval_matches_brute_force(query: Query, relations: Relations) -> None:
    assert naive_eval(query, relations) == brute_force(query, relations), str(query)


@given(small_queries(), RELATIONS, RELATIONS)
def test_naive_delta_is_the_difference(query: Query, before: Relations, after: Relations) -> None:
    delta = naive_delta(query, before, after)
    old, new = brute_force(query, before), brute_force(query, after)
    assert 0 not in delta.values()
    for row in old.keys() | new.keys() | delta.keys():
        assert delta[row] == new[row] - old[row]


# --- folding an epoch into a set or a bag (the oracle of `wcoj_core.meaning`) ---------------------

TUPLES = st.tuples(st.integers(0, 3), st.integers(0, 3))
LANDED = st.lists(st.tuples(TUPLES, st.sampled_from([1, 1, 2, -1, -2])), max_size=12)
SET_BEFORE = st.dictionaries(TUPLES, st.just(1), max_size=8)


def test_fold_epoch_reads_a_set_by_the_sign_of_each_tuples_sum() -> None:
    before = {(1, 2): 1, (2, 3): 1, (3, 4): 1}
    landed = [
        ((1, 2), 1),  # present, inserted again: unchanged
        ((2, 3), -1),  # present, deleted
        ((3, 4), 1),  # inserted and deleted in one epoch: sum 0, unchanged
        ((3, 4), -1),
        ((5, 6), -1),  # absent, deleted: unchanged
        ((6, 7), 2),  # absent, inserted twice: present once
        ((7, 8), 1),  # net +1 over three changes
        ((7, 8), 1),
        ((7, 8), -1),
    ]
    assert fold_epoch(before, landed, as_set=True) == Counter(
        {(1, 2): 1, (3, 4): 1, (6, 7): 1, (7, 8): 1}
    )
    assert fold_epoch(before, landed, as_set=False) == Counter(
        {(1, 2): 2, (3, 4): 1, (5, 6): -1, (6, 7): 2, (7, 8): 1}
    )


@given(SET_BEFORE, LANDED, st.randoms(use_true_random=False))
def test_a_set_fold_is_presence_idempotent_and_order_free(
    before: dict[tuple[int, ...], int], landed: list, rng: random.Random
) -> None:
    after = fold_epoch(before, landed, as_set=True)
    sums: Counter[tuple[int, ...]] = Counter()
    for t, d in landed:
        sums[t] += d
    assert set(after.values()) <= {1}
    for t in set(before) | set(sums):
        present = sums[t] > 0 or (sums[t] == 0 and t in before)
        assert (t in after) == present, t
    assert fold_epoch(after, landed, as_set=True) == after, "landing an epoch again: no change"
    shuffled = list(landed)
    rng.shuffle(shuffled)
    assert fold_epoch(before, shuffled, as_set=True) == after


@given(st.dictionaries(TUPLES, st.integers(-2, 2), max_size=8), LANDED)
def test_a_bag_fold_adds_every_diff(before: dict[tuple[int, ...], int], landed: list) -> None:
    expected: Counter[tuple[int, ...]] = Counter(before)
    for t, d in landed:
        expected[t] += d
    assert fold_epoch(before, landed, as_set=False) == Counter(
        {t: m for t, m in expected.items() if m}
    )
