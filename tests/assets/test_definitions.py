"""The code location: cheap to import, valid for Dagster, and wired as the issue describes."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from dagster import (
    AssetKey,
    BackfillPolicy,
    DefaultSensorStatus,
    TimeWindowPartitionMapping,
)

from wcoj_assets.definitions import JOB_NAME, build_definitions
from wcoj_assets.epochs import EPOCH_START, Epochs, epoch_key
from wcoj_assets.specs import QuerySpec
from wcoj_core.errors import InputError, QueryError
from wcoj_core.query.builtins import BUILTINS

BIN = Path(sys.executable).parent

IMPORT_PROBE = """
import json, os, sys
before = sorted(os.listdir("."))
import wcoj_assets.definitions as d
import wcoj_assets.component
from pyspark import SparkContext
imported = {
    "files": sorted(os.listdir(".")) == before,
    "jvm": SparkContext._gateway is not None,
    "session": SparkContext._active_spark_context is not None,
    "pandera": "pandera" in sys.modules,
}
os.environ["WCOJ_EPOCH_START"] = "2024-03-01"  # read when Dagster loads the location, not before
loaded = d.defs()
from dagster import AssetKey
node = loaded.resolve_asset_graph().get(AssetKey("triangles"))
print(json.dumps({
    **imported,
    "type": type(loaded).__name__,
    "first": node.partitions_def.get_first_partition_key(),
    "files after loading": sorted(os.listdir(".")) == before,
    "session after loading": SparkContext._active_spark_context is not None,
}))
"""


def test_importing_the_definitions_has_no_side_effects(tmp_path: Path) -> None:
    env = {
        "PATH": str(BIN),
        "HOME": str(tmp_path),
        "WCOJ_STORAGE": "/nonexistent",
        "WCOJ_EPOCH_START": "not read at import",
    }
    out = subprocess.run(
        [sys.executable, "-c", IMPORT_PROBE],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    probe = json.loads(out.stdout.strip().splitlines()[-1])
    assert probe == {
        "files": True,
        "jvm": False,
        "session": False,
        "pandera": False,
        "type": "Definitions",
        "first": "2024-03-01",
        "files after loading": True,
        "session after loading": False,
    }
    assert list(tmp_path.iterdir()) == []


def test_dagster_validates_the_code_location(tmp_path: Path) -> None:
    out = subprocess.run(
        [str(BIN / "dagster"), "definitions", "validate", "-m", "wcoj_assets.definitions"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert "Validation successful" in out.stdout + out.stderr


ASSETS = {
    "edge_deltas",
    "edge_snapshot",
    "edge_forward",
    "edge_reverse",
    "edge_counts_c0",
    "edge_counts_c1",
    "triangles_rule_0",
    "triangles_rule_1",
    "triangles_rule_2",
    "triangles_deltas",
    "triangles",
}


def test_the_default_spec_builds_the_documented_assets() -> None:
    defs = build_definitions()
    graph = defs.resolve_asset_graph()
    names = {k.to_user_string() for k in graph.get_all_asset_keys()}
    assert names == ASSETS
    job = defs.resolve_job_def(JOB_NAME)
    assert {k.to_user_string() for k in job.asset_layer.selected_asset_keys} == names
    # ONE step makes every asset and evaluates every check. It can be subset (so that Dagster
    # launches a backfill of any selection from the asset graph), and makes whole epochs anyway.
    (step,) = defs.assets
    assert [n.name for n in job.graph.node_defs] == [step.op.name] == ["wcoj_epochs"]
    assert step.can_subset
    checks = {(c.asset_key.to_user_string(), c.name) for c in graph.asset_check_keys}
    assert checks == {
        ("edge_deltas", "update_triples"),
        ("edge_snapshot", "non_negative"),
        ("triangles_deltas", "current_history"),
        ("triangles_deltas", "matches_delta_rules"),
        ("triangles", "matches_binary_join"),
    }
    for key in graph.get_all_asset_keys():
        node = graph.get(key)
        assert node.partitions_def == Epochs().partitions()
        assert node.backfill_policy == BackfillPolicy.single_run()
    assert defs.resolve_sensor_def("wcoj_landing_sensor").default_status is (
        DefaultSensorStatus.RUNNING
    )
    assert not list(defs.schedules or [])  # one way to run daily: the landing sensor


def offsets(graph, child: str, parent: str) -> tuple[int, int]:
    """The epochs of `parent` that `child` at epoch t reads, relative to t."""
    mapping = graph.get_partition_mapping(AssetKey(child), AssetKey(parent))
    assert isinstance(mapping, TimeWindowPartitionMapping)
    if mapping.start_offset < 0:  # epoch 0 has no predecessor, and needs none
        assert mapping.allow_nonexistent_upstream_partitions
    return (mapping.start_offset, mapping.end_offset)


def test_lineage_reads_the_same_epoch_and_accumulates_from_the_previous() -> None:
    graph = build_definitions().resolve_asset_graph()
    for accumulated in ("edge_snapshot", "edge_counts_c0", "edge_counts_c1", "triangles"):
        node = graph.get(AssetKey(accumulated))
        # Said, not wired: a self-dependency would split Dagster's asset backfills into a run
        # per asset.
        assert AssetKey(accumulated) not in node.parent_keys
        assert node.tags["wcoj/role"] in {"snapshot", "counts", "output"}
    assert "previous epoch" in (graph.get(AssetKey("triangles")).description or "")
    parents = {
        name: {p.to_user_string() for p in graph.get(AssetKey(name)).parent_keys} for name in ASSETS
    }
    assert parents["edge_forward"] == parents["edge_reverse"] == {"edge_snapshot"}
    # Each rule reads the epoch's changes and the arrangements the kernel probes for it.
    assert parents["triangles_rule_0"] == {"edge_deltas", "edge_forward", "edge_counts_c0"}
    assert parents["triangles_rule_1"] == {"edge_deltas", "edge_reverse", "edge_counts_c1"}
    for i in range(3):
        rule = f"triangles_rule_{i}"
        for parent in parents[rule]:
            assert offsets(graph, rule, parent) == (0, 0)
        assert "triangles" not in parents[rule] and "triangles_deltas" not in parents[rule]


def test_arrangements_are_shared_across_queries() -> None:
    specs = [
        QuerySpec("triangles", BUILTINS["triangles"], ("edge",)),
        QuerySpec("cycles4", BUILTINS["4-cycles"], ("edge",)),
    ]
    graph = build_definitions(specs).resolve_asset_graph()
    shared = sorted(
        k.to_user_string()
        for k in graph.get_all_asset_keys()
        if k.to_user_string().startswith("edge_")
    )
    assert shared == [
        "edge_counts_all",
        "edge_counts_c0",
        "edge_counts_c1",
        "edge_deltas",
        "edge_forward",
        "edge_reverse",
        "edge_snapshot",
    ]
    for name in ("edge_counts_c0", "edge_reverse"):
        readers = {c.to_user_string() for c in graph.get(AssetKey(name)).child_keys}
        assert {r.split("_rule_")[0] for r in readers if "_rule_" in r} == {"triangles", "cycles4"}


@pytest.mark.parametrize(
    "specs, message",
    [
        ([QuerySpec("t", BUILTINS["triangles"], ("edges",))], "declares relations"),
        ([QuerySpec("edge_snapshot", BUILTINS["2-paths"], ("edge",))], "is used for both"),
        ([QuerySpec("a", BUILTINS["2-paths"], ("edge",))] * 2, "share a name"),
        ([], "no query specs"),
    ],
)
def test_bad_specs_are_refused_with_a_clear_message(specs, message: str) -> None:
    with pytest.raises(QueryError, match=message):
        build_definitions(specs)


def test_epoch_keys_round_trip() -> None:
    assert epoch_key(0) == EPOCH_START
    for n in (0, 1, 59, 60, 366, 5000):
        assert Epochs().number(epoch_key(n)) == n
    keys = Epochs().partitions().get_partition_keys()
    assert keys[:3] == [epoch_key(0), epoch_key(1), epoch_key(2)]
    with pytest.raises(InputError):
        epoch_key(-1)


def test_storage_from_an_env_var_is_read_at_run_time_only(monkeypatch) -> None:
    from dagster import EnvVar

    monkeypatch.delenv("WCOJ_TEST_STORAGE", raising=False)
    defs = build_definitions(storage=EnvVar("WCOJ_TEST_STORAGE"), landing="/data/landing")
    resource = defs.resources["wcoj"]
    assert resource.landing == "/data/landing"
    monkeypatch.setenv("WCOJ_TEST_STORAGE", "/data/state")
    with resource.process_config_and_initialize_cm() as initialized:
        assert initialized.storage == "/data/state"


def test_epochs_start_on_the_given_day() -> None:
    from wcoj_assets.epochs import Epochs

    epochs = Epochs("2024-02-28")
    assert [epochs.key(n) for n in (0, 1, 2)] == ["2024-02-28", "2024-02-29", "2024-03-01"]
    assert epochs.number("2024-03-01") == 2 and not epochs.is_key("2024-02-27")
    defs = build_definitions(start="2024-02-28")
    for node in defs.resolve_asset_graph().asset_nodes:
        assert node.partitions_def == epochs.partitions()
        assert node.partitions_def.get_first_partition_key() == "2024-02-28"
    with pytest.raises(InputError, match="first epoch '2024-02-30'"):
        build_definitions(start="2024-02-30")


@pytest.mark.parametrize(
    "undirected, message",
    [(["edges"], "read by no query"), (["other"], "read by no query")],
)
def test_undirected_relations_must_be_read_and_binary(undirected, message: str) -> None:
    with pytest.raises(QueryError, match=message):
        build_definitions(undirected=undirected)
    ternary = [QuerySpec("t", "t(a) :- r(a, b, c)", ("r",))]
    with pytest.raises(QueryError, match="arity 3; only a binary"):
        build_definitions(ternary, undirected="r")


def test_stale_epochs_are_rebuilt_by_the_rebuild_sensor() -> None:
    from wcoj_assets.provenance import AUTOMATION_SENSOR, REBUILD_SENSOR

    defs = build_definitions(undirected=["edge"])
    graph = defs.resolve_asset_graph()
    # No asset of the pipeline carries an automation condition: the rebuild sensor requests
    # the rebuilds, as ranged runs of the epoch job.
    assert all(graph.get(key).automation_condition is None for key in graph.get_all_asset_keys())
    rebuild = defs.resolve_sensor_def(REBUILD_SENSOR)
    assert rebuild.default_status is DefaultSensorStatus.RUNNING
    assert rebuild.job_name == JOB_NAME
    automation = defs.resolve_sensor_def(AUTOMATION_SENSOR)  # for assets downstream of yours
    assert automation.default_status is DefaultSensorStatus.RUNNING
    assert {k.to_user_string() for k in automation.asset_selection.resolve(graph)} == ASSETS
    assert automation.run_tags == {"wcoj/serial": "epochs"}
    assert "Undirected" in (graph.get(AssetKey("edge_deltas")).description or "")


def test_query_assets_declare_their_columns_and_their_io_manager() -> None:
    from dagster import TableSchema

    from wcoj_assets.outputs import OUTPUTS_IO_MANAGER

    defs = build_definitions()
    graph = defs.resolve_asset_graph()
    assert OUTPUTS_IO_MANAGER in defs.resources
    for name, columns in [
        ("triangles", ["a", "b", "c", "diff"]),
        ("triangles_deltas", ["a", "b", "c", "diff"]),
        ("triangles_rule_1", ["a", "b", "c", "diff"]),
        ("edge_deltas", ["c0", "c1", "diff"]),
        ("edge_reverse", ["c1", "c0", "diff"]),
        ("edge_counts_c1", ["c1", "diff"]),
    ]:
        schema = graph.get(AssetKey(name)).metadata["dagster/column_schema"]
        schema = schema.schema if not isinstance(schema, TableSchema) else schema
        assert [c.name for c in schema.columns] == columns, name
    for name in ("triangles", "triangles_deltas"):
        assets = defs.resolve_assets_def(name)
        assert assets.get_io_manager_key_for_asset_key(AssetKey(name)) == OUTPUTS_IO_MANAGER
