"""`wcoj-bench scale --shards`: the k-shard simulation of the sharded deployment is exact.

At every k and both placements (by key, as `wcoj_core.deploy.sharded` places rows today; heavy
keys split), the bindings the shards' stages make, summed, are the naive oracle's exact
multiset on a small hub-heavy graph; a split heavy key's rows lie on several shards, each row
on exactly one; the independent 4-clique count agrees with the pure-Python one.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from oracle import naive_eval

from wcoj_bench import cli
from wcoj_bench.infra.probes import count_cliques
from wcoj_bench.parts import shards
from wcoj_core.query.builtins import builtin

GRAPH = "rmat:scale=6,edges=260,seed=3"


@pytest.fixture(scope="module")
def edges() -> np.ndarray:
    return shards.hub_graph(GRAPH, hubs=6, hub_degree=30)


def oracle(query: str, edges: np.ndarray) -> Counter:
    both = {(int(a), int(b)): 1 for a, b in edges} | {(int(b), int(a)): 1 for a, b in edges}
    return naive_eval(builtin(query), {"edge": both})


@pytest.mark.parametrize("query", ["triangles", "4-cliques"])
@pytest.mark.parametrize("k", [1, 2, 3, 8])
@pytest.mark.parametrize("slice_rows", [None, 4])
def test_shards_sum_to_the_oracle(
    edges: np.ndarray, query: str, k: int, slice_rows: int | None
) -> None:
    sim = shards.simulate(query, edges, k, slice_rows, collect=True)
    want = oracle(query, edges)
    assert want  # the graph has some
    assert +sim.found == want
    assert sim.answer == sum(want.values())
    assert sum(t.proposed for t in sim.tallies) > 0
    assert all(t.rows > 0 for t in sim.tallies)


def shards_holding(sim: shards.Simulation, key: int) -> list[int]:
    """For each binary arrangement cut of a run, how many shards hold rows of `key`."""
    out = []
    for cut in sim._cuts.values():
        held = [x.rows for x in cut if len(x) and x.width == 2]
        if held:
            rows = np.concatenate(held)
            assert len(np.unique(rows, axis=0)) == len(rows)  # no row on two shards
            out.append(sum(int((r[:, 0] == key).any()) for r in held))
    return out


def test_heavy_keys_are_split_each_row_once(edges: np.ndarray) -> None:
    hubs = range(6)
    split = shards.simulate("triangles", edges, 5, 4)
    assert max(max(shards_holding(split, h)) for h in hubs) > 1
    by_key = shards.simulate("triangles", edges, 5, None)
    assert max(max(shards_holding(by_key, h)) for h in hubs) == 1


def test_four_cliques_independent_count(edges: np.ndarray) -> None:
    pairs = [(int(a), int(b)) for a, b in edges]
    assert shards.four_cliques(edges) == count_cliques(pairs, 4) > 0


def test_hub_graph_has_its_hubs() -> None:
    g = shards.hub_graph(GRAPH, hubs=6, hub_degree=30)
    degree = np.bincount(g.ravel())
    assert (degree[:6] >= 30).all() and len(degree) <= 64 + 6
    assert (g[:, 0] < g[:, 1]).all()


def test_the_scale_part_runs_both_placements_and_checks_them(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    plot = tmp_path / "shards.png"
    argv = ["scale", "--shards", "1,3", "--rmat", GRAPH, "--hubs", "6", "--hub-degree", "30"]
    assert cli.main([*argv, "--slice-rows", "4", "--plot", str(plot), "--json"]) == 0
    report = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    for query, q in report["queries"].items():
        assert q["truth"] == sum(oracle(query, shards.hub_graph(GRAPH, 6, 30)).values())
        runs = {(r["shards"], r["placement"]): r for r in q["runs"]}
        assert set(runs) == {(k, p) for k in (1, 3) for p in shards.PLACEMENTS}
        assert all(r["exact"] and len(r["work"]) == r["shards"] for r in runs.values())
    assert len(report["targets"]) == 4 and plot.stat().st_size > 0


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--shards", "two"], "--shards: 'two' is not a list"),
        (["--shards", "2", "--queries", "5-cycles"], "--queries: 5-cycles"),
    ],
)
def test_shard_mistakes_are_refused_in_one_line(
    capsys: pytest.CaptureFixture[str], flags: list[str], message: str
) -> None:
    assert cli.main(["scale", *flags]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0]
