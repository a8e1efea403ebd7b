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

import pyarrow as pa
import pytest
from hypothesis import given, note, settings
from hypothesis import strategies as st
from oracle import naive_counts, naive_eval, signed_difference
from pyspark.sql import DataFrame, SparkSession
from strategies import Rel, queries, updates

from wcoj_core.deploy import Limits
from wcoj_core.engine import Engine
from wcoj_core.meaning import Meaning, RelationSpec
from wcoj_core.query.builtins import BUILTINS, builtin
from wcoj_core.query.ir import Query, Var
from wcoj_core.query.plan import Kind, valid_orders
from wcoj_core.traces import counts_trace_name


def engine_for(
    spark: SparkSession,
    state_dir: str,
    query: Query,
    orders: Mapping[int, Sequence[Var]],
    deployment: str,
) -> Engine:
    engine = Engine(
        spark,
        state_dir,
        query,
        relations=bags(query),
        orders={query.name: orders},
        deployment=deployment.split("-")[0],
        executor_tasks=2,
        executor_max_rows=SHARD_ROWS if deployment.endswith("-sharded") else 10**9,
    )
    if deployment.endswith(("-split", "-sharded")):
        engine.access.one_task_rows = 0  # split in tasks, however small
    # Sharded: routed stages, even where its tasks could search the mapped arrangement files.
    engine.access.routed = deployment.endswith("-sharded")
    return engine


def bags(query: Query) -> dict[str, RelationSpec]:
    """Every relation a bag: the oracle below sums multiplicities."""
    return {rel: RelationSpec(rel, arity, Meaning.BAG) for rel, arity in query.relations.items()}


def frame(spark: SparkSession, arity: int, ups: Sequence[tuple[tuple[int, ...], int]]) -> DataFrame:
    cols = ", ".join(f"c{i} long" for i in range(arity))
    return spark.createDataFrame([(*t, d) for t, d in ups], f"{cols}, diff long")


def collected(df: DataFrame | pa.Table, arity: int) -> Counter[tuple[int, ...]]:
    out: Counter[tuple[int, ...]] = Counter()
    rows = df.to_pylist() if isinstance(df, pa.Table) else df.collect()
    for row in rows:
        out[tuple(row[f"c{i}"] for i in range(arity))] += row["diff"]
    return Counter({k: v for k, v in out.items() if v})


DEPLOYMENTS = ("driver", "executors", "executors-split", "executors-sharded")
# executors-sharded: an executor holds at most this many rows, so the test's arrangements are cut
# in a few shards.
SHARD_ROWS = 16


def run_and_compare(
    spark: SparkSession,
    state_dir: str,
    query: Query,
    epochs: Sequence[Mapping[str, list[tuple[tuple[int, ...], int]]]],
    orders: Mapping[int, Sequence[Var]] | None = None,
    deployment: str = "driver",
) -> None:
    """Apply `epochs` and compare every change and accumulation with the oracle.

    `deployment` picks where the kernel runs every epoch, and the test checks it ran there:
    ``driver`` on this process's resident traces, ``executors`` inside one Spark task (as a
    small epoch runs), ``executors-split`` in two tasks (every rule's delta cut in two shares,
    the outputs summed by a second stage), ``executors-sharded`` with every arrangement cut in
    shards and the prefixes routed to them. All must agree with the oracle.
    """
    assert deployment in DEPLOYMENTS, deployment
    engine = engine_for(spark, state_dir, query, orders or {}, deployment)
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
        engine = engine_for(spark, state_dir, query, orders or {}, deployment)  # a new process
        result = engine.apply(t, given_changes)
        assert result.metrics.deployment == deployment.split("-")[0] or not given_changes
        change = collected(engine.change(query.name, t), width)
        expected = signed_difference(after, before)
        assert change == expected, f"epoch {t}: output change differs from the oracle"
        assert collected(engine.output(query.name), width) == after, f"epoch {t}: accumulated"
        assert sum(result.metrics.outputs.values()) == len(expected)


@given(data=st.data())
def test_random_queries_match_the_oracle(small: SparkSession, tmp_path_factory, data) -> None:
    query = data.draw(queries(aggregates=True), label="query")
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
    deployment = data.draw(st.sampled_from(DEPLOYMENTS), label="deployment")
    note(f"query: {query}")
    run_and_compare(small, str(tmp_path_factory.mktemp("state")), query, epochs, orders, deployment)


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
        deployment = DEPLOYMENTS[k % len(DEPLOYMENTS)]  # every deployment, in turn
        state = str(tmp_path_factory.mktemp(name))
        run_and_compare(small, state, query, epochs, orders, deployment)


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
    for deployment in DEPLOYMENTS:
        state = str(tmp_path_factory.mktemp("example"))
        run_and_compare(small, state, query, epochs, None, deployment)


@settings(max_examples=15)  # each example runs up to 4 epochs, most in Spark jobs
@given(data=st.data())
def test_driver_and_executor_epochs_interleave_and_match_the_oracle(
    small: SparkSession, tmp_path_factory, data, monkeypatch
) -> None:
    """Random queries over 2-4 epochs, each epoch in a deployment drawn at random.

    The driver's resident traces must follow batches the executors wrote (and the other way
    round), and a recent layer must give the same answers whether or not it was merged into
    the base (the merge threshold is drawn too: 0 merges after every epoch).
    """
    from wcoj_core import indexes as index

    query = data.draw(queries(aggregates=True), label="query")
    epochs = data.draw(
        st.lists(
            st.fixed_dictionaries({rel: updates(ar) for rel, ar in query.relations.items()}),
            min_size=2,
            max_size=4,
        ),
        label="epochs",
    )
    merge_at = data.draw(st.sampled_from([0, 3, index.MERGE_MIN_ROWS]), label="merge at rows")
    monkeypatch.setattr(index, "MERGE_MIN_ROWS", merge_at)
    monkeypatch.setattr(index, "MERGE_SHARE", 0.0 if merge_at == 0 else index.MERGE_SHARE)
    note(f"query: {query}")
    root = str(tmp_path_factory.mktemp("mixed"))
    engine = Engine(small, root, query, relations=bags(query), executor_tasks=2)
    state: dict[str, Rel] = {rel: {} for rel in query.relations}
    width = len(query.head)
    for t, changes in enumerate(epochs):
        deployment = data.draw(st.sampled_from(DEPLOYMENTS), label=f"epoch {t} deployment")
        shard_rows = SHARD_ROWS if deployment.endswith("-sharded") else 10**9
        engine.limits = Limits(deployment.split("-")[0], executor_max_rows=shard_rows)
        engine.access.one_task_rows = 0 if deployment.endswith(("-split", "-sharded")) else 50_000
        engine.access.routed = deployment.endswith("-sharded")
        before = naive_eval(query, state)
        for rel, ups in changes.items():
            for tup, d in ups:
                state[rel][tup] = state[rel].get(tup, 0) + d
        result = engine.apply(
            t,
            {rel: frame(small, query.relations[rel], ups) for rel, ups in changes.items()},
        )
        assert result.metrics.deployment == deployment.split("-")[0] or not any(changes.values())
        after = naive_eval(query, state)
        change = collected(engine.change(query.name, t), width)
        assert change == signed_difference(after, before)
        assert collected(engine.output(query.name), width) == after
        for rel in query.relations:
            arity = query.relations[rel]
            expected = Counter({k: v for k, v in state[rel].items() if v})
            assert collected(engine.relation(rel), arity) == expected
        for a in engine.served.arrangements:
            if a.kind is Kind.COUNTS:
                df = engine._accumulated(counts_trace_name(a), None)
                cols = [f"c{k}" for k in a.key]
                stored = Counter({tuple(r[c] for c in cols): r["diff"] for r in df.collect()})
                assert stored == naive_counts(a, state[a.view.relation]), f"epoch {t}: {a}"
