"""The backfill benchmark: end to end on a tiny generated graph, and its comparison on its own.

One run of ``wcoj-bench backfill`` (two epochs of four changes) lands the epochs,
runs the Dagster pipeline over them in one run and the engine epoch by epoch, compares them and
reports. The tests read its printed report and JSON line, check its final count against the
pure-Python oracle, and show that the comparison it ran fails on a pipeline output changed in
one tuple or one multiplicity.
"""

from __future__ import annotations

import doctest
import json
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from oracle import naive_eval
from pyspark.sql import SparkSession
from spark_support import interpreted

from wcoj_assets.specs import DEFAULT_SPECS, Topology
from wcoj_bench.parts import backfill as bb
from wcoj_bench.parts import backfill_sides
from wcoj_bench.parts.epochs import make_workload
from wcoj_core.input_spark import read_relation

GRAPH = "rmat:scale=7,edges=600,seed=3"
EPOCHS, SIZE, SEED = 2, 4, 1
STEPS = ["wcoj_epochs"]  # every asset and check of an epoch: one step


@dataclass
class Run:
    status: int
    lines: list[str]
    summary: dict[str, Any]
    result: bb.BackfillResult


@pytest.fixture(scope="module")
def run(spark: SparkSession, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Run]:
    root = tmp_path_factory.mktemp("backfill") / "root"
    argv = ["--input", f"edge={GRAPH}", "--undirected", "edge", "--epochs", str(EPOCHS)]
    argv += ["--epoch-size", str(SIZE), "--seed", str(SEED), "--root", str(root), "--json"]
    argv += ["--progress", "5"]
    results: list[bb.BackfillResult] = []
    bench = bb.backfill_bench

    def keep(*args: Any, **kwargs: Any) -> bb.BackfillResult:
        results.append(bench(*args, **kwargs))
        return results[-1]

    lines: list[str] = []
    with interpreted(spark), pytest.MonkeyPatch.context() as patch:
        patch.setattr(bb, "backfill_bench", keep)
        patch.setattr("builtins.print", lambda *a, **_: lines.append(" ".join(map(str, a))))
        status = bb.main(argv)
    assert status == 0, lines
    yield Run(status, lines, json.loads(lines[-1]), results[0])


def test_doctests() -> None:
    result = doctest.testmod(backfill_sides)
    assert result.failed == 0 and result.attempted > 0


def test_a_different_tuple_or_multiplicity_names_its_epoch() -> None:
    same = Counter({(1, 2, 3): 1, (2, 3, 4): -1})
    assert backfill_sides.compare_changes(7, same, Counter(same)) == 2
    with pytest.raises(bb.BackfillError, match=r"^epoch 7: 1 output tuple\(s\) differ.*engine 2"):
        backfill_sides.compare_changes(7, same, Counter({(1, 2, 3): 2, (2, 3, 4): -1}))
    with pytest.raises(bb.BackfillError, match=r"^epoch 7: .*\(2, 3, 4\): pipeline -1, engine 0"):
        backfill_sides.compare_changes(7, same, Counter({(1, 2, 3): 1}))
    with pytest.raises(bb.BackfillError, match=r"^epoch 2: the engine has an output change"):
        bb.check_changes({1: same}, {1: same, 2: Counter()})


def test_the_report_and_its_json(run: Run) -> None:
    text = "\n".join(run.lines)
    assert "dagster: ONE run over epochs 1..2" in text
    assert "dagster: step wcoj_epochs done in" in text
    assert f"cli: epoch {EPOCHS}/{EPOCHS}:" in text
    assert "ratio dagster / cli median:" in text
    s = run.summary
    assert (s["command"], s["query"], s["epochs"], s["epoch_size"]) == (
        "backfill-bench",
        "triangles",
        EPOCHS,
        SIZE,
    )
    assert s["dagster_seconds_per_epoch"] == pytest.approx(s["dagster_seconds"] / EPOCHS, abs=1e-3)
    assert s["cli_seconds_per_epoch"] > 0 and s["cli_mean_seconds_per_epoch"] > 0
    assert len(s["cli_seconds"]) == EPOCHS
    # The ratio is of the unrounded figures; the report rounds each to 0.1 ms (the ratio to 0.001).
    half = 0.00005
    dagster, cli = s["dagster_seconds_per_epoch"], s["cli_seconds_per_epoch"]
    assert (dagster - half) / (cli + half) - 0.0005 <= s["ratio"]
    assert s["ratio"] <= (dagster + half) / (cli - half) + 0.0005
    assert s["target_met"] == (s["ratio"] <= bb.TARGET_RATIO)
    assert "ratio floor / cli median:" in text and "floor: epochs 1..2 done in" in text
    floor = s["dagster_floor_seconds_per_epoch"]
    assert floor > 0 and (floor - half) / (cli + half) - 0.0005 <= s["floor_ratio"]
    assert s["floor_ratio"] <= (floor + half) / (cli - half) + 0.0005
    # Per epoch one materialization per asset (the floor's run wrote the same, or it raised); one
    # evaluation per check and partition (a short range: each partition its own status), the
    # binary join off its cadence reporting none; and per check the range's result.
    per_epoch = (4 * EPOCHS + 4) / EPOCHS
    assert s["dagster_events_per_epoch"] == {
        "materializations": 11.0,
        "check_evaluations": per_epoch,
    }
    assert list(s["asset_seconds"]) == STEPS
    assert all(v > 0 for v in s["asset_seconds"].values())
    # The epochs' own work fits inside the step.
    step = s["asset_seconds"]["wcoj_epochs"]
    assert set(s["asset_epoch_work_seconds"]) == {"engine pass", "read and check landed"}
    assert 0 < sum(s["asset_epoch_work_seconds"].values()) <= step + 0.01
    assert s["check_seconds"]["matches_delta_rules"] > 0
    assert s["cli_paths"] == {"driver": EPOCHS}
    # One manifest per epoch, in Dagster as in the command line; and no Spark job per epoch.
    assert s["manifest_commits_per_epoch"] == {"dagster": 1.0, "cli": 1.0}
    assert s["spark_jobs_per_epoch"]["dagster"] == 0
    assert set(s["load_average"]) == {"start", "end"}
    checks = s["checks"]
    assert checks["output_changes"] == "identical" and checks["epochs_compared"] == EPOCHS + 1
    assert checks["dagster_runs"] == "succeeded" and checks["asset_checks_failed"] == 0
    assert checks["asset_checks_passed"] > 0
    assert checks["tuples_compared"] >= sum(s["output_change_rows"]) > 0


def test_the_final_count_is_the_oracles(run: Run, spark: SparkSession) -> None:
    query = Topology.of(DEFAULT_SPECS).queries[0]
    workload = make_workload(
        spark,
        query,
        {"edge": read_relation(spark, GRAPH, 2, "edge")},
        epochs=EPOCHS,
        epoch_size=SIZE,
        seed=SEED,
        undirected=frozenset({"edge"}),
    )
    edges: Counter[tuple[int, ...]] = Counter()
    frames = [workload.initial["edge"], *(workload.changes(t)["edge"] for t in (1, 2))]
    for df in frames:
        for c0, c1, diff in df.select("c0", "c1", "diff").collect():
            edges[(c0, c1)] += diff
    expected = naive_eval(query, {"edge": {e: m for e, m in edges.items() if m}})
    assert run.summary["final_count"] == sum(expected.values())


def test_the_comparison_that_ran_catches_a_changed_pipeline_output(run: Run) -> None:
    pipeline, engine = run.result.pipeline_changes, run.result.engine_changes
    assert bb.check_changes(pipeline, engine) == sum(len(c) for c in engine.values())
    t = max(engine, key=lambda e: len(engine[e]))
    tup, mult = next(iter(pipeline[t].items()))
    bumped = {**pipeline, t: Counter({**pipeline[t], tup: mult + 1})}
    with pytest.raises(bb.BackfillError, match=rf"^epoch {t}: 1 output tuple"):
        bb.check_changes(bumped, engine)
    dropped = {**pipeline, t: Counter({k: v for k, v in pipeline[t].items() if k != tup})}
    with pytest.raises(bb.BackfillError, match=rf"^epoch {t}: 1 output tuple"):
        bb.check_changes(dropped, engine)


def test_a_used_root_is_refused(tmp_path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "something").write_text("x")
    argv = ["--input", f"edge={GRAPH}", "--epochs", "2", "--epoch-size", "4"]
    assert bb.main([*argv, "--root", str(tmp_path)]) == 2
    assert "not empty" in capsys.readouterr().err
    assert (tmp_path / "something").exists()
