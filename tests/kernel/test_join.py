"""The kernel against the naive oracle, with no Spark and no files (the fast tier).

Random queries (`strategies.queries`) over random epochs of inserts, deletes and multiplicities
above one: at every epoch, the traces are indexed in memory as of the old state, the epoch's
changes are the deltas, the counts arrangements are maintained from them (`support_delta`,
`counts_delta`), and the sum of every delta rule's output is the oracle's change, as exact
multisets. Each rule runs under a random variable order, cut into random shares, with tiny
chunks and proposal budgets, so the pieces a deployment or the memory bound makes are taken
too; the shares' tallies add up to one share's.
"""

from __future__ import annotations

import subprocess
import sys
from collections import Counter
from collections.abc import Iterator, Mapping
from contextlib import contextmanager

import numpy as np
from hypothesis import given, note
from hypothesis import strategies as st
from oracle import naive_eval, signed_difference
from strategies import Rel, queries, updates

from wcoj_core.kernel import step
from wcoj_core.kernel.changes import counts_delta, output_changes, support_delta
from wcoj_core.kernel.index import EpochLayers, TraceIndex
from wcoj_core.kernel.join import (
    Pace,
    RuleTally,
    bindings,
    count_rule,
    delta_layer,
    run_rule,
    shares,
    weights,
)
from wcoj_core.kernel.layer import Layer
from wcoj_core.kernel.native import native
from wcoj_core.query.builtins import builtin
from wcoj_core.query.ir import Query
from wcoj_core.query.plan import Kind, Plan, plan_query, valid_orders
from wcoj_core.traces import counts_trace_name, relation_columns, relation_trace_name


def layer_of(tuples: Mapping[tuple[int, ...], int], arity: int) -> Layer:
    rows = np.array(list(tuples), dtype=np.int64).reshape(-1, arity)
    return Layer.build(rows, np.array(list(tuples.values()), dtype=np.int64))


def epoch_layers(plan: Plan, old: Mapping[str, Rel], delta: Mapping[str, Rel]) -> EpochLayers:
    """Every trace the plan reads as of `old`, with `delta` as the epoch's changes."""
    query = plan.query
    traces: dict[str, TraceIndex] = {}
    deltas: dict[str, Layer] = {}
    for rel, arity in query.relations.items():
        name = relation_trace_name(rel)
        traces[name] = TraceIndex.of(tuple(relation_columns(arity)), layer_of(old[rel], arity), ())
        if delta[rel]:
            deltas[name] = layer_of(delta[rel], arity)
    layers = EpochLayers(traces, deltas)
    for a in plan.arrangements:
        if a.kind is not Kind.COUNTS:
            continue
        name = relation_trace_name(a.view.relation)
        empty = TraceIndex.of(traces[name].columns, Layer.empty(len(traces[name].columns)), ())
        whole = EpochLayers({name: empty}, {name: traces[name].base})
        cols = tuple(f"c{k}" for k in a.key)
        traces[counts_trace_name(a)] = TraceIndex.of(
            cols, counts_delta(support_delta(whole, a.view), a.key), ()
        )
        if name in deltas:
            deltas[counts_trace_name(a)] = counts_delta(support_delta(layers, a.view), a.key)
    return layers


@contextmanager
def threaded(prefixes: int) -> Iterator[None]:
    """Every loop of the kernel on as many threads as it is given, however few its prefixes,
    each thread taking `prefixes` at a time (so tiny examples are cut into many chunks)."""
    saved = (step.THREAD_PREFIXES, step.CHUNK_PREFIXES, step.COUNT_CHUNK)
    step.THREAD_PREFIXES, step.CHUNK_PREFIXES, step.COUNT_CHUNK = 1, prefixes, prefixes
    try:
        yield
    finally:
        step.THREAD_PREFIXES, step.CHUNK_PREFIXES, step.COUNT_CHUNK = saved


def kernel_change(
    plan: Plan,
    layers: EpochLayers,
    parts: int,
    chunk: int,
    budget: int,
    threads: tuple[int, int] = (1, 1),
) -> tuple[Counter, list[RuleTally]]:
    """Every rule on `parts` shares of its delta, its loops on ``threads[0]`` threads taking
    ``threads[1]`` prefixes at a time: the summed output change, and each rule's tally."""
    found = []
    tallies = []
    for rule in plan.rules:
        tally = RuleTally.of(rule)
        d = delta_layer(plan, rule, layers)
        for lo, hi in shares(weights(plan, rule, layers), parts) if len(d) else []:
            written, counting = RuleTally.of(rule), RuleTally.of(rule)
            with threaded(threads[1]):
                pace = Pace(chunk, budget, threads[0])
                got = list(run_rule(plan, rule, layers, written, (lo, hi), pace=pace))
            tally = tally.plus(written)
            if plan.query.aggregate is not None:  # partial sums per group, counted already
                found += [p if k is None else p.take(k) for p, k in got]
                continue
            with threaded(threads[1]):
                # Counted, not written (`wcoj count`): the same bindings and weights, and the
                # same work counted (a last step counted and extended in one pass included).
                counted = count_rule(
                    plan,
                    rule,
                    layers,
                    counting,
                    (lo, hi),
                    pace=Pace(budget=budget, threads=threads[0]),
                )
            made = [p.weight if k is None else p.weight[k] for p, k in got]
            assert counted.rows == sum(len(w) for w in made)
            assert counted.total == sum(int(w) for ws in made for w in ws.tolist())
            assert counting == written
            if got:
                found.append(bindings(plan, rule, got))
        tallies.append(tally)
    rows, diff = output_changes(found, plan.query.head)
    change = Counter({tuple(int(v) for v in r): int(d) for r, d in zip(rows, diff, strict=True)})
    return change, tallies


def run_epochs(query: Query, epochs: list[dict[str, list]], plan: Plan, draw) -> None:
    state: dict[str, Rel] = {rel: {} for rel in query.relations}
    for t, changes in enumerate(epochs):
        delta: dict[str, Rel] = {rel: {} for rel in query.relations}
        for rel, ups in changes.items():
            for tup, d in ups:
                delta[rel][tup] = delta[rel].get(tup, 0) + d
        delta = {rel: {k: v for k, v in ups.items() if v} for rel, ups in delta.items()}
        before = naive_eval(query, state)
        layers = epoch_layers(
            plan, {r: {k: v for k, v in s.items() if v} for r, s in state.items()}, delta
        )
        parts = draw(st.integers(1, 3), label=f"epoch {t} shares")
        chunk = draw(st.sampled_from([1, 2, 1 << 20]), label=f"epoch {t} chunk rows")
        budget = draw(st.sampled_from([1, 3, 1 << 23]), label=f"epoch {t} proposal budget")
        threads = draw(st.sampled_from([(1, 1), (2, 1), (3, 2), (2, 64)]), label="threads")
        change, tallies = kernel_change(plan, layers, parts, chunk, budget, threads)
        whole, reference = kernel_change(plan, layers, 1, 1 << 20, 1 << 23)
        for rel, ups in delta.items():
            for tup, d in ups.items():
                state[rel][tup] = state[rel].get(tup, 0) + d
        after = naive_eval(query, state)
        assert change == signed_difference(after, before), f"epoch {t}: the output change"
        assert change == whole, f"epoch {t}: shares and pieces change the output"
        for mine, one in zip(tallies, reference, strict=True):
            assert [(s.prefixes, s.min_sum, s.proposed, s.validated) for s in mine.steps] == [
                (s.prefixes, s.min_sum, s.proposed, s.validated) for s in one.steps
            ], t


@given(data=st.data())
def test_random_queries_match_the_oracle_in_the_kernel(data) -> None:
    query = data.draw(queries(aggregates=True), label="query")
    epochs = data.draw(
        st.lists(
            st.fixed_dictionaries({rel: updates(ar) for rel, ar in query.relations.items()}),
            min_size=1,
            max_size=4,
        ),
        label="epochs",
    )
    orders = {
        i: data.draw(st.sampled_from(valid_orders(query, i)), label=f"order of rule {i}")
        for i in range(len(query.atoms))
    }
    note(f"query: {query}")
    run_epochs(query, epochs, plan_query(query, orders=orders), data.draw)


@contextmanager
def reading_ahead() -> Iterator[None]:
    """Every kernel call reads its pages ahead first, down to the smallest layer (`_native.c`,
    "reading ahead from disk": what a call on a cold mapped layer does)."""
    mode = native.read_ahead()[0]
    native.read_ahead(2, 0)
    try:
        yield
    finally:
        native.read_ahead(mode, 1 << 15)


@given(data=st.data())
def test_random_queries_read_ahead_match_the_oracle(data) -> None:
    """Reading ahead changes no answer: every call of every step reads ahead first."""
    query = data.draw(queries(aggregates=True), label="query")
    epochs = data.draw(
        st.lists(
            st.fixed_dictionaries({rel: updates(ar) for rel, ar in query.relations.items()}),
            min_size=1,
            max_size=3,
        ),
        label="epochs",
    )
    note(f"query: {query}")
    with reading_ahead():
        run_epochs(query, epochs, plan_query(query), data.draw)


@given(data=st.data())
def test_four_cliques_on_a_dense_graph_in_pieces(data) -> None:
    """A hub-heavy graph, 4-cliques: small budgets cut every step into many pieces."""
    query = builtin("4-cliques")
    rng = np.random.default_rng(data.draw(st.integers(0, 99), label="seed"))
    ups = []
    for a, b in rng.integers(0, 12, size=(60, 2)).tolist():
        if a != b:
            ups += [((a, b), 1), ((b, a), 1)]
    ups += [((0, v), 1) for v in range(1, 12)] + [((v, 0), 1) for v in range(1, 12)]
    epochs = [{"edge": ups[:80]}, {"edge": ups[80:] + [(t, -d) for t, d in ups[:10]]}]
    run_epochs(query, epochs, plan_query(query), data.draw)


@given(data=st.data())
def test_a_whole_graph_counted_by_marks_and_merges_matches_the_oracle(data) -> None:
    """A first load of a whole undirected graph, triangles and 4-cliques: counting intersects
    ranges by marking a repeated key's values (dense ids) or by merging and galloping (ids
    spread too far to mark), on threads in small chunks; the counts are checked against the
    bindings written and the oracle."""
    rng = np.random.default_rng(data.draw(st.integers(0, 999), label="seed"))
    n = data.draw(st.integers(3, 30), label="vertices")
    spread = data.draw(st.sampled_from([1, 5, 1 << 36]), label="id spread")
    shift = data.draw(st.integers(-50, 50), label="id shift")
    hubs = data.draw(st.integers(0, 2), label="hubs")
    pairs = rng.integers(0, n, size=(int(rng.integers(1, 6 * n)), 2)).tolist()
    pairs += [[h, v] for h in range(hubs) for v in range(n)]
    ups = {}
    for a, b in pairs:
        if a != b:
            a, b = a * spread + shift, b * spread + shift
            ups[(a, b)] = ups[(b, a)] = 1
    for name in ("triangles", "4-cliques"):
        query = builtin(name)
        run_epochs(query, [{"edge": list(ups.items())}], plan_query(query), data.draw)


def test_the_kernel_needs_no_spark() -> None:
    """Importing and running the kernel loads neither pyspark nor a JVM."""
    code = (
        "import sys; import wcoj_core.kernel.join, wcoj_core.kernel.changes; "
        "assert not any(m.startswith('pyspark') or m.startswith('py4j') for m in sys.modules)"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
