"""A clique counted from nothing, oriented: the query's filters rechained (`plan.counted`) and
its relation's ids relabelled by (degree, id) rank as they land, each edge once from lower rank to
higher (`input_land.by_rank`) where every atom is oriented (`plan.oriented`).

The counts are compared with the oracle's on the graph as given, over a skewed graph whose hubs
hold the lowest ids (where the orientation proposes fewer candidates), landed from a table or a
stream (relabelled as it is packed) and from a layer (relabelled and sorted again). What is not
order-free keeps its query, and a kept state keeps its ids.
"""

from __future__ import annotations

import json
import random
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from oracle import naive_eval

from wcoj_core.engine import Engine
from wcoj_core.input_land import by_rank, degree_ranks
from wcoj_core.kernel.layer import Layer
from wcoj_core.meaning import Meaning, RelationSpec
from wcoj_core.query.builtins import BUILTINS, builtin
from wcoj_core.query.parse import parse_query
from wcoj_core.query.plan import counted, order_free, oriented

SETS = {"edge": RelationSpec("edge", 2, Meaning.SET, True)}


def skewed(seed: int, n: int = 80, hubs: int = 3, edges: int = 400) -> list[tuple[int, int]]:
    """Edges (with repeats, both directions and self-loops, as files hold them) over ids
    0..n-1, the lowest ids hubs joined to most vertices."""
    rng = random.Random(seed)
    out = [(h, v) for h in range(hubs) for v in range(n) if rng.random() < 0.7]
    out += [(rng.randrange(n), rng.randrange(n)) for _ in range(edges)]
    return out + [(b, a) for a, b in out[::7]]


def table(edges: list[tuple[int, int]]) -> pa.Table:
    c0, c1 = zip(*edges, strict=True)
    return pa.table({"c0": list(c0), "c1": list(c1), "diff": [1] * len(edges)})


def oracle_count(query_name: str, edges: list[tuple[int, int]]) -> int:
    both = {(a, b): 1 for a, b in edges if a != b} | {(b, a): 1 for a, b in edges if a != b}
    return sum(naive_eval(builtin(query_name), {"edge": both}).values())


@pytest.mark.parametrize("name", ["triangles", "4-cliques"])
@pytest.mark.parametrize("stream", [False, True])
def test_an_oriented_clique_count_is_the_oracles_with_fewer_candidates(
    tmp_path: Path, name: str, stream: bool
) -> None:
    """The query run instead, over its relabelled relation, counts what the oracle counts over
    the ids as given, proposing fewer candidates than the query as written over the same edges
    read as a directed set of both directions (not order-free: run as written, ids as given)."""
    for seed in range(2):
        edges = skewed(seed)
        both = [*edges, *((b, a) for a, b in edges)]
        query = builtin(name)
        directed = {"edge": RelationSpec("edge", 2, Meaning.SET)}
        figures = []
        for q, specs, rows in ((query, directed, both), (counted(query, ["edge"]), SETS, edges)):
            engine = Engine(None, str(tmp_path / f"{seed}-{len(figures)}"), q, relations=specs)
            given = table([(a, b) for a, b in rows if a != b])
            inputs = pa.RecordBatchReader.from_batches(given.schema, given.to_batches(97))
            result = engine.evaluate({"edge": inputs if stream else given}, count_only=True)
            assert result.changes[q.name] is None  # counted, never made
            figures.append((result.count(q.name), result.metrics.proposed))
        expected = oracle_count(name, edges)
        assert expected > 0
        assert [c for c, _ in figures] == [expected, expected], seed
        assert figures[1][1] < figures[0][1], seed


@pytest.mark.parametrize("given_as", ["table", "stream", "layer"])
def test_each_edge_is_held_once_only_where_every_atom_is_oriented(
    tmp_path: Path, given_as: str
) -> None:
    """A count whose every atom matches edges from lower to higher lands each edge once (its
    changes are the distinct edges, not both directions); an order-free query with an atom
    against its filters (`edge(c, a)`, `a < b, b < c`) lands both directions, ids as given.
    Both count what the oracle counts, bags included."""
    edges = skewed(5)
    bag = {"edge": RelationSpec("edge", 2, Meaning.BAG, True)}
    against = parse_query("t(a, b, c) :- edge(a, b), edge(b, c), edge(c, a), a < b, b < c")
    distinct = len({(min(a, b), max(a, b)) for a, b in edges if a != b})
    for q, held in ((counted(builtin("4-cliques"), ["edge"]), distinct), (against, 2 * distinct)):
        assert order_free(q, ["edge"]) and oriented(q) == (held == distinct)
        for specs in (SETS, bag):
            engine = Engine(
                None,
                str(tmp_path / f"{q.name}-{specs['edge'].meaning.name}"),
                q,
                relations=specs,
            )
            given = table(edges)
            inputs = {
                "table": given,
                "stream": pa.RecordBatchReader.from_batches(given.schema, given.to_batches(61)),
                "layer": Layer.build(np.array(edges), np.ones(len(edges), dtype=np.int64)),
            }
            result = engine.evaluate({"edge": inputs[given_as]}, count_only=True)
            if specs is SETS:  # (a bag's output is summed, not only counted: not ranked)
                assert result.metrics.changes["edge"] == held
            weights: dict[tuple[int, int], int] = {}
            for a, b in edges:
                if a != b:
                    for e in ((a, b), (b, a)):
                        weights[e] = weights.get(e, 0) + 1 if specs is bag else 1
            assert result.count(q.name) == sum(naive_eval(q, {"edge": weights}).values())


def test_a_kept_state_and_a_written_output_keep_their_ids(tmp_path: Path) -> None:
    """An epoch applied to a state keeps the relation's own ids (nothing is relabelled): its
    output's tuples are the oracle's."""
    edges = skewed(7)
    q = builtin("triangles")
    engine = Engine(None, str(tmp_path / "kept"), counted(q, ["edge"]), relations=SETS)
    result = engine.apply(0, {"edge": table(edges)})
    rows, diff = result.changes[q.name]
    both = {(a, b): 1 for a, b in edges if a != b} | {(b, a): 1 for a, b in edges if a != b}
    got = {tuple(r): int(d) for r, d in zip(rows.tolist(), diff.tolist(), strict=True)}
    expected = naive_eval(parse_query(str(counted(q, ["edge"]))), {"edge": both})
    assert got == dict(expected)


def test_only_a_clique_over_one_undirected_relation_ordered_whole_is_order_free() -> None:
    free = [n for n in BUILTINS if order_free(builtin(n), ["edge"])]
    assert free == ["triangles", "4-cliques"]
    assert not order_free(builtin("triangles"), [])  # a directed relation
    for text in (
        "t(a, b, c) :- edge(a, b), edge(b, c), edge(a, c), a < b",  # not ordered whole
        "t(a, b, c) :- edge(a, b), edge(b, c), edge(a, c), a < b, b <= c",  # not strict
        "t(a, b, c) :- edge(a, b), edge(b, c), f(a, c), a < b, b < c",  # two relations
        "t(a, b, c) :- edge(a, b), edge(b, c), edge(a, c), edge(c, a), a < b, b < c",  # twice
        "t(a, b) :- edge(a, b), edge(b, 3), a < b",  # a constant
        "t(a, b, c) :- edge(a, b), edge(b, c), a < b, b < c",  # a path, not a clique
        "t(a, b) :- edge(a, b), edge(b, c), edge(a, c), a < b, b < c",  # c not in the head
    ):
        q = parse_query(text)
        assert not order_free(q, ["edge", "f"]), text
        assert counted(q, ["edge", "f"]) is q
    assert order_free(parse_query("t(a, b) :- edge(a, b), a > b"), ["edge"])
    assert str(counted(builtin("4-cliques"), ["edge"])).endswith("c < d, d < a, a < b")


def test_ranks_order_the_ids_by_degree_then_id_and_relabel_a_layer_one_to_one() -> None:
    rank = degree_ranks([np.array([9, 9, 9, 10]), np.array([11, 12, 10, 9])], 9, 12)
    assert rank is not None and rank.tolist() == [3, 2, 0, 1]  # degrees 4, 2, 1, 1
    assert degree_ranks([np.array([0, 1 << 40])], 0, 1 << 40) is None  # too sparse
    a, b = [1, 2, 2, 5, 5, 5], [5, 5, 1, 1, 2, 7]
    layer = Layer.build([np.array(a + b), np.array(b + a)], np.ones(12, dtype=np.int64))
    ranked = by_rank(layer)
    assert ranked is not None and not ranked.symmetric
    rank = degree_ranks([layer.col(0)], 1, 7)
    assert rank is not None and rank[5 - 1] == 6  # vertex 5, of the highest degree, ranks last
    assert ranked.rows.tolist() == sorted(  # each edge once, from lower rank to higher
        [int(rank[x - 1]), int(rank[y - 1])]
        for x, y in layer.rows.tolist()
        if rank[x - 1] < rank[y - 1]
    )


def test_a_count_keeping_nothing_imports_only_what_it_reads_with(tmp_path: Path) -> None:
    """``wcoj count`` on a SNAP text keeping nothing imports neither pandas, pyspark nor
    Dagster, nor pyarrow's Parquet, file systems and ssl; its count is the oracle's."""
    edges = skewed(3)
    path = tmp_path / "g.txt"
    path.write_text("".join(f"{a}\t{b}\n" for a, b in edges))
    heavy = ("pandas", "pyspark", "dagster", "pyarrow.parquet", "pyarrow.fs", "ssl")
    script = (
        "import json, sys\n"
        "from wcoj_core.cli import main\n"
        "code = main()\n"
        f"print(json.dumps([m for m in {heavy!r} if m in sys.modules]))\n"
        "sys.exit(code)\n"
    )
    argv = ["count", "--query", "triangles", "--input", f"edge={path}", "--undirected", "edge"]
    done = subprocess.run(
        [sys.executable, "-c", script, *argv, "--json"],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    *lines, imported = done.stdout.splitlines()
    assert json.loads(imported) == []
    assert json.loads(lines[-1])["count"] == oracle_count("triangles", edges)
