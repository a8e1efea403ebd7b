"""Skew: a hub vertex must not blow up the work of a delta rule.

A sparse random graph plus one hub adjacent to most vertices is loaded at epoch 0. Epoch 1 adds a
few edges next to the hub: edges between two of its neighbours and edges from the hub to new
neighbours. A binary plan joins each delta edge through the hub with the hub's whole adjacency
list (about `HUB_DEGREE` wedges per edge, and about ``HUB_DEGREE**2`` wedges for the static
query). GenericJoin lets the extender with the fewest candidates propose, so each delta prefix
costs the smaller degree of its two endpoints.

The test checks the output change against the naive oracle, the engine's per-step metrics against
the same counts recomputed here in pure Python, and the proposals against the binary plan's size.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Mapping
from pathlib import Path

import pytest
from pyspark.sql import DataFrame, SparkSession

from wcoj_core.engine import Engine, StepMetrics
from wcoj_core.naive import naive_delta, naive_eval
from wcoj_core.query.builtins import builtin
from wcoj_core.query.plan import Plan, Version

VERTICES = 3000
SPARSE_EDGES = 300
HUB = 0  # the smallest vertex, so that the naive oracle's body-order search stays cheap
HUB_DEGREE = 2000
TRIANGLES = builtin("triangles")

Graph = Counter[tuple[int, int]]


@pytest.fixture(autouse=True)
def small_data_conf(small: SparkSession) -> None:
    """Every test here runs on tiny data (see the `small` fixture)."""


def symmetric(pairs: set[tuple[int, int]]) -> Graph:
    graph: Graph = Counter()
    for u, v in pairs:
        graph[(u, v)] += 1
        graph[(v, u)] += 1
    return graph


def frame(spark: SparkSession, graph: Graph) -> DataFrame:
    rows = [(u, v, d) for (u, v), d in sorted(graph.items())]
    return spark.createDataFrame(rows, "c0 long, c1 long, diff long")


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


def test_hub_edges_propose_from_the_small_side(spark: SparkSession, tmp_path: Path) -> None:
    rng = random.Random(20240611)
    pairs, neighbours = skewed_graph(rng)
    before = symmetric(pairs)
    delta = symmetric(hub_changes(rng, pairs, neighbours))
    after = before + delta
    hub_degree = len(adjacency(before)[0][HUB])
    assert hub_degree >= HUB_DEGREE

    engine = Engine(spark, str(tmp_path / "state"), TRIANGLES)
    engine.apply_epoch(0, {"edge": frame(spark, before)})
    result = engine.apply_epoch(1, {"edge": frame(spark, delta)})

    # Exactness: the change equals the naive oracle's, and so does the accumulated output.
    change: Counter[tuple[int, ...]] = Counter()
    for row in result.outputs[TRIANGLES.name].collect():
        assert row["time"] == 1
        change[tuple(row)[:-2]] += row["diff"]
    expected = naive_delta(TRIANGLES, {"edge": before}, {"edge": after})
    assert change == expected
    assert len(expected) >= len(delta) // 2, "every new pair should close a triangle"
    accumulated = Counter({tuple(r)[:-1]: r["diff"] for r in engine.output().collect()})
    assert accumulated == naive_eval(TRIANGLES, {"edge": after})

    # The engine's per-step metrics match the counts recomputed here.
    steps: list[StepMetrics] = [s for s in result.metrics.steps if s.query == TRIANGLES.name]
    measured = [s for s in steps if s.prefixes is not None and s.proposed is not None]
    assert measured, f"no step was measured: {steps}"
    plan = engine.plans[TRIANGLES.name]
    bound = expected_steps(plan, delta, before, after)
    for s in measured:
        min_count_sum = s.min_count_sum or 0  # Spark sums no rows to null
        assert (s.prefixes, min_count_sum) == bound[s.rule], s
        # Spark proposes every candidate; the keyed path narrows ranges by the order filters.
        assert s.proposed is not None and s.proposed <= min_count_sum, s
    proposed = sum(s.proposed or 0 for s in measured)
    wcoj_bound = sum(fewest for _, fewest in bound.values())
    assert proposed <= wcoj_bound

    # Against a binary plan: each delta edge into the hub meets the hub's whole adjacency list.
    hub_delta_edges = sum(1 for (u, v) in delta if HUB in (u, v))
    wedges = binary_wedges(delta, before)
    assert wedges >= hub_delta_edges // 2 * hub_degree
    assert 10 * proposed <= wedges, (proposed, wedges)
    assert 100 * wcoj_bound <= hub_degree**2, (wcoj_bound, hub_degree)
