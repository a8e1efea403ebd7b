"""Skew: a hub vertex must not blow up the work of a delta rule.

A sparse random graph plus one hub adjacent to most vertices is loaded at epoch 0. Epoch 1 adds a
few edges next to the hub: edges between two of its neighbours and edges from the hub to new
neighbours. A binary plan joins each delta edge through the hub with the hub's whole adjacency
list (about `HUB_DEGREE` wedges per edge, and about ``HUB_DEGREE**2`` wedges for the static
query). GenericJoin lets the extender with the fewest candidates propose, so each delta prefix
costs the smaller degree of its two endpoints.

The test checks the output change against the naive oracle, the engine's per-step metrics against
the same counts recomputed here in pure Python, and the proposals against the binary plan's size;
on the driver (no Spark), and on the executors with the hub epoch's work split over two tasks,
which must do exactly the driver's work.

Ported to the one-pass engine: the edges are landed once each, as an undirected relation (a set,
read in both directions by the engine), as Arrow tables; the change is `EpochResult.changes`
(or `Engine.change` when the executors wrote it); every step is measured (no Spark nulls).
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pyarrow as pa
from oracle import naive_delta, naive_eval
from pyspark.sql import SparkSession

from wcoj_core.engine import Engine, EpochResult, StepMetrics
from wcoj_core.meaning import relation_specs
from wcoj_core.query.builtins import builtin
from wcoj_core.query.plan import Plan, Version

VERTICES = 3000
SPARSE_EDGES = 300
HUB = 0  # the smallest vertex, so that the naive oracle's body-order search stays cheap
HUB_DEGREE = 2000
TRIANGLES = builtin("triangles")
SPECS = relation_specs({"edge": 2}, undirected=["edge"])

Graph = Counter[tuple[int, int]]


def symmetric(pairs: set[tuple[int, int]]) -> Graph:
    graph: Graph = Counter()
    for u, v in pairs:
        graph[(u, v)] += 1
        graph[(v, u)] += 1
    return graph


def table(pairs: set[tuple[int, int]]) -> pa.Table:
    """Undirected edges, each named once (the engine reads both directions)."""
    rows = sorted(pairs)
    return pa.table(
        {
            "c0": pa.array([u for u, _ in rows], pa.int64()),
            "c1": pa.array([v for _, v in rows], pa.int64()),
            "diff": pa.array([1] * len(rows), pa.int64()),
        }
    )


def adjacency(graph: Graph) -> tuple[dict[int, set[int]], dict[int, set[int]]]:
    """Out- and in-neighbours over the tuples of non-zero multiplicity."""
    out: dict[int, set[int]] = {}
    into: dict[int, set[int]] = {}
    for (u, v), d in graph.items():
        if d != 0:
            out.setdefault(u, set()).add(v)
            into.setdefault(v, set()).add(u)
    return out, into


def skewed_graph(rng: random.Random) -> tuple[set[tuple[int, int]], list[int]]:
    """Sparse random pairs plus the hub's pairs; returns the pairs and the hub's neighbours."""
    neighbours = rng.sample(range(1, VERTICES), HUB_DEGREE + 100)
    pairs = {(HUB, x) for x in neighbours}
    while len(pairs) < len(neighbours) + SPARSE_EDGES:
        u, v = sorted(rng.sample(range(1, VERTICES), 2))
        pairs.add((u, v))
    return pairs, neighbours


def hub_changes(
    rng: random.Random, pairs: set[tuple[int, int]], neighbours: list[int]
) -> set[tuple[int, int]]:
    """New pairs next to the hub: three between its neighbours, two from it to new neighbours.

    Each new hub neighbour is chosen among vertices with a sparse edge into the hub's
    neighbourhood, so that every new pair closes at least one triangle.
    """
    near = set(neighbours)
    out, _ = adjacency(symmetric(pairs))
    new: set[tuple[int, int]] = set()
    while len(new) < 3:
        u, v = sorted(rng.sample(neighbours, 2))
        if (u, v) not in pairs:
            new.add((u, v))
    outsiders = sorted(x for x in out if x != HUB and x not in near and out[x] & near)
    new.update((HUB, x) for x in rng.sample(outsiders, 2))
    return new


def expected_steps(plan: Plan, delta: Graph, old: Graph, new: Graph) -> dict[int, tuple[int, int]]:
    """Per rule: (surviving prefixes, sum of the fewest candidates), computed without Spark.

    A prefix is a delta tuple passing the start filters; it survives when every extender has at
    least one candidate for it, and the extender with the fewest candidates proposes them.
    """
    adj = {Version.OLD: adjacency(old), Version.NEW: adjacency(new)}
    result: dict[int, tuple[int, int]] = {}
    for rule in plan.rules:
        assert len(rule.steps) == 1 and not rule.checks, "the triangle rules extend once"
        (step,) = rule.steps
        prefixes = fewest = 0
        for (u, v), d in delta.items():
            if d == 0:
                continue
            binding = dict(zip(rule.start, (u, v), strict=True))
            if not all(f.holds(binding) for f in rule.start_filters):
                continue
            counts = []
            for x in step.extenders:
                assert len(x.key) == 1 and x.view.is_identity
                value = binding[plan.atom_vars[x.atom][x.key[0]]]
                out, into = adj[x.version]
                # Keyed by column 0 the candidates are out-neighbours, by column 1 in-neighbours.
                counts.append(len((out if x.key == (0,) else into).get(value, ())))
            if min(counts) > 0:
                prefixes += 1
                fewest += min(counts)
        result[rule.delta] = (prefixes, fewest)
    return result


def binary_wedges(delta: Graph, graph: Mapping[tuple[int, int], int]) -> int:
    """Rows of ``delta(a, b) ⋈ edge(b, c)``: every delta edge meets all edges out of its head."""
    out, _ = adjacency(Counter(graph))
    return sum(len(out.get(v, ())) for (_, v), d in delta.items() if d != 0)


def change_of(engine: Engine, result: EpochResult) -> Counter[tuple[int, ...]]:
    arrays = result.changes[TRIANGLES.name]
    change: Counter[tuple[int, ...]] = Counter()
    if arrays is None:
        for row in engine.change(TRIANGLES.name, result.epoch).to_pylist():
            change[(row["c0"], row["c1"], row["c2"])] += row["diff"]
    else:
        rows, diff = arrays
        for row, d in zip(rows.tolist(), diff.tolist(), strict=True):
            change[tuple(row)] += d
    return Counter({k: v for k, v in change.items() if v})


def hub_epoch(engine: Engine) -> tuple[str, list[tuple[int, str, int, int, int, int]]]:
    """Load the skewed graph, apply the hub epoch, check it; where it ran and its steps."""
    rng = random.Random(20240611)
    pairs, neighbours = skewed_graph(rng)
    new_pairs = hub_changes(rng, pairs, neighbours)
    before = symmetric(pairs)
    delta = symmetric(new_pairs)
    after = before + delta
    hub_degree = len(adjacency(before)[0][HUB])
    assert hub_degree >= HUB_DEGREE

    engine.apply(0, {"edge": table(pairs)})
    result = engine.apply(1, {"edge": table(new_pairs)})
    assert result.relations["edge"].changed == len(delta)

    # Exactness: the change equals the naive oracle's, and so does the count.
    expected = naive_delta(TRIANGLES, {"edge": before}, {"edge": after})
    assert change_of(engine, result) == expected
    assert len(expected) >= len(delta) // 2, "every new pair should close a triangle"
    assert result.count(TRIANGLES.name) == sum(naive_eval(TRIANGLES, {"edge": after}).values())

    # The engine's per-step metrics match the counts recomputed here.
    steps: list[StepMetrics] = [s for s in result.metrics.steps if s.query == TRIANGLES.name]
    assert len(steps) == len(engine.served.plans[TRIANGLES.name].rules), steps
    bound = expected_steps(engine.served.plans[TRIANGLES.name], delta, before, after)
    for s in steps:
        assert (s.prefixes, s.min_count_sum) == bound[s.rule], s
        # Every proposal is one of the fewest candidates; ranges narrowed by the order filters.
        assert s.validated <= s.proposed <= s.min_count_sum, s
    proposed = sum(s.proposed for s in steps)
    wcoj_bound = sum(fewest for _, fewest in bound.values())
    assert 0 < proposed <= wcoj_bound

    # Against a binary plan: each delta edge into the hub meets the hub's whole adjacency list.
    hub_delta_edges = sum(1 for (u, v) in delta if HUB in (u, v))
    wedges = binary_wedges(delta, before)
    assert wedges >= hub_delta_edges // 2 * hub_degree
    assert 10 * proposed <= wedges, (proposed, wedges)
    assert 100 * wcoj_bound <= hub_degree**2, (wcoj_bound, hub_degree)
    return result.metrics.deployment, sorted(
        (s.rule, s.var, s.prefixes, s.min_count_sum, s.proposed, s.validated) for s in steps
    )


def test_hub_edges_propose_from_the_small_side(tmp_path: Path) -> None:
    engine = Engine(None, str(tmp_path / "state"), TRIANGLES, relations=SPECS)
    assert hub_epoch(engine)[0] == "driver"


def test_the_hub_epoch_split_over_tasks_does_the_drivers_work(
    small: SparkSession, tmp_path: Path
) -> None:
    """The same epochs with the kernel in two Spark tasks, the hub's delta tuples split between
    them by the work the counts predict: the same change and exactly the driver's steps."""
    _, driver = hub_epoch(Engine(None, str(tmp_path / "driver"), TRIANGLES, relations=SPECS))
    options: dict[str, Any] = {"deployment": "executors", "executor_tasks": 2}
    engine = Engine(small, str(tmp_path / "executors"), TRIANGLES, relations=SPECS, **options)
    engine.access.one_task_rows = 0  # split even a small epoch
    assert hub_epoch(engine) == ("executors", driver)
