"""Warm epochs of an undirected graph against the naive oracle, as exact multisets.

One `Engine` applies epoch after epoch in this process (as `wcoj-bench epochs` and a Dagster
code server do): its segments are kept mapped between epochs (`indexes.KEPT`), its recent
segments folded into one layer, and the undirected relation's reversed view read from its
identity's segments (`open_trace(mirror=True)`); its changes and support changes stay marked
as their own mirror, and its two counts traces share one lookup. Every epoch mixes inserts,
deletes of present and absent edges, both directions given at once, repeats and self-loops;
each epoch's output change, the accumulated output, the relation, its counts traces and their
figures are compared with the oracle, with recent segments merged often and seldom.
"""

from __future__ import annotations

import random
from collections import Counter

import pyarrow as pa
import pytest
from oracle import Oracle, naive_counts, stored

from wcoj_core import indexes
from wcoj_core.check.verify import verify_state
from wcoj_core.engine import Engine
from wcoj_core.indexes import open_trace
from wcoj_core.kernel.layer import summed_sorted
from wcoj_core.meaning import relation_specs
from wcoj_core.query.builtins import builtin
from wcoj_core.query.plan import Kind
from wcoj_core.traces import counts_trace_name, output_trace_name, relation_trace_name

Ups = list[tuple[tuple[int, ...], int]]


def epoch_changes(rng: random.Random, present: set[tuple[int, int]], nodes: int) -> Ups:
    ups: Ups = []
    for _ in range(rng.randint(1, 14)):
        a, b = rng.randrange(nodes), rng.randrange(nodes)
        roll = rng.random()
        if roll < 0.45:
            ups.append(((a, b), 1))
        elif roll < 0.7 and present:
            x, y = rng.choice(sorted(present))
            ups.append(((x, y) if rng.random() < 0.5 else (y, x), -1))
        elif roll < 0.8:
            ups.append(((a, b), -1))  # most likely absent
        elif roll < 0.9:
            ups += [((a, b), 1), ((b, a), 1)]  # both directions given
        else:
            ups.append(((a, a), 1))  # a self-loop, dropped
    return ups


def table(ups: Ups) -> pa.Table:
    return pa.table(
        {
            "c0": [t[0] for t, _ in ups],
            "c1": [t[1] for t, _ in ups],
            "diff": [d for _, d in ups],
        }
    )


@pytest.mark.parametrize(
    ("name", "seed", "merge"),
    [
        ("triangles", 1, "default"),
        ("triangles", 2, "seldom"),
        ("4-cycles", 3, "default"),
        ("4-cliques", 4, "seldom"),
        ("2-paths", 5, "often"),
    ],
)
def test_warm_epochs_of_an_undirected_set_match_the_oracle(
    tmp_path, monkeypatch, name: str, seed: int, merge: str
) -> None:
    if merge == "seldom":
        monkeypatch.setattr(indexes, "MAX_RECENT", 1000)
        monkeypatch.setattr(indexes, "MERGE_MIN_ROWS", 10**9)
    elif merge == "often":
        monkeypatch.setattr(indexes, "MERGE_MIN_ROWS", 0)
        monkeypatch.setattr(indexes, "MERGE_SHARE", 0.0)
    indexes.KEPT.clear()
    query = builtin(name)
    specs = relation_specs({"edge": 2}, undirected=["edge"])
    oracle = Oracle(query, specs)
    engine = Engine(None, str(tmp_path / "state"), query, undirected=["edge"], deployment="driver")
    rng = random.Random(seed)
    nodes = 9
    counts = [a for a in engine.served.arrangements if a.kind is Kind.COUNTS]
    for t in range(14):
        present = {e for e, d in oracle.state(t - 1)["edge"].items() if d}
        ups = epoch_changes(rng, present, nodes)
        oracle.land(t, {"edge": ups})
        engine.apply(t, {"edge": table(ups)})
        width = len(query.head)
        got: Counter[tuple[int, ...]] = Counter()
        for row in engine.change(query.name, t).to_pylist():
            got[tuple(row[f"c{i}"] for i in range(width))] += row["diff"]
        assert +got == +oracle.change(t) and -got == -oracle.change(t), f"epoch {t}: change"
        out = oracle.output(t)
        assert stored(engine, output_trace_name(query.name)) == out, f"epoch {t}: output"
        edges = oracle.state(t)["edge"]
        assert stored(engine, relation_trace_name("edge")) == edges, f"epoch {t}: edges"
        for a in counts:
            want = naive_counts(a, edges)
            cname = counts_trace_name(a)
            assert stored(engine, cname) == want, f"epoch {t}: {cname}"
            assert engine.figures(cname)[:2] == (len(want), sum(want.values())), cname
        assert engine.figures(relation_trace_name("edge"))[:2] == (len(edges), len(edges))
        assert engine.count(query.name) == sum(out.values()), f"epoch {t}: count"
    # The reversed view's segments are the identity's (`advance(mirror=True)`): a reader that
    # opens every view of the relation from its files (as the executors and `wcoj verify` do)
    # reads each view's rows in its own order.
    name = relation_trace_name("edge")
    trace = engine.store.current().trace(name)
    assert trace is not None and trace.index is not None
    paths: dict[tuple[int, ...], set[str]] = {}
    for s in trace.index.segments:
        if s.rows and s.view is None:
            paths.setdefault(tuple(s.order), set()).add(s.path)
    assert paths[(1, 0)] == paths[(0, 1)]
    # The counts by the second column are indexed by the first's segments (its twin).
    twins = [engine.store.current().trace(counts_trace_name(a)) for a in counts]
    if len(twins) == 2:
        assert [s.path for s in twins[0].index.segments] == [
            s.path for s in twins[1].index.segments
        ]
    opened = open_trace(
        engine.store.root, trace, 14, engine.served.views[name], engine.read_batch, verify=True
    )
    edges = sorted(e for e, d in oracle.state(13)["edge"].items() if d)
    for key in engine.served.views[name]:
        order = key[1]
        held = summed_sorted(opened.at(key)) if opened.at(key) else None
        rows = [] if held is None else [tuple(r) for r in held.rows.tolist()]
        assert rows == sorted(tuple(e[j] for j in order) for e in edges), key
    assert verify_state(engine.store).ok


def test_the_executors_read_the_shared_segments_of_an_undirected_set(small, tmp_path) -> None:
    """Epochs taking turns on the driver (which writes the reversed view and the second counts
    as the identity's and the first's segments), on the executors and on sharded executors
    (which open every view and every counts trace from the files, as named): each change
    equals the oracle's."""
    query = builtin("triangles")
    specs = relation_specs({"edge": 2}, undirected=["edge"])
    oracle = Oracle(query, specs)
    state = str(tmp_path / "state")
    ways = [
        Engine(small, state, query, undirected=["edge"], deployment=d, executor_max_rows=rows)
        for d, rows in (("driver", 10**9), ("executors", 10**9), ("executors", 16))
    ]
    ways[2].access.one_task_rows = 0  # sharded: every arrangement cut in shards, prefixes routed
    ways[2].access.routed = True
    rng = random.Random(11)
    for t in range(9):
        present = {e for e, d in oracle.state(t - 1)["edge"].items() if d}
        ups = epoch_changes(rng, present, 10)
        oracle.land(t, {"edge": ups})
        way = (t // 2) % 3
        engine = ways[way]
        result = engine.apply(t, {"edge": table(ups)})
        assert result.metrics.deployment == ("driver", "executors", "executors")[way] or t == 0
        got: Counter[tuple[int, ...]] = Counter()
        for row in engine.change(query.name, t).to_pylist():
            got[(row["c0"], row["c1"], row["c2"])] += row["diff"]
        expect = oracle.change(t)
        assert +got == +expect and -got == -expect, f"epoch {t}"
        assert stored(engine, output_trace_name(query.name)) == oracle.output(t), f"epoch {t}"
