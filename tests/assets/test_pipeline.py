"""The Dagster pipeline end to end: epochs run in-process against the naive oracle.

One scenario (two queries sharing the `edge` arrangements, four epochs landed as CSV, Parquet, a
SNAP edge list and a two-file folder) is processed epoch by epoch through ``wcoj_epoch_job``, one
run per epoch as the sensor requests them. The tests then read it, and the later ones change it
in ways that must either leave it as it was (bad data) or end where a from-scratch computation
ends (a repaired output, a corrected epoch): they run in file order.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from dagster import evaluate_automation_conditions
from pyspark.sql import SparkSession
from wcoj_support import (
    Changes,
    Pipeline,
    checks,
    failures,
    materializations,
    oracle,
    updates,
)

from wcoj_assets.epochs import epoch_key
from wcoj_assets.provenance import CURRENT
from wcoj_assets.specs import DEFAULT_SPECS, QuerySpec
from wcoj_core.engine import output_trace_name
from wcoj_core.query.builtins import BUILTINS

SPECS = (*DEFAULT_SPECS, QuerySpec("paths2", BUILTINS["2-paths"], ("edge",)))
QUERIES = ("triangles", "paths2")
EPOCHS = 4
# deltas + snapshot + 2 counts + 3 + 2 rules + 2 query deltas: update_triples / non_negative;
# plus one binary-join correctness check per query.
# current_history on every derived asset: 2 counts + 5 rules + 2 query deltas + 2 outputs.
CHECKS_PER_EPOCH = 1 + 1 + 2 + 5 + 2 + 2 + (2 + 5 + 2 + 2)


@dataclass
class Scenario:
    pipeline: Pipeline
    history: list[Changes]
    results: list


@pytest.fixture(scope="module", params=["driver", "executors"])
def scenario(
    spark: SparkSession, tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest
) -> Iterator[Scenario]:
    """The scenario with every kernel step on the driver, and on Spark's executors."""
    previous = spark.conf.get("spark.sql.codegen.wholeStage")
    spark.conf.set("spark.sql.codegen.wholeStage", "false")
    p = Pipeline(spark, tmp_path_factory.mktemp("pipeline"), SPECS, deployment=request.param)
    history = updates(seed=11, epochs=EPOCHS)
    p.land(0, history[0], "txt")
    p.land(1, history[1], "parquet")
    p.land(2, history[2], "csv")
    half = len(history[3]) // 2
    p.land(3, history[3][:half], "csv", name="a")
    p.land(3, history[3][half:], "parquet", name="b", clear=False)
    results = [p.run(n) for n in range(EPOCHS)]
    ran = [e.metadata["ran on"].value for r in results for e in _rule_figures(r)]
    assert ran and set(ran) == {request.param}, ran
    yield Scenario(p, history, results)
    spark.conf.set("spark.sql.codegen.wholeStage", previous or "true")


def _rule_figures(result) -> list:
    """The rule assets' materializations of a run (their metadata names where they ran)."""
    return [m for m in materializations(result) if "_rule_" in m.asset_key.to_user_string()]


def test_every_epoch_matches_the_oracle(scenario: Scenario) -> None:
    p = scenario.pipeline
    for result in scenario.results:
        assert result.success, failures(result)
    for t in range(EPOCHS):
        for q in QUERIES:
            expected = oracle(p.topology, q, scenario.history, t)
            assert p.output(q, t) == expected, f"{q} at epoch {t}"
    assert sum(oracle(p.topology, "triangles", scenario.history, EPOCHS - 1).values()) > 0


def test_every_check_runs_for_its_epoch_and_passes(scenario: Scenario) -> None:
    for n, result in enumerate(scenario.results):
        found = checks(result)
        assert len(found) == CHECKS_PER_EPOCH
        assert all(c.passed for c in found), [c for c in found if not c.passed]
        assert {c.partition for c in found} == {epoch_key(n)}
        correctness = [c for c in found if c.name == "matches_binary_join"]
        assert {c.asset for c in correctness} == set(QUERIES)
        assert all(c.metadata["checked"] and c.metadata["mismatches"] == 0 for c in correctness)


def test_arrangements_are_shared_and_metadata_is_complete(scenario: Scenario) -> None:
    mats = materializations(scenario.results[-1])
    by_asset: dict[str, list] = {}
    for m in mats:
        by_asset.setdefault(m.asset_key.to_user_string(), []).append(m)
    # One materialization per asset per run, however many rules of however many queries read it.
    assert all(len(ms) == 1 for ms in by_asset.values())
    counts = {name for name in by_asset if "_counts_" in name}
    assert counts == {"edge_counts_c0", "edge_counts_c1"}  # read by both queries' rules
    for name, (m,) in by_asset.items():
        assert m.partition == epoch_key(EPOCHS - 1)
        assert {"epoch", "rows_in", "rows_out", "seconds"} <= set(m.metadata), name
        assert m.metadata["epoch"].value == EPOCHS - 1
    for i in range(2):
        (rule,) = by_asset[f"paths2_rule_{i}"]
        assert {"rows_proposed", "rows_validated", "explain"} <= set(rule.metadata)
        assert f"rule {i}: delta edge" in rule.metadata["explain"].value
    (out,) = by_asset["triangles"]
    expected = oracle(scenario.pipeline.topology, "triangles", scenario.history, EPOCHS - 1)
    assert out.metadata["count"].value == sum(expected.values())


@pytest.mark.parametrize(
    "bad",
    [
        "src,dst,diff\n1,2,1\n2,1,0\n",  # a zero diff
        "src,dst,diff\n1,2,1\n2,,1\n",  # a null id
        "src,dst,diff\n1,2,1\nx,1,1\n",  # a string id
    ],
    ids=["zero-diff", "null", "string-id"],
)
def test_bad_data_fails_the_check_and_changes_nothing(scenario: Scenario, bad: str) -> None:
    p = scenario.pipeline
    folder = p.landing / "edge" / epoch_key(EPOCHS)
    folder.mkdir(parents=True)
    try:
        (folder / "part.csv").write_text(bad)
        before = p.traces()
        result = p.run(EPOCHS)
        assert not result.success
        (check,) = [c for c in checks(result) if c.asset == "edge_deltas"]
        assert not check.passed and check.partition == epoch_key(EPOCHS)
        assert "part.csv" in str(check.metadata["errors"])
        assert p.traces() == before  # not a relation, arrangement or output batch changed
        assert not [m for m in materializations(result)]
    finally:
        for f in folder.iterdir():
            f.unlink()
        folder.rmdir()


def test_a_tampered_output_fails_the_correctness_check(scenario: Scenario) -> None:
    p = scenario.pipeline
    # A batch rewritten with one extra row: the output as of every later epoch holds it too.
    extra = p.spark.createDataFrame([(100, 101, 102, 1)], "c0 long, c1 long, c2 long, diff long")
    trace = output_trace_name("triangles")
    p.history.record(trace, 1, p.history.changes(trace, 1).unionByName(extra))
    last = EPOCHS - 1
    result = p.run(last, assets=["triangles"])
    (check,) = [c for c in checks(result) if c.name == "matches_binary_join"]
    assert not check.passed
    assert check.metadata["mismatches"] == 1
    assert "(100, 101, 102): expected 0, maintained 1" in str(check.metadata["examples"])
    # A batch written by hand, not derived by a step, is not current either.
    (current,) = [c for c in checks(result) if c.name == CURRENT]
    assert not current.passed and current.metadata["stale_epochs"] == [last]
    # On a cadence of two epochs (config of the run, the rest as built), epoch 3 is not checked.
    cadence = {"resources": {"wcoj": {"config": {"check_every": 2}}}}
    for t, checked in ((last, False), (2, True)):
        result = p.run(t, assets=["triangles"], run_config=cadence)
        (check,) = [c for c in checks(result) if c.name == "matches_binary_join"]
        assert check.metadata["checked"] is checked
        assert check.passed is not checked  # epoch 2 is checked, and is tampered too
    # Re-materializing the epoch's output change repairs it.
    assert p.run(1, assets=["triangles_deltas"]).success
    found = checks(p.run(last, assets=["triangles"]))
    (check,) = [c for c in found if c.asset == "triangles" and c.name == "matches_binary_join"]
    assert check.passed
    assert all(c.passed for c in found if c.name == CURRENT)


def test_a_corrected_epoch_and_a_backfill_equal_the_from_scratch_answer(
    scenario: Scenario,
) -> None:
    p = scenario.pipeline
    extra = [(0, 7), (7, 8), (0, 8), (1, 7), (1, 8)]
    corrected = list(scenario.history)
    corrected[1] = [*corrected[1], *[(e, 1) for e in extra], *[((b, a), 1) for a, b in extra]]
    p.land(1, corrected[1], "csv")
    rerun = p.run(1)  # what the sensor requests for the changed folder
    assert rerun.success, failures(rerun)
    (deltas,) = [
        m for m in materializations(rerun) if m.asset_key.to_user_string() == "edge_deltas"
    ]
    # Dagster marks only the corrected partitions' direct readers stale; the materialization
    # names every later epoch derived from the old changes, and where a backfill must start,
    # and every later partition of every derived asset fails `current_history`.
    assert deltas.metadata["stale_later_epochs"].value == EPOCHS - 2
    assert deltas.metadata["backfill_from"].value == epoch_key(2)
    later = {epoch_key(t) for t in range(2, EPOCHS)}
    derived = {c.asset for c in checks(rerun) if c.name == CURRENT and c.partition == epoch_key(1)}
    assert derived >= {"edge_counts_c0", "triangles_rule_0", "triangles_deltas", "triangles"}
    assert {"paths2", "paths2_rule_1"} <= derived
    failed = {(c.asset, c.partition) for c in checks(rerun) if c.name == CURRENT and not c.passed}
    assert failed == {(a, k) for a in derived for k in later}
    # The automation sensor's condition requests exactly those partitions (Dagster adds the
    # partition before each for an asset that reads its own previous epoch: see provenance).
    self_dependent = {"edge_counts_c0", "edge_counts_c1", *QUERIES}
    assert requested(p) == {(a, k) for a in derived for k in later} | {
        (a, epoch_key(1)) for a in self_dependent
    }
    # Rebuilding rule 2 alone cannot make it current: it reads the counts as of epoch 2 (new),
    # still stale. Rule 0 reads them as of epoch 1 (old), rebuilt by the re-run: it is current.
    rule_only = p.run(2, assets=["triangles_rule_2", "triangles_rule_0"])
    found = {c.asset: c for c in checks(rule_only) if c.name == CURRENT}
    assert not found["triangles_rule_2"].passed
    assert found["triangles_rule_2"].metadata["stale_epochs"] == [2]
    assert found["triangles_rule_0"].passed
    assert p.output("triangles", 1) == oracle(p.topology, "triangles", corrected, 1)
    # The later epochs are stale until backfilled; one run over the range brings them back.
    assert p.output("triangles", EPOCHS - 1) != oracle(
        p.topology, "triangles", corrected, EPOCHS - 1
    )
    result = p.run((2, EPOCHS - 1))
    assert result.success, failures(result)
    assert requested(p) == set()  # nothing left for the automation to rebuild
    for t in range(EPOCHS):
        for q in QUERIES:
            assert p.output(q, t) == oracle(p.topology, q, corrected, t), f"{q} at epoch {t}"
    assert all(c.passed for c in checks(result))
    # Every partition the correction reported failed passes again. The backfill logs it on its
    # own partition where its latest evaluation had failed; rule 0 at epoch 2 had passed on its
    # own already (the run of that rule above), so the backfill only covers it in its range.
    latest: dict[tuple[str, str], bool] = {}
    for run in (rerun, rule_only, result):
        for c in checks(run):
            if c.name == CURRENT and c.partition is not None:
                latest[(c.asset, c.partition)] = c.passed
    assert all(latest[(a, k)] for a in derived for k in later)
    logged = {(c.asset, c.partition) for c in checks(result) if c.name == CURRENT}
    assert logged == {(a, None) for a in derived} | (
        {(a, k) for a in derived for k in later} - {("triangles_rule_0", epoch_key(2))}
    )


def requested(p: Pipeline) -> set[tuple[str, str | None]]:
    """The asset partitions one tick of the automation sensor would request now."""
    result = evaluate_automation_conditions(defs=p.defs, instance=p.instance)
    keys = p.defs.resolve_asset_graph().get_all_asset_keys()
    return {(k.to_user_string(), pk) for k in keys for pk in result.get_requested_partitions(k)}


def test_state_lives_under_the_configured_storage(scenario: Scenario) -> None:
    root = Path(scenario.pipeline.storage)
    assert (root / "manifests").is_dir() and (root / "traces").is_dir()
