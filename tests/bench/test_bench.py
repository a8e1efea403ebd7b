"""`wcoj-bench epochs`: the workload it builds, the agreement check it relies on, and its report.

Timings are not asserted (benchmarks measure, tests check); what is asserted is that the methods
are handed the same changes (the Spark SQL methods an undirected edge in both directions, wcoj
each edge once, as a user names it), that their output changes are compared exactly (a method
that drops one tuple stops the benchmark), that wcoj's accumulated output equals the naive
oracle over the symmetric set, and that the report carries the figures the benchmark promises.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest
from oracle import naive_eval
from pyspark.sql import DataFrame, SparkSession

from wcoj_bench import cli
from wcoj_bench.parts import epochs
from wcoj_bench.parts.epochs import BenchError, BinaryDelta, Workload, bench, make_workload
from wcoj_core.engine import Engine
from wcoj_core.generate import generate
from wcoj_core.query.builtins import builtin

TRIANGLES = builtin("triangles")
GRAPH = "rmat:scale=9,edges=3000,seed=5"


def rows(df: DataFrame) -> Counter:
    out: Counter = Counter()
    for r in df.collect():
        out[tuple(r[:-1])] += r[-1]
    return Counter({k: v for k, v in out.items() if v})


@pytest.fixture(scope="module")
def workload(spark: SparkSession) -> Workload:
    edges = generate(spark, GRAPH)
    return make_workload(
        spark,
        TRIANGLES,
        {"edge": edges},
        epochs=3,
        epoch_size=20,
        seed=4,
        undirected=frozenset({"edge"}),
        skew=300,
    )


def test_the_workload_inserts_held_back_edges_and_deletes_present_ones(workload: Workload) -> None:
    initial = rows(workload.initial["edge"])
    assert all(m == 1 for m in initial.values())
    assert all((b, a) in initial for a, b in initial), "undirected: both directions"
    state = Counter(initial)
    for t in range(1, 4):
        changes = rows(workload.changes(t)["edge"])
        assert len(changes) == 2 * 20, "20 undirected edges, both directions"
        once = workload.changes_table(t)["edge"].to_pylist()
        assert len(once) == 20, "wcoj gets each edge once"
        assert {((r["c0"], r["c1"]), r["diff"]) for r in once} <= set(changes.items())
        inserted = [e for e, d in changes.items() if d > 0]
        deleted = [e for e, d in changes.items() if d < 0]
        assert len(inserted) == len(deleted) == 20
        assert not any(e in state for e in inserted), "inserts are held back until their epoch"
        assert all(state[e] == 1 for e in deleted), "deletes remove present edges"
        state.update(changes)
        state = Counter({e: m for e, m in state.items() if m})
    assert workload.skew_epoch == 4
    hub = rows(workload.changes(4)["edge"])
    vertex = min(min(e) for e in initial) - 1  # a new vertex, below every other
    assert len(hub) == 600 and all(d == 1 for d in hub.values())
    assert sum(1 for a, _ in hub if a == vertex) == 300
    assert all((b, a) in hub for a, b in hub)
    assert workload.changes_table(4)["edge"].num_rows == 300


def test_the_methods_agree_and_wcoj_equals_the_oracle(
    small: SparkSession, workload: Workload, tmp_path: Path
) -> None:
    result = bench(small, TRIANGLES, workload, str(tmp_path))
    report = result.to_dict()
    assert report["check"] == "passed"
    assert set(report["methods"]) == {"recompute", "binary-delta", "wcoj", "wcoj-bag"}
    assert report["meanings"] == {"wcoj": "edge undirected set", "wcoj-bag": "edge undirected bag"}
    for key in ("speedup_vs_recompute", "speedup_vs_binary_delta", "set_over_bag"):
        assert report[key] > 0
    assert report["intermediate_ratio_vs_binary_delta"] > 0
    for m in report["methods"].values():
        assert len(m["seconds_per_epoch"]) == 4
        assert m["state_bytes"] > 0 and m["shuffle_bytes"] >= 0
        assert m["intermediate_rows"] > 0
    assert report["wcoj_batch_bytes"] > 0 and report["wcoj_index_bytes"] > 0
    assert (
        report["wcoj_arrangement_bytes"] == report["wcoj_batch_bytes"] + report["wcoj_index_bytes"]
    )
    assert report["skew"]["epoch"] == 4 and report["load_epochs"] == 1
    # The skew epoch is where worst-case optimality shows: the binary plan joins the hub's new
    # edges with each other, wcoj proposes from the smaller side.
    skew = report["skew"]
    assert skew["binary-delta"]["intermediate_rows"] > skew["wcoj"]["intermediate_rows"]

    accumulated = rows(workload.initial["edge"])
    for t in range(1, 5):
        accumulated.update(rows(workload.changes(t)["edge"]))
    edges = {e: m for e, m in accumulated.items() if m}
    final = Engine(small, str(tmp_path / "wcoj" / "engine"), TRIANGLES, undirected=["edge"])
    assert rows(final.output("triangles")) == naive_eval(TRIANGLES, {"edge": edges})


def test_wcoj_loads_a_large_graph_in_several_epochs(
    small: SparkSession, workload: Workload, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(epochs, "LOAD_ROWS", 700)
    # Checked against recompute: as independent as binary-delta, in fewer Spark jobs an epoch.
    result = bench(small, TRIANGLES, workload, str(tmp_path), methods=["recompute", "wcoj"])
    report = result.to_dict()
    edges = len(rows(workload.initial["edge"])) // 2
    loads = -(-edges // 700)
    assert loads > 1
    assert report["check"] == "passed" and report["load_epochs"] == loads
    engine = Engine(small, str(tmp_path / "wcoj" / "engine"), TRIANGLES, undirected=["edge"])
    assert engine.epoch == loads - 1 + len(workload.epochs)


def test_a_method_that_disagrees_stops_the_benchmark(
    small: SparkSession, workload: Workload, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    original = BinaryDelta.change

    def drop_one(self: BinaryDelta, t: int) -> DataFrame:
        df = original(self, t)
        first = df.orderBy(*df.columns).limit(1)
        return df.exceptAll(first)

    monkeypatch.setattr(BinaryDelta, "change", drop_one)
    with pytest.raises(BenchError, match="epoch 1: 1 output tuples differ between binary-delta"):
        bench(small, TRIANGLES, workload, str(tmp_path), methods=["binary-delta", "wcoj"])


def test_too_small_an_input_is_refused(small: SparkSession) -> None:
    edges = generate(small, "rmat:scale=4,edges=20,seed=1")
    with pytest.raises(BenchError, match="need 400 distinct tuples"):
        make_workload(small, TRIANGLES, {"edge": edges}, epochs=4, epoch_size=100)


def test_the_command_reports_json(small: SparkSession, capsys: pytest.CaptureFixture[str]) -> None:
    status = cli.main(
        [
            "epochs",
            "--input",
            f"edge={GRAPH}",
            "--undirected",
            "edge",
            "--epochs",
            "2",
            "--epoch-size",
            "10",
            "--methods",
            "binary-delta,wcoj",
            "--json",
        ]
    )
    out = capsys.readouterr().out.strip().splitlines()
    assert status == 0, out
    report = json.loads(out[-1])
    assert report["command"] == "bench" and report["check"] == "passed"
    assert "speedup_vs_binary_delta" in report and "intermediate_ratio_vs_binary_delta" in report
    assert any(line.startswith("epoch 2/2:") and "identical" in line for line in out)
    assert (
        cli.main(["epochs", "--input", f"edge={GRAPH}", "--epochs", "1", "--epoch-size", "9"]) == 2
    )
