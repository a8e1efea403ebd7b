"""Checked multiplicity arithmetic: the kernel raises `MultiplicityOverflow` instead of wrapping.

What raises (the choice `wcoj_core.kernel.join` documents): a full binding of a delta rule whose
weight — the product of its atoms' multiplicities, each as of the version the rule reads — leaves
int64, and a sum that leaves int64 (a tuple's multiplicity over layers, equal rows consolidated,
the output change summed over rules and bindings). "Intermediate" thus means a delta rule's
binding, not a partial binding the join happens to form on the way: those die without raising,
so what raises depends on neither the variable order nor which extender proposes. The oracle
computes every delta rule's bindings with Python ints (`naive_eval`, each atom renamed to its
version) and expects a raise exactly when one of them, or a summed output change, leaves int64.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping

import numpy as np
import pytest
from hypothesis import event, given, note, settings
from hypothesis import strategies as st
from oracle import naive_eval, signed_difference
from strategies import Rel, queries
from test_join import epoch_layers, kernel_change

from wcoj_core.errors import MultiplicityOverflow
from wcoj_core.kernel.join import RuleTally, count_rule
from wcoj_core.kernel.layer import Layer, enumerate_ranges, lookup_sum, merged
from wcoj_core.kernel.multiplicity import sums_at, times, total
from wcoj_core.query.builtins import builtin
from wcoj_core.query.ir import Atom, Query
from wcoj_core.query.parse import parse_query
from wcoj_core.query.plan import Plan, Version, plan_query, valid_orders

I64_MIN, I64_MAX = -(2**63), 2**63 - 1


def fits(v: int) -> bool:
    return I64_MIN <= v <= I64_MAX


# -- the arithmetic alone ---------------------------------------------------------------------

INT64 = st.one_of(
    st.integers(I64_MIN, I64_MAX),
    st.sampled_from([I64_MIN, I64_MAX, 0, 1, -1, 2**31, -(2**31), 2**32, 3037000499, 3037000500]),
)


@given(pairs=st.lists(st.tuples(INT64, INT64), min_size=1, max_size=20))
def test_a_product_flags_exactly_the_rows_past_int64(pairs) -> None:
    a = np.array([x for x, _ in pairs], dtype=np.int64)
    b = np.array([y for _, y in pairs], dtype=np.int64)
    product, over = times(a, b)
    exact = [x * y for x, y in pairs]
    flags = [False] * len(pairs) if over is None else over.tolist()
    assert flags == [not fits(v) for v in exact]
    assert [p for p, v in zip(product.tolist(), exact, strict=True) if fits(v)] == [
        v for v in exact if fits(v)
    ]


@given(rows=st.lists(st.lists(INT64, min_size=1, max_size=4), min_size=1, max_size=8))
def test_a_sum_is_exact_or_raises_at_the_first_row_past_int64(rows) -> None:
    k = min(len(r) for r in rows)
    parts = [np.array([r[j] for r in rows], dtype=np.int64) for j in range(k)]
    exact = [sum(r[:k]) for r in rows]
    bad = [i for i, v in enumerate(exact) if not fits(v)]
    if bad:
        with pytest.raises(MultiplicityOverflow) as e:
            total(parts, lambda i: (i,), "a sum")
        assert e.value.tuple == (bad[0],)
    else:
        assert total(parts, lambda i: (i,), "a sum").tolist() == exact
    starts = np.array([0, *sorted({len(rows) // 2, len(rows) - 1} - {0})], dtype=np.int64)
    flat = np.array([r[0] for r in rows], dtype=np.int64)
    runs = np.split(flat.astype(object), starts[1:])
    sums = [int(sum(r.tolist())) for r in runs]
    bad = [i for i, v in enumerate(sums) if not fits(v)]
    if bad:
        with pytest.raises(MultiplicityOverflow) as e:
            sums_at(flat, starts, lambda i: (i,), "a sum")
        assert e.value.tuple == (int(starts[bad[0]]),)
    else:
        assert sums_at(flat, starts, lambda i: (i,), "a sum").tolist() == sums


# -- sums in layers -----------------------------------------------------------------------------


@pytest.mark.parametrize("row", [(1, 2), (1, I64_MAX)])  # packed, and bytes
def test_consolidating_past_int64_raises_naming_the_row(row) -> None:
    rows = np.array([row, row, (0, 0)], dtype=np.int64)
    with pytest.raises(MultiplicityOverflow, match=r"at \(1, ") as e:
        Layer.build(rows, np.array([2**62, 2**62, 1]))
    assert e.value.tuple == row
    inside = Layer.build(rows, np.array([2**62, 2**62 - 1, 1]))
    assert inside.diff.tolist() == [1, I64_MAX]
    lowest = Layer.build(rows, np.array([-(2**62), -(2**62), 1]))
    assert lowest.diff.tolist() == [1, I64_MIN]
    with pytest.raises(MultiplicityOverflow):
        Layer.build(np.zeros((2, 0), dtype=np.int64), np.array([I64_MIN, -1]))


def test_summing_layers_raises_only_when_the_whole_sum_leaves_int64() -> None:
    def layer(d: int) -> Layer:
        return Layer.build(np.array([[1, 2], [3, 4]]), np.array([d, 1]))

    rows = np.array([[1, 2], [3, 4], [5, 6]])
    # Past the range after two layers, back into it after the third: the sum is exact.
    assert lookup_sum([layer(2**62), layer(2**62), layer(-(2**62))], rows).tolist() == [2**62, 3, 0]
    with pytest.raises(MultiplicityOverflow, match=r"at \(1, 2\)"):
        lookup_sum([layer(2**62), layer(2**62)], rows)
    with pytest.raises(MultiplicityOverflow) as e:  # proposing (1, 2) sums it over both layers
        enumerate_ranges([layer(2**62), layer(2**62)], np.array([[3], [1]]))
    assert e.value.tuple == (1, 2)
    with pytest.raises(MultiplicityOverflow, match="merging"):
        merged(layer(I64_MAX), layer(1))


# -- products in rules ----------------------------------------------------------------------


def change_of(
    query: Query, plan: Plan, old: Mapping[str, Rel], delta: Mapping[str, Rel]
) -> Counter:
    """The kernel's output change for one epoch (every rule, one share)."""
    return kernel_change(plan, epoch_layers(plan, old, delta), 1, 1 << 20, 1 << 23)[0]


TRIANGLE = {(1, 2): 1, (2, 3): 1, (1, 3): 1}


@pytest.mark.parametrize("rule", [0, 1, 2])
def test_a_triangle_of_three_edges_of_2_to_the_21_raises(rule) -> None:
    query = builtin("triangles")
    plan = plan_query(query)
    weights = {e: 2**21 for e in TRIANGLE}
    with pytest.raises(MultiplicityOverflow) as e:
        change_of(query, plan, {"edge": {}}, {"edge": weights})
    assert e.value.tuple == (1, 2, 3)
    layers = epoch_layers(plan, {"edge": {}}, {"edge": weights})
    with pytest.raises(MultiplicityOverflow) as counting:  # counted, not written: the same
        count_rule(plan, plan.rules[2], layers, RuleTally.of(plan.rules[2]))
    assert counting.value.tuple == (1, 2, 3)
    assert "(1, 2, 3)" in str(e.value) and "(a, b, c)" in str(e.value)
    assert str(e.value.with_epoch(4)).endswith(
        "so epoch 4 cannot be applied (check the diffs of its changes)"
    )
    # Two edges there already, the third lands: only one rule has a binding.
    last = list(TRIANGLE)[rule]
    old = {"edge": {k: v for k, v in weights.items() if k != last}}
    with pytest.raises(MultiplicityOverflow):
        change_of(query, plan, old, {"edge": {last: 2**21}})
    # Just inside the range, both ends: exact.
    for d, want in [(2**20, 2**62), (-(2**21), I64_MIN)]:
        assert change_of(query, plan, old, {"edge": {last: d}}) == Counter({(1, 2, 3): want})


def test_a_partial_binding_past_int64_that_dies_raises_nothing() -> None:
    """Two heavy edges a -> b -> c with no shortcut a -> c: the heavy one proposes c (a has
    more successors than b), the weight 2**80 is flagged, and the binding dies validating."""
    query = builtin("directed-triangles")
    plan = plan_query(query)
    old = {"edge": {(2, 3): 2**40, (1, 4): 1, (1, 5): 1}}
    assert change_of(query, plan, old, {"edge": {(1, 2): 2**40}}) == Counter()


def test_an_output_change_summed_past_int64_raises() -> None:
    query = parse_query("p(a) :- r(a, b)")
    plan = plan_query(query)
    with pytest.raises(MultiplicityOverflow, match=r"output change \(a\) at \(1,\)"):
        change_of(query, plan, {"r": {}}, {"r": {(1, 2): 2**62, (1, 3): 2**62}})
    assert change_of(query, plan, {"r": {}}, {"r": {(1, 2): 2**62, (1, 3): 2**62 - 1}}) == Counter(
        {(1,): I64_MAX}
    )


# -- the kernel against the oracle, multiplicities past the range -----------------------------

BIG = [1, -1, 2, 2**20, -(2**21), 2**31, -(2**31), 2**40, -(2**40)]


def big_updates(arity: int) -> st.SearchStrategy[list]:
    """Updates over a small domain with multiplicities up to 2**40: products of two or three
    of them leave int64, a relation's own multiplicity never does."""
    return st.lists(
        st.tuples(st.tuples(*[st.integers(0, 3)] * arity), st.sampled_from(BIG)), max_size=10
    )


def rule_bindings(plan: Plan, versions: Mapping[Version, Mapping[str, Rel]]) -> list[Counter]:
    """Every delta rule's full bindings (all the body's variables) and their weights, in Python
    ints: each atom renamed to its own relation, holding the version the rule reads."""
    query = plan.query
    out = []
    for rule in plan.rules:
        atoms, rels = [], {}
        for i, (atom, version) in enumerate(zip(query.atoms, rule.versions, strict=True)):
            name = f"{atom.relation}_{i}"
            atoms.append(Atom(name, atom.terms))
            rels[name] = versions[version][atom.relation]
        whole = Query("bindings", query.vars, tuple(atoms), query.filters)
        out.append(naive_eval(whole, rels))
    return out


def expect_overflow(plan: Plan, bindings: list[Counter]) -> bool:
    """Whether a binding's weight or a summed output change leaves int64."""
    query = plan.query
    at = {v: i for i, v in enumerate(query.vars)}
    change: Counter = Counter()
    for found in bindings:
        for b, w in found.items():
            if not fits(w):
                return True
            change[tuple(b[at[v]] for v in query.head)] += w
    return not all(fits(w) for w in change.values())


@settings(max_examples=200)  # numpy and Python only: a few ms each
@given(data=st.data())
def test_the_kernel_matches_the_oracle_or_raises_exactly_when_it_leaves_int64(data) -> None:
    # Random queries, and cyclic ones over one relation where partial bindings often die.
    cyclic = st.sampled_from(["directed-triangles", "4-cycles", "4-cliques"]).map(builtin)
    query = data.draw(st.one_of(queries(), cyclic), label="query")
    note(f"query: {query}")
    orders = {
        i: data.draw(st.sampled_from(valid_orders(query, i)), label=f"order of rule {i}")
        for i in range(len(query.atoms))
    }
    plan = plan_query(query, orders=orders)
    state: dict[str, Rel] = {rel: {} for rel in query.relations}
    for t in range(data.draw(st.integers(1, 3), label="epochs")):
        delta: dict[str, Rel] = {rel: {} for rel in query.relations}
        for rel, arity in query.relations.items():
            for tup, d in data.draw(big_updates(arity), label=f"epoch {t} {rel}"):
                delta[rel][tup] = delta[rel].get(tup, 0) + d
        delta = {rel: {k: v for k, v in ups.items() if v} for rel, ups in delta.items()}
        new = {rel: dict(state[rel]) for rel in state}
        for rel, ups in delta.items():
            for tup, d in ups.items():
                new[rel][tup] = state[rel].get(tup, 0) + d
        new = {rel: {k: v for k, v in s.items() if v} for rel, s in new.items()}
        bindings = rule_bindings(plan, {Version.OLD: state, Version.NEW: new, Version.DELTA: delta})
        layers_args = (plan, epoch_layers(plan, state, delta))
        parts = data.draw(st.integers(1, 3), label=f"epoch {t} shares")
        threads = data.draw(st.sampled_from([(1, 1), (2, 1), (3, 2)]), label=f"epoch {t} threads")
        if expect_overflow(plan, bindings):
            event("an epoch past int64")
            with pytest.raises(MultiplicityOverflow):
                kernel_change(*layers_args, parts, 2, 3, threads)
            return  # the epoch cannot be applied: the state stays as it was
        change, _ = kernel_change(*layers_args, parts, 2, 3, threads)
        event("an exact epoch with a change" if change else "an exact epoch")
        assert change == signed_difference(naive_eval(query, new), naive_eval(query, state)), t
        state = new
