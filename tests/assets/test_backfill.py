"""Backfills: a range of epochs is ONE run, ONE step and one manifest commit per epoch.

On a real (SQLite) instance, the pipeline runs four epochs in one run over the range (what a
single-run backfill or ``dagster asset materialize --partition-range`` launches). The tests read
what the instance stored: one run, one step, a materialization per asset and epoch, one commit per
epoch; and every check's status per partition as the UI reads it (`AssetCheckState`). By default
(``check_reporting: news``) a range reports per partition only what is news — failures and
recoveries — and summarizes the rest
in the range's result (Dagster shows those partitions SKIPPED); with ``every`` each partition
shows its own status, not SKIPPED. Then epochs are applied again in any order (each
replaces what it held: the outputs stay the oracle's), and a failure in the middle of a range
keeps the epochs committed before it, reported materialized.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from dagster import (
    AssetKey,
    AssetPartitionStatus,
    DagsterEventType,
    DagsterInstance,
)
from dagster._core.storage.asset_check_state import AssetCheckState, bulk_update_asset_check_state
from pyspark.sql import SparkSession
from wcoj_support import Changes, Pipeline, checks, failures, materializations, oracle, updates

from wcoj_assets import checks as ck
from wcoj_assets.checks import BINARY_JOIN, DELTA_RULES
from wcoj_assets.epochs import Epochs, epoch_key
from wcoj_assets.instance import prepare_home

EPOCHS = 4
EVERY = 2  # the binary join due at epochs 1 and 3: a range run recomputes once, at epoch 3


@dataclass
class Scenario:
    pipeline: Pipeline
    history: list[Changes]
    run_id: str
    generations: int


@pytest.fixture(scope="module")
def scenario(spark: SparkSession, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Scenario]:
    root = tmp_path_factory.mktemp("backfill")
    with DagsterInstance.from_config(str(prepare_home(root / "home"))) as instance:
        p = Pipeline(spark, root, instance=instance, check_every=EVERY)
        history = updates(seed=5, epochs=EPOCHS)
        for n, ups in enumerate(history):
            p.land(n, ups, "parquet" if n % 2 else "csv")
        result = p.run((0, EPOCHS - 1))
        assert result.success, failures(result)
        yield Scenario(p, history, result.run_id, p.generation())


def test_a_range_is_one_run_one_step_and_one_commit_per_epoch(scenario: Scenario) -> None:
    p, instance = scenario.pipeline, scenario.pipeline.instance
    assert len(instance.get_runs()) == 1
    steps = {
        e.dagster_event.step_key
        for e in instance.all_logs(scenario.run_id, of_type=DagsterEventType.STEP_START)
        if e.dagster_event is not None
    }
    assert steps == {"wcoj_epochs"}
    assert scenario.generations == EPOCHS  # a new state: one manifest generation per epoch
    stored = [
        e.dagster_event.event_specific_data.materialization
        for e in instance.all_logs(scenario.run_id, of_type=DagsterEventType.ASSET_MATERIALIZATION)
        if e.dagster_event is not None
    ]
    assets = {k.to_user_string() for k in p.defs.resolve_asset_graph().get_all_asset_keys()}
    assert sorted((m.asset_key.to_user_string(), m.partition) for m in stored) == sorted(
        (a, epoch_key(n)) for a in assets for n in range(EPOCHS)
    )
    for t in range(EPOCHS):
        assert p.output("triangles", t) == oracle(p.topology, "triangles", scenario.history, t), t


def check_statuses(p: Pipeline) -> dict[tuple[str, str], dict[str, list[str]]]:
    """Every check's partitions by status, as the UI reads them from the instance."""
    graph = p.defs.resolve_asset_graph()
    keys = [(k, graph.get(k.asset_key).partitions_def) for k in graph.asset_check_keys]
    states = bulk_update_asset_check_state(
        p.instance, keys, {k: AssetCheckState.empty() for k, _ in keys}
    )
    return {
        (k.asset_key.to_user_string(), k.name): {
            status.value: sorted(subset.subset_value.get_partition_keys())
            for status, subset in state.subsets.items()
            if not subset.is_empty
        }
        for k, state in states.items()
    }


def test_a_range_gives_each_partition_its_own_check_status_by_default(scenario: Scenario) -> None:
    statuses = check_statuses(scenario.pipeline)
    every = [epoch_key(n) for n in range(EPOCHS)]
    # The binary join has no partitions: never planned by the epoch job, so no partition of it
    # is SKIPPED (drawn red); its status is its latest evaluation's, at the range's last due
    # epoch, named in its metadata.
    assert statuses.pop(("triangles", BINARY_JOIN)) == {}
    assert len(statuses) == 4
    for check, by_status in statuses.items():
        assert by_status == {"SUCCEEDED": every}, check  # each partition its own status
    logged = scenario.pipeline.instance.all_logs(
        scenario.run_id, of_type=DagsterEventType.ASSET_CHECK_EVALUATION
    )
    results = [e.dagster_event.event_specific_data for e in logged if e.dagster_event]
    (join,) = [c for c in results if c.check_name == BINARY_JOIN]
    assert join.passed and join.partition is None
    assert join.metadata["partition"].value == epoch_key(EPOCHS - 1)
    # Each partitioned check's evaluations name their partitions, and the range's result (the
    # check's output, so no "did not yield expected outputs" line) says they all passed.
    summaries = [c for c in results if c.partition is None and c is not join]
    assert len(summaries) == 4 and all(c.passed for c in summaries)
    assert all(
        c.description.startswith("passed at every partition of the run (4, ") for c in summaries
    )
    assert len(results) == 4 * EPOCHS + 1 + 4
    said = [e.user_message for e in scenario.pipeline.instance.all_logs(scenario.run_id)]
    assert not [m for m in said if "did not yield or return expected outputs" in m]


def test_with_every_each_partition_shows_its_own_check_status(
    spark: SparkSession, tmp_path: Path
) -> None:
    with DagsterInstance.from_config(str(prepare_home(tmp_path / "home"))) as instance:
        p = Pipeline(spark, tmp_path, instance=instance, check_every=EVERY, check_reporting="every")
        for n, ups in enumerate(updates(seed=5, epochs=EPOCHS)):
            p.land(n, ups, "csv")
        result = p.run((0, EPOCHS - 1))
        assert result.success, failures(result)
        statuses = check_statuses(p)
    every = [epoch_key(n) for n in range(EPOCHS)]
    assert statuses.pop(("triangles", BINARY_JOIN)) == {}  # no partitions: its latest evaluation
    assert len(statuses) == 4
    for check, by_status in statuses.items():
        assert by_status == {"SUCCEEDED": every}, check


def test_a_range_reports_failures_and_recoveries_per_partition(
    spark: SparkSession, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    bad = epoch_key(1)
    audit = ("triangles_deltas", DELTA_RULES)
    with DagsterInstance.from_config(str(prepare_home(tmp_path / "home"))) as instance:
        p = Pipeline(spark, tmp_path, instance=instance, check_every=EVERY, check_reporting="news")
        for n, ups in enumerate(updates(seed=9, epochs=EPOCHS)):
            p.land(n, ups, "csv")
        real = ck.delta_rules

        def failing(engine, query, epoch):
            if epoch == 1:
                return ck.Outcome(False, {"checked": True}, "injected mismatch")
            return real(engine, query, epoch)

        monkeypatch.setattr(ck, "delta_rules", failing)
        first = p.run((0, EPOCHS - 1))
        assert first.success, failures(first)  # the audit is not blocking
        own = [(c.name, c.partition, c.passed) for c in checks(first) if c.partition is not None]
        assert own == [(DELTA_RULES, bad, False)]
        assert check_statuses(p)[audit] == {
            "FAILED": [bad],
            "SKIPPED": sorted({epoch_key(n) for n in range(EPOCHS)} - {bad}),
        }
        monkeypatch.undo()
        again = p.run((0, EPOCHS - 1))
        assert again.success, failures(again)
        own = [(c.name, c.partition, c.passed) for c in checks(again) if c.partition is not None]
        assert own == [(DELTA_RULES, bad, True)]  # the recovery
        assert check_statuses(p)[audit]["SUCCEEDED"] == [bad]


def test_epochs_applied_again_in_any_order_keep_the_oracles_answer(scenario: Scenario) -> None:
    p = scenario.pipeline
    before = p.generation()
    for n in reversed(range(EPOCHS)):
        result = p.run(n)
        assert result.success and all(c.passed for c in checks(result)), failures(result)
    assert p.generation() - before == EPOCHS  # one commit per epoch, a re-run too
    for t in range(EPOCHS):
        assert p.output("triangles", t) == oracle(p.topology, "triangles", scenario.history, t), t


def test_a_failure_mid_range_keeps_the_committed_epochs(
    spark: SparkSession, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from wcoj_core.engine import Engine

    with DagsterInstance.from_config(str(prepare_home(tmp_path / "home"))) as instance:
        p = Pipeline(spark, tmp_path, instance=instance)
        history = updates(seed=7, epochs=EPOCHS)
        for n, ups in enumerate(history):
            p.land(n, ups, "csv")
        apply = Engine.apply

        def failing(self, epoch, changes, **kwargs):
            if epoch == 2:
                raise OSError("disk full (injected)")
            return apply(self, epoch, changes, **kwargs)

        monkeypatch.setattr(Engine, "apply", failing)
        result = p.run((0, EPOCHS - 1))
        assert not result.success
        (failure,) = failures(result)
        assert "epoch 2 (2020-01-03) was not applied: OSError: disk full (injected)" in failure
        assert "epochs 2020-01-01..2020-01-02 were committed" in failure
        assert p.generation() == 2
        committed = {(m.asset_key.to_user_string(), m.partition) for m in materializations(result)}
        assets = {k.to_user_string() for k in p.defs.resolve_asset_graph().get_all_asset_keys()}
        assert committed == {(a, epoch_key(n)) for a in assets for n in (0, 1)}
        keys = [epoch_key(n) for n in range(EPOCHS)]
        status = instance.get_status_by_partition(
            AssetKey("triangles"), keys, Epochs().partitions()
        )
        assert [status.get(k) == AssetPartitionStatus.MATERIALIZED for k in keys] == [
            True,
            True,
            False,
            False,
        ]
        monkeypatch.undo()
        again = p.run((2, EPOCHS - 1))  # the rest of the backfill, retried
        assert again.success, failures(again)
        for t in range(EPOCHS):
            assert p.output("triangles", t) == oracle(p.topology, "triangles", history, t), t
