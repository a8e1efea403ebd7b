"""Questions asked of a kept state (`wcoj_core.ask`, ``wcoj query``): exact against the oracle's
naive join on random epochs of sets, bags and undirected sets, at every epoch; exact against
scipy's neighbour sets on the shared graphs (triangles, 4-cliques at a vertex, 4-cycles through
an edge) at the latest and an earlier epoch; read-only beside an apply; refused in one line.
No JVM starts here.
"""

from __future__ import annotations

import gzip
import json
import os
import random
import subprocess
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
import scipy.sparse as sp
from hypothesis import given, settings
from hypothesis import strategies as st
from oracle import Oracle, naive_eval

from wcoj_core.ask import Question, Snapshot, ask
from wcoj_core.cli import main
from wcoj_core.engine import Engine
from wcoj_core.errors import QueryError, StateError
from wcoj_core.meaning import Meaning, RelationSpec, relation_specs
from wcoj_core.query.builtins import builtin
from wcoj_core.query.ir import CmpOp, Const, Filter, Query, Var
from wcoj_core.query.parse import parse_query
from wcoj_core.store.store import KEEP_MANIFESTS

SHARED = Path(__file__).resolve().parents[3] / "shared" / "data"
Ups = list[tuple[tuple[int, ...], int]]

QUESTIONS: list[tuple[str, dict[str, list[int]]]] = [
    ("q(b, c) :- edge(3, b), edge(b, c), edge(3, c)", {}),
    ("q(b, c) :- edge(v, b), edge(b, c), edge(v, c), b < c", {"v": [0, 1, 2, 3, 5, 5]}),
    ("q(v, count()) :- edge(v, b), edge(b, c), edge(v, c), b < c", {"v": [1, 2, 4, 9, 13]}),
    (
        "q(v, b, c, d) :- edge(v, b), edge(v, c), edge(v, d), edge(b, c), edge(b, d), "
        "edge(c, d), b < c, c < d",
        {"v": list(range(14))},
    ),
    ("q(x, y) :- edge(1, 2), edge(2, x), edge(x, y), edge(y, 1), x != 1, y != 2", {}),
    ("q(a, b, sum(c)) :- edge(a, b), edge(b, c)", {"a": [1, 2, 3], "b": [2, 5, 3]}),
    ("q(a, b) :- edge(a, b), edge(b, a)", {}),
    ("q(a) :- edge(a, a)", {}),
    ("q(count()) :- edge(a, b), edge(b, c), edge(a, c)", {}),
    ("q(c) :- edge(4, b), edge(b, c), c > 2", {}),
    ("q(b, count()) :- edge(a, b), edge(b, 7)", {"a": [7, 8, 2]}),
]


def table(ups: Ups) -> pa.Table:
    return pa.table(
        {
            "c0": pa.array([t[0] for t, _ in ups], pa.int64()),
            "c1": pa.array([t[1] for t, _ in ups], pa.int64()),
            "diff": pa.array([d for _, d in ups], pa.int64()),
        }
    )


def answered(values: pa.Table) -> Counter[tuple[int, ...]]:
    """An answer as the oracle gives one: head tuple -> multiplicity (or value)."""
    *keys, last = values.column_names
    rows = values.to_pylist()
    assert all(r[last] for r in rows), "a zero in an answer"
    got = Counter({tuple(r[k] for k in keys): r[last] for r in rows})
    assert len(got) == len(rows), "a tuple twice in an answer"
    return got


def expected(query: Query, bind: dict[str, list[int]], relations: dict) -> Counter:
    """The oracle's answer: the query itself, or summed over each distinct binding (the
    binding as equality filters)."""
    if not bind:
        return naive_eval(query, relations)
    total: Counter[tuple[int, ...]] = Counter()
    for row in dict.fromkeys(zip(*bind.values(), strict=True)):
        pinned = tuple(Filter(Var(v), CmpOp.EQ, Const(x)) for v, x in zip(bind, row, strict=True))
        q = Query(query.name, query.head, query.atoms, query.filters + pinned, query.aggregate)
        total.update(naive_eval(q, relations))
    return Counter({k: v for k, v in total.items() if v})


@settings(max_examples=10, deadline=None)
@given(
    data=st.data(),
    meaning=st.sampled_from(["undirected", "set", "bag"]),
    kept=st.sampled_from(["triangles", "degrees"]),
)
def test_questions_match_the_oracle_at_every_epoch(
    tmp_path_factory: pytest.TempPathFactory, data: st.DataObject, meaning: str, kept: str
) -> None:
    """Random epochs of inserts and deletes (multiplicities for a bag) under a state keeping
    `kept` (triangles: its counts arrangements are read; degrees: none are kept, they are
    made from the relation): every question, constants and bindings included, equals the
    oracle's naive join as of every epoch, from one snapshot per epoch."""
    specs = (
        relation_specs({"edge": 2}, undirected=["edge"])
        if meaning == "undirected"
        else {"edge": RelationSpec("edge", 2, Meaning(meaning))}
    )
    rng = random.Random(data.draw(st.integers(0, 2**16), label="seed"))
    root = str(tmp_path_factory.mktemp("ask"))
    oracle = Oracle(builtin(kept), specs)
    present: list[tuple[int, int]] = []
    epochs = data.draw(st.integers(1, 3), label="epochs")
    for t in range(epochs):
        ups: Ups = []
        for _ in range(rng.randrange(20, 90)):
            edge = (rng.randrange(14), rng.randrange(14))
            ups.append((edge, rng.choice([1, 1, 2, -1]) if meaning == "bag" else 1))
            present.append(edge)
        ups += [(e, -1) for e in rng.sample(present, k=min(len(present) // 5, 14))]
        oracle.land(t, {"edge": ups})
        Engine(None, root, builtin(kept), relations=specs).apply(t, {"edge": table(ups)})
    for t in range(epochs):
        snapshot = Snapshot.open(root, t)
        for text, bind in QUESTIONS:
            query = parse_query(text)
            question = snapshot.question(query, list(bind))
            values = np.array(list(zip(*bind.values(), strict=True))) if bind else None
            got = answered(snapshot.ask(question, values))
            assert got == expected(query, bind, oracle.state(t)), (t, text)


# -- exact against scipy's neighbour sets, on the shared graphs ------------------------------------


def graph_edges(path: Path) -> np.ndarray:
    """A SNAP edge list's undirected simple edges, each once (a < b)."""
    with gzip.open(path, "rt") as f:
        pairs = np.array([line.split() for line in f if line[0] != "#"], dtype=np.int64)
    pairs = pairs[pairs[:, 0] != pairs[:, 1]]
    return np.unique(np.sort(pairs, axis=1), axis=0)


def adjacency(edges: np.ndarray, n: int) -> sp.csr_matrix:
    a = sp.coo_matrix((np.ones(len(edges)), (edges[:, 0], edges[:, 1])), shape=(n, n))
    return ((a + a.T) > 0).astype(np.int8).tocsr()


def neighbours(a: sp.csr_matrix, v: int) -> np.ndarray:
    return a.indices[a.indptr[v] : a.indptr[v + 1]]


def scipy_triangles(a: sp.csr_matrix, v: int) -> Counter:
    """The triangles at v: pairs b < c of v's neighbours that are adjacent."""
    nv = neighbours(a, v)
    sub = a[nv][:, nv].tocoo()
    return Counter(
        {
            (int(nv[i]), int(nv[j])): 1
            for i, j in zip(sub.row, sub.col, strict=True)
            if nv[i] < nv[j]
        }
    )


def scipy_cliques(a: sp.csr_matrix, v: int) -> Counter:
    """The 4-cliques at v: triples b < c < d of v's neighbours, pairwise adjacent."""
    nv = neighbours(a, v)
    sub = a[nv][:, nv].tocsr()
    out: Counter = Counter()
    for i in range(len(nv)):
        ni = {int(x) for x in neighbours(sub, i) if x > i}
        for j in ni:
            for k in ni & {int(x) for x in neighbours(sub, j) if x > j}:
                out[(int(nv[i]), int(nv[j]), int(nv[k]))] = 1
    return out


def scipy_cycles(a: sp.csr_matrix, u: int, w: int) -> Counter:
    """The 4-cycles u - w - x - y - u through the edge (u, w), as (x, y)."""
    out: Counter = Counter()
    ys = set(neighbours(a, u).tolist()) - {w}
    for x in neighbours(a, w).tolist():
        if x != u:
            for y in ys & set(neighbours(a, x).tolist()):
                out[(x, y)] = 1
    return out


TRIANGLES_AT = "t(v, b, c) :- edge(v, b), edge(b, c), edge(v, c), b < c"
CLIQUES_AT = (
    "k(v, b, c, d) :- edge(v, b), edge(v, c), edge(v, d), edge(b, c), edge(b, d), edge(c, d), "
    "b < c, c < d"
)


def cycles_through(u: int, w: int) -> str:
    return f"c(x, y) :- edge({u}, {w}), edge({w}, x), edge(x, y), edge(y, {u}), x != {u}, y != {w}"


SMALL = [
    "ca-GrQc.txt.gz",
    "email-Eu-core.txt.gz",
    "oregon1_010331.txt.gz",
    "facebook_combined.txt.gz",
]
LARGER = [
    "wiki-Vote.txt.gz",
    "ca-HepPh.txt.gz",
    "email-Enron.txt.gz",
    "soc-Epinions1.txt.gz",
    "soc-Slashdot0902.txt.gz",
    "web-NotreDame.txt.gz",
]


@pytest.mark.parametrize(
    "name", [*SMALL, *(pytest.param(n, marks=pytest.mark.slow) for n in LARGER)]
)
def test_per_vertex_answers_equal_scipys_at_the_latest_and_an_earlier_epoch(
    tmp_path: Path, name: str
) -> None:
    """A shared graph kept as two epochs (some edges held back, then inserted while others are
    deleted): the triangles and the 4-cliques at vertices (random ones and the hubs: batched,
    and one at a time), and the 4-cycles through edges, each equal to scipy's from neighbour
    sets of the graph as of that epoch."""
    path = SHARED / name
    if not path.exists():
        pytest.skip(f"{path} is not there")
    edges = graph_edges(path)
    rng = np.random.default_rng(7)
    held = rng.random(len(edges)) < 0.03
    deleted = rng.random(len(edges)) < 0.03
    n = int(edges.max()) + 1
    graphs = [edges[~held], edges[~deleted]]
    specs = relation_specs({"edge": 2}, undirected=["edge"])
    root = str(tmp_path / "state")
    ones = np.ones(len(graphs[0]), dtype=np.int64)
    first = pa.table({"c0": graphs[0][:, 0], "c1": graphs[0][:, 1], "diff": ones})
    change = np.concatenate([edges[held & ~deleted], edges[deleted & ~held]])
    diff = np.concatenate(
        [np.ones(int((held & ~deleted).sum())), -np.ones(int((deleted & ~held).sum()))]
    )
    second = pa.table({"c0": change[:, 0], "c1": change[:, 1], "diff": diff.astype(np.int64)})
    for t, changes in enumerate((first, second)):
        Engine(None, root, builtin("triangle-count"), relations=specs).apply(t, {"edge": changes})
    for t, g in enumerate(graphs):
        a = adjacency(g, n)
        degree = np.diff(a.indptr)
        live = np.flatnonzero(degree)
        picks = rng.choice(live, size=min(30, len(live)), replace=False).tolist()
        picks += np.argsort(degree)[-2:].tolist()  # the hubs
        snapshot = Snapshot.open(root, t)
        tri = snapshot.question(parse_query(TRIANGLES_AT), ["v"])
        want = Counter({(v, *k): 1 for v in picks for k in scipy_triangles(a, v)})
        assert answered(snapshot.ask(tri, np.array(picks))) == want, (name, t)
        for v in picks[:5]:
            assert answered(snapshot.ask(tri, [v])) == Counter(
                {(v, *k): 1 for k in scipy_triangles(a, v)}
            )
        small = [v for v in picks if degree[v] <= 400]
        k4 = snapshot.question(parse_query(CLIQUES_AT), ["v"])
        want = Counter({(v, *k): 1 for v in small for k in scipy_cliques(a, v)})
        assert answered(snapshot.ask(k4, np.array(small))) == want, (name, t)
        for u, w in g[rng.choice(len(g), size=5, replace=False)].tolist():
            got = answered(snapshot.ask(snapshot.question(parse_query(cycles_through(u, w)))))
            assert got == scipy_cycles(a, u, w), (name, t, u, w)


# -- read-only, beside an apply; refusals ----------------------------------------------------------


def small_state(root: Path, epochs: int = 2) -> Oracle:
    specs = relation_specs({"edge": 2}, undirected=["edge"])
    oracle = Oracle(builtin("triangles"), specs)
    rng = random.Random(5)
    for t in range(epochs):
        ups: Ups = [((rng.randrange(12), rng.randrange(12)), 1) for _ in range(40)]
        ups += [((rng.randrange(12), rng.randrange(12)), -1) for _ in range(8)]
        oracle.land(t, {"edge": ups})
        Engine(None, str(root), builtin("triangles"), relations=specs).apply(
            t, {"edge": table(ups)}
        )
    return oracle


def test_a_snapshot_answers_from_its_generation_while_epochs_commit_beside_it(
    tmp_path: Path,
) -> None:
    """A snapshot writes nothing and takes no lock: epochs commit beside it (more than the
    manifests a state keeps, so the files of its generation are pruned), and it still answers
    as of its epoch — from the files it mapped, or, for a question reading what it had not
    opened, from the current generation as of the same epoch."""
    root = tmp_path / "state"
    oracle = small_state(root)
    snapshot = Snapshot.open(str(root))
    listed = snapshot.question(parse_query(TRIANGLES_AT), ["v"])
    assert answered(snapshot.ask(listed, np.arange(12))) == expected(
        parse_query(TRIANGLES_AT), {"v": list(range(12))}, oracle.state(1)
    )
    engine = Engine(None, str(root), builtin("triangles"), relations=oracle.specs)
    rng = random.Random(9)
    for t in range(2, 10 + KEEP_MANIFESTS):
        ups: Ups = [
            ((rng.randrange(12), rng.randrange(12)), rng.choice([1, -1])) for _ in range(30)
        ]
        oracle.land(t, {"edge": ups})
        engine.apply(t, {"edge": table(ups)})
    assert snapshot.generation == 2 and snapshot.epoch == 1
    assert answered(snapshot.ask(listed, np.arange(12))) == expected(
        parse_query(TRIANGLES_AT), {"v": list(range(12))}, oracle.state(1)
    )
    # Read through the counts by the second column, which it had not opened: their files then
    # are long pruned.
    into = snapshot.question(parse_query("i(a, count()) :- edge(b, a), edge(c, a), b < c"), ["a"])
    assert answered(snapshot.ask(into, np.arange(12))) == expected(
        into.query, {"a": list(range(12))}, oracle.state(1)
    )


@pytest.mark.parametrize("budget", [None, 0])
def test_a_vertex_a_call_answers_as_all_at_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, budget: int | None
) -> None:
    """A question of a few bindings (`wcoj_core.ask.FEW`) runs its own steps, once per
    vertex asked, and falls back to the kernel's pieces past the proposal budget (0 here):
    every vertex's answer is the oracle's, at the latest and an earlier epoch."""
    import wcoj_core.ask as asking

    if budget is not None:
        monkeypatch.setattr(asking, "PROPOSAL_BUDGET", budget)
    oracle = small_state(tmp_path / "state", epochs=3)
    for epoch in (1, 2):
        snapshot = Snapshot.open(str(tmp_path / "state"), epoch)
        for text, bind in ((TRIANGLES_AT, "v"), (CLIQUES_AT, "v"), ("q(b) :- edge(3, b)", "")):
            question = snapshot.question(parse_query(text), [bind] if bind else [])
            for v in range(12) if bind else [-1]:
                got = answered(snapshot.ask(question, [v] if bind else None))
                want = expected(question.query, {bind: [v]} if bind else {}, oracle.state(epoch))
                assert got == want, (text, v, epoch)


def test_wcoj_query_writes_nothing_and_says_what_it_read(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = tmp_path / "state"
    oracle = small_state(root)
    files = sorted(p.relative_to(root) for p in root.rglob("*"))
    out = tmp_path / "answer.csv"
    argv = ["query", str(root), "--query", TRIANGLES_AT, "--bind", "v=0,1,2,3", "--json"]
    assert main([*argv, "--output", str(out), "--epoch", "0"]) == 0
    doc = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert (doc["epoch"], doc["generation"], doc["columns"]) == (0, 2, ["v", "b", "c", "diff"])
    want = expected(parse_query(TRIANGLES_AT), {"v": [0, 1, 2, 3]}, oracle.state(0))
    assert doc["rows"] == len(want) and doc["count"] == sum(want.values())
    import pyarrow.csv as pacsv

    assert answered(pacsv.read_csv(out)) == want
    assert sorted(p.relative_to(root) for p in root.rglob("*")) == files
    per = "p(v, count()) :- edge(v, b), edge(b, c), edge(v, c), b < c"
    assert main(["query", str(root), "--query", per, "--json"]) == 0
    doc = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert doc["groups"] == doc["rows"] and doc["total"] == 3 * len(oracle.output(1))


def test_wcoj_query_imports_no_spark_dagster_pandas_or_arrow(tmp_path: Path) -> None:
    """A fresh ``wcoj query`` process answers without importing Spark, Dagster or pandas, nor
    Arrow for an answer it only prints (a vertex's question: a point lookup)."""
    root = tmp_path / "state"
    oracle = small_state(root)
    probe = (
        "import sys\n"
        "from wcoj_core.cli import main\n"
        "sys.argv = ['wcoj', 'query', *sys.argv[1:]]\n"
        "code = main()\n"
        "heavy = {'pyspark', 'py4j', 'dagster', 'pandas', 'pyarrow'}\n"
        "print(code, sorted({m.split('.')[0] for m in sys.modules} & heavy), file=sys.stderr)\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "PYTEST_CURRENT_TEST"}
    argv = [str(root), "--query", TRIANGLES_AT, "--bind", "v=0,1,2,3", "--json"]
    done = subprocess.run(
        [sys.executable, "-c", probe, *argv], capture_output=True, text=True, env=env
    )
    assert done.stderr.strip() == "0 []", done.stderr
    want = expected(parse_query(TRIANGLES_AT), {"v": [0, 1, 2, 3]}, oracle.state(1))
    assert json.loads(done.stdout.splitlines()[-1])["rows"] == len(want)


@pytest.mark.parametrize(
    ("argv", "fragment"),
    [
        (["--query", "triangles", "--epoch", "9"], "holds epochs up to 1; epoch 9 is not applied"),
        (["--query", "q(a) :- other(a)"], "reads 'other', which the state at"),
        (
            ["--query", "q(a) :- edge(a)"],
            "reads 'edge' with arity 1; the state holds it with arity 2",
        ),
        (["--query", TRIANGLES_AT, "--bind", "z=1"], "cannot bind z"),
        (["--query", TRIANGLES_AT, "--bind", "v=1,x"], "the values must be integers"),
    ],
)
def test_a_bad_question_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: list[str], fragment: str
) -> None:
    root = tmp_path / "state"
    small_state(root)
    capsys.readouterr()
    assert main(["query", str(root), *argv]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and fragment in err[0], err


def test_an_epoch_before_the_compaction_frontier_is_refused_naming_it(tmp_path: Path) -> None:
    root = tmp_path / "state"
    oracle = small_state(root, epochs=3)
    Engine(None, str(root), builtin("triangles"), relations=oracle.specs).compact(1)
    with pytest.raises(StateError, match=r"history before epoch 1 was compacted.*epoch 1 or later"):
        Snapshot.open(str(root), 0)
    got = ask(str(root), "triangles", epoch=1)
    assert answered(got) == oracle.output(1)
    with pytest.raises(QueryError, match="give values for v"):
        Snapshot.open(str(root)).ask(Question.of(parse_query(TRIANGLES_AT), ["v"]))
    with pytest.raises(QueryError, match="_given names the bindings of a question"):
        Question.of(parse_query("q(a) :- _given(a)"))


def test_the_benchmark_part_checks_what_it_times(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``wcoj-bench ask`` on a small graph: its answers equal scipy's neighbour sets (a missing
    triangle on scipy's side is a `BenchError`), the attached 4-cliques equal the static count
    and every later epoch's change equals the static state's, the relation untouched."""
    import argparse

    from wcoj_bench.infra.measure import BenchError
    from wcoj_bench.parts import ask as bench

    path = SHARED / "ca-GrQc.txt.gz"
    if not path.exists():
        pytest.skip(f"{path} is not there")
    args = argparse.Namespace(
        input=f"edge={path}", work=str(tmp_path), vertices=60, runs=1, cold_state=None,
        epochs=2, epoch_size=200, delete_fraction=0.5, seed=3, parts="vertex,attach",
    )  # fmt: skip
    got = bench.run(args)
    assert got["vertex"]["triangles"]["exact"] and got["vertex"]["4-cliques"]["exact"]
    attach = got["attach"]
    assert attach["relation_unchanged"] and attach["epochs_exact"] == 2
    assert set(attach["bytes_added"]) == {"out/cliques4", "counts/edge/"}
    real = bench.scipy_triangles
    monkeypatch.setattr(bench, "scipy_triangles", lambda *a: real(*a)[1:])
    with pytest.raises(BenchError, match="triangles at a vertex differs"):
        bench.run(argparse.Namespace(**{**vars(args), "parts": "vertex"}))


def test_a_question_during_an_epoch_reads_the_last_commit_and_never_holds_it_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Asked while an epoch has written everything but its manifest, a question answers as of
    the last committed generation; the epoch then commits as it would alone, and the next
    question sees it. Asking changes no generation."""
    from wcoj_core.store.manifest import Manifest
    from wcoj_core.store.store import Store

    root = tmp_path / "state"
    oracle = small_state(root)
    ups: Ups = [((0, 1), 1), ((1, 2), 1), ((0, 2), 1), ((3, 4), -1)]
    oracle.land(2, {"edge": ups})
    seen: list[tuple[int, Counter]] = []
    commit = Store.commit

    def asked_first(self: Store, manifest: Manifest, expected: Manifest) -> Manifest:
        snapshot = Snapshot.open(str(root))
        seen.append(
            (snapshot.generation, answered(snapshot.ask(snapshot.question(builtin("triangles")))))
        )
        return commit(self, manifest, expected)

    monkeypatch.setattr(Store, "commit", asked_first)
    Engine(None, str(root), builtin("triangles"), relations=oracle.specs).apply(
        2, {"edge": table(ups)}
    )
    monkeypatch.undo()
    assert seen == [(2, oracle.output(1))]
    after = Snapshot.open(str(root))
    assert after.generation == 3 and answered(ask(str(root), "triangles")) == oracle.output(2)
    assert Store.open(root, create=False).current().generation == 3
