"""Aggregate queries (``count()``, ``sum(x)``): counted by the kernel, exact against the oracle's
naive join and against an independent count (scipy's per-vertex ``(A @ A) * A`` row sums), epoch
by epoch with deletions and bags, through the command line, with overflow named and a wrong
value found by the audit. No JVM starts here (the Spark deployments draw aggregate queries in
tests/core/test_engine_oracle.py).
"""

from __future__ import annotations

import gzip
import json
import random
from collections import Counter
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv
import pytest
import scipy.sparse as sp
from hypothesis import given, settings
from hypothesis import strategies as st
from oracle import Oracle

from wcoj_core import aggregates
from wcoj_core.audit_sample import audit_epoch
from wcoj_core.cli import main
from wcoj_core.engine import Engine
from wcoj_core.errors import MultiplicityOverflow, WcojError
from wcoj_core.meaning import Meaning, RelationSpec, relation_specs
from wcoj_core.query.builtins import builtin
from wcoj_core.query.explain import explain
from wcoj_core.query.ir import Aggregate, Var
from wcoj_core.query.parse import parse_query
from wcoj_core.query.plan import plan_query

SHARED = Path(__file__).resolve().parents[3] / "shared" / "data"
Ups = list[tuple[tuple[int, ...], int]]


def table(ups: Ups) -> pa.Table:
    return pa.table(
        {
            "c0": pa.array([t[0] for t, _ in ups], pa.int64()),
            "c1": pa.array([t[1] for t, _ in ups], pa.int64()),
            "diff": pa.array([d for _, d in ups], pa.int64()),
        }
    )


def as_counter(values: pa.Table) -> Counter[tuple[int, ...]]:
    """An aggregate's table as key -> value."""
    *keys, value = values.column_names
    return Counter(
        {tuple(r[k] for k in keys): r[value] for r in values.to_pylist() if r[value] != 0}
    )


# -- the query text ----------------------------------------------------------------------------


def test_aggregate_heads_parse_print_and_plan_their_groups_first() -> None:
    q = parse_query("tri(a, count()) :- edge(a, b), edge(b, c), edge(a, c), b < c")
    assert q.head == (Var("a"),) and q.aggregate == Aggregate()
    assert parse_query(str(q)) == q
    s = parse_query("s(b, sum(c)) :- edge(a, b), edge(b, c)")
    assert s.aggregate == Aggregate(Var("c")) and str(s).startswith("s(b, sum(c)) :-")
    assert parse_query("t(count()) :- e(a, b)").head == ()
    for rule in plan_query(s).rules:  # the group first, the summed variable last
        order = rule.order
        assert order[-1] == Var("c") or Var("c") in rule.start
        assert order.index(Var("b")) <= max(order.index(Var("c")), len(rule.start) - 1)
    assert "extend b counted: count() per group" in explain(plan_query(q))


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("m(a, max(b)) :- e(a, b)", "max() is not an aggregate wcoj keeps: the aggregates are"),
        ("m(count(), a) :- e(a, b)", "count() must be the head's last argument"),
        ("m(sum(z)) :- e(a, b)", "head variable 'z' does not appear in any atom"),
        ("m(count(a)) :- e(a, b)", "expected ')' closing count()"),
    ],
)
def test_what_is_not_a_linear_aggregate_is_refused_in_one_line(text: str, message: str) -> None:
    with pytest.raises(WcojError) as e:
        parse_query(text)
    assert message in str(e.value) and "\n" not in str(e.value)


# -- exact against the oracle, epoch by epoch --------------------------------------------------


AGGREGATE_QUERIES = [
    builtin("triangles-per-vertex"),
    builtin("triangle-count"),
    builtin("edge-support"),
    builtin("degrees"),
    parse_query("w(a, sum(c)) :- edge(a, b), edge(b, c), edge(a, c), b < c"),
    parse_query("p(b, sum(a)) :- edge(a, b), edge(b, c)"),
    parse_query("c4(a, count()) :- edge(a, b), edge(b, c), edge(c, d), edge(d, a), b < d"),
]


@settings(max_examples=12)
@given(
    data=st.data(),
    query=st.sampled_from(AGGREGATE_QUERIES),
    meaning=st.sampled_from(["undirected", "set", "bag"]),
)
def test_aggregates_match_the_oracle_with_deletions_and_bags(
    tmp_path_factory: pytest.TempPathFactory, data: st.DataObject, query, meaning: str
) -> None:
    """Random epochs of inserts, deletes and (for a bag) multiplicities above one, each applied
    by a fresh engine: the change and the table as of every epoch equal the oracle's, the
    output's figures are its groups and the sum of its values."""
    specs = (
        relation_specs({"edge": 2}, undirected=["edge"])
        if meaning == "undirected"
        else {"edge": RelationSpec("edge", 2, Meaning(meaning))}
    )
    rng = random.Random(data.draw(st.integers(0, 2**16), label="seed"))
    root = str(tmp_path_factory.mktemp("agg"))
    oracle = Oracle(query, specs)
    present: list[tuple[int, int]] = []
    for t in range(data.draw(st.integers(1, 4), label="epochs")):
        ups: Ups = []
        for _ in range(rng.randrange(10, 90)):
            edge = (rng.randrange(14), rng.randrange(14))
            ups.append((edge, rng.choice([1, 1, 2, -1]) if meaning == "bag" else 1))
            present.append(edge)
        ups += [(e, -1) for e in rng.sample(present, k=min(len(present) // 6, 12))]
        oracle.land(t, {"edge": ups})
        engine = Engine(None, root, query, relations=specs)
        result = engine.apply(t, {"edge": table(ups)})
        assert as_counter(engine.change(query.name, t)) == oracle.change(t), t
        out = oracle.output(t)
        figures = result.traces[f"out/{query.name}"].figures
        assert (figures.rows, figures.count) == (len(out), sum(out.values())), t
    for k in range(t + 1):
        assert as_counter(aggregates.table(engine, query, k)) == oracle.output(k), k


CLIQUES_4_PER_VERTEX = parse_query(
    "k4(a, count()) :- edge(a, b), edge(a, c), edge(a, d), edge(b, c), edge(b, d), edge(c, d), "
    "b < c, c < d"
)


@settings(max_examples=10)
@given(
    data=st.data(),
    query=st.sampled_from(
        [builtin("triangles-per-vertex"), builtin("degrees"), CLIQUES_4_PER_VERTEX]
    ),
    meaning=st.sampled_from(["set", "bag"]),
)
def test_cliques_credited_to_their_members_match_the_oracle(
    tmp_path_factory: pytest.TempPathFactory, data: st.DataObject, query, meaning: str
) -> None:
    """Counts per vertex of cliques of an undirected relation run as the cliques themselves,
    each binding's weight added to each member (`Plan.members`): over random epochs of inserts,
    deletes and, in a bag, multiplicities, every epoch's change equals the oracle's, which
    evaluates the query as written; the same query over a directed relation has no such plan."""
    specs = relation_specs({"edge": 2}, undirected=["edge"], **{f"{meaning}s": ["edge"]})
    assert plan_query(query, undirected=["edge"]).members is not None
    assert plan_query(query).members is None
    rng = random.Random(data.draw(st.integers(0, 2**16), label="seed"))
    root = str(tmp_path_factory.mktemp("members"))
    oracle = Oracle(query, specs)
    engine = Engine(None, root, query, relations=specs)
    present: list[tuple[int, int]] = []
    for t in range(data.draw(st.integers(1, 4), label="epochs")):
        ups: Ups = []
        for _ in range(rng.randrange(20, 120)):
            edge = (rng.randrange(10), rng.randrange(10))
            ups.append((edge, rng.choice([1, 2, 3]) if meaning == "bag" else 1))
            present.append(edge)
        ups += [(e, -1) for e in rng.sample(present, k=min(len(present) // 5, 15))]
        oracle.land(t, {"edge": ups})
        engine.apply(t, {"edge": table(ups)})
        assert as_counter(engine.change(query.name, t)) == oracle.change(t), t
    assert as_counter(aggregates.table(engine, query)) == oracle.output(t)


# -- exact against an independent count ----------------------------------------------------------


def undirected_graph(path: Path) -> sp.csr_matrix:
    """The undirected simple graph of a SNAP edge list: symmetric, no self-loop, 0/1."""
    with gzip.open(path, "rt") as f:
        pairs = np.array([line.split() for line in f if line[0] != "#"], dtype=np.int64)
    pairs = pairs[pairs[:, 0] != pairs[:, 1]]
    n = int(pairs.max()) + 1
    a = sp.coo_matrix((np.ones(len(pairs)), (pairs[:, 0], pairs[:, 1])), shape=(n, n))
    a = ((a + a.T) > 0).astype(np.int64).tocsr()
    return a


@pytest.mark.parametrize("name", ["ca-GrQc.txt.gz", "email-Eu-core.txt.gz"])
def test_per_vertex_counts_equal_scipys_on_shared_graphs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], name: str
) -> None:
    """``wcoj count`` of triangles-per-vertex, edge-support, degrees and triangle-count against
    scipy: T(v) = row sums of (A @ A) * A over 2, support(a, b) = (A @ A)[a, b] on edges, and
    the clustering coefficient made of the first and the third."""
    path = SHARED / name
    if not path.exists():
        pytest.skip(f"{path} is not there")
    a = undirected_graph(path)
    paths = (a @ a).multiply(a).tocsr()
    per_vertex = np.asarray(paths.sum(axis=1)).ravel() // 2
    degree = np.asarray(a.sum(axis=1)).ravel()
    tables = {}
    for q in ("triangles-per-vertex", "edge-support", "degrees", "triangle-count"):
        out = tmp_path / f"{q}.csv"
        given = ["--input", f"edge={path}", "--undirected", "edge", "--output", str(out)]
        code = main(["count", "--query", q, *given, "--json"])
        assert code == 0
        doc = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
        tables[q] = pacsv.read_csv(out)
        assert list(doc)[-2:] == ["groups", "total"]
        assert doc["groups"] == tables[q].num_rows and doc["total"] == doc["count"]
    tri = tables["triangles-per-vertex"]
    assert tri.column_names == ["c0", "count"]
    expected = Counter({(v,): int(c) for v, c in enumerate(per_vertex) if c})
    assert as_counter(tri) == expected
    coo = sp.triu(paths, k=1).tocoo()
    edges = zip(coo.row.tolist(), coo.col.tolist(), coo.data.tolist(), strict=True)
    assert as_counter(tables["edge-support"]) == Counter({(i, j): v for i, j, v in edges})
    assert tables["triangle-count"]["count"].to_pylist() == [int(per_vertex.sum()) // 3]
    cc = aggregates.clustering(tri, tables["degrees"])
    d = degree[cc["c0"].to_numpy()]
    want = np.where(d > 1, 2 * per_vertex[cc["c0"].to_numpy()] / np.maximum(d * (d - 1), 1), 0)
    assert np.allclose(cc["clustering"].to_numpy(), want)


# -- overflow, the audit ---------------------------------------------------------------------------


def test_a_sum_leaving_int64_is_named_not_wrapped(tmp_path: Path) -> None:
    """A term weight * x past int64, and a group's sum past it, raise naming the binding or
    the group; nothing is committed."""
    big = 2**62
    q = parse_query("s(a, sum(b)) :- edge(a, b)")
    engine = Engine(
        None, str(tmp_path / "one"), q, relations={"edge": RelationSpec("edge", 2, Meaning.BAG)}
    )
    with pytest.raises(MultiplicityOverflow) as e:
        engine.apply(0, {"edge": table([((1, big), 4)])})
    assert e.value.tuple is not None and big in e.value.tuple
    assert engine.epoch is None
    tri = parse_query("s(a, sum(c)) :- edge(a, b), edge(b, c)")
    engine = Engine(
        None, str(tmp_path / "two"), tri, relations={"edge": RelationSpec("edge", 2, Meaning.BAG)}
    )
    with pytest.raises(MultiplicityOverflow):
        engine.apply(0, {"edge": table([((1, 2), 1), ((2, big), 1), ((2, big + 1), 1)])})


def test_the_audit_finds_a_wrong_value(tmp_path: Path) -> None:
    """A group's value changed in the stored change: the epoch's audit (a sample recounted
    from the arrangements, or every group) names it; the untouched epoch passes."""
    from test_audit import replace_output, stored_change

    q = builtin("triangles-per-vertex")
    specs = relation_specs({"edge": 2}, undirected=["edge"])
    root = str(tmp_path / "state")
    rng = random.Random(4)
    for t in range(2):
        ups = [((rng.randrange(40), rng.randrange(40)), 1) for _ in range(300)]
        Engine(None, root, q, relations=specs).apply(t, {"edge": table(ups)})
    engine = Engine(None, root, q, relations=specs)
    assert audit_epoch(engine, q.name, 1).passed
    layer = stored_change(engine, q.name, 1)
    rows, diff = np.asarray(layer.rows), np.asarray(layer.diff).copy()
    diff[0] += 1
    replace_output(engine, q.name, 1, rows, diff)
    audit = audit_epoch(engine, q.name, 1)
    assert not audit.passed and audit.examples[0].startswith(f"({int(rows[0, 0])},)")


def test_the_command_line_keeps_an_aggregate_and_says_its_groups(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``apply`` epochs of a per-vertex sum: ``--output`` writes the table as of each epoch
    (the value column named after the aggregate), ``--json`` ends with its groups and total,
    ``status`` and ``explain`` say what it is; every table equals the oracle's."""
    query = parse_query("w(a, sum(c)) :- edge(a, b), edge(b, c), edge(a, c), b < c")
    specs = relation_specs({"edge": 2}, undirected=["edge"])
    oracle = Oracle(query, specs)
    state, rng = tmp_path / "state", random.Random(7)
    for t in range(3):
        ups: Ups = [
            ((rng.randrange(12), rng.randrange(12)), rng.choice([1, 1, -1])) for _ in range(40)
        ]
        oracle.land(t, {"edge": ups})
        changes, out = tmp_path / f"c{t}.csv", tmp_path / f"w{t}.csv"
        pacsv.write_csv(table(ups), changes)
        given = ["--changes", f"edge={changes}", "--undirected", "edge", "--output", str(out)]
        where = ["--query", str(query), "--state", str(state), "--epoch", str(t)]
        code = main(["apply", *where, *given, "--json"])
        assert code == 0
        doc = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
        values = pacsv.read_csv(out)
        assert values.column_names == ["c0", "sum_c"]
        assert as_counter(values) == oracle.output(t), t
        assert list(doc)[-2:] == ["groups", "total"]
        assert (doc["groups"], doc["total"]) == (values.num_rows, sum(oracle.output(t).values()))
    assert main(["status", str(state), "--json"]) == 0
    status = json.loads(capsys.readouterr().out.strip().splitlines()[-1])["queries"]["w"]
    assert (status["aggregate"], status["groups"]) == ("sum_c", len(oracle.output(2)))
    assert main(["explain", "--query", "triangles-per-vertex"]) == 0
    assert "extend b counted: count() per group" in capsys.readouterr().out


def test_the_benchmark_part_checks_what_it_times(tmp_path: Path) -> None:
    """``wcoj-bench aggregates`` on a small graph: its static counts equal scipy's, every warm
    epoch passes a full audit and its last table equals scipy's recount; the two-hub stream's
    work per change grows with N, the per-vertex change moving N + 2 groups."""
    import argparse

    from wcoj_bench.parts import aggregates as bench

    path = SHARED / "ca-GrQc.txt.gz"
    if not path.exists():
        pytest.skip(f"{path} is not there")
    args = argparse.Namespace(
        input=f"edge={path}", runs=1, epochs=3, epoch_size=300, delete_fraction=0.2,
        hubs="50,200", seed=3, parts="static,warm,skew",
    )  # fmt: skip
    got = bench.run(args)
    assert got["static"]["exact"] and got["static"]["triangles"] == 48_260
    warm = got["warm"]
    per_vertex = warm["triangles_per_vertex"]
    assert warm["final_equals_scipy"] and per_vertex["audited_epochs_passed"] == 3
    assert per_vertex["epochs_equal_scipy"] == 3
    skew = {(s["query"], s["N"]): s for s in got["skew"]}
    assert skew[("triangles_per_vertex", 200)]["keys_per_change"] == 202
    assert (
        skew[("triangle_count", 200)]["work_per_change"]
        > skew[("triangle_count", 50)]["work_per_change"]
    )
