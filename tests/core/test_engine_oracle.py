"""The engine against the naive oracle, epoch by epoch, as exact multisets.

For random queries (cyclic and acyclic, binary and ternary relations, repeated relations,
constants, filters, repeated variables) and random epochs of inserts, deletes and multiplicities
above one, at every epoch:

* the accumulated output equals the oracle on the accumulated inputs, and
* the epoch's output change equals the difference of the oracle's results.

Every rule runs with a randomly drawn variable order (hypothesis), and the built-in queries run
with every order the planner may choose.
"""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Mapping, Sequence

import pytest
from hypothesis import given, note
from hypothesis import strategies as st
from pyspark.sql import DataFrame, SparkSession

from wcoj_core.arrangement import counts_trace_name
from wcoj_core.engine import KEYED_EPOCH_ROWS, SMALL_EPOCH_ROWS, Engine
from wcoj_core.naive import naive_eval
from wcoj_core.query.builtins import BUILTINS, builtin
from wcoj_core.query.ir import Atom, CmpOp, Const, Filter, Query, Var
from wcoj_core.query.plan import Arrangement, Kind, valid_orders

ARITY = {"r": 2, "s": 2, "t": 3, "u": 1}
VARS = [Var(n) for n in "abcd"]
DOMAIN = st.integers(0, 3)

Rel = dict[tuple[int, ...], int]


@st.composite
def queries(draw: st.DrawFn) -> Query:
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
    return Query("q", head, tuple(atoms), tuple(filters))


def updates(arity: int) -> st.SearchStrategy[list[tuple[tuple[int, ...], int]]]:
    tuple_ = st.tuples(*[DOMAIN] * arity)
    diff = st.sampled_from([1, 1, 1, 2, -1, -2])
    return st.lists(st.tuples(tuple_, diff), max_size=10)


def frame(spark: SparkSession, arity: int, ups: Sequence[tuple[tuple[int, ...], int]]) -> DataFrame:
    cols = ", ".join(f"c{i} long" for i in range(arity))
    return spark.createDataFrame([(*t, d) for t, d in ups], f"{cols}, diff long")


def collected(df: DataFrame, arity: int) -> Counter[tuple[int, ...]]:
    out: Counter[tuple[int, ...]] = Counter()
    for row in df.collect():
        out[tuple(row[f"c{i}"] for i in range(arity))] += row["diff"]
    return Counter({k: v for k, v in out.items() if v})


def signed_difference(after: Counter, before: Counter) -> Counter:
    diff: Counter = Counter()
    for k in set(after) | set(before):
        d = after.get(k, 0) - before.get(k, 0)
        if d:
            diff[k] = d
    return diff


PATHS = ("keyed", "small", "large")


def run_and_compare(
    spark: SparkSession,
    state_dir: str,
    query: Query,
    epochs: Sequence[Mapping[str, list[tuple[tuple[int, ...], int]]]],
    orders: Mapping[int, Sequence[Var]] | None = None,
    path: str = "keyed",
    cache_state: bool = True,
) -> None:
    """Apply `epochs` and compare every change and accumulation with the oracle.

    `path` picks how every epoch is evaluated, and the test checks it was taken:
    ``keyed`` on the driver's resident index (`wcoj_core.keyed`); ``small`` on Spark with
    materialized, broadcast proposals and linear views; ``large`` on Spark in one straight
    pipeline per rule (left-join validation, consolidated views). All must agree with the oracle.
    """
    assert path in PATHS, path
    engine = Engine(
        spark,
        state_dir,
        query,
        orders={query.name: orders or {}},
        small_epoch_rows=0 if path == "large" else SMALL_EPOCH_ROWS,
        keyed_epoch_rows=KEYED_EPOCH_ROWS if path == "keyed" else 0,
        cache_state=cache_state,
    )
    state: dict[str, Rel] = {rel: {} for rel in query.relations}
    width = len(query.head)
    for t, changes in enumerate(epochs):
        before = naive_eval(query, state)
        for rel, ups in changes.items():
            for tup, d in ups:
                state[rel][tup] = state[rel].get(tup, 0) + d
        after = naive_eval(query, state)
        given_changes = {
            rel: frame(spark, query.relations[rel], ups) for rel, ups in changes.items() if ups
        }
        result = engine.apply_epoch(t, given_changes)
        assert result.metrics.path == ("keyed" if path == "keyed" else "spark")
        change = collected(result.outputs[query.name], width)
        expected = signed_difference(after, before)
        assert change == expected, f"epoch {t}: output change differs from the oracle"
        assert collected(engine.output(query.name), width) == after, f"epoch {t}: accumulated"
        assert sum(result.metrics.outputs.values()) == len(expected)


@given(data=st.data())
def test_random_queries_match_the_oracle(small: SparkSession, tmp_path_factory, data) -> None:
    query = data.draw(queries(), label="query")
    epochs = data.draw(
        st.lists(
            st.fixed_dictionaries({rel: updates(ar) for rel, ar in query.relations.items()}),
            min_size=1,
            max_size=3,
        ),
        label="epochs",
    )
    orders = {
        i: data.draw(st.sampled_from(valid_orders(query, i)), label=f"order of rule {i}")
        for i in range(len(query.atoms))
    }
    path = data.draw(st.sampled_from(PATHS), label="path")
    cache_state = data.draw(st.booleans(), label="cache_state")
    note(f"query: {query}")
    run_and_compare(
        small,
        str(tmp_path_factory.mktemp("state")),
        query,
        epochs,
        orders,
        path=path,
        cache_state=cache_state,
    )


def _graph_epochs(seed: int, nodes: int, edges: int, epochs: int) -> list[dict]:
    """Symmetric random edge changes: inserts, some deletes of earlier edges, one double edge."""
    import random

    rng = random.Random(seed)
    present: list[tuple[int, int]] = []
    out = []
    for _ in range(epochs):
        ups: list[tuple[tuple[int, ...], int]] = []
        for _ in range(edges):
            a, b = rng.sample(range(nodes), 2)
            ups += [((a, b), 1), ((b, a), 1)]
            present.append((a, b))
        for a, b in rng.sample(present, k=min(len(present) // 5, 6)):
            ups += [((a, b), -1), ((b, a), -1)]
        out.append({"edge": ups})
    return out


@pytest.mark.parametrize("name", list(BUILTINS))
def test_builtins_under_every_variable_order(
    small: SparkSession, tmp_path_factory, name: str
) -> None:
    query = builtin(name)
    epochs = _graph_epochs(seed=len(name), nodes=9, edges=14, epochs=3)
    per_rule = [valid_orders(query, i) for i in range(len(query.atoms))]
    runs = max(len(o) for o in per_rule)
    for k in range(max(runs, 2)):
        orders = {i: o[k % len(o)] for i, o in enumerate(per_rule)}
        path = PATHS[k % len(PATHS)]  # every path, in turn
        run_and_compare(small, str(tmp_path_factory.mktemp(name)), query, epochs, orders, path)


def test_the_example_query_with_constants_repeats_and_filters(
    small: SparkSession, tmp_path_factory
) -> None:
    from wcoj_core.query.parse import parse_query

    query = parse_query(
        "head(a, b, c) :- rel(a, b), rel(b, c), other(a, c, 7), e(a, a), a < b, b != c"
    )
    pairs = list(itertools.product(range(4), repeat=2))
    epochs = [
        {
            "rel": [(p, 1) for p in pairs[::2]],
            "other": [((a, c, 7), 2) for a, c in pairs[::3]] + [((0, 1, 6), 1)],
            "e": [((0, 0), 1), ((1, 1), 3), ((2, 1), 1)],
        },
        {
            "rel": [(p, -1) for p in pairs[::4]] + [((3, 3), 2)],
            "other": [((1, 3, 7), -2)],
            "e": [((2, 2), 1)],
        },
    ]
    for path in PATHS:
        run_and_compare(small, str(tmp_path_factory.mktemp("example")), query, epochs, None, path)


@given(data=st.data())
def test_keyed_and_spark_epochs_interleave_and_match_the_oracle(
    small: SparkSession, tmp_path_factory, data, monkeypatch
) -> None:
    """Random queries over 2-5 epochs, each epoch on a path drawn at random.

    The keyed path's resident index must follow batches the Spark path wrote (and the other way
    round), and its recent layer must give the same answers whether or not it was merged into
    the base (the merge threshold is drawn too: 0 merges after every epoch).
    """
    from wcoj_core import keyed

    query = data.draw(queries(), label="query")
    epochs = data.draw(
        st.lists(
            st.fixed_dictionaries({rel: updates(ar) for rel, ar in query.relations.items()}),
            min_size=2,
            max_size=5,
        ),
        label="epochs",
    )
    merge_at = data.draw(st.sampled_from([0, 3, keyed.MERGE_MIN_ROWS]), label="merge at rows")
    monkeypatch.setattr(keyed, "MERGE_MIN_ROWS", merge_at)
    monkeypatch.setattr(keyed, "MERGE_SHARE", 0.0 if merge_at == 0 else keyed.MERGE_SHARE)
    note(f"query: {query}")
    engine = Engine(small, str(tmp_path_factory.mktemp("mixed")), query)
    state: dict[str, Rel] = {rel: {} for rel in query.relations}
    width = len(query.head)
    for t, changes in enumerate(epochs):
        keyed_epoch = data.draw(st.booleans(), label=f"epoch {t} keyed")
        engine.keyed_epoch_rows = KEYED_EPOCH_ROWS if keyed_epoch else 0
        before = naive_eval(query, state)
        for rel, ups in changes.items():
            for tup, d in ups:
                state[rel][tup] = state[rel].get(tup, 0) + d
        result = engine.apply_epoch(
            t,
            {rel: frame(small, query.relations[rel], ups) for rel, ups in changes.items()},
        )
        assert result.metrics.path == ("keyed" if keyed_epoch else "spark")
        after = naive_eval(query, state)
        assert collected(result.outputs[query.name], width) == signed_difference(after, before)
        assert collected(engine.output(query.name), width) == after
        for rel in query.relations:
            arity = query.relations[rel]
            expected = Counter({k: v for k, v in state[rel].items() if v})
            assert collected(engine.relation(rel), arity) == expected
        for a in engine.arrangements:
            if a.kind is Kind.COUNTS:
                df = engine._accumulated(counts_trace_name(a), None)
                cols = [f"c{k}" for k in a.key]
                stored = Counter({tuple(r[c] for c in cols): r["diff"] for r in df.collect()})
                assert stored == naive_counts(a, state[a.view.relation]), f"epoch {t}: {a}"


def naive_counts(a: Arrangement, tuples: Rel) -> Counter:
    """counts[key] of a view, from the relation's tuples: distinct view tuples per key."""
    seen: set[tuple[int, ...]] = set()
    for tup, d in tuples.items():
        if d == 0:
            continue
        first: dict[int, int] = {}
        ok = True
        for col, p in enumerate(a.view.pattern):
            if isinstance(p, Const):
                ok &= tup[col] == p.value
            elif p in first:
                ok &= tup[col] == tup[first[p]]
            else:
                first[p] = col
        if ok:
            seen.add(tuple(tup[first[j]] for j in range(a.view.arity)))
    return Counter(tuple(v[k] for k in a.key) for v in seen)
